"""Evaluation speed in Hopper-v5: dt-primal's batched evaluation (dt_primal.evaluation.rollout:
every episode at once in one vector env, one forward pass per step for all live episodes) against
the classic one-episode-at-a-time Decision Transformer loop of the same model.

  python -m bench.eval_speed                          # untrained models, full-length episodes
  python -m bench.eval_speed --checkpoint runs/x/last.pt
  python -m bench.eval_speed --quick                  # smoke check, < 1 min

Episode length. An untrained (or briefly trained) DT falls within a few dozen steps in Hopper, so
its episodes say nothing about a 1000-step evaluation. By default the environment is Hopper-v5
with ``terminate_when_unhealthy=False``: the same physics and observations, but every episode
runs to the 1000-step time limit, as a good policy's do. With ``--checkpoint`` the real
environment is used (``--full-length`` forces full-length episodes there too).

What is timed. Batched: one call of ``rollout`` for ``--episodes`` episodes (environment creation
included). Sequential: ``--seq-episodes`` whole episodes one after another with one Hopper-v5 env,
one forward pass per step over the last K steps (batch 1, no padding, the same tensors the library
feeds); its time per env-step is extrapolated to the batched run's total env-steps.
"""

from __future__ import annotations

import argparse
import os
import time

import bench.common as common  # sets OMP_WAIT_POLICY before torch loads

import numpy as np
import torch

from dt_primal.cli import command_parser
from dt_primal.config import make_config
from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.rollout import rollout
from dt_primal.model.transformer import DecisionTransformer
from dt_primal.precision import resolve_precision
from envs import TASKS, Task


@torch.no_grad()
def sequential_rollout(
    model: DecisionTransformer,
    task: Task,
    target: float,
    episodes: int,
    state_mean,
    state_std,
    reward_scale: float,
    context: int,
    precision: str,
    last_only: bool,
    seed: int = 0,
) -> tuple[int, list[float]]:
    """The classic DT evaluation: one env, one episode after another, one forward per step over
    the last ``context`` steps (of a one-member model). Returns (total env-steps, episode returns)."""
    model.eval()
    env = task.make()
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    mean, std = (torch.as_tensor(a, dtype=torch.float32) for a in (state_mean, state_std))
    T = model.max_ep_len
    timesteps = torch.arange(T)[None, None]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    steps, returns = 0, []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        states, actions, rtg = torch.zeros(1, 1, T, obs_dim), torch.zeros(1, 1, T, act_dim), torch.zeros(1, 1, T, 1)
        rtg[0, 0, 0, 0] = target / reward_scale
        ret = 0.0
        for t in range(T):
            states[0, 0, t] = (torch.as_tensor(obs, dtype=torch.float32) - mean) / std
            lo = max(0, t + 1 - context)
            with autocast:
                window = (x[..., lo : t + 1, :] for x in (states, actions, rtg))
                pred, _ = model(*window, timesteps[..., lo : t + 1], last_only=last_only)
            actions[0, 0, t] = pred[0, 0, -1].float()
            obs, reward, term, trunc, _ = env.step(actions[0, 0, t].numpy())
            ret += reward
            steps += 1
            if term or trunc:
                break
            if t + 1 < T:
                rtg[0, 0, t + 1, 0] = rtg[0, 0, t, 0] - reward / reward_scale
        returns.append(ret)
    env.close()
    return steps, returns


@torch.no_grad()
def warm_up(model: DecisionTransformer, batch: int, context: int, precision: str) -> None:
    """One forward at the batched and at the sequential shape, so neither timing pays first-call costs."""
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        for b in (batch, 1):
            model(
                torch.zeros(1, b, context, model.embed_state.weight.shape[-1]),
                torch.zeros(1, b, context, model.embed_action.weight.shape[-1]),
                torch.zeros(1, b, context, 1),
                torch.arange(context).expand(1, b, -1),
            )


def forward_clock(model: DecisionTransformer):
    """Hooks that add the wall seconds of each forward pass of ``model`` to ``seconds[0]``.
    Returns (seconds, the hook handles to remove)."""
    seconds, start = [0.0], [0.0]
    pre = model.register_forward_pre_hook(lambda *_: start.__setitem__(0, time.perf_counter()))
    post = model.register_forward_hook(lambda *_: seconds.__setitem__(0, seconds[0] + time.perf_counter() - start[0]))
    return seconds, (pre, post)


