"""Checkpoints (``last.pt``) as archives: a zip archive as ``torch.save`` writes it, uncompressed entries whose
sizes add up to the file's, holding tensors and the plain data of ``pickles``. Every tensor is checked as a view
before its values are touched: dense (no zero or overlapping strides) and inside its storage, all of them
together no larger than the file, so that a view cannot make a small file expand into gigabytes."""

from __future__ import annotations

import zipfile

from dt_primal.errors import UserError
from dt_primal.files.pickles import ADMITTED_GLOBALS, NUMPY_DTYPES, _Array, _unpickling_error, _unwrap
from dt_primal.files.reading import regular_file


def _check_archive(path, size: int) -> None:
    """``path`` is a zip archive as ``torch.save`` writes it: its entries stored uncompressed, so that what
    they declare cannot exceed the file (a compressed entry could inflate a small file a thousandfold)."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise UserError(
            f"Checkpoint {path} is not a checkpoint archive ({exc}); it is truncated or corrupted, or was "
            f"not written by train.py. Use an earlier copy or retrain."
        ) from None
    packed = [e.filename for e in entries if e.compress_type != zipfile.ZIP_STORED]
    declared = sum(e.file_size for e in entries)
    if packed or declared > size:
        raise UserError(
            f"Checkpoint {path} was refused: its entries declare {declared} bytes in a file of {size}"
            f"{' and ' + packed[0] + ' is compressed' if packed else ''}, which torch.save never writes "
            f"(a small file must not make the reader allocate much more than its size). Use a checkpoint "
            f"written by train.py."
        )


def load_torch(path) -> object:
    """``torch.load`` of the tensors and plain data a checkpoint holds, on the CPU, after checking the archive;
    a UserError when it names anything not admitted. Other failures raise as ``torch.load``'s do."""
    import torch

    size = regular_file(path, "Checkpoint")
    _check_archive(path, size)
    admitted = [(f, name) for name, f in ADMITTED_GLOBALS.items()] + [(_Array, f"{_Array.__module__}._Array")]
    try:
        with torch.serialization.safe_globals(admitted + NUMPY_DTYPES):
            loaded = _unwrap(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as exc:
        refusal = _unpickling_error(path, exc)
        if refusal is not None:
            raise refusal from None
        raise
    _check_views(loaded, path, size)
    return loaded


def _tensors(value):
    """Every tensor in ``value``, through dicts, lists and tuples."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def dense_in_storage(t) -> bool:
    """Whether the tensor ``t`` is a dense view (its elements one after another in some order of its dimensions:
    no stride 0, no overlap) lying inside its storage."""
    dims = sorted((stride, n) for n, stride in zip(t.shape, t.stride()) if n > 1)
    expected = 1
    for stride, n in dims:
        if stride != expected:
            return False
        expected *= n
    end = t.storage_offset() + t.numel()
    return t.storage_offset() >= 0 and end * t.element_size() <= t.untyped_storage().nbytes()


def _check_views(value, path, size: int) -> None:
    """Refuse a checkpoint with a tensor that is not ``dense_in_storage``, or whose tensors together would take
    more memory than the file's ``size`` (views sharing one storage)."""
    total = 0
    for t in _tensors(value):
        if not dense_in_storage(t):
            raise UserError(
                f"Checkpoint {path} was refused: it holds a tensor of shape {tuple(t.shape)} viewed with strides "
                f"{t.stride()} over a storage of {t.untyped_storage().nbytes()} bytes, which train.py never "
                f"writes (such a view makes a small file take far more memory). Use a checkpoint written by "
                f"train.py."
            )
        total += t.numel() * t.element_size()
    if total > size:
        raise UserError(
            f"Checkpoint {path} was refused: its tensors would take {total:,} bytes of memory from a file of "
            f"{size:,} (views sharing their storage), which train.py never writes. Use a checkpoint written by "
            f"train.py."
        )
