"""An intermediate evaluation beside training, as the training loop runs it: the evaluation's seconds alone,
and beside the training step of the same members replaying, with training held to ``RUN_AHEAD`` updates queued
on the device (``OverlappedEvaluation.pace``) and without that limit; and training's updates/s meanwhile
against its updates/s alone.

  python -m bench.eval_overlap --device cuda --json overlap.json    # 9 members, 180 episodes of 200 steps
  python -m bench.eval_overlap --quick                              # smoke check on a CPU, < 1 min

The pieces are the product's: ``TrainStep`` (``fresh_step``; captured, paper size, bf16 on CUDA; options after
``--`` as train.py's, e.g. ``-- --compile --attention-kernel math``), ``OverlappedEvaluation`` and ``rollout``
(Hopper-v5 with ``terminate_when_unhealthy=False``: every episode runs ``--steps`` steps). Training runs on
Hopper-shaped random data, and waits on the device every ``log_every`` updates as the loop's log does. On a
CPU the evaluation and training share the cores, and pacing does nothing.
"""

from __future__ import annotations

import json
import time

import bench.common as common  # sets OMP_WAIT_POLICY before torch loads

import torch

from bench.step_variants import setting_parser, variant_config
from datasets.loaders import load_dataset
from dt_primal.cli import split_train_options
from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.rollout import rollout
from dt_primal.training.overlapped_eval import RUN_AHEAD, OverlappedEvaluation
from dt_primal.training.step import WARMUP_CALLS
from dt_primal.training.throughput import fresh_step, time_updates
from envs import TASKS

MODES = {"alone": None, "overlapped": None, "overlapped, paced": RUN_AHEAD}


def setting(args, options: list[str]):
    """The training step of ``args.members`` members with train.py's ``options`` (captured; its first updates run
    here) and the copy that evaluates beside it."""
    device = torch.device(args.device)
    cfg = variant_config(options, args.device, args.quick)
    data = load_dataset(str(common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")), env="hopper")
    step = fresh_step(cfg, data, range(args.members), device)
    for _ in range(WARMUP_CALLS + 1):
        step()
    mean, std = data.state_stats()

    def act_with(copy, **options):
        return Policy(copy, mean, std, cfg.reward_scale, cfg.context, cfg.precision, **options)

    return cfg, step, OverlappedEvaluation(step.model, act_with, device, cfg.attention_kernel)


def evaluation(args):
    """What the loop's evaluation runs on a policy: the episodes of every member, and their seconds."""
    task = common.task_with(TASKS["hopper"], terminate_when_unhealthy=False, max_episode_steps=args.steps)

    def evaluate(policy):
        t0 = time.perf_counter()
        rollout(policy, task, [3600.0], args.episodes // args.members, pipeline=False)  # as periodic ones run
        return [], time.perf_counter() - t0

    return evaluate


def measure_mode(mode: str, cfg, step, overlapped: OverlappedEvaluation, evaluate) -> dict:
    """One evaluation ``mode``: its seconds, and training's updates/s meanwhile (None alone)."""
    overlapped.run_ahead = MODES[mode]
    overlapped.start(step.model, 0, evaluate)
    updates, t0 = 0, time.perf_counter()
    while mode != "alone" and overlapped.thread.is_alive():
        step()
        overlapped.pace()
        updates += 1
        if updates % cfg.log_every == 0:
            step.sums.cpu()  # the loop's log: its one wait on the device
    if step.step.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    _, _, seconds = overlapped.collect()
    return {"mode": mode, "evaluation_s": seconds, "updates_per_s": updates / elapsed if updates else None}


def main() -> None:
    p = setting_parser(__doc__)
    p.add_argument("--episodes", type=int, default=180, help="episodes of all members at once")
    p.add_argument("--steps", type=int, default=200, help="steps of every episode")
    common.add_json_options(p)
    p.add_argument("--quick", action="store_true", help="smoke check: DT-paper size, 2 members, 4 episodes")
    own, options = split_train_options()
    args = p.parse_args(own)
    if args.quick:
        args.members, args.episodes, args.steps = 2, 4, 30
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
    else:
        cfg, step, overlapped = setting(args, options)
        evaluate = evaluation(args)
        alone = time_updates(step, 0, 20 if args.quick else 200)["updates_per_s"]
        measure = lambda mode: measure_mode(mode, cfg, step, overlapped, evaluate)
        records = [dict(measure(mode), alone_updates_per_s=alone) for mode in MODES]
        for r in records:
            print(json.dumps(r), flush=True)
        size = "the DT paper's size" if args.quick else "the paper's size"
        doc = dict(members=args.members, size=size, episodes=args.episodes, steps=args.steps, options=options)
        doc |= {"records": records, "run_ahead": RUN_AHEAD, "device": args.device, "info": common.run_info()}
        if args.json:
            args.json.write_text(json.dumps(doc, indent=1))
    section(doc, args.quick)


def section(doc: dict, quick: bool) -> None:
    """The measurements as the section of docs/benchmarks.md for their device (their GPU's name on CUDA)."""
    rows = [
        [
            r["mode"],
            f"{r['evaluation_s']:.1f}",
            "–" if r["updates_per_s"] is None else f"{r['updates_per_s']:.1f}",
            f"{r['alone_updates_per_s']:.1f}",
        ]
        for r in doc["records"]
    ]
    header = ["evaluation", "its seconds", "training's updates/s meanwhile", "training's updates/s alone"]
    body = "\n".join(
        [
            f"`--device {doc['device']}`, {doc['members']} members of Primal.+DT at {doc['size']} "
            f"(options: {' '.join(doc['options']) or 'none'}), an evaluation of {doc['episodes']} Hopper-v5 "
            f"episodes of {doc['steps']} steps; paced: training holds at most {doc['run_ahead']} updates queued on "
            "the device while the evaluation runs.",
            "",
            common.md_table(header, rows),
        ]
    )
    common.write_measured_section("eval_overlap", "Evaluation overlapping training", body, quick, doc)


if __name__ == "__main__":
    main()
