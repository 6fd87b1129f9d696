"""The grid of a sweep: its folders (OUT/DATASET/MODEL/seed_N), and each (dataset, model) group trained
as one ensemble, resumed where it stopped and locked while it trains; the local backend runs
``--jobs`` groups at once, each in a child process."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

from commands.sweep.budget import Group, Setting
from datasets.suite import suite_id
from dt_primal.cli import run_main
from dt_primal.cli.train import Loader, train_command
from dt_primal.files.run_folder import CHECKPOINT, RECORD, group_dir, run_dir, try_lock
from dt_primal.process import configure_process

ROOT = Path(__file__).resolve().parents[2]
# the nine D4RL datasets of the paper's Table 4, as the offline suite builds them, at the versions its records use:
# per dataset, the version closest to D4RL v2's statistics (docs/datasets.md; hopper's medium-v0, which meets
# them, over medium-v1 and medium-v2, which do not); rows made on earlier versions are kept under results/legacy/
TABLE4_VERSIONS = {
    "halfcheetah": {"medium": 1, "medium-replay": 1, "medium-expert": 2},
    "hopper": {"medium": 0, "medium-replay": 2, "medium-expert": 1},
    "walker2d": {"medium": 1, "medium-replay": 1, "medium-expert": 2},
}
TABLE4 = [
    suite_id(env, level, TABLE4_VERSIONS[env][level])
    for env in ("halfcheetah", "hopper", "walker2d")
    for level in ("medium", "medium-replay", "medium-expert")
]
# the same nine in the order a time budget takes them: the paper's largest claimed gains over DT first
TABLE4_BY_GAIN = [
    suite_id(env, level, TABLE4_VERSIONS[env][level])
    for env, level in [
        ("hopper", "medium"),
        ("walker2d", "medium-replay"),
        ("hopper", "medium-replay"),
        ("walker2d", "medium"),
        ("hopper", "medium-expert"),
        ("halfcheetah", "medium-replay"),
        ("walker2d", "medium-expert"),
        ("halfcheetah", "medium"),
        ("halfcheetah", "medium-expert"),
    ]
]

BUSY = None  # run_group's status for a group that another sweep is training (-N would be a signal's exit status)
COMMAND = [sys.executable, "-m", "commands.train"]  # train.py, as the library runs it
# how a backend runs one train command: (its arguments, the group's train.log) -> exit status
Trainer = Callable[[list[str], TextIO], int]


def run_group(
    datasets: list[str],
    model: str,
    seeds: list[int],
    out: Path,
    extra: list[str],
    trainer: Trainer,
    recorded: Path | None = None,
) -> tuple[str, list[int], int | None]:
    """Train the runs of (``datasets``, model) that have not finished, in ``out`` or, when given, in the
    folder of committed records ``recorded`` (the same layout): datasets whose models share an
    architecture (``ensemble_groups``), as ensembles: the runs that started resume together, the others
    start together (datasets with the same seeds left in one ensemble). A group another sweep holds
    (any of its folders) is left to it. Returns (the group's folders, the seeds trained, exit status or BUSY)."""
    dirs = [group_dir(out, d, model) for d in datasets]
    name = " + ".join(map(str, dirs))
    with contextlib.ExitStack() as held:
        for gd in dirs:
            gd.mkdir(parents=True, exist_ok=True)
            fd = try_lock(gd)
            if fd is None:
                return name, [], BUSY
            held.callback(os.close, fd)
        todo = {d: [s for s in seeds if not finished(d, model, s, out, recorded)] for d in datasets}
        trained = sorted({s for left in todo.values() for s in left})
        for resume in (True, False):
            parts: dict[tuple[int, ...], list[str]] = {}  # seeds -> the datasets with those seeds to train
            for d, left in todo.items():
                part = tuple(s for s in left if (run_dir(out, d, model, s) / CHECKPOINT).exists() == resume)
                if part:
                    parts.setdefault(part, []).append(d)
            for part, ds in parts.items():
                rc = train_ensemble(ds, model, list(part), out, extra, trainer, resume)
                if rc:
                    return name, trained, rc
        return name, trained, 0


def finished(dataset: str, model: str, seed: int, out: Path, recorded: Path | None) -> bool:
    """Whether the run has its record in ``out`` or in the folder of committed records ``recorded``."""
    return any((run_dir(o, dataset, model, seed) / RECORD).exists() for o in (out, recorded) if o)


def all_finished(dataset: str, models: list[str], seeds: list[int], out: Path, recorded: Path | None) -> bool:
    """Whether every run of ``dataset`` with ``models`` and ``seeds`` has finished (``finished``)."""
    return all(finished(dataset, m, s, out, recorded) for m in models for s in seeds)


def train_ensemble(
    datasets: list[str], model: str, seeds: list[int], out: Path, extra: list[str], trainer: Trainer, resume: bool
) -> int:
    """One ``train.py --dataset ... --seeds ...`` into the sweep's layout, logged in the first dataset's
    train.log (the others' logs name the command and where its output went); its exit status."""
    where = group_dir(out, datasets[0], model) if len(datasets) == 1 else out  # several: OUT/DATASET/MODEL/seed_N
    argv = [
        "--dataset",
        *datasets,
        "--model",
        model,
        "--seeds",
        *map(str, seeds),
        "--out",
        str(where),
        *extra,
        *(["--resume"] if resume else []),
    ]
    logs = [group_dir(out, d, model) / "train.log" for d in datasets]
    for i, log_path in enumerate(logs):
        cut = log_path.exists() and log_path.read_bytes()[-1:] not in (b"", b"\n")  # a killed run's last line
        with open(log_path, "a") as log:
            log.write(f"{chr(10) if cut else ''}$ python -m commands.train {' '.join(argv)}\n")
            if i:
                log.write(f"(one ensemble with {datasets[0]}: its output is in {logs[0]})\n")
    with open(logs[0], "a") as log:
        return trainer(argv, log)


def train_options(argv: list[str]) -> tuple[str, dict]:
    """The preset and the Config fields that a train.py command line ``argv`` sets."""
    from dt_primal.config import add_config_args, overrides

    p = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    p.add_argument("--preset", default="paper")
    add_config_args(p)
    known, _ = p.parse_known_args(argv)
    return known.preset, overrides(known)


def ensemble_groups(datasets: list[str], models: list[str], extra: list[str]) -> list[tuple[list[str], str]]:
    """The (datasets, model) groups that train as one ensemble each: per model, the datasets whose models
    share an architecture (``dt_primal.training.ensemble.architecture``; in Table 4 the three datasets of a task,
    except halfcheetah's with Primal.+DT, whose KSVD rank differs per dataset). A dataset whose task
    its name does not tell trains alone."""
    from dt_primal.config import make_config
    from dt_primal.evaluation.checks import env_sizes
    from dt_primal.training.ensemble import architecture
    from envs import find_task

    preset, given = train_options(extra)
    groups: dict[tuple, list[str]] = {}
    for m in models:
        for d in datasets:
            task = find_task(given.get("env") or d)
            cfg = make_config(preset, **{**given, "dataset": d, "model": m})
            key = (m, d) if task is None else (m, architecture(env_sizes(task), task, cfg.resolved(task)))
            groups.setdefault(key, []).append(d)
    return [(ds, key[0]) for key, ds in groups.items()]


def budget_groups(
    datasets: list[str], models: list[str], seeds: list[int], extra: list[str], out: Path, recorded: Path | None
) -> list[Group]:
    """The groups (``ensemble_groups``) that would train the runs of ``datasets`` not finished yet, as a
    time budget estimates them (``commands.sweep.budget``)."""
    from dt_primal.config import make_config
    from envs import find_task

    preset, given = train_options(extra)
    groups = []
    for all_ds, model in ensemble_groups(datasets, models, extra):
        todo = {d: [s for s in seeds if not finished(d, model, s, out, recorded)] for d in all_ds}
        ds = [d for d in all_ds if todo[d]]
        left = sorted({s for d in ds for s in todo[d]})
        if not left:
            continue
        cfg = make_config(preset, **{**given, "dataset": ds[0], "model": model})
        task = find_task(given.get("env") or ds[0])
        # the intermediate evaluations: in line they take training time; beside training on a GPU, what they cost it
        intermediate = (cfg.steps - 1) // max(1, cfg.eval_every)
        overlapped = intermediate if overlapped_on_gpu(cfg) else 0
        during = intermediate - overlapped
        episodes = cfg.eval_episodes + during * cfg.eval_episodes_during
        targets = len(cfg.targets or (task.targets if task else ())) or 1
        limit = (task.time_limit if task else None) or 1000
        per_episode = len(ds) * len(left) * targets * limit  # environment steps of an episode of each run and target
        groups.append(
            Group(
                ds,
                model,
                left,
                step_setting(cfg),
                cfg.steps,
                per_episode * episodes,
                cfg,
                evaluations=during + 1,
                limit=limit,
                overlapped=overlapped,
                overlapped_steps=per_episode * cfg.eval_episodes_during,
                overlapped_every=cfg.eval_every,
            )
        )
    return groups


@functools.cache
def _precision(precision: str, device: str, d_model: int) -> str:
    from dt_primal.machine import resolve_device
    from dt_primal.precision import resolve_precision

    return resolve_precision(precision, resolve_device(device), d_model)[0]


def overlapped_on_gpu(cfg) -> bool:
    """Whether ``cfg``'s intermediate evaluations run beside its training on a GPU, counted as what they cost
    training (``commands.sweep.budget.overlap_cost``; on a CPU they share the cores that train: counted in full)."""
    from dt_primal.machine import resolve_device

    return cfg.eval_overlap and resolve_device(cfg.device).type == "cuda"


def step_setting(cfg) -> Setting:
    """How ``cfg``'s training step runs on its device, as its throughput is measured."""
    from dt_primal.machine import resolve_device
    from dt_primal.training.step import step_mode

    precision = _precision(cfg.precision, cfg.device, cfg.d_model)
    return Setting(cfg.model, cfg.d_model, cfg.n_head, step_mode(cfg, resolve_device(cfg.device)), precision)


def python_path() -> str:
    """``$PYTHONPATH`` with this checkout first: what the trainers' processes import (on every node of a cluster)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def in_subprocess(threads: int, deadline: float | None = None) -> Trainer:
    """The local pool's trainer: ``python -m commands.train`` in a child process with ``threads`` CPU threads, in
    the sweep's folder (relative paths mean what they mean to the sweep), importing this checkout. At
    ``deadline`` (``time.time()``), a command still running is sent SIGTERM: it checkpoints and exits 143."""

    def trainer(argv: list[str], log: TextIO) -> int:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": python_path()}
        proc = subprocess.Popen([*COMMAND, *argv], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            return proc.wait(None if deadline is None else max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.terminate()
            return proc.wait()

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


def run_groups_locally(groups: list[tuple[list[str], str]], args, extra: list[str], deadline: float | None = None):
    """Yield ``run_group``'s result for each group, ``--jobs`` groups at once, each in a child process
    (stopped at ``deadline``, ``in_subprocess``)."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    trainer = in_subprocess(threads, deadline)
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_group, d, m, args.seeds, args.out, extra, trainer, args.recorded) for d, m in groups]
        for f in futures:
            yield f.result()
