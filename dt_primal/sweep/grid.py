"""The grid of a sweep: its folders (OUT/DATASET/MODEL/seed_N), and each (dataset, model) group trained
as one ensemble, resumed where it stopped and locked while it trains; the local backend runs
``--jobs`` groups at once, each in a child process."""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TextIO

from dt_primal.cli import run_main
from dt_primal.process import configure_process
from dt_primal.run import Loader, train_command

ROOT = Path(__file__).resolve().parents[2]
# the nine D4RL datasets of the paper's Table 4, as the offline suite builds them
TABLE4 = [f"dt-primal/{env}/{level}-v0" for env in ("halfcheetah", "hopper", "walker2d")
          for level in ("medium", "medium-replay", "medium-expert")]


def group_dir(out: Path, dataset: str, model: str) -> Path:
    slug = dataset.replace("/", "_").replace(os.sep, "_").removesuffix(".hdf5").removesuffix(".pkl")
    return out / slug / model


def run_dir(out: Path, dataset: str, model: str, seed: int) -> Path:
    return group_dir(out, dataset, model) / f"seed_{seed}"


BUSY = None  # run_group's status for a group that another sweep is training (-N would be a signal's exit status)
COMMAND = [sys.executable, "-m", "dt_primal.run"]  # train.py, as the library runs it
# how a backend runs one train command: (its arguments, the group's train.log) -> exit status
Trainer = Callable[[list[str], TextIO], int]


def run_group(dataset: str, model: str, seeds: list[int], out: Path, extra: list[str],
              trainer: Trainer) -> tuple[Path, list[int], int | None]:
    """Train the seeds of (dataset, model) that have not finished, as ensembles: those that started
    resume together, the others start together. A group another sweep holds is left to it.
    Returns (group dir, the seeds trained, exit status or BUSY)."""
    gd = group_dir(out, dataset, model)
    gd.mkdir(parents=True, exist_ok=True)
    with open(gd / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when this process ends, however it ends
        except BlockingIOError:
            return gd, [], BUSY
        todo = [s for s in seeds if not (run_dir(out, dataset, model, s) / "eval.json").exists()]
        started = [s for s in todo if (run_dir(out, dataset, model, s) / "last.pt").exists()]
        for part, resume in ((started, True), ([s for s in todo if s not in started], False)):
            if not part:
                continue
            argv = ["--dataset", dataset, "--model", model, "--seeds", *map(str, part), "--out", str(gd), *extra,
                    *(["--resume"] if resume else [])]
            log_path = gd / "train.log"
            cut = log_path.exists() and log_path.read_bytes()[-1:] not in (b"", b"\n")  # a killed run's last line
            with open(log_path, "a") as log:
                log.write(f"{chr(10) if cut else ''}$ python -m dt_primal.run {' '.join(argv)}\n"); log.flush()
                rc = trainer(argv, log)
            if rc:
                return gd, todo, rc
        return gd, todo, 0


def python_path() -> str:
    """``$PYTHONPATH`` with this checkout first: what the trainers' processes import (on every node of a cluster)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def in_subprocess(threads: int) -> Trainer:
    """The local pool's trainer: ``python -m dt_primal.run`` in a child process with ``threads`` CPU threads, in
    the sweep's folder (relative paths mean what they mean to the sweep), importing this checkout."""
    def trainer(argv: list[str], log: TextIO) -> int:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": python_path()}
        return subprocess.run([*COMMAND, *argv], stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    return trainer


def in_process(load_dataset: Loader, threads: int) -> Trainer:
    """A Ray worker's trainer: ``train_command`` in this process, its output into the log and its exit
    status returned as the command line's would be (a bug's traceback goes to the log, status 1)."""
    def trainer(argv: list[str], log: TextIO) -> int:
        configure_process(threads=threads)
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            try:
                run_main(lambda: train_command(argv, load_dataset))
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except Exception:
                traceback.print_exc()
                return 1
        return 0
    return trainer


def run_groups_locally(groups: list[tuple[str, str]], args, extra: list[str]):
    """Yield ``run_group``'s result for each group, ``--jobs`` groups at once, each in a child process."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_group, d, m, args.seeds, args.out, extra, in_subprocess(threads)) for d, m in groups]
        for f in futures:
            yield f.result()
