"""The evaluation command as a function, ``evaluate_command(argv)``: what ``evaluate.py`` and the installed
``dt-primal-evaluate`` (``dt_primal.cli.console``) run."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from dt_primal.cli import command_parser
from dt_primal.config import Config, add_config_args, overrides
from dt_primal.errors import UserError, phase
from dt_primal.evaluation import video
from dt_primal.evaluation.checks import check_evaluate_args, check_evaluate_run
from dt_primal.evaluation.onnx_policy import onnx_run
from dt_primal.evaluation.reports import across_text, markdown, run_record, scoring, target_text, write_report
from dt_primal.evaluation.rollout import Recorder, evaluation_seeds, rollout
from dt_primal.files.checkpoint import load_checkpoint
from dt_primal.machine import resolve_device
from dt_primal.model.architecture import conditions_on_return, evaluation_targets
from dt_primal.precision import acting_precision
from dt_primal.provenance import provenance
from envs import Task

DESCRIPTION = """Evaluate one or more checkpoints (e.g. one per seed) with batched rollouts and write a JSON
report and a Markdown table (per checkpoint and target, then the mean across checkpoints with its
95 % interval). A policy exported to ONNX (``python -m dt_primal.cli.export``) evaluates like its
checkpoint, on onnxruntime.

  python evaluate.py runs/hopper/seed_*/last.pt --episodes 100 --out runs/hopper/eval100.json
  python evaluate.py runs/hopper/policy.onnx --episodes 100 --out runs/hopper/eval-onnx.json
