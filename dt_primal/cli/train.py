"""The training command as a function, ``train_command(argv, load_dataset)``: what ``train.py``, the
installed ``dt-primal-train`` (``dt_primal.cli.console``) and a sweep's workers run. The installed command reads
the standard formats (``dt_primal.files.loaders``); a checkout passes ``datasets.loaders.load_dataset``, which
also builds its offline suite's datasets."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from dt_primal.cli import command_parser
from dt_primal.config import PRESETS, Config, add_config_args, make_config, overrides
from dt_primal.data import Trajectories
from dt_primal.errors import UserError
from dt_primal.evaluation.reports import across_text, normalized_text, scoring, target_text, write_report
from dt_primal.evaluation.video import check_folder
from dt_primal.files.checkpoint import load_checkpoint
from dt_primal.files.run_folder import CHECKPOINT, hold_run_folder, member_folders
from dt_primal.training.checks import check_run_inputs
from dt_primal.training.distributed import Interrupted, distributed
from dt_primal.training.loop import train
from dt_primal.training.resume import record_dataset

# load_dataset(spec, env, download, *, build, ref_scores) -> Trajectories: where the data comes from
# (dt_primal.files.loaders.load_dataset, or a checkout's datasets.loaders.load_dataset; a test may pass another)
Loader = Callable[..., Trajectories]

DESCRIPTION = """Train a Decision Transformer (dt), Primal.+DT (primal, default) or PrimalFormer on an offline
dataset, evaluate it, and write DIR/last.pt, DIR/eval.json and TensorBoard events.

  python train.py --preset quick                       # a checkout: minutes on a CPU, on its offline suite
  python train.py --dataset dt-primal/hopper/medium-replay-v2 --model primal --seeds 0 1 2 --out runs/hmr
  python train.py --seeds 0 1 2 --out runs/hmr --resume  # after Ctrl-C (exit 130) or SIGTERM (exit 143)
  python train.py --dataset dt-primal/hopper/medium-v0 dt-primal/hopper/medium-replay-v2 --seeds 0 1 2 --out runs/h
  dt-primal-train --dataset mujoco/hopper/medium-v0 --download --out runs/hm   # installed: the same options
  (--seeds, and several --dataset of one task, train in one process as one ensemble, each member as it
  would train alone; several datasets write OUT/DATASET/MODEL/seed_N: docs/ensembles.md)
  torchrun --nproc_per_node 4 --standalone train.py ...  # data-parallel on 4 GPUs (docs/sweeps.md)
"""


def parser() -> argparse.ArgumentParser:
    p = command_parser(DESCRIPTION)
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="paper",
        help="paper: the Primal.+DT paper's settings (default); quick: d_model 128, 2000 steps, 10 final "
        "episodes per target (minutes on a CPU); dt-paper: the original DT paper's baseline (--model dt, "
        "d_model 128, 1 head, lr 1e-4; the rest as paper). Options given on the command line override "
        "the preset",
    )
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help="train these seeds at once, as one ensemble, into OUT/seed_N and write OUT/report.json",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/last.pt where a run stopped, with its settings (--steps and the evaluation "
        "and checkpoint options may be changed)",
    )
    p.add_argument(
        "--rescale-actions",
        action="store_true",
        help="scale dataset actions that lie outside the task's action space into its bounds (else refused)",
    )
    p.add_argument(
        "--video",
        type=Path,
        default=None,
        metavar="DIR",
        help="render the final evaluation's first episode of every seed and target into DIR, as MP4 and PNG "
        'strip (as evaluate.py --video; needs pip install "dt-primal[video]")',
    )
    add_config_args(p)
    return p


def train_command(argv: list[str], load_dataset: Loader) -> None:
    """``train.py argv``: parse, check, hold the run folder, load the data with ``load_dataset``, train,
    evaluate and print the results. Bad input raises UserError; a SIGINT/SIGTERM that stopped training
    exits with 128 + the signal (SystemExit). Run it under ``dt_primal.cli.run_main`` for the messages
    and exit statuses of the command line."""
    args = parser().parse_args(argv)
    check_folder(args.video)
    given = overrides(args)
    if args.seeds and "seed" in given:
        raise UserError(
            f"--seed {given['seed']} and --seeds {' '.join(map(str, args.seeds))} were both given: --seeds "
            f"trains each of its seeds as --seed N alone would; leave out --seed."
        )
    cfg = make_config(args.preset, **given)
    specs = list(dict.fromkeys(args.dataset)) if args.dataset else None  # else the checkpoint's, or the default
    seeds = args.seeds or ([cfg.seed] if specs and len(specs) > 1 else None)
    first = member_folders(Path(cfg.out), seeds, specs, cfg.model)[0] / CHECKPOINT
    if args.resume and first.exists():  # the checkpoint's settings, except those given now; checked whole first,
        # so that a damaged checkpoint is refused before the dataset it names is read
        run = Config.from_record(load_checkpoint(first, resume=True)["config"])
        if specs and len(specs) > 1:  # fields resolved for the first member's dataset: each member resolves its own
            run = run.unresolved()
        cfg = dataclasses.replace(run, **{**given, "out": cfg.out}).validate()
    specs = specs or [cfg.dataset]
    with (
        distributed(cfg.device) as (rank, world),
        hold_run_folder(cfg.out, seeds, rank == 0, specs, cfg.model) as folder,
    ):
        datas = {}
        for spec in specs:
            data = datas[spec] = load_dataset(spec, cfg.env, cfg.download, build=world == 1, ref_scores=cfg.ref_scores)
            if rank == 0:
                print(scoring(data.task, cfg.targets, cfg.model))
            check_run_inputs(
                data,
                dataclasses.replace(cfg, dataset=spec),
                seeds,
                rescale_actions=args.rescale_actions,
                notes=rank == 0,
            )
        record_dataset(folder, list(datas.values()), resume=args.resume)
        try:
            results = train(cfg, datas, resume=args.resume, seeds=seeds, video=args.video)
        except Interrupted as exc:
            print(f"\n{exc}", file=sys.stderr)
            sys.exit(128 + exc.signum)
        if rank != 0:  # only rank 0 evaluates and reports
            return
        for result in results:
            for r in result["targets"]:
                print(
                    f"seed {result['seed']} target {target_text(r['target'])}: return {r['return_mean']:.1f} ± "
                    f"{r['return_std']:.1f}, "
                    f"normalised score {normalized_text(r)} ({r['episodes']} episodes)"
                )
        if args.seeds:
            for k, (spec, out) in enumerate(zip(specs, folder.datasets)):  # the members come dataset by dataset
                summary = write_report(results[k * len(seeds) : (k + 1) * len(seeds)], out / "report.json")
                for r in summary["across_checkpoints"]:
                    print(
                        f"{'' if len(specs) == 1 else spec + ' '}target {target_text(r['target'])}: normalised score "
                        f"{across_text(r)} across {len(seeds)} seeds"
                    )
                print(f"report: {out / 'report.md'}")
