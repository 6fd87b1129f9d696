"""The learner's transitions as the repository stores them (``medium_replay.npz``, ``history.npz``):
NumPy's ``.npz``, with each float array stored as its byte planes (every value's first byte, then
every value's second byte, ...), which zlib compresses about 15 % smaller than the values as they
lie; lossless, and read with ``np.load`` (no pickle). Files written as plain ``.npz`` read as well.
The suite's newer buffers keep their observations, and from halfcheetah's learner v1 on their actions, at
half precision (``half_precision``), which lets three buffers of D4RL's size live in the repository."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
    """The arrays ``save_transitions`` wrote to ``path`` (or a plain ``.npz``'s), each decompressed once."""
    with np.load(path, allow_pickle=False) as z:
        stored = {k: z[k] for k in z.files}
    arrays = {k: v for k, v in stored.items() if not k.startswith("__")}
    for key, planes in stored.items():
        if key.startswith(PLANES):
            name = key.removeprefix(PLANES)
            dtype, shape = np.dtype(str(stored[DTYPE + name])), tuple(stored[SHAPE + name])
            arrays[name] = np.ascontiguousarray(planes.T).view(dtype).reshape(shape)
    return arrays


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