"""


def run_names(paths: list[Path]) -> list[str]:
    """How video files name the run of each checkpoint: its folder for ``last.pt`` (``runs/hopper/seed_0``),
    else its path without the suffix; numbered where two are the same."""
    names = [str(p.parent if p.name == "last.pt" else p.with_suffix("")) for p in paths]
    return names if len(set(names)) == len(names) else [f"{n}-{i}" for i, n in enumerate(names)]


def resolved_precision(given: str | None, cfg: dict, model_config: dict, device, done: dict) -> str:
    """``--precision`` for checkpoints of run config ``cfg``, printed the first time (``acting_precision``)."""
    key = (given, cfg["precision"], model_config["d_model"])
    if key not in done:
        done[key], why = acting_precision(given, cfg["precision"], device, model_config["d_model"])
        print(f"precision: {done[key]} ({why})")
    return done[key]


def policy_of(ckpts: list[dict], given: str | None, device, done: dict):
    """One policy of ``ckpts`` (one architecture): an exported .onnx one on onnxruntime (fp32), loaded with
    its record (``onnx_run``), else the checkpoints' as one ensemble at the precision ``resolved_precision``
    gives."""
    from dt_primal.evaluation.policy import policy_from_checkpoints

    if "onnx" in ckpts[0]:
        return ckpts[0]["onnx"]
    precision = resolved_precision(given, ckpts[0]["config"], ckpts[0]["model_config"], device, done)
    return policy_from_checkpoints(ckpts, device, precision)


def parser() -> argparse.ArgumentParser:
    p = command_parser(DESCRIPTION)
    p.add_argument("checkpoints", nargs="+", type=Path)
    p.add_argument("--episodes", type=int, default=100, help="episodes per target (default 100)")
    p.add_argument("--out", type=Path, required=True, help="JSON report; the Markdown table goes beside it")
    p.add_argument(
        "--env-workers",
        type=int,
        default=None,
        help="worker processes stepping the environments (default: none on a CPU, one per core beside a "
        "GPU; with 2 or more, two halves of the episodes, each with that many, are pipelined: one steps while the "
        'other acts; docs/gpu.md, docs/benchmarks.md "Evaluation speed")',
    )
    p.add_argument(
        "--video",
        type=Path,
        default=None,
        metavar="DIR",
        help="also render the first episode of every checkpoint and target (--video-episodes N: the first N), "
        'replayed from the evaluation, into DIR as MP4 and PNG strip (needs pip install "dt-primal[video]")',
    )
    p.add_argument("--video-episodes", type=int, default=1, help="episodes per target rendered with --video")
    p.add_argument(
        "--side-by-side",
        action="store_true",
        help="with --video and several checkpoints: also one clip per target of their episodes side by side",
    )
    add_config_args(p, only=("device", "targets", "seed", "precision", "ref_min", "ref_max"))
    return p


def evaluate_command(argv: list[str]) -> tuple[dict, Task]:
    """``evaluate.py argv``: load and check the checkpoints (or exported policies), evaluate each group of one
    architecture as one ensemble, write the report and print it; the report and the task it scored on. Bad input
    raises UserError; run it under ``dt_primal.cli.run_main`` for the command line's messages and exit statuses."""
    args = parser().parse_args(argv)
    check_evaluate_args(args)
    given = overrides(args)
    refs = Config(ref_min=given.get("ref_min"), ref_max=given.get("ref_max")).validate().ref_scores
    device = resolve_device(given.get("device", "auto"))
    ckpts = [onnx_run(path) if path.suffix == ".onnx" else load_checkpoint(path) for path in args.checkpoints]
    check_evaluate_run(args, ckpts)
    tasks = [Task.from_record(c["task"]) for c in ckpts]
    if refs is not None:
        tasks = [dataclasses.replace(t, ref_min=refs[0], ref_max=refs[1]) for t in tasks]
    if len({dataclasses.replace(t, targets=()) for t in tasks}) > 1:
        names = sorted({f"{t.gym_id} (reference returns {t.ref_min}, {t.ref_max})" for t in tasks})
        raise UserError(
            f"The checkpoints come from different tasks or reference scores ({', '.join(names)}); evaluate "
            f"each task separately, or give --ref-min and --ref-max."
        )
    task = tasks[0]
    groups: dict[tuple, list[int]] = {}
    for i, ckpt in enumerate(ckpts):
        cfg = ckpt["config"]
        targets = tuple(evaluation_targets(cfg["model"], given.get("targets") or cfg["targets"] or tasks[i].targets))
        # checkpoints of one architecture and reward scale run as one ensemble (one batched forward pass for all)
        one = ckpt.get("onnx")  # an exported policy acts alone
        groups.setdefault((targets, tuple(ckpt["model_config"].items()), cfg["reward_scale"], one), []).append(i)
    models = [c["config"]["model"] for c in ckpts]
    print(scoring(task, given.get("targets"), next((m for m in models if conditions_on_return(m)), models[0])))
    made = provenance(device)
    results, precisions, filmed = [None] * len(ckpts), {}, []
    chosen = video.renderer(task) if args.video else None
    runs = run_names(args.checkpoints)
    for (targets, *_), members in groups.items():
        cfgs = [ckpts[i]["config"] for i in members]
        for i, cfg in zip(members, cfgs):
            print(
                f"{args.checkpoints[i]}: {cfg['model']} on {ckpts[i]['dataset']} (step {ckpts[i]['step']}), "
                f"{args.episodes} episodes x {len(targets)} target{'s' if len(targets) > 1 else ''}"
            )
        policy = policy_of([ckpts[i] for i in members], given.get("precision"), device, precisions)
        precision = policy.precision
        seed = given.get("seed")
        recorder = Recorder(args.video_episodes) if chosen else None
        with phase("evaluate.py"):
            per_member = rollout(
                policy,
                task,
                list(targets),
                args.episodes,
                env_workers=args.env_workers,
                progress=True,
                seeds=evaluation_seeds([cfg["seed"] if seed is None else seed for cfg in cfgs]),
                recorder=recorder,
            )
        if recorder is not None:
            named = [runs[i] for i in members]
            filmed += video.render(task, recorder.recorded(), per_member, named, args.video, chosen)
        for i, cfg, reports in zip(members, cfgs, per_member):
            results[i] = run_record(
                str(args.checkpoints[i]),
                ckpts[i]["step"],
                task.gym_id,
                ckpts[i]["dataset"],
                cfg,
                reports,
                made,
                precision=precision,
            )
    if args.side_by_side and filmed:
        video.side_by_side(filmed, args.video)
    summary = write_report(results, args.out)
    print(markdown(summary))
    for r in summary["across_checkpoints"]:
        print(f"target {target_text(r['target'])}: normalised score {across_text(r)}")
    return summary, task
