"""``python -m commands.sweep.records SRC DST``: the small records of a sweep's finished runs (``eval.json``,
``evals.jsonl``, ``dataset.json`` of every ``seed_N`` folder with an ``eval.json``), without checkpoints or logs,
copied from a sweep folder or a ``.tgz`` archive into a folder, or packed from a sweep folder into an archive:

  python -m commands.sweep.records runs/table4 records.tgz        # on the GPU machine: one small archive
  python -m commands.sweep.records records.tgz results/table4     # here: into the committed records
  python -m commands.sweep.records runs/table4-cpu results/table4-cpu

An archive is read as untrusted: only those three file names, as regular files under a relative
``.../seed_N/`` path, are taken from it; anything else in it is named and left out; each record must be
JSON (``evals.jsonl``: a JSON value per line), and all of them together at most ``MAX_TOTAL`` bytes. A
sweep folder is packed without following links. A record already in DST is kept unless it differs, which
is refused (a run is never recorded twice with two results).
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import re
import tarfile
import time
import zlib
from pathlib import Path, PurePosixPath

from dt_primal.cli import command_parser, run_main
from dt_primal.errors import UserError
from dt_primal.files.reading import MAX_RECORD, open_regular, read_bytes
from dt_primal.files.run_folder import CURVE, DATASET_RECORD, RECORD, SEED_FOLDERS, linked
from dt_primal.files.writing import check_target, write_file

MAX_ENTRIES = 100_000
MAX_DEPTH = 16  # folders of a record's path in an archive
MAX_TOTAL = 64 * 2**20  # all the records of a sweep: Table 4's 54 runs hold well under 1 MiB
MAX_ARCHIVE = 4 * MAX_TOTAL  # the decompressed bytes read of an archive, its headers and other members included
ARCHIVE_SECONDS = 60.0  # the longest reading an archive may take

NAMES = (RECORD, CURVE, DATASET_RECORD)
RECORD_PATH = re.compile(r"^(?:[\w.+-]+/)*seed_\d+/(?:" + "|".join(map(re.escape, NAMES)) + ")$")


def is_record_path(name: str) -> bool:
    """Whether an archive member's ``name`` is where a sweep keeps a record: ``.../seed_N/<record>``, relative,
    without ``..``, at most ``MAX_DEPTH`` folders deep and 1,024 characters long (a sweep's are 4 and about 100)."""
    parts = name.split("/")
    return len(name) <= 1024 and len(parts) <= MAX_DEPTH and ".." not in parts and bool(RECORD_PATH.match(name))


def checked(records: dict[str, bytes], src: Path) -> dict[str, bytes]:
    """``records`` when together they hold at most MAX_TOTAL bytes and each is JSON (a value per line of
    ``evals.jsonl``); else a UserError naming the first that is not."""
    if sum(map(len, records.values())) > MAX_TOTAL:
        raise UserError(f"{src} holds more than {MAX_TOTAL >> 20} MiB of records; a sweep's are far fewer.")
    for name, data in records.items():
        try:
            lines = data.splitlines() if name.endswith(".jsonl") else [data]
            for line in filter(bytes.strip, lines):
                json.loads(line)
        except (ValueError, RecursionError):
            raise UserError(f"{src} was refused: {name} is not JSON, as every run record is.") from None
    return records


def from_folder(src: Path) -> dict[str, bytes]:
    """The records of the finished runs under ``src``, by their path relative to it; none through a link."""
    runs = [p.parent for p in src.rglob(f"{SEED_FOLDERS}/{RECORD}") if not linked(p, src)]
    files = [run / n for run in runs for n in NAMES if (run / n).is_file() and not (run / n).is_symlink()]
    if len(files) > MAX_ENTRIES:
        raise UserError(f"{src} holds more than {MAX_ENTRIES} run records; a sweep's are far fewer.")
    records = {f.relative_to(src).as_posix(): read_bytes(f, "The run record", MAX_RECORD) for f in files}
    return checked(records, src)


class Budget(io.RawIOBase):
    """The decompressed bytes of an archive, read with a budget: at most ``limit`` bytes (headers and the members
    skipped included) and ``seconds`` of reading, else a UserError naming ``src``."""

    def __init__(self, stream, src: Path, limit: int, seconds: float):
        self.stream, self.src, self.limit, self.seconds = stream, src, limit, seconds
        self.left, self.end = limit, time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.left < 0 or time.monotonic() > self.end:
            raise UserError(
                f"{self.src} was refused: reading it took more than {self.limit >> 20} MiB or {self.seconds:.0f} s, "
                "where a sweep's records are well under 1 MiB; it is damaged or not one this command packed."
            )
        data = self.stream.read(min(len(buffer), self.left + 1))
        buffer[: len(data)] = data
        self.left -= len(data)
        return len(data)


def decompressed(f):
    """The tar stream in ``f``: gzip, bzip2 or xz by their magic bytes, else as it is."""
    magic = f.read(6)
    f.seek(0)
    for prefix, opener in ((b"\x1f\x8b", gzip.GzipFile), (b"BZh", bz2.BZ2File), (b"\xfd7zXZ\x00", lzma.LZMAFile)):
        if magic.startswith(prefix):
            return opener(fileobj=f) if opener is gzip.GzipFile else opener(f)
    return f


def from_archive(src: Path) -> dict[str, bytes]:
    """The records in the archive ``src`` (as this command packs them, paths relative to the sweep folder), read
    once from start to end within a byte and time budget (``Budget``); no other member is kept, and none is
    extracted. Two members of one name with different contents are refused."""
    files, left, entries, total = {}, [], 0, 0
    try:
        raw = open_regular(src, "The archive")
        stream = Budget(decompressed(raw), src, MAX_ARCHIVE, ARCHIVE_SECONDS)
        with raw, tarfile.open(fileobj=stream, mode="r|") as tar:
            for m in tar:  # one at a time: an archive of millions of entries is refused before it fills memory
                entries += 1
                if entries > MAX_ENTRIES:
                    raise UserError(f"{src} holds more than {MAX_ENTRIES} entries; a sweep's records are far fewer.")
                if not (m.isreg() and is_record_path(m.name)):
                    left += [] if m.isdir() else [m.name]
                    continue
                data = member(tar, m, src, files.get(m.name))
                total += 0 if m.name in files else len(data)
                files[m.name] = data
                if total > MAX_TOTAL:
                    raise UserError(f"{src} holds more than {MAX_TOTAL >> 20} MiB of records; a sweep's are far fewer.")
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError, RecursionError) as exc:
        raise UserError(f"{src} is not a readable .tgz archive ({type(exc).__name__}: {str(exc)[:200]}).") from None
    if left:
        print(f"left out of {src}: {', '.join(left[:5])}{' ...' if len(left) > 5 else ''} (not a run record)")
    finished = {str(PurePosixPath(n).parent) for n in files if PurePosixPath(n).name == RECORD}
    return checked({n: b for n, b in files.items() if str(PurePosixPath(n).parent) in finished}, src)


