"""The one way dt-primal writes a file a user will read: into a new file beside the name, flushed to disk, then
renamed over it. A link, a FIFO or a device at the name is replaced, never written through or waited on; a
crash, a kill or a full disk leaves the old file or none, never a partial one under the final name."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from dt_primal.errors import UserError
from dt_primal.files.reading import _too_long, _unreadable


def check_target(path, what: str) -> Path:
    """``path`` as ``write_file`` will write it, checked before any work that ends in writing it."""
    path = Path(path)
    try:
        folder, parent = path.is_dir() and not path.is_symlink(), path.parent.is_dir()
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    if folder:
        raise UserError(f"{what} {path} is a folder; give the name of a file to write.")
    if not parent:
        raise UserError(f"{what} {path} cannot be written: the folder {path.parent} does not exist. Create it first.")
    if len(path.name.encode()) > os.pathconf(path.parent, "PC_NAME_MAX"):
        raise _too_long(path, what)
    return path


def _new_beside(path: Path, what: str, suffix: str = "") -> tuple[Path, int]:
    """A new, empty file beside ``path`` (checked first, ``check_target``), created and never opened through a
    link, named ``.NAME.PID.tmp`` + ``suffix``: its path and an open descriptor for writing."""
    path = check_target(path, what)
    tmp = path.with_name(f".{path.name[:200]}.{os.getpid()}.tmp{suffix}")
    try:
        tmp.unlink(missing_ok=True)
        return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        raise _too_long(path, what) from None


def write_beside(path, data: bytes | str | Callable[[BinaryIO], object], what: str) -> Path:
    """``data`` (bytes, text, or a function that writes into an open binary file) written into a new file beside
    ``path`` and flushed to disk; that file's path, for the caller to rename over ``path`` (``write_file``) once
    everything it writes is on disk. ``path`` is checked first (``check_target``); the new file is created, never
    opened through a link; on any failure it is removed."""
    tmp, fd = _new_beside(Path(path), what)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                # text as UTF-8; a path's bytes that are not (a surrogate-escaped name) appear as escapes
                f.write(data.encode("utf-8", errors="backslashreplace") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_file(path, data: bytes | str | Callable[[BinaryIO], object], what: str) -> None:
    """``data`` into ``path``, a file a user named (``write_beside``, then renamed over it): a link, a FIFO or a
    device at ``path`` is replaced, never written through or waited on, and a crash or a full disk leaves the
    old file or none; a folder at ``path``, a missing folder or a name too long for the file system is a
    UserError naming ``what``."""
    tmp = write_beside(path, data, what)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def writing_by_name(path, what: str) -> Iterator[Path]:
    """For a writer that opens its file by name (ffmpeg's): a new file's path beside ``path``, with its suffix (a
    writer may choose its format by it), to write inside the block; when the block ends without an error the file
    is flushed to disk and renamed over ``path`` as ``write_file`` does, else removed."""
    path = Path(path)
    tmp, fd = _new_beside(path, what, path.suffix)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
