"""Reading the files a user is given (checkpoints, dataset pickles) without running their code.

Unpickling calls whatever functions a file names, so a shared file could run anything on the
reader's machine. Both readers here build plain data only: lists, dicts, tuples, numbers and
strings, tensors (``torch.load(weights_only=True)``), and NumPy arrays, scalars and dtypes (the
few NumPy functions that rebuild them from their bytes; ``ADMITTED_GLOBALS``). A file that names
anything else is refused before anything it names is called.
"""
from __future__ import annotations

import _codecs
import os
import pickle
import re

import numpy as np
import torch

from dt_primal.errors import UserError

_NUMPY = {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype,
          "numpy._core.multiarray._reconstruct": np._core.multiarray._reconstruct,
          "numpy._core.multiarray.scalar": np._core.multiarray.scalar,
          "numpy._core.numeric._frombuffer": np._core.numeric._frombuffer}
# what a pickle may name: NumPy's rebuilders under their NumPy 2 and NumPy 1 module names, and the bytes decoder
# of pickle protocol 2 (the protocol torch.save writes)
ADMITTED_GLOBALS = {**_NUMPY, **{k.replace("numpy._core", "numpy.core"): v for k, v in _NUMPY.items()},
                    "_codecs.encode": _codecs.encode}
# the classes of NumPy's dtypes of numbers, booleans and text, which torch.load checks as it rebuilds a dtype
NUMPY_DTYPES = sorted({type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGSU"}, key=str)
ADMITTED = "lists, dicts, numbers, strings, tensors and NumPy arrays"


def refused(path: str | os.PathLike, name: str) -> UserError:
    """The error for a file that names ``name``, which is not admitted."""
    return UserError(f"{path} was refused: reading it would call {name}, and dt-primal reads only {ADMITTED} from a "
                     f"file, because unpickling anything else can run code on this machine (nothing in the file was "
                     f"run). Do not use the file unless you know where it came from; ask for one written by train.py, "
                     f"or for a dataset as an .hdf5 file.")


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        try:
            return ADMITTED_GLOBALS[f"{module}.{name}"]
        except KeyError:
            raise refused(self.path, f"{module}.{name}") from None


def load_pickle(path: str | os.PathLike) -> object:
    """The plain data a pickle file holds; UserError when it names anything not admitted."""
    with open(path, "rb") as f:
        return _PlainUnpickler(f, path).load()


def load_torch(path: str | os.PathLike) -> object:
    """``torch.load`` of the tensors and plain data a file holds, on the CPU; UserError when it names
    anything else. Other failures (a missing, truncated or foreign file) raise as torch.load's do."""
    try:
        with torch.serialization.safe_globals([(f, name) for name, f in ADMITTED_GLOBALS.items()] + NUMPY_DTYPES):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL (\S+) was not an allowed global", str(exc))
        if named:
            raise refused(path, named.group(1)) from None
        raise
