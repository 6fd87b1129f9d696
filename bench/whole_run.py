"""Wall time of a whole run: `python train.py` (training + the final evaluation of 2 targets x 100
episodes) at the paper's settings on one Hopper dataset, measured on a short run and extrapolated to
the paper's 100 000 steps.

  python -m bench.whole_run                 # 300 training steps + full final evaluation, extrapolated
  python -m bench.whole_run --steps 1000 --device cuda
  python -m bench.whole_run --quick         # smoke check, < 1 min

Measured: one `python train.py` subprocess (Primal.+DT, the paper's defaults, --device cpu or cuda) on a
D4RL-style hdf5 of Hopper-shaped random data, with no intermediate evaluation; its wall time, its
final evaluation time (eval.json's eval_seconds) and its training rate (TensorBoard's
perf/steps_per_s, written by the training loop itself). Training on random data gives a policy that falls
within a few dozen steps, so that final evaluation is far shorter than a good policy's. Hence
the evaluation cost of full-length episodes is measured separately: dt_primal.evaluation.rollout on
Hopper-v5 without termination (every episode reaches its time limit) for 200 and for 20 live
episodes: the median time of one step (forward pass + env step) over --probe-steps steps after
the first K (full window, the steady state), times 1000 steps.
Extrapolated: a 100k-step run = startup + 100k training steps + 9 intermediate evaluations
(2 targets x 10 episodes every 10k steps) + the final evaluation (2 x 100 episodes).
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import bench.common as common

import numpy as np
import torch

from dt_primal.cli import command_parser
from dt_primal.config import make_config
from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.rollout import rollout
from dt_primal.model.transformer import DecisionTransformer
from envs import TASKS

WORK = common.SCRATCH / "whole_run"


class StepClock(DecisionTransformer):
    """A DecisionTransformer that notes when each forward pass starts and over how many steps."""

    def forward(self, states, *rest, **kwargs):
        self.calls.append((time.perf_counter(), states.shape[2]))  # states (members, episodes, steps, obs)
        return super().forward(states, *rest, **kwargs)


def eval_seconds_per_step(episodes: int, probe: int, context: int, precision: str, device: str) -> float:
    """Seconds per batched evaluation step (forward pass + env step + bookkeeping) with
    ``episodes`` live episodes and a full window of K steps: the median interval between
    consecutive forward passes of ``rollout`` over ``probe`` steps after the first K, untrained model."""
    cfg = make_config("paper", model="primal", s=64, precision=precision)
    torch.manual_seed(0)
    model = StepClock(cfg.model_config(11, 3)).to(device)
    model.calls = []
    policy = Policy(model, np.zeros(11), np.ones(11), cfg.reward_scale, context, precision)
    task = common.task_with(TASKS["hopper"], terminate_when_unhealthy=False, max_episode_steps=context + probe + 1)
    targets = list(TASKS["hopper"].targets)[: 1 if episodes < 2 else 2]
    rollout(policy, task, targets, episodes // len(targets))
    calls = model.calls
    full = [t1 - t0 for (t0, w), (t1, _) in zip(calls, calls[1:]) if w == context]
    return float(np.median(full))


def parse_args():
    p = command_parser(__doc__)
    p.add_argument("--steps", type=int, default=300, help="training steps of the measured run")
    p.add_argument("--total-steps", type=int, default=100_000, help="the run to extrapolate to (the paper's)")
    p.add_argument("--eval-episodes", type=int, default=100, help="final evaluation episodes per target")
    p.add_argument("--probe-steps", type=int, default=30, help="steady-state evaluation steps timed per probe")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--quick", action="store_true", help="smoke check: 20 steps, 5 episodes per target, short probes")
    args = p.parse_args()
    if args.quick:
        args.steps, args.eval_episodes, args.probe_steps = 6, 5, 3
    return args


def measured_run(args) -> dict:
    """``train.py`` for ``args.steps`` steps with the full final evaluation: its command, wall and CPU seconds,
    training rate, final evaluation's seconds and episode lengths, and the start-up (the rest of the wall time)."""
    hdf5 = common.hopper_hdf5(common.SCRATCH / "hopper-random-100k.hdf5")
    out = WORK / ("quick" if args.quick else f"steps{args.steps}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "train.py", "--dataset", str(hdf5), "--model", "primal", "--out", str(out)]
    cmd += common.short_run_args(args.steps, args.eval_episodes, args.precision, args.device)
    wall, cpu = common.run_timed(cmd)
    result = json.loads((out / "eval.json").read_text())
    rate = common.training_rate(out)
    m = dict(cmd=cmd, hdf5=hdf5, wall=wall, cpu=cpu, eval_s=result["eval_seconds"], rate=rate)
    m |= dict(lengths=[n for r in result["targets"] for n in r["lengths"]], train_s=args.steps / rate)
    m["startup_s"] = wall - m["train_s"] - m["eval_s"]  # imports, dataset, env check, model, checkpoint, TensorBoard
    print(
        f"measured: {wall:.1f} s wall = ~{m['startup_s']:.1f} s startup + {m['train_s']:.1f} s training "
        f"({rate:.2f} steps/s) + {m['eval_s']:.1f} s final evaluation (episodes of {np.mean(m['lengths']):.0f} "
        "steps on average)",
        flush=True,
    )
    return m


def duration(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def extrapolated(args, m: dict) -> tuple[list[list[str]], float, float]:
    """The table's rows, and the whole run's seconds with full-length evaluations and with evaluations as short
    as the measured run's."""
    cfg = make_config("paper").resolved(TASKS["hopper"])
    probe = lambda episodes: eval_seconds_per_step(episodes, args.probe_steps, cfg.context, args.precision, args.device)
    per_step_final, per_step_mid = probe(2 * args.eval_episodes), probe(2 * cfg.eval_episodes_during)
    T, n_mid = cfg.max_ep_len, (args.total_steps - 1) // cfg.eval_every
    final_full, mid_full, total_train = per_step_final * T, per_step_mid * T, args.total_steps / m["rate"]
    short = m["eval_s"] * (1 + n_mid * cfg.eval_episodes_during / args.eval_episodes)
    startup, lengths, rate = m["startup_s"], m["lengths"], f"{m['rate']:.2f}"
    rows = [
        ["startup (imports, dataset, env check, model, TensorBoard, checkpoint)", f"{startup:.1f} s"]
        + ["measured (rest of the wall time)", f"{startup:.0f} s"],
        [f"training, {args.total_steps:,} steps", f"{args.steps} steps in {m['train_s']:.1f} s: **{rate} steps/s**"]
        + [f"× {args.total_steps / args.steps:.0f}", f"**{duration(total_train)}**"],
        [f"final evaluation, 2 × {args.eval_episodes} episodes as this policy plays them"]
        + [f"{m['eval_s']:.1f} s (mean episode {np.mean(lengths):.0f} steps, longest {max(lengths)})", "measured"]
        + [duration(m["eval_s"])],
        [f"final evaluation, 2 × {args.eval_episodes} full-length episodes"]
        + [f"{per_step_final:.2f} s per step with {2 * args.eval_episodes} live episodes", f"× {T} steps"]
        + [f"**{duration(final_full)}**"],
        [f"{n_mid} intermediate evaluations, 2 × {cfg.eval_episodes_during} full-length episodes"]
        + [f"{per_step_mid:.3f} s per step with {2 * cfg.eval_episodes_during} live episodes"]
        + [f"× {T} steps × {n_mid}", duration(n_mid * mid_full)],
    ]
    return rows, startup + total_train + n_mid * mid_full + final_full, startup + total_train + short


def main() -> None:
    args = parse_args()
    m = measured_run(args)
    rows, total_full, total_short = extrapolated(args, m)
    T = make_config("paper").resolved(TASKS["hopper"]).max_ep_len
    body = "\n".join(
        [
            "`python train.py` (Primal.+DT, the paper's settings: d_model 256, 4 heads, 3 layers, K 20, batch 64, "
            f"{args.precision}, --device {args.device}) on {m['hdf5'].name} (Hopper-shaped random data, D4RL hdf5), "
            f"measured for {args.steps} steps with no intermediate evaluation and the full final evaluation, then "
            f"extrapolated to {args.total_steps:,} steps. Measured wall time of that command: **{m['wall']:.0f} s** "
            f"({m['cpu']:.0f} CPU-seconds, all threads; on a machine shared with other jobs the wall time depends "
            "on how much of its cores this run got). Exact command:",
            "",
            "```",
            common.shown(m["cmd"]),
            "```",
            "",
            "A policy trained on random data falls within a few dozen steps, so its evaluation is short; a good Hopper "
            "policy's episodes last 1000 steps. The full-length evaluation cost is therefore measured separately with "
            "`dt_primal.evaluation.rollout` on Hopper-v5 without termination: the median time of one batched step "
            f"(forward pass + env step, full window of K steps) over {args.probe_steps} steps, times {T} steps. "
            f"train.py inherits OMP_WAIT_POLICY={common.machine()['omp_wait_policy']} from this script.",
            "",
            common.md_table(["part", "measured", "extrapolation", f"{args.total_steps:,}-step run"], rows),
            "",
            f"**Whole {args.total_steps:,}-step run, extrapolated: {duration(total_full)} with full-length "
            f"evaluation episodes** ({duration(total_short)} if every evaluation were as short as this random-data "
            "policy's). For comparison, the published DT implementations take about 40 minutes per 100k-step run "
            "on a GPU (d3rlpy-benchmarks' DT logs, CORL).",
        ]
    )
    common.write_section("whole_run", "Whole run: training + final evaluation", body, args.quick)


if __name__ == "__main__":
    main()
