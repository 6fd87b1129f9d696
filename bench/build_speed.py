"""Building a suite dataset on all cores: a rollout's envs split over worker processes (``datasets.suite.rollouts``).

  python -m bench.build_speed            # Hopper medium, 200k steps: processes 1 and every core; shards 1 to 16
  python -m bench.build_speed --quick    # smoke check, < 1 min

Two measurements. The rollout as a build runs it (``rollouts(..., processes=P)``, its worker pool included)
for each ``--processes``, with a digest of its episodes: the same for every P. And one worker's share alone:
a part's first shard when its envs are split ``S`` ways (``--shards``), run in this process one at a time, so
that no other work shares the cores: on a machine with ``S × ROLLOUT_PARTS`` free cores a part takes about
its slowest shard's time, which gives the speed-up a machine with more cores than this one would see (each
shard still evaluates the policy on the whole batch: the price of the same data).
"""

from __future__ import annotations

import hashlib
import time

import bench.common as common  # sets OMP_WAIT_POLICY before torch loads

import numpy as np

from datasets import suite
from dt_primal.cli import command_parser
from envs import TASKS


def digest(episodes: list[dict]) -> str:
    h = hashlib.sha256()
    for ep in episodes:
        for k in sorted(ep):
            h.update(np.ascontiguousarray(ep[k]).tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    p = command_parser(__doc__)
    p.add_argument("--env", default="hopper", choices=list(TASKS))
    p.add_argument("--policy", default="medium.pt", help="a committed policy of the task, or 'random'")
    p.add_argument("--steps", type=int, default=200_000, help="transitions of the rollout (a build's: 1M)")
    p.add_argument("--processes", type=int, nargs="+", default=[1, common.machine()["cores"]])
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.steps, args.processes, args.shards = 4_000, [1, 2], [1, 4]
    task, policy = TASKS[args.env], None if args.policy == "random" else args.policy
    whole = []
    for n in args.processes:
        t0 = time.perf_counter()
        episodes = suite.rollouts(task, policy, args.steps, 0, processes=n)
        took = time.perf_counter() - t0
        whole.append([n, f"{took:.1f}", f"{args.steps / took:,.0f}", digest(episodes)])
        print(whole[-1], flush=True)
    part = args.steps // suite.ROLLOUT_PARTS
    seconds = {}
    for s in sorted(set(args.shards) | {1}):
        t0 = time.perf_counter()
        suite._rollout_part(task.name, policy, part, 0, list(range(suite.PART_ENVS))[::s], False)
        seconds[s] = time.perf_counter() - t0
        print(f"shards {s}: {seconds[s]:.2f} s", flush=True)
    alone = [[s, s * suite.ROLLOUT_PARTS, f"{t:.2f}", f"{seconds[1] / t:.1f}×"] for s, t in seconds.items()]
    body = "\n".join(
        [
            f"{task.gym_id}, the committed `{args.policy}` policy, {args.steps:,} steps (a build's rollout: "
            f"{suite.ROLLOUT_PARTS} parts of {suite.PART_ENVS} envs).",
            "",
            common.md_table(["processes", "seconds", "steps/s", "episodes' digest"], whole),
            "",
            f"One worker alone, a part ({part:,} steps) split S ways:",
            "",
            common.md_table(["S", "cores a build would use", "one shard's seconds", "speed-up of a part"], alone),
        ]
    )
    common.write_section("build_speed", "Datasets: a build's rollout on all cores", body, args.quick)


if __name__ == "__main__":
    main()
