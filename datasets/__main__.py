"""``python -m datasets``: the offline dataset suite (train behaviour policies, build, stats)."""
from __future__ import annotations

from dt_primal.process import configure_process

if __name__ == "__main__":
    configure_process()  # a command: its process-wide settings, before torch loads

import argparse
from pathlib import Path

from datasets.suite import FULL_STEPS, LEVELS, build
from dt_primal.cli import run_main
from envs import TASKS


def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m datasets", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train-policy", allow_abbrev=False, help="train (or resume) the behaviour learner of one task")
    t.add_argument("--env", choices=list(TASKS), required=True)
    t.add_argument("--steps", type=int, default=1_000_000)
    t.add_argument("--eval-every", type=int, default=20_000)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--work-dir", type=Path, default=None, help="checkpoints (default runs/behaviour/<env>)")
    b = sub.add_parser("build", allow_abbrev=False,
                       help="build suite datasets dt-primal/<env>/<level>-v0 as Minari datasets")
    b.add_argument("--env", choices=[*TASKS, "all"], required=True)
    b.add_argument("--level", choices=[*LEVELS, "all"], required=True)
    b.add_argument("--steps", type=int, default=FULL_STEPS, help="transitions per level (default 1M; scale down for quick builds)")
    b.add_argument("--seed", type=int, default=0, help="rollout seed")
    s = sub.add_parser("stats", allow_abbrev=False,
                       help="print and write docs/datasets.md: the built datasets and the behaviour policies")
    s.add_argument("--out", type=Path, default=Path("docs/datasets.md"))
    s.add_argument("--episodes", type=int, default=100, help="episodes to measure each behaviour policy")
    s.add_argument("--datasets", nargs="+", default=[],
                   help="also these Minari datasets in $MINARI_DATASETS_PATH, of any task (normalised: – where the task "
                        "has no reference scores)")
    args = p.parse_args(argv)
    if args.cmd == "build":
        for env in TASKS if args.env == "all" else [args.env]:
            for level in LEVELS if args.level == "all" else [args.level]:
                build(TASKS[env], level, steps=args.steps, seed=args.seed)
    elif args.cmd == "stats":
        from datasets.stats import stats
        print(stats(args.out, args.episodes, args.datasets))
    elif args.cmd == "train-policy":
        from datasets.behaviour import train_behaviour
        train_behaviour(TASKS[args.env], args.work_dir or Path("runs/behaviour") / args.env,
                        total_steps=args.steps, eval_every=args.eval_every, seed=args.seed)


if __name__ == "__main__":
    run_main(main)
