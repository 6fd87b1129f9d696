"""``python -m datasets``: the offline dataset suite (train behaviour policies, build, stats) and the
combination of Minari datasets (a D4RL-style medium-expert of hosted ones)."""

from __future__ import annotations

from dt_primal.process import configure_process

if __name__ == "__main__":
    configure_process()  # a command: its process-wide settings, before torch loads

from pathlib import Path

from datasets.behaviour import LEARNING_RATE, POLICY_DIR
from datasets.suite import (
    FULL_STEPS,
    LEVELS,
    build_at_once,
    build_id,
    buildable,
    parse_suite_id,
    suite_id,
    versions_text,
)
from dt_primal.cli import command_parser, run_main, subcommand
from dt_primal.errors import UserError
from envs import TASKS


def add_train_policy(sub) -> None:
    """``train-policy``: a task's behaviour learner."""
    t = subcommand(sub, "train-policy", "train (or resume) the behaviour learner of one task")
    t.add_argument("--env", choices=list(TASKS), required=True)
    t.add_argument(
        "--steps",
        dest="total_steps",
        metavar="STEPS",
        type=int,
        default=3_000_000,
        help="learner steps in all (it stops earlier at its expert)",
    )
    t.add_argument("--eval-every", type=int, default=20_000)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="its whole state, saved at each evaluation (default runs/behaviour/<env>)",
    )
    t.add_argument(
        "--policy-dir",
        type=Path,
        default=POLICY_DIR,
        help="where its exports, history and snapshot go (default datasets/policies, committed)",
    )
    t.add_argument(
        "--algo", choices=["SAC", "TQC"], default=None, help="default: the task's (SAC; TQC for halfcheetah)"
    )
    t.add_argument(
        "--medium-score",
        type=float,
        default=None,
        help="the normalised score of its first evaluation that makes medium and medium-replay (default 40)",
    )
    t.add_argument("--until-medium", action="store_true", help="stop once medium and medium-replay are exported")
    t.add_argument(
        "--learning-rate",
        type=float,
        default=LEARNING_RATE,
        help=f"a new learner's (default {LEARNING_RATE:g}; a resumed one keeps its own)",
    )


def add_adopt(sub) -> None:
    """``adopt``: a learner's medium exports as the committed files of a new learner version."""
    a = subcommand(
        sub,
        "adopt",
        "copy a learner's medium exports (train-policy --until-medium --policy-dir DIR) into "
        "datasets/policies as learner version N: medium-vN.pt, medium_replay-vN.npz (half-precision "
        "observations), learner-vN.json",
    )
    a.add_argument("--env", choices=list(TASKS), required=True)
    a.add_argument("--learner", type=Path, required=True, help="the learner's folder: DIR/<env> of --policy-dir DIR")
    a.add_argument("--version", type=int, required=True, help="the new learner version (1 or more)")


def add_build(sub) -> None:
    """``build``: suite datasets as Minari datasets."""
    b = subcommand(sub, "build", "build suite datasets dt-primal/<env>/<level>-v<N> as Minari datasets")
    b.add_argument(
        "--env",
        choices=[*TASKS, "all"],
        help="a task, or all: every task, leaving out (named) a dataset whose expert is not trained yet",
    )
    b.add_argument("--level", choices=[*LEVELS, "all"], nargs="+")
    b.add_argument(
        "--dataset",
        nargs="+",
        metavar="ID",
        default=[],
        help="suite ids to build, each at its own version, instead of --env, --level and --version",
    )
    b.add_argument(
        "--steps", type=int, default=FULL_STEPS, help="transitions per level (default 1M; scale down for quick builds)"
    )
    b.add_argument("--seed", type=int, default=0, help="rollout seed")
    b.add_argument(
        "--version",
        type=int,
        default=None,
        help=f"dataset version (default: each level's newest: {versions_text()})",
    )
    b.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="datasets built at once, each in its own processes (default 1: one after the other)",
    )
    b.add_argument(
        "--processes",
        type=int,
        default=None,
        help="processes each dataset's rollout runs in (default: this machine's cores, shared by the datasets "
        "built at once; the same data however many)",
    )
    b.add_argument(
        "--missing",
        action="store_true",
        help="build only the datasets not built yet, where otherwise a built one is replaced (a run that needs "
        "one meanwhile waits for its build)",
    )


