"""``python -m datasets``: the offline dataset suite (train behaviour policies, build, stats)."""
from __future__ import annotations

import argparse
from pathlib import Path

from envs import TASKS


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m datasets", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train-policy", help="train (or resume) the behaviour learner of one task")
    t.add_argument("--env", choices=list(TASKS), required=True)
    t.add_argument("--steps", type=int, default=1_000_000)
    t.add_argument("--eval-every", type=int, default=20_000)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--work-dir", type=Path, default=None, help="checkpoints (default runs/behaviour/<env>)")
    args = p.parse_args(argv)
    if args.cmd == "train-policy":
        from datasets.behaviour import train_behaviour
        train_behaviour(TASKS[args.env], args.work_dir or Path("runs/behaviour") / args.env,
                        total_steps=args.steps, eval_every=args.eval_every, seed=args.seed)


if __name__ == "__main__":
    main()
