"""``python -m commands.sweep``: a grid of (dataset × model × seed) training runs. Per model, the
datasets whose models share an architecture and their seeds train in one process as one ensemble
(``train.py --dataset ... --seeds ...``, through ``commands.train.train_command``; Table 4 is six
ensembles, docs/ensembles.md), several groups at once: a local process pool (``--jobs``, e.g.
sharing one GPU), or one Ray task per group on a Ray cluster (``--backend ray``); finished runs are
skipped and interrupted ones resumed (several sweeps may share one folder: a group that one of them
is training is locked). Then one aggregated table (Markdown, CSV), a bar chart and learning curves.
Scores are those of the **last** checkpoint of each run, beside each seed's mean of its last three
evaluations.

Two DT baselines: this folder's ``dt`` runs share Primal.+DT's settings ("DT (matched settings)");
the DT paper's own ("DT (DT paper's settings)", the paper's Table 4 row) is a sweep of its own with
``--models dt -- --preset dt-paper``, whose folder ``--baseline`` adds to the tables.

  python -m commands.sweep --datasets dt-primal/hopper/medium-replay-v2 --models dt primal \\
      --seeds 0 1 2 --jobs 2 --out runs/sweep -- --preset quick --steps 5000
  python -m commands.sweep --datasets table4 --jobs 6 --out runs/table4   # the paper's Table 4, 54 runs in 6 ensembles
  # only the rows not committed:
  python -m commands.sweep --datasets table4 --jobs 6 --recorded results/table4 --out runs/table4
  python -m commands.sweep --datasets table4 --models dt --jobs 3 --out runs/table4-dt-paper -- --preset dt-paper
  # on a machine held for 11 minutes: only what is expected to finish in them (docs/sweeps.md)
  python -m commands.sweep --datasets table4 --recorded results/table4 --out runs/table4 --time-budget 11m \\
      -- --device cuda --compile
  python -m commands.sweep --datasets table4 --out runs/table4 --baseline runs/table4-dt-paper --aggregate-only
  python -m commands.sweep --datasets table4 --backend ray --ray-address auto --gpus-per-task 0.25 --out /shared/table4
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from commands.sweep.budget import choose, estimate, load_throughput, measure, parse_duration
from commands.sweep.clips import film
from commands.sweep.grid import (
    BUSY,
    TABLE4,
    TABLE4_BY_GAIN,
    all_finished,
    budget_groups,
    ensemble_groups,
    run_groups_locally,
    train_options,
)
from commands.sweep.plots import plot_bars, plot_curves, plot_intervals
from commands.sweep.ray_cluster import run_groups_on_ray
from commands.sweep.results import DT_PAPER, collect
from commands.sweep.tables import write_tables
from datasets.suite import SUITE_NAMESPACE, buildable, is_built
from dt_primal.cli import command_parser, split_train_options
from dt_primal.errors import UserError
from dt_primal.model.architecture import MODELS


def parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__, prog="python -m commands.sweep")
    p.add_argument(
        "--datasets",
        nargs="+",
        required=True,
        help="dataset ids or files; 'table4' stands for the nine datasets of the paper's Table 4 (those this "
        "tree can build: a medium-expert whose expert is not trained yet is left out, named)",
    )
    p.add_argument("--models", nargs="+", default=["dt", "primal"], choices=MODELS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: a pool of --jobs child processes on this machine (default); ray: one Ray task per "
        "(dataset, model) group, on a Ray cluster (pip install -r requirements-ray.txt)",
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="local: ensembles (groups of datasets of one model) trained at once"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="local: CPU threads per run (default: the cores divided by --jobs)"
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="ray: the cluster, 'auto' (the one this machine belongs to) or HOST:PORT; default: a local "
        "Ray instance on this machine",
    )
    p.add_argument(
        "--gpus-per-task",
        type=float,
        default=None,
        help="ray: GPUs per group, a fraction shares one (0.25: four groups per GPU); default: 1 when the "
        "cluster has GPUs, else 0",
    )
    p.add_argument("--cpus-per-task", type=float, default=1, help="ray: CPUs per group, also its training threads")
    p.add_argument("--out", type=Path, default=Path("runs/sweep"))
    add_budget_options(p)
    add_report_options(p)
    return p


def add_budget_options(p) -> None:
    """What is trained of the grid: runs committed before, and a time budget with what it plans with."""
    p.add_argument(
        "--recorded",
        type=Path,
        default=None,
        help="a folder of committed records in the same layout (results/table4): runs with an eval.json "
        "there count as finished and are not trained again; new runs still go to --out",
    )
    p.add_argument(
        "--time-budget",
        default=None,
        help="e.g. 600, 90s, 11m, 1.5h: start only the groups expected to finish (final evaluation included) "
        "within it, all at once, taking the datasets in the order given ('table4': the paper's largest claimed "
        "gains first); say which are left out and why; stop what still runs when it ends (docs/sweeps.md)",
    )
    p.add_argument(
        "--throughput",
        type=Path,
        default=None,
        help="--time-budget: a file of throughput measurements (bench/ensemble_speed.py --json, or the "
        "throughput.json a budgeted sweep writes in --out) instead of measuring in the sweep's first seconds",
    )
    p.add_argument(
        "--building",
        nargs="+",
        default=[],
        metavar="DATASET",
        help="--time-budget: suite datasets another process is building now (python -m datasets build): planned "
        "as if built, their groups waiting for the build, where otherwise a dataset not built is left out",
    )
    p.add_argument(
        "--build-wait",
        default="0s",
        metavar="DURATION",
        help="--building: how long those builds may still take; a group that needs one is planned to start "
        "after it (the budget still stops the sweep at its end)",
    )


def add_report_options(p) -> None:
    """The tables, plots and videos made from the finished runs."""
    p.add_argument("--aggregate-only", action="store_true", help="only rebuild the tables and plots")
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a sweep folder of the DT paper's baseline (--models dt -- --preset dt-paper ...): its runs join "
        'the tables as "DT (DT paper\'s settings)" beside this folder\'s "DT (matched settings)"',
    )
    p.add_argument("--report-dir", type=Path, default=None, help="where the tables and plots go (default --out)")
    p.add_argument(
        "--video",
        action="store_true",
        help="also film each dataset and model's best and worst seed, one episode per target, side by side, into "
        'REPORT/videos (evaluate.py --video; needs pip install "dt-primal[video]")',
    )


def budgeted_groups(priority: list[str], args, extra: list[str], budget_s: float) -> list[tuple[list[str], str]]:
    """The groups of ``priority``'s datasets and ``--models`` that fit ``budget_s``
    (``commands.sweep.budget.choose``), the choice and what is left out printed; the throughput
    measured here is kept in OUT/throughput.json."""

    wait = parse_duration(args.build_wait, "--build-wait", zero=True)

    def plan(pairs: list[tuple[str, str]]):
        return [
            dataclasses.replace(g, wait_s=wait if set(g.datasets) & set(args.building) else 0.0)
            for m in args.models
            for g in budget_groups([d for d, dm in pairs if dm == m], [m], args.seeds, extra, args.out, args.recorded)
        ]

    # --building: datasets another process builds now count as built (their groups wait for its build lock); one
    # whose runs have all finished is not named
    unbuilt = [
        d
        for d in priority
        if d.startswith(SUITE_NAMESPACE + "/")
        and not (is_built(d) or d in args.building)
        and not all_finished(d, args.models, args.seeds, args.out, args.recorded)
    ]
    pairs = [(d, m) for d in priority if d not in unbuilt for m in args.models]
    if args.throughput:
        tp = load_throughput(args.throughput)
    else:
        from datasets.loaders import load_dataset
        from dt_primal.machine import resolve_device

        given = train_options(extra)[1]
        device = resolve_device(given.get("device", "auto"))
        # every planned dataset is built or being built (--building: then this waits for it)
        tp = measure(plan(pairs), lambda d: load_dataset(d, env=given.get("env")), str(device))
        tp.save(args.out / "throughput.json", {"device": str(device)})
    chosen, left = choose(pairs, plan, tp, budget_s)
    for g in chosen:
        print(f"starting {' + '.join(g.datasets)} ({g.model}): {g.members} members, seeds {g.seeds}", flush=True)
    print(f"estimated: {estimate(chosen, tp) / 60:.1f} min of the {budget_s / 60:.1f} min left", flush=True)
    for d in unbuilt:
        print(f"left out: {d} (not built yet: python -m datasets build first; the estimate has no build time)")
    for (d, m), why in left:
        print(f"left out: {d} ({m}): {why}", flush=True)
    return [(g.datasets, g.model) for g in chosen]


def main(argv: list[str] | None = None) -> None:
    own, extra = split_train_options(argv)
    p = parser()
    args = p.parse_args(own)
    for name in ("jobs", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1 (got {getattr(args, name)}).")
    if args.cpus_per_task <= 0 or (args.gpus_per_task is not None and args.gpus_per_task < 0):
        raise UserError("--cpus-per-task must be positive and --gpus-per-task at least 0.")
    budget = parse_duration(args.time_budget) if args.time_budget else None
    if budget and args.backend != "local":
        raise UserError("--time-budget runs the groups on this machine: leave --backend at local.")
    if budget and args.aggregate_only:
        raise UserError("--time-budget starts training; it does nothing with --aggregate-only.")
    t0, deadline = time.time(), None if budget is None else time.time() + budget
    priority = [d for spec in args.datasets for d in (TABLE4_BY_GAIN if spec == "table4" else [spec])]
    if "table4" in args.datasets:  # rows whose expert is not trained yet wait, named, unless only aggregating
        table4 = TABLE4 if args.aggregate_only else buildable(TABLE4)
        args.datasets = [d for spec in args.datasets for d in (table4 if spec == "table4" else [spec])]
        priority = [d for d in priority if d in args.datasets]
    args.out.mkdir(parents=True, exist_ok=True)
    groups = ensemble_groups(args.datasets, args.models, extra)
    if budget:
        groups = budgeted_groups(priority, args, extra, budget - (time.time() - t0))
        args.jobs = max(args.jobs, len(groups))  # all at once, as the estimate has them
    if not args.aggregate_only:
        failed = []
        results = (
            run_groups_on_ray(groups, args, extra)
            if args.backend == "ray"
            else run_groups_locally(groups, args, extra, deadline)
        )
        for i, (gd, trained, rc) in enumerate(results, 1):
            seeds = f"seeds {' '.join(map(str, trained))}" if trained else "all seeds"
            failure = rc if isinstance(rc, str) else f"exit {rc}"  # a string: why Ray gave up on the group
            stopped = deadline is not None and time.time() >= deadline and rc in (143, -15)
            status = {
                0: f"done ({seeds})" if trained else "done before",
                BUSY: "left to the sweep that is training it",
            }.get(
                rc,
                "stopped at the time budget (the same command resumes it)"
                if stopped
                else f"FAILED ({failure}, see train.log there)",
            )
            print(f"[{i}/{len(groups)}] {gd} {status} ({(time.time() - t0) / 60:.1f} min)", flush=True)
            if rc not in (0, BUSY) and not stopped:
                failed.append(gd)
        if failed:
            print(f"{len(failed)} groups failed; fix and run the same command again (finished runs are skipped).")
    rows = collect(args.out, args.datasets, args.models, args.seeds)
    if args.baseline:  # the DT-paper runs of another sweep folder, beside this one's rows
        extra = collect(args.baseline, args.datasets, ["dt"], args.seeds, label=DT_PAPER, name="dt (dt-paper)")
        rows = [r for d in args.datasets for r in rows + extra if r["dataset"] == d]
    if not rows:
        sys.exit("no finished run to aggregate yet")
    report = args.report_dir or args.out
    report.mkdir(parents=True, exist_ok=True)
    print(write_tables(rows, report))
    plot_bars(rows, report)
    plot_curves(args.out, rows, report)
    drew = plot_intervals(rows, report)
    print(f"wrote {report}/results.md, results.csv, results.png, curves.png{', intervals.png' * drew}")
    if args.video:
        print(f"wrote the clips of {len(film(rows, report / 'videos'))} datasets and models into {report}/videos")