def member(tar: tarfile.TarFile, m: tarfile.TarInfo, src: Path, before: bytes | None) -> bytes:
    """The bytes of the record ``m``, at most ``MAX_RECORD``; refused where an earlier member of its name held
    other bytes (which one would win is not for an archive to decide)."""
    if m.size > MAX_RECORD:
        raise UserError(
            f"{src} was refused: {m.name} declares {m.size} bytes, where a run record is a few kB (at most "
            f"{MAX_RECORD >> 20} MiB are read); the archive is damaged or not one this command packed."
        )
    data = tar.extractfile(m).read(MAX_RECORD)
    if before is not None and before != data:
        raise UserError(f"{src} was refused: it holds two different records named {m.name}; which is the run's?")
    return data


def into_folder(records: dict[str, bytes], dst: Path) -> int:
    """Write ``records`` under ``dst``; the number of new files. A differing file already there is refused."""
    folders = {str(f) for n in records for f in PurePosixPath(n).parents}
    in_the_way = lambda p, folder: p.is_symlink() or (p.exists() and not (p.is_dir() if folder else p.is_file()))
    blocked = [
        n
        for n in records
        if n in folders
        or in_the_way(dst / n, False)
        or any(in_the_way(p, True) for p in (dst / n).parents if dst in p.parents)
    ]
    if blocked:
        raise UserError(
            f"{dst} cannot take the records {', '.join(blocked[:3])}: a file, folder or link is in the way "
            f"of that path there. Nothing was written; move it aside, or choose another destination."
        )
    clash = [n for n, b in records.items() if (dst / n).is_file() and (dst / n).read_bytes() != b]
    if clash:
        raise UserError(
            f"{dst} already holds different records for {', '.join(clash[:3])}: a run is recorded once. "
            f"Move the old ones aside first if the new ones replace them."
        )
    new = {n: b for n, b in records.items() if not (dst / n).is_file()}
    for n, b in new.items():
        (dst / n).parent.mkdir(parents=True, exist_ok=True)
        write_file(dst / n, b, "The run record")
    return len(new)


def into_archive(records: dict[str, bytes], dst: Path) -> None:
    """``records`` packed as one .tgz at ``dst``, written beside it and renamed (``write_file``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for n, b in sorted(records.items()):
            info = tarfile.TarInfo(n)
            info.size = len(b)
            tar.addfile(info, io.BytesIO(b))
    write_file(dst, buf.getvalue(), "The archive")


def main(argv: list[str] | None = None) -> None:
    p = command_parser(__doc__, prog="python -m commands.sweep.records")
    p.add_argument("src", type=Path, help="a sweep folder, or a .tgz archive this command packed")
    p.add_argument("dst", type=Path, help="a folder, or a .tgz archive to write (from a sweep folder)")
    args = p.parse_args(argv)
    archive = lambda path: path.name.endswith((".tgz", ".tar.gz"))
    if not args.src.exists():
        raise UserError(
            f"{args.src} does not exist: give a sweep folder (--out of python -m commands.sweep) or a .tgz."
        )
    if archive(args.dst):
        check_target(args.dst, "The archive")  # before reading the records
    records = from_archive(args.src) if archive(args.src) else from_folder(args.src)
    n = sum(PurePosixPath(name).name == RECORD for name in records)
    runs = f"{n} finished run{'s' * (n != 1)}"
    if archive(args.dst):
        into_archive(records, args.dst)
        print(f"packed the records of {runs} into {args.dst} ({args.dst.stat().st_size / 1024:.0f} KiB)")
    else:
        print(f"{into_folder(records, args.dst)} new files, the records of {runs}, in {args.dst}")


if __name__ == "__main__":
    run_main(main)
