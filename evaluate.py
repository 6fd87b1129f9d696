"""Evaluate one or more checkpoints (e.g. one per seed) with batched rollouts and write a JSON
report and a Markdown table (per checkpoint and target, then mean ± std across checkpoints).

  python evaluate.py runs/hopper/seed_*/last.pt --episodes 100 --out runs/hopper/eval100.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dt_primal.cli import run_main, write_report
from dt_primal.config import add_config_args, overrides
from dt_primal.errors import UserError
from dt_primal.evaluation import rollout
from dt_primal.training import load_checkpoint, model_from_checkpoint, resolve_device
from envs import get_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=Path)
    p.add_argument("--episodes", type=int, default=100, help="episodes per target (default 100)")
    p.add_argument("--out", type=Path, required=True, help="JSON report; the Markdown table goes beside it")
    p.add_argument("--async-envs", action="store_true",
                   help="step the environments in worker processes, one per episode (pays only with many cores "
                        "and slow environments; docs/benchmarks.md, \"Evaluation speed\")")
    add_config_args(p, only=("device", "targets", "seed", "precision"))
    args = p.parse_args()
    if args.episodes < 1:
        raise UserError(f"--episodes must be at least 1 (got {args.episodes}).")
    given = overrides(args)
    device = resolve_device(given.get("device", "auto"))
    results, tasks = [], set()
    for path in args.checkpoints:
        ckpt = load_checkpoint(path, device)
        model, cfg = model_from_checkpoint(ckpt, device)
        task = get_task(ckpt["task"])
        tasks.add(task.name)
        targets = given.get("targets") or cfg.targets or list(task.targets)
        print(f"{path}: {cfg.model} on {ckpt['dataset']} (step {ckpt['step']}), {args.episodes} episodes x {len(targets)} targets")
        reports = rollout(model, task, targets, args.episodes, ckpt["state_mean"], ckpt["state_std"], cfg.reward_scale,
                          cfg.context, device, seed=given.get("seed", cfg.seed) + 100_000,
                          precision=given.get("precision", cfg.precision), asynchronous=args.async_envs, progress=True)
        results.append({"checkpoint": str(path), "model": cfg.model, "dataset": ckpt["dataset"], "step": ckpt["step"],
                        "task": task.gym_id, "seed": cfg.seed, "targets": reports})
    if len(tasks) > 1:
        raise UserError(f"The checkpoints come from different tasks ({', '.join(sorted(tasks))}); evaluate each task separately.")
    summary = write_report(results, args.out)
    print(args.out.with_suffix(".md").read_text())
    for r in summary["across_checkpoints"]:
        print(f"target {r['target']:g}: normalised score {r['normalized_mean']:.1f} ± {r['normalized_std']:.1f}")


if __name__ == "__main__":
    run_main(main)
