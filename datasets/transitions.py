"""The learner's transitions as the repository stores them (``medium_replay.npz``, ``history.npz``):
NumPy's ``.npz``, with each float array stored as its byte planes (every value's first byte, then
every value's second byte, ...), which zlib compresses about 15 % smaller than the values as they
lie; lossless, and read with ``np.load`` (no pickle). Files written as plain ``.npz`` read as well.
The suite's newer buffers keep their observations, and from halfcheetah's learner v1 on their actions, at
half precision (``half_precision``), which lets three buffers of D4RL's size live in the repository."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from dt_primal.files.reading import check_fits_memory, regular_file

PLANES = "__planes_"  # key prefix of an array stored as byte planes; its shape and dtype under SHAPE/DTYPE
SHAPE, DTYPE = "__shape_", "__dtype_"


def save_transitions(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` written to ``path`` (a file name or an open binary file), float arrays as byte planes."""
    packed = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.kind == "f":
            packed[PLANES + name] = np.ascontiguousarray(a.reshape(-1).view(np.uint8).reshape(-1, a.itemsize).T)
            packed[SHAPE + name], packed[DTYPE + name] = np.array(a.shape, np.int64), np.array(a.dtype.str)
        else:
            packed[name] = a
    np.savez_compressed(path, **packed)


def load_transitions(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays ``save_transitions`` wrote to ``path`` (or a plain ``.npz``'s), each decompressed once. The
    file is checked first: numbers and text only, no more declared than this machine can hold
    (``declared_bytes``), and each byte-plane array's dtype a float whose planes hold exactly its shape; else a
    ValueError."""
    regular_file(path, "The transitions file")
    check_fits_memory(declared_bytes(path), path, "arrays")
    with np.load(path, allow_pickle=False) as z:
        stored = {k: z[k] for k in z.files}
    arrays = {k: v for k, v in stored.items() if not k.startswith("__")}
    for key, planes in stored.items():
        if key.startswith(PLANES):
            name = key.removeprefix(PLANES)
            dtype, shape = np.dtype(str(stored[DTYPE + name])), tuple(int(n) for n in stored[SHAPE + name])
            if dtype.kind != "f" or planes.shape != (dtype.itemsize, math.prod(shape)):
                raise ValueError(f"{path}: {name} declares {dtype} of shape {shape}, not what its planes hold")
            arrays[name] = np.ascontiguousarray(planes.T).view(dtype).reshape(shape)
    return arrays


def declared_bytes(path: str | Path) -> int:
    """The bytes the arrays of the ``.npz`` at ``path`` declare in their headers, read without their data; a
    ValueError for a member that is not a ``.npy`` array of numbers or text."""
    headers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version not in headers:
                        raise ValueError(f"{info.filename} is a .npy of format {version}")
                    shape, _, dtype = headers[version](member)
                if dtype.kind not in "biufU":
                    raise ValueError(f"{info.filename} holds {dtype}, not numbers or text")
                total += math.prod(shape) * dtype.itemsize
    except (zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{path} is not a .npz archive ({exc})") from None
    return total


HALF = ("observations", "final_observations", "actions")  # the arrays adopt rounds (walker2d's v1 kept its actions)
HALF_MAX = float(np.finfo(np.float16).max)


def half_precision(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with the observations and actions (``HALF``) rounded to float16: a relative error of at most
    2**-11 (0.05 %; for actions in [-1, 1] at most 2.4e-4), about half the bytes of the whole buffer; the
    rewards stay as they are, so that returns add up exactly."""
    out = dict(arrays)
    for key in HALF:
        a = np.asarray(arrays[key])
        if not np.all(np.abs(a) <= HALF_MAX):
            raise ValueError(f"{key} holds values that half precision cannot store (beyond ±{HALF_MAX:g}, or NaN)")
        out[key] = a.astype(np.float16)
    return out
