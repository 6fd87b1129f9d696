"""Speed of the online learners that could train the suite's behaviour policies, on one CPU thread:
environment steps per CPU second of SAC (stable-baselines3), TQC and CrossQ (sb3-contrib), each
step with one gradient update, after ``--warmup`` steps that fill the replay buffer.

  python bench/learner_speed.py                                  # SAC, TQC, CrossQ on hopper
  python bench/learner_speed.py --env halfcheetah --algos SAC TQC
  python bench/learner_speed.py --algos CrossQ --critic 256 256  # CrossQ with SAC-sized critics

CrossQ's default critics (sb3-contrib) are two 1024-unit layers with batch renormalisation; SAC's
and TQC's are two 256-unit layers.
"""

from __future__ import annotations

import argparse
import time

import common  # noqa: F401  (puts the repository on the path)
import torch

from envs import TASKS


def steps_per_second(algo: str, env: str, steps: int, warmup: int, critic: list[int] | None) -> float:
    """Environment steps (one update each) per CPU second, after ``warmup`` steps."""
    from sb3_contrib import TQC, CrossQ
    from stable_baselines3 import SAC

    kwargs = {"policy_kwargs": {"net_arch": {"pi": [256, 256], "qf": critic}}} if critic else {}
    model = {"SAC": SAC, "TQC": TQC, "CrossQ": CrossQ}[algo](
        "MlpPolicy",
        TASKS[env].make(),
        learning_starts=warmup // 2,
        buffer_size=steps + warmup,
        seed=0,
        device="cpu",
        **kwargs,
    )
    model.learn(warmup)
    t0 = time.process_time()
    model.learn(steps, reset_num_timesteps=False)
    return steps / (time.process_time() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=list(TASKS), default="hopper")
    p.add_argument("--algos", nargs="+", choices=["SAC", "TQC", "CrossQ"], default=["SAC", "TQC", "CrossQ"])
    p.add_argument("--critic", nargs="+", type=int, default=None, help="critic layer widths (default: each learner's)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--warmup", type=int, default=1200)
    args = p.parse_args()
    torch.set_num_threads(1)
    for algo in args.algos:
        rate = steps_per_second(algo, args.env, args.steps, args.warmup, args.critic)
        print(f"{algo} {args.env} critic {args.critic or 'default'}: {rate:.1f} steps per CPU second", flush=True)


if __name__ == "__main__":
    main()
