"""Reading a file a user gave, whatever its kind: only regular files (a FIFO or a device would make the reader
wait or never end), only as many bytes as such a file holds, and no more memory than this machine has; JSON
records; the error that names what a file tried to call. Every reader of the package starts here."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import BinaryIO

import numpy as np

from dt_primal.errors import UserError

MAX_RECORD = 16 * 2**20  # a run record (eval.json, evals.jsonl, dataset.json) is a few kB
ADMITTED_IN_WORDS = "lists, dicts, numbers, strings, tensors and NumPy arrays"


def check_fits_memory(nbytes: int, path, what: str) -> None:
    """Refuse a file that declares ``nbytes`` of ``what``, more than half this machine's free memory (the
    data is converted once after it is read)."""
    from dt_primal.machine import available_bytes

    free = available_bytes("cpu")[0]
    if free and nbytes > free // 2:
        raise UserError(
            f"{path} declares {what} of {nbytes / 2**30:.1f} GiB, more than this machine can hold while "
            f"converting it ({free / 2**30:.1f} GiB free); it was not read. Use a machine with more "
            f"memory, or check that the file is the one you meant."
        )


def _not_regular(path, what: str, mode: int) -> UserError:
    """The error for ``path`` that is not a regular file, naming what it is."""
    kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")]
    kind = next((name for test, name in kinds if test(mode)), "a device")
    return UserError(f"{what} {path} is {kind}, not a regular file; give the file itself.")


def _too_long(path, what: str) -> UserError:
    return UserError(f"{what} {str(path)[:80]}... has a name too long for the file system; shorten it.")


def _unreadable(path, what: str, exc: OSError) -> UserError:
    if isinstance(exc, FileNotFoundError):
        return UserError(f"{what} {path} does not exist.")
    if exc.errno == errno.ENAMETOOLONG:
        return _too_long(path, what)
    return UserError(f"{what} {path} cannot be read ({exc.strerror or exc}).")


def regular_file(path, what: str) -> int:
    """The size of ``path``, a regular, non-empty file; a UserError for a folder, a FIFO, a device or an
    empty file (a FIFO would make the reader wait forever)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, what, info.st_mode)
    if info.st_size == 0:
        raise UserError(f"{what} {path} is empty (0 bytes): it was not written completely. Use another copy.")
    return info.st_size


def open_regular(path, what: str) -> BinaryIO:
    """``path``, a file a user gave, open for reading: opened without waiting (a FIFO cannot block) and checked on
    the open file (a regular file, so that nothing swapped in after a check is read); a UserError naming
    ``what`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, what, mode)
    return os.fdopen(fd, "rb")


def read_bytes(path, what: str, limit: int) -> bytes:
    """The bytes of ``path``, a file a user gave: opened without waiting (a FIFO cannot block), checked on the
    open file (a regular file, of at most ``limit`` bytes, so that nothing swapped in after a check is read),
    read to at most ``limit`` bytes and closed. A UserError naming ``what`` otherwise."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise UserError(f"{what} {path} is larger than {limit:,} bytes, more than such a file holds; it was not read.")
    return data


def not_admitted(path, name: str) -> UserError:
    """The error for a file that names ``name``, which is not admitted."""
    return UserError(
        f"{path} was refused: reading it would call {name}, and dt-primal reads only {ADMITTED_IN_WORDS} from a "
        f"file, because unpickling anything else can run code on this machine (nothing in the file was "
        f"run). Do not use the file unless you know where it came from; ask for one written by train.py, "
        f"or for a dataset as an .hdf5 file."
    )


def is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def is_number(x: object) -> bool:
    """A finite int or float (an int of any size, which a float conversion would overflow, is compared)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return abs(x) < 1e300 if isinstance(x, int) else math.isfinite(x)


def read_json(path, what: str, remedy: str, limit: int = MAX_RECORD) -> object:
    """The JSON value of the regular file ``path``, of at most ``limit`` bytes (``read_bytes``); ``what`` names
    the file in the messages ("The run record"), ``remedy`` says what to do with one that is not JSON."""
    data = read_bytes(path, what, limit)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{what} {path} is not JSON ({str(exc)[:100]}); it is damaged. {remedy}") from None


def acts_finite(state_mean, state_std, reward_scale) -> bool:
    """Whether a policy's statistics keep what acting computes from them finite in float32, the precision it acts
    in: the normalisation (obs − mean) / std and the returns-to-go divided by a positive reward scale."""
    if not is_number(reward_scale):
        return False
    with np.errstate(all="ignore"):
        mean, std = (np.asarray(a, np.float64).astype(np.float32) for a in (state_mean, state_std))
        inverse = np.float32(1) / std
        return bool(
            np.isfinite(mean).all()
            and (std > 0).all()
            and np.isfinite(inverse).all()
            and np.isfinite(mean * inverse).all()
            and np.float32(reward_scale) > 0
            and np.isfinite(np.float32(1) / np.float32(reward_scale))
        )
