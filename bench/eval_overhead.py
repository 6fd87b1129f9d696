"""Where an evaluation step's time goes: the batched rollout (``dt_primal.evaluation.rollout``) split into
the model's forward pass, the environments' stepping (with the worker processes' pipes) and the rest
(acting's bookkeeping, the rollout loop, host-device transfers), per environment step, against stepping
the same environments alone with fixed actions.

  python bench/eval_overhead.py                              # CPU: 64 and 256 episodes, 1 and 2 workers
  python bench/eval_overhead.py --device cuda --episodes 600 1800 --workers 16   # on a GPU machine
  python bench/eval_overhead.py --quick                      # smoke check, < 1 min

Hopper-v5 with ``terminate_when_unhealthy=False``: every episode runs ``--steps`` steps, so every step has
the same width. The model: an untrained Primal.+DT at the paper's size (3 members), acting in fp32 on a CPU,
bf16 on CUDA. The forward pass is timed with the device synchronised; the rest is the rollout's total less
forward and stepping.
"""

from __future__ import annotations

import time

import common  # sets OMP_WAIT_POLICY before torch loads
import numpy as np
import torch

import dt_primal.evaluation.rollout as rollout_module
from dt_primal.cli import command_parser
from dt_primal.config import make_config
from dt_primal.evaluation.policy import Policy
from dt_primal.model.transformer import DecisionTransformer
from envs import TASKS, Episodes


class Timed:
    """Seconds spent in ``fn``, the device synchronised after each call."""

    def __init__(self, fn, device: torch.device):
        self.fn, self.seconds, self.cuda = fn, 0.0, device.type == "cuda"

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - t0
        return out


def envs_alone(task, n: int, workers: int, steps: int) -> float:
    """Seconds of ``steps`` steps of ``n`` environments with fixed actions."""
    env = Episodes(task, n, workers)
    env.reset(list(range(n)))
    actions, alive = np.zeros((n, *env.action_shape), np.float32), np.ones(n, bool)
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(actions, alive)
    seconds = time.perf_counter() - t0
    env.close()
    return seconds


def in_rollout(task, n: int, workers: int, steps: int, device: str, members: int) -> dict:
    """The rollout of ``n`` episodes (over ``members`` members) split into forward, stepping and the rest."""
    cfg = make_config("paper", model="primal", s=64, max_ep_len=steps)
    model = DecisionTransformer(cfg.model_config(11, 3), members=members).to(device).eval()
    forward = Timed(model.forward, torch.device(device))
    model.forward = forward
    stepping = []

    class TimedEpisodes(Episodes):
        def step(self, actions, alive):
            t0 = time.perf_counter()
            out = super().step(actions, alive)
            stepping.append(time.perf_counter() - t0)
            return out

    precision = "bf16" if device.startswith("cuda") else "fp32"
    policy = Policy(model, np.zeros(11), np.ones(11), 1000.0, cfg.context, precision)
    saved, rollout_module.Episodes = rollout_module.Episodes, TimedEpisodes
    try:
        t0 = time.perf_counter()
        rollout_module.rollout(policy, task, [3600.0], n // members, env_workers=workers)
        total = time.perf_counter() - t0
    finally:
        rollout_module.Episodes = saved
    return {"total": total, "forward": forward.seconds, "stepping": sum(stepping)}


def main() -> None:
    p = command_parser(__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--episodes", type=int, nargs="+", default=[64, 256], help="episodes at once (all members)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="steps of every episode")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.episodes, args.workers, args.steps = [12], [1], 20
    task = common.task_with(TASKS["hopper"], terminate_when_unhealthy=False, max_episode_steps=args.steps)
    rows = []
    for n in args.episodes:
        for w in args.workers:
            alone = envs_alone(task, n, w, args.steps)
            r = in_rollout(task, n, w, args.steps, args.device, args.members)
            per = lambda s, n=n: f"{1e6 * s / (n * args.steps):.1f}"
            rest = r["total"] - r["forward"] - r["stepping"]
            rows.append(
                [n, w, per(r["total"]), per(r["forward"]), per(r["stepping"]), per(rest), per(alone)]
                + [f"{r['stepping'] / alone:.2f}", f"{rest / r['total']:.0%}"]
            )
            print(" | ".join(map(str, rows[-1])), f"(load {common.load_avg():.2f})", flush=True)
    header = [
        "episodes",
        "workers",
        "rollout µs per env-step",
        "forward",
        "stepping",
        "the rest (acting, loop, transfers)",
        "envs alone",
        "stepping ÷ alone",
        "the rest's share",
    ]
    body = "\n".join(
        [
            f"`--device {args.device}`, {args.members} members of an untrained Primal.+DT at the paper's size, "
            f"Hopper-v5 episodes of {args.steps} steps (never terminated early); every time per environment step "
            "(total over episodes × steps).",
            "",
            common.md_table(header, rows),
        ]
    )
    common.write_section("eval_overhead", "Evaluation: where a step's time goes", body, args.quick, device=args.device)


if __name__ == "__main__":
    main()