def models_to_run(args) -> list[dict]:
    """(label, model, precision, normalisation, task) for each model size to compare."""
    if args.checkpoint:
        from dt_primal.config import Config
        from dt_primal.files.checkpoint import load_checkpoint, model_from_checkpoint

        ckpt = load_checkpoint(args.checkpoint)
        model, cfg = model_from_checkpoint(ckpt, "cpu"), Config(**ckpt["config"])
        base = Task.from_record(ckpt["task"])
        return [
            dict(
                label=f"{args.checkpoint} ({cfg.model}, d_model {cfg.d_model}, {cfg.n_head} heads, "
                f"{cfg.n_layer} layers)",
                model=model,
                cfg=cfg,
                precision=args.precision or cfg.precision,
                mean=ckpt["state_mean"],
                std=ckpt["state_std"],
                base=base,
            )
        ]
    runs = []
    for label, preset in (
        ("the Primal.+DT paper's size (d_model 256, 4 heads, 3 layers, K 20)", "paper"),
        ("quick preset size (d_model 128, 4 heads, 3 layers, K 20)", "quick"),
    ):
        cfg = make_config(preset, model="primal", s=64)
        torch.manual_seed(0)
        model = DecisionTransformer(cfg.model_config(11, 3))
        chosen = args.precision or resolve_precision(cfg.precision, torch.device("cpu"), cfg.d_model)[0]
        runs.append(
            dict(
                label=label + f", untrained {cfg.model}",
                model=model,
                cfg=cfg,
                precision=chosen,
                mean=np.zeros(11),
                std=np.ones(11),
                base=TASKS["hopper"],
            )
        )
    return runs