def add_stats(sub) -> None:
    """``stats``: the built datasets and the behaviour policies, beside D4RL's."""
    s = subcommand(
        sub,
        "stats",
        "print and write docs/datasets.md: the built datasets and the behaviour policies",
    )
    s.add_argument("--out", type=Path, default=Path("docs/datasets.md"))
    s.add_argument(
        "--episodes",
        type=int,
        default=100,
        help="episodes to measure each behaviour policy (0: keep the measurements the page has)",
    )
    s.add_argument(
        "--datasets",
        nargs="+",
        default=[],
        help="also these Minari datasets in $MINARI_DATASETS_PATH, of any task (normalised: – where the task "
        "has no reference scores)",
    )


def add_combine(sub) -> None:
    """``combine``: one Minari dataset from the episodes of several."""
    c = subcommand(
        sub,
        "combine",
        "one Minari dataset from the episodes of several, e.g. a D4RL-style medium-expert "
        "of Minari's hosted medium-v0 and expert-v0",
    )
    c.add_argument(
        "parts", nargs="+", help="local Minari dataset ids, in order (mujoco/hopper/medium-v0 mujoco/hopper/expert-v0)"
    )
    c.add_argument("--into", required=True, help="the new dataset's id (mujoco/hopper/medium-expert-v0)")


def build(args) -> None:
    """``build``: the datasets asked for, one after the other or ``--jobs`` at once."""
    if args.dataset and (args.env or args.level or args.version is not None):
        raise UserError("--dataset names its datasets and their versions: give it without --env, --level, --version.")
    if not args.dataset and not (args.env and args.level):
        raise UserError("build needs --env and --level, or --dataset ID...")
    for dataset_id in args.dataset:
        parse_suite_id(dataset_id)  # a message for an id that is not the suite's, before any build
    ids = args.dataset or [
        suite_id(env, level, args.version)
        for env in (TASKS if args.env == "all" else [args.env])
        for level in (LEVELS if "all" in args.level else args.level)
    ]
    ids = buildable(ids) if args.env == "all" else ids  # all tasks: those whose expert is not trained yet wait
    if args.processes is not None and args.processes < 1:
        raise UserError(f"--processes must be at least 1 (got {args.processes}).")
    if args.jobs > 1:
        build_at_once(ids, args.jobs, args.steps, args.seed, args.missing, args.processes)
    else:
        for dataset_id in ids:
            build_id(dataset_id, args.steps, args.seed, args.missing, args.processes)


def main(argv=None) -> None:
    p = command_parser(__doc__, prog="python -m datasets")
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in (add_train_policy, add_adopt, add_build, add_stats, add_combine):
        add(sub)
    args = p.parse_args(argv)
    if args.cmd == "build":
        build(args)
    elif args.cmd == "adopt":
        from datasets.behaviour import adopt_learner

        for path in adopt_learner(TASKS[args.env], args.learner, args.version):
            print(f"wrote {path}")
    elif args.cmd == "combine":
        from datasets.combine import combine

        combine(args.parts, args.into)
    elif args.cmd == "stats":
        from datasets.stats import stats

        print(stats(args.out, args.episodes, args.datasets))
    elif args.cmd == "train-policy":
        from datasets.behaviour import train_behaviour

        if not 0 < args.learning_rate < 1:
            raise UserError(f"--learning-rate must lie between 0 and 1, not {args.learning_rate}")
        learner = {k: v for k, v in vars(args).items() if k not in ("cmd", "env", "work_dir")}
        train_behaviour(TASKS[args.env], args.work_dir or Path("runs/behaviour") / args.env, **learner)


if __name__ == "__main__":
    run_main(main)
