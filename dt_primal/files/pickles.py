"""Pickles (a checkpoint's data.pkl, a decision-transformer dataset): plain data only. Lists, dicts, numbers,
strings and NumPy arrays, scalars and dtypes (``ADMITTED_GLOBALS``), each array no larger than its bytes in
the file; anything else a pickle names is refused before it is called."""

from __future__ import annotations

import _codecs
import math
import pickle
import re

import numpy as np

from dt_primal.errors import UserError
from dt_primal.files.reading import ADMITTED_IN_WORDS, not_admitted, regular_file


class _ArrayName:
    """What a pickle gets for ``numpy.ndarray``: only a marker for ``_reconstruct``; calling it (an array
    of uninitialised memory of a size the file chooses) is refused."""

    def __new__(cls, *args, **kwargs):
        raise UserError(
            "it calls numpy.ndarray directly (an array of uninitialised memory of a size the file "
            "chooses), which NumPy's own pickles never do"
        )


class _Array:
    """An array as NumPy pickles it, made empty by ``_reconstruct`` and filled by ``__setstate__``, which
    checks that the file holds every byte of the shape it declares before NumPy allocates it."""

    def __init__(self, subtype=None, shape=(0,), dtype=b"b"):
        if subtype is not _ArrayName or tuple(shape) != (0,):
            raise UserError(
                f"it rebuilds an array with the shape {str(shape)[:80]}, where NumPy's own pickles "
                f"start from an empty array"
            )
        self.array = None

    def __setstate__(self, state):
        version, shape, dtype, fortran, raw = state if len(state) == 5 else (1, *state)
        if not (
            isinstance(dtype, np.dtype)
            and isinstance(shape, tuple)
            and all(isinstance(n, int) and 0 <= n < 2**40 for n in shape)
        ):
            raise UserError(f"an array in it declares the shape {str(shape)[:80]} and dtype {str(dtype)[:80]}")
        count = math.prod(shape)
        held = len(raw) if dtype.hasobject else len(raw) // max(dtype.itemsize, 1)
        if not isinstance(raw, (bytes, bytearray, list)) or held != count:
            raise UserError(f"an array in it declares {count} values of {dtype} but holds {held}")
        self.array = np._core.multiarray._reconstruct(np.ndarray, (0,), b"b")
        self.array.__setstate__((version, shape, dtype, fortran, raw))


def _unwrap(value):
    """``value`` with every ``_Array`` replaced by its array, in dicts, lists and tuples."""
    if isinstance(value, _Array):
        if value.array is None:
            raise UserError("an array in it is never filled")
        return value.array
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    return value


_NUMPY = {
    "numpy.ndarray": _ArrayName,
    "numpy.dtype": np.dtype,
    "numpy._core.multiarray._reconstruct": _Array,
    "numpy._core.multiarray.scalar": np._core.multiarray.scalar,
    "numpy._core.numeric._frombuffer": np._core.numeric._frombuffer,
}
# what a pickle may name: NumPy's rebuilders (bounded) under their NumPy 2 and NumPy 1 module names, and the bytes
# decoder of pickle protocol 2 (the protocol torch.save writes)
ADMITTED_GLOBALS = {
    **_NUMPY,
    **{k.replace("numpy._core", "numpy.core"): v for k, v in _NUMPY.items()},
    "_codecs.encode": _codecs.encode,
}
# the classes of NumPy's dtypes of numbers, booleans and text, which torch.load checks as it rebuilds a dtype
NUMPY_DTYPES = sorted({type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGSU"}, key=str)


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        try:
            return ADMITTED_GLOBALS[f"{module}.{name}"]
        except KeyError:
            raise not_admitted(self.path, f"{module}.{name}") from None


def _unpickling_error(path, exc: Exception) -> UserError | None:
    """The UserError for a pickle that names or rebuilds something not admitted (``exc`` raised by either
    unpickler); None for other failures."""
    if isinstance(exc, UserError):
        return (
            exc
            if str(path) in str(exc)
            else UserError(
                f"{path} was refused: {exc}. dt-primal reads only {ADMITTED_IN_WORDS} as NumPy and torch.save write "
                f"them; use a file written by train.py, or a dataset as an .hdf5 file."
            )
        )
    named = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if named and isinstance(exc, pickle.UnpicklingError):
        return not_admitted(path, named.group(1))
    return None


def load_pickle(path) -> object:
    """The plain data a pickle file holds; a UserError when it names anything not admitted, or is not a
    pickle of plain data."""
    regular_file(path, "The dataset file")
    try:
        with open(path, "rb") as f:
            return _unwrap(_PlainUnpickler(f, path).load())
    except Exception as exc:
        raise (
            _unpickling_error(path, exc)
            or UserError(
                f"Cannot unpickle {path} ({type(exc).__name__}: {str(exc)[:200]}); the file may be truncated or not a "
                f"pickle."
            )
        ) from None
