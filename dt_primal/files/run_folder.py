"""The folder a train.py run writes (--out): one run at a time, and always the same data. The one module
that knows its layout (OUT, OUT/seed_N, a sweep's OUT/DATASET/MODEL/seed_N: ``member_folders``,
``group_dir``, ``run_dir``), the files a run writes there (``RUN_FILES``) and the lock (``try_lock``);
everything else asks it. Torch-free, so that records are read without it.

``hold_run_folder`` refuses an --out that is a file or cannot be written, and locks it (and, with
--seeds, each member's folder) for as long as the run lasts, with ``fcntl.flock`` on ``.train.lock``:
a second run started on the same folder is refused, and the lock of a run that was killed, however,
is released by the operating system, so a stale lock never blocks. The sweep locks ``.lock`` in the
same folder, by the same protocol, while its train.py child runs there; a different file, so the two
never block each other.

What a run records of its data there (``dataset.json``), and checks on --resume, is
``dt_primal.training.resume``'s.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from dt_primal.errors import UserError

# the files of a run's folder: the only place that spells them
CHECKPOINT = "last.pt"  # the weights and everything to act with them or continue (dt_primal.files.checkpoint)
PREVIOUS = "prev.pt"  # an ensemble's previous checkpoint, kept while its members' new ones are renamed in
RECORD = "eval.json"  # the final evaluation, its config and provenance: a finished run has one
CURVE = "evals.jsonl"  # the evaluations during training, one JSON object per line
DATASET_RECORD = "dataset.json"  # what the run trains on
LOCK_NAME = ".train.lock"  # held by the train.py run that writes the folder
GROUP_LOCK = ".lock"  # held by the sweep while its train.py child runs in the folder (a different file: no deadlock)
# what a run writes into a member's folder (besides TensorBoard's events, whose names are new each time) and, with
# --seeds, into its dataset's folder: never through a link, and never over a file that no run wrote
RUN_FILES = (CHECKPOINT, PREVIOUS, RECORD, CURVE, DATASET_RECORD, LOCK_NAME)
REPORT_FILES = ("report.json", "report.md")


def cannot_write(folder: Path, exc: OSError) -> UserError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "its disk is full: free some space, or choose another --out"
    else:
        what = "choose a folder you can write to (or fix this one's permissions)"
    return UserError(f"Cannot write into --out {folder} ({exc.strerror or exc}); {what}.")


def usable_folder(out: Path) -> None:
    """``out`` is, or can be made, a folder this process can write into."""
    if out.exists() and not out.is_dir():
        raise UserError(
            f"--out {out} is an existing file, not a folder: train.py writes a folder of files there "
            f"(last.pt, eval.json, TensorBoard events). Choose another --out, a new or existing folder."
        )
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UserError(f"--out {out} lies under {blocker}, which is a file, not a folder. Choose another --out.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cannot_write(out, exc) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise cannot_write(out, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))


def check_no_links(folder: Path, names: tuple[str, ...]) -> None:
    """None of ``folder``'s files ``names`` is a symbolic link: writing a run's files (or evaluate.py's report)
    through one would rewrite the file it points to."""
    link = next((folder / n for n in names if (folder / n).is_symlink()), None)
    if link is not None:
        raise UserError(
            f"{link} is a symbolic link, and dt-primal never writes through a link (it would rewrite the file "
            f"the link points to, {os.readlink(link)}). Remove the link, or choose another --out."
        )


def _holder(path: Path) -> str:
    """Who holds the lock ``path``, as the holder wrote it there; "" when unknown."""
    try:
        with open(path, "rb") as f:
            holder = json.loads(f.read(4096).decode())
        return f" (pid {holder['pid']} on {holder['host']}, started {holder['started']}: {holder['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def try_lock(folder: Path, name: str = GROUP_LOCK) -> int | None:
    """The one lock protocol of a folder: an exclusive ``fcntl.flock`` on ``folder``/``name``, which the
    operating system releases when the process ends, however it ends (a stale lock never blocks).
    Returns the locked file's descriptor (closing it releases the lock), or None when another process
    holds it."""
    try:
        fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            check_no_links(folder, (name,))
        raise cannot_write(folder, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lock(folder: Path) -> int:
    """An exclusive lock on ``folder``/.train.lock (``try_lock``), or a UserError naming the run that holds it."""
    path = folder / LOCK_NAME
    while True:
        fd = try_lock(folder, LOCK_NAME)
        if fd is None:
            raise UserError(
                f"--out {folder} is in use by another train.py run{_holder(path)}, which writes its checkpoints, "
                f"TensorBoard events and eval.json there. Wait for it to end (or stop it), or choose "
                f"another --out. A run that was killed releases the folder by itself."
            ) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the run before removed the file (and its empty folder) while this one waited: again
        folder.mkdir(parents=True, exist_ok=True)
    info = json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500],
        }
    ).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
    except OSError:
        pass  # the lock holds without its description
    return fd


def check_nothing_in_the_way(folder: Path) -> None:
    """A folder that never held a run (no ``.train.lock``, no ``last.pt``) holds none of the files a run
    writes: they are someone else's, a user's own ``eval.json`` say, which the run would overwrite."""
    if (folder / LOCK_NAME).exists() or (folder / CHECKPOINT).exists():
        return
    in_the_way = [n for n in RUN_FILES + REPORT_FILES if (folder / n).exists()]
    if in_the_way:
        them = "them" if len(in_the_way) > 1 else "it"
        raise UserError(
            f"{folder} already holds {', '.join(in_the_way)}, which no run of dt-primal wrote there (the "
            f"folder never held a run): the run would overwrite {them}. Move {them} away, or choose "
            f"another --out."
        )


def dataset_slug(dataset: str) -> str:
    """A dataset's id or file as one folder name."""
    return dataset.replace("/", "_").replace(os.sep, "_").removesuffix(".hdf5").removesuffix(".pkl")


def seed_folder(folder: Path, seed: int) -> Path:
    """The folder of one seed of an ensemble in ``folder``: FOLDER/seed_N (``SEED_FOLDERS`` matches them)."""
    return folder / f"seed_{seed}"


SEED_FOLDERS = "seed_*"


def linked(path: Path, top: Path) -> bool:
    """Whether ``path`` or a folder between it and ``top`` is a link (a record read through it would be another
    file, possibly outside ``top``)."""
    return any(p.is_symlink() for p in [path, *path.parents] if p == path or top in p.parents)


def seed_of(folder: Path) -> int | None:
    """The seed of a ``seed_folder``; None for another folder that ``SEED_FOLDERS`` matches."""
    seed = folder.name.removeprefix("seed_")
    return int(seed) if seed.isdecimal() else None


def group_dir(out: Path, dataset: str, model: str) -> Path:
    """A sweep's folder of one dataset and model in ``out``: OUT/DATASET/MODEL."""
    return out / dataset_slug(dataset) / model


def run_dir(out: Path, dataset: str, model: str, seed: int) -> Path:
    """A sweep's run of one dataset, model and seed in ``out``: OUT/DATASET/MODEL/seed_N."""
    return seed_folder(group_dir(out, dataset, model), seed)


def dataset_folders(out: Path, datasets: list[str] | None = None, model: str | None = None) -> list[Path]:
    """The folder of each dataset of a run, where its report goes: OUT, or with several datasets its
    ``group_dir`` (a sweep's layout, so that ensembles of other datasets or models share OUT)."""
    if datasets is not None and len(datasets) > 1:
        return [group_dir(out, d, model) for d in datasets]
    return [out]


def member_folders(
    out: Path, seeds: list[int] | None, datasets: list[str] | None = None, model: str | None = None
) -> list[Path]:
    """Where each member of a run writes, dataset by dataset and seed by seed: its dataset's folder
    (``dataset_folders``) with --seeds, as seed_N in it (always, with several datasets)."""
    folders = dataset_folders(out, datasets, model)
    return [seed_folder(f, s) for f in folders for s in seeds] if seeds else folders


def member_name(dataset: str, seed: int, with_dataset: bool) -> str:
    """How messages name a member: "seed N", with its dataset when the run has several."""
    return f"{dataset} seed {seed}" if with_dataset else f"seed {seed}"


class RunFolder:
    """A run folder held by this process (``enabled`` False: another process of the run holds it,
    and this one does nothing)."""

    def __init__(
        self,
        out: Path,
        seeds: list[int] | None,
        enabled: bool,
        datasets: list[str] | None = None,
        model: str | None = None,
    ):
        self.out, self.enabled = out, enabled
        self.datasets, self.members = dataset_folders(out, datasets, model), member_folders(out, seeds, datasets, model)


@contextlib.contextmanager
def hold_run_folder(
    out: str | os.PathLike,
    seeds: list[int] | None = None,
    enabled: bool = True,
    datasets: list[str] | None = None,
    model: str | None = None,
):
    """Hold each dataset's folder (``dataset_folders``) and each member's (``member_folders``) for the
    duration of the block; yields a ``RunFolder``. ``enabled`` False (the other processes of a torchrun
    run): nothing is held."""
    out = Path(out)
    folder = RunFolder(out, seeds, enabled, datasets, model)
    if not enabled:
        yield folder
        return
    created = [p for p in dict.fromkeys([out, *folder.datasets, *folder.members]) if not p.exists()]
    usable_folder(out)
    fds = []
    try:
        for path in dict.fromkeys([*folder.datasets, *folder.members]):
            if path != out:
                check_no_links(path.parent, (path.name,))
                usable_folder(path)
            check_no_links(path, RUN_FILES + REPORT_FILES)
            check_nothing_in_the_way(path)
            fds.append(_lock(path))
        yield folder
    finally:
        for path in reversed(created):  # a run that stopped before writing anything leaves no folder behind
            try:
                if {p.name for p in path.iterdir()} <= {LOCK_NAME, DATASET_RECORD}:
                    for name in (DATASET_RECORD, LOCK_NAME):  # the lock file last, while still locked
                        (path / name).unlink(missing_ok=True)
                    path.rmdir()
            except OSError:
                pass
        for fd in fds:
            os.close(fd)  # closing the file releases its lock