def time_model(run: dict, task, args) -> tuple[list, Policy, object, float]:
    """One model's batched rollout (median of ``--repeats``, with its forward passes' share) and its sequential
    loop with the full forward and with the newest-step one: its table row, its policy, task and batched seconds."""
    cfg, model = run["cfg"], run["model"]
    common_args = (run["mean"], run["std"], cfg.reward_scale, cfg.context)
    warm_up(model, args.episodes, cfg.context, run["precision"])
    batched, batched_cpu, forward_share = [], [], []
    policy = Policy(model, *common_args, run["precision"])
    for _ in range(args.repeats):
        forward_s, hooks = forward_clock(model)
        t0, c0 = time.perf_counter(), time.process_time()
        reports = rollout(policy, task, [args.target], args.episodes)[0]
        batched.append(time.perf_counter() - t0)
        batched_cpu.append(time.process_time() - c0)
        forward_share.append(forward_s[0] / batched[-1])
        for h in hooks:
            h.remove()
    lengths = reports[0]["lengths"]
    steps = int(sum(lengths))
    b_s, b_cpu = float(np.median(batched)), float(np.median(batched_cpu))
    row = [run["label"], run["precision"], f"{args.episodes} × {np.mean(lengths):.0f}"]
    row += [f"{b_s:.0f} s (CPU {b_cpu:.0f} s): {steps / b_s:,.0f} steps/s; forward passes "]
    row[-1] += f"{np.median(forward_share):.0%} of it"
    for last_only in (False, True):  # the peers' full forward, then the library's newest-step-only forward
        seq, seq_cpu = [], []
        for _ in range(args.seq_repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            seq_steps, _ = sequential_rollout(
                model, task, args.target, args.seq_episodes, *common_args, run["precision"], last_only
            )
            seq.append((time.perf_counter() - t0) / seq_steps)
            seq_cpu.append((time.process_time() - c0) / seq_steps)
        s_step, s_cpu = float(np.median(seq)), float(np.median(seq_cpu))
        row += [
            f"{1 / s_step:,.0f} steps/s (CPU {s_cpu * 1e3:.1f} ms/step) → {s_step * steps:.0f} s",
            f"**{s_step * steps / b_s:.1f}×** ({s_cpu * steps / b_cpu:.1f}×)",
        ]
    return row, policy, task, b_s


def main() -> None:
    p = command_parser(__doc__)
    p.add_argument("--checkpoint", help="a dt-primal DIR/last.pt to evaluate instead of untrained models")
    p.add_argument("--episodes", type=int, default=100, help="episodes of the batched run (default 100)")
    p.add_argument("--seq-episodes", type=int, default=2, help="episodes timed one at a time (then extrapolated)")
    p.add_argument("--repeats", type=int, default=1, help="repeat the batched run and take the median")
    p.add_argument("--seq-repeats", type=int, default=3, help="repeat the sequential timing and take the median")
    p.add_argument("--max-steps", type=int, default=1000, help="episode time limit (default Hopper's 1000)")
    p.add_argument("--full-length", action="store_true", help="with --checkpoint: no termination either")
    p.add_argument(
        "--precision", choices=("fp32", "bf16"), help="default: the model's config (auto: resolved for this CPU)"
    )
    p.add_argument("--target", type=float, default=3600.0, help="return to condition on (Hopper's high target)")
    p.add_argument("--quick", action="store_true", help="smoke check: 10 episodes of 50 steps")
    p.add_argument("--replot", action="store_true", help="rewrite the section from the last full run's saved results")
    args = p.parse_args()
    if args.replot:
        saved = common.load_results("eval_speed")
        write(saved["rows"], argparse.Namespace(**saved["args"]), saved["full_length"], saved["info"])
        return
    if args.quick:
        args.episodes, args.seq_episodes, args.max_steps, args.seq_repeats = 10, 2, 50, 1
    full_length = args.full_length or not args.checkpoint
    rows, timed = [], []
    for run in models_to_run(args):
        kwargs = {"max_episode_steps": args.max_steps} | ({"terminate_when_unhealthy": False} if full_length else {})
        row, policy, task, b_s = time_model(run, common.task_with(run["base"], **kwargs), args)
        rows.append(row)
        timed.append((policy, task, b_s))
        print(" | ".join(str(c) for c in rows[-1]), f"(load {common.load_avg():.2f})", flush=True)
    # The batched run with the environments in one worker process per core (`evaluate.py --env-workers N`), after
    # every other timing: its worker processes keep the load raised for a while after they exit.
    workers = os.cpu_count() or 1
    for row, (policy, task, b_s) in zip(rows, timed):
        t0 = time.perf_counter()
        rollout(policy, task, [args.target], args.episodes, env_workers=workers)
        a_s = time.perf_counter() - t0
        row.insert(4, f"{a_s:.0f} s: {b_s / a_s:.2f}× the speed of the in-process run")
        print(row[0], f"| {workers} env workers:", row[4], f"(load {common.load_avg():.2f})", flush=True)
    info = (
        None
        if args.quick
        else common.save_results("eval_speed", {"rows": rows, "args": vars(args), "full_length": full_length})["info"]
    )
    write(rows, args, full_length, info)


def write(rows: list[list], args, full_length: bool, info: dict | None) -> None:
    env_note = (
        "Hopper-v5 with `terminate_when_unhealthy=False` (every episode runs to the time limit)"
        if full_length
        else "Hopper-v5 (episodes end on termination)"
    )
    body = "\n".join(
        [
            f"{args.episodes} episodes of at most {args.max_steps} steps, conditioned on return {args.target:g}, in "
            f"{env_note}. "
            "**Batched**: `dt_primal.evaluation.rollout`, all episodes at once (environments stepped in this "
            f"process, one "
            "forward pass per step for all live episodes), timed "
            f"whole{'' if args.repeats == 1 else f', median of {args.repeats}'}, "
            f"with the share of its wall time spent in the model's forward passes (the rest: the environment steps "
            f"and the bookkeeping around them). "
            f"The batched forward is the model's inference path (`last_only`, exact): the last block at the newest "
            "state token only, and no KSVD objective, so the primal layer projects only the running mean at that "
            f"token. "
            f"**Sequential**: the classic DT loop in `bench/eval_speed.py` (one env, one episode after another, one "
            f"forward pass per step over the last K steps, batch 1), once with the full forward the published DTs run "
            "(every state token's action, and here the KSVD objective too) and once with the same inference path, "
            f"each timed on {args.seq_episodes} episodes (median of "
            f"{args.seq_repeats}); its time per env-step × the batched run's env-steps is the extrapolated time for "
            f"the "
            f"same evaluation. **Batched, env workers**: the batched run once more with "
            f"`env_workers` = the machine's cores (`evaluate.py --env-workers N`): the environments are split into one "
            "group per worker process, and the groups step in parallel; it pays only where environment steps, not "
            f"the forward pass, bound "
            f"the loop and there are cores to spread them over. Same model, same precision, `torch.no_grad`, "
            f"{(info or common.machine())['torch_threads']} threads. In "
            f"brackets: CPU time of the process (all threads), which other jobs on a shared machine disturb much less.",
            "",
            common.md_table(
                [
                    "model",
                    "precision",
                    "episodes × mean length",
                    "batched (measured)",
                    "batched, env workers",
                    "sequential, full forward (measured → extrapolated)",
                    "speed-up over it, wall (CPU)",
                    "sequential, newest-step forward",
                    "speed-up over it, wall (CPU)",
                ],
                rows,
            ),
            "",
            "Why the factor is small at the Primal.+DT paper's size in fp32: both methods do the same arithmetic, a "
            "forward pass over "
            "the last K = 20 steps (60 tokens) for every env-step of every episode, and there that arithmetic is the "
            "cost. A batch-1 forward over 60 tokens already feeds 60-row matrix products to the CPU, which run at a "
            "good fraction of the speed a 100-episode batch gets; batching removes the per-call overhead (Python, "
            "dispatch, small tensors, one env at a time), which weighs more for the smaller model and in bf16, where "
            "the batched matrix products run on the CPU's bf16 units and the batch-1 ones gain little. The sliding "
            "window rules out caching keys/values across steps (the tokens' hidden states change when the oldest step "
            "leaves the window). Tried and dropped: `torch.compile` of the batched forward (1.2× less CPU time after "
            "compiling for minutes, recompiling as the window and the live batch change); the math path instead of "
            "SDPA's flash kernel (slower at 60 tokens); fp32 instead of bf16 for the attention inside autocast, and "
            "one autocast region around the whole rollout so that the weights are cast once (neither faster in "
            "interleaved A/Bs); glibc malloc settings that keep freed memory for reuse (the rollout already "
            "page-faults nothing per step in steady state; one run with them looked 10% faster, the next did not). "
            "On a GPU, where a batch-1 forward is latency-bound, batching is where the large factors come from.",
        ]
    )
    common.write_section(
        "eval_speed", "Evaluation speed: batched vs one episode at a time", body, args.quick, info=info
    )


if __name__ == "__main__":
    main()
