"""Checks of a run's inputs against each other and against the task, made before anything trains or
evaluates: what neither the loaders (one file at a time) nor ``Config.validate`` (one option at a
time) can see. A problem is a ``UserError`` that says what is wrong and what to do; something that
may be meant but is worth knowing is one ``note:`` line on stderr.

  check_run_inputs(data, cfg, seeds)    train.py, right after the dataset is loaded
  check_evaluate_args(args)             evaluate.py, right after its arguments are parsed
  check_evaluate_run(args, ckpts)       evaluate.py, once the checkpoints are loaded
"""
from __future__ import annotations

import functools
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from dt_primal.config import MAX_SEED, PRECISIONS, Config
from dt_primal.data import Trajectories
from dt_primal.errors import UserError
from envs import Task

# A conditioning return (a target or a return-to-go divided by --reward-scale) goes through a linear
# embedding and a layer norm whose squares overflow float32 from about 1e19 on (every action is then
# NaN); 1e9 leaves a wide margin and is far beyond any meaningful return of these tasks.
SCALED_RETURN_LIMIT = 1e9
# A target counts as far above the data when it exceeds the best episode's return by more than this
# many times the data's return scale (the largest of |best|, best - worst and --reward-scale).
FAR_ABOVE = 10
# What one evaluation episode costs besides its buffers: a MuJoCo environment (about 1.1 MB measured
# for Hopper-v5 and HalfCheetah-v5) and its share of the bookkeeping.
ENV_BYTES = 2 << 20
# --max-ep-len only sizes the timestep embedding and the evaluation buffers: beyond this many times
# what the data and the task need it only costs memory.
MAX_EP_LEN_FACTOR = 10
# Actions this far (relative to the half-width of the bounds) beyond the action space are rounding.
ACTION_TOLERANCE = 1e-3


def note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


@dataclass(frozen=True)
class TaskLimits:
    low: np.ndarray  # (act_dim,) action bounds
    high: np.ndarray
    time_limit: int  # steps after which the environment ends an episode


@functools.lru_cache(maxsize=None)
def task_limits(task: Task) -> TaskLimits:
    """The action bounds and the time limit of a task's environment (made once per process); an
    environment that cannot be made, or whose spaces are not flat boxes, is refused."""
    try:
        env = task.make()
    except Exception as exc:  # a missing package, bad kwargs in the dataset's EnvSpec, ...
        raise UserError(f"Cannot make the environment {task.gym_id} ({type(exc).__name__}: {exc}); install what it "
                        f"needs, or pass --env with another environment.") from exc
    if not all(isinstance(space, gym.spaces.Box) and len(space.shape) == 1
               for space in (env.observation_space, env.action_space)):
        env.close()
        raise UserError(f"{task.gym_id} has the observation space {env.observation_space} and the action space "
                        f"{env.action_space}; a Decision Transformer here needs vectors of real numbers for both "
                        f"(continuous control, as the MuJoCo tasks).")
    limits = TaskLimits(np.asarray(env.action_space.low, np.float64), np.asarray(env.action_space.high, np.float64),
                        int(env.spec.max_episode_steps or 1000))
    env.close()
    return limits


def check_run_inputs(data: Trajectories, cfg: Config, seeds: list[int] | None = None, rescale_actions: bool = False,
                     notes: bool = True) -> None:
    """Refuse what would train silently wrong (actions the model cannot output, episodes longer than
    the timestep embedding, conditioning returns that overflow, impossible seeds or GPUs, evaluations
    that cannot fit in memory) and note what is unusual. ``rescale_actions``: scale action columns
    that lie outside the task's bounds into them (in place) instead of refusing. ``notes``: print
    the notes (only one process of a multi-process run should)."""
    task = data.task
    cfg = cfg.resolved(task)
    check_seeds(seeds or [cfg.seed])
    check_device(cfg.device)
    check_actions(data, task, rescale=rescale_actions, notes=notes)
    check_episode_lengths(data, cfg, task, notes=notes)
    check_observations(data)
    targets = list(cfg.targets or task.targets)
    check_returns(data, targets, cfg.reward_scale, task, notes=notes)
    members = len(seeds or [cfg.seed])
    check_batch_memory(cfg, members)
    for episodes, flag in ((cfg.eval_episodes, "--eval-episodes"), (cfg.eval_episodes_during, "--eval-episodes-during")):
        check_evaluation_memory(episodes * len(targets) * members, cfg.context, data.obs_dim, data.act_dim,
                                cfg.device, f"{flag} {episodes} x {len(targets)} targets x {members} "
                                            f"seed{'s' if members > 1 else ''}",
                                f"Lower {flag} (it may change when a run continues with --resume).")
    if notes and cfg.steps and cfg.warmup_steps > cfg.steps:
        note(f"--warmup-steps {cfg.warmup_steps} is more than --steps {cfg.steps}: the linear warm-up never ends, and "
             f"the learning rate reaches only {cfg.steps / cfg.warmup_steps:.0%} of --lr {cfg.lr:g} by the last step. "
             f"Pass a smaller --warmup-steps (e.g. a tenth of --steps, as --preset quick does) if that is not meant.")


def check_seeds(seeds: list[int]) -> None:
    bad = [s for s in seeds if not 0 <= s <= MAX_SEED]
    if bad:
        raise UserError(f"--seeds must be between 0 and {MAX_SEED} (got {' '.join(map(str, bad))}): they seed NumPy's "
                        f"and PyTorch's generators. Give other seeds.")


def check_device(device: str) -> None:
    """A ``cuda:N`` that this machine has (``cuda`` without a GPU is refused when the device is resolved)."""
    if device.startswith("cuda:") and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if int(device.split(":")[1]) >= count:
            raise UserError(f"--device {device} names a GPU this machine does not have: PyTorch sees {count} "
                            f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}). Pick one of them, or cuda.")


def _bounds(low: float, high: float) -> str:
    return f"[{low:g}, {high:g}]"


def check_actions(data: Trajectories, task: Task, rescale: bool = False, notes: bool = True) -> None:
    """The model's actions come out of a tanh scaled to the task's bounds, so it can never produce a
    dataset action beyond them: such data is refused, or with ``rescale`` scaled into the bounds."""
    limits = task_limits(task)
    if data.act_dim != len(limits.low) or not (np.isfinite(limits.low).all() and np.isfinite(limits.high).all()):
        return  # other sizes are refused with their own message when training starts
    centre, half = (limits.high + limits.low) / 2, (limits.high - limits.low) / 2
    lo, hi = data.actions.min(0).astype(np.float64), data.actions.max(0).astype(np.float64)
    reach = np.maximum(np.abs(lo - centre), np.abs(hi - centre)) / half  # 1: exactly at the bounds
    outside = np.flatnonzero(reach > 1 + ACTION_TOLERANCE)
    if not len(outside):
        return
    columns = "; ".join(f"column {j} ranges from {lo[j]:.4g} to {hi[j]:.4g}" for j in outside[:6])
    more = f" (and {len(outside) - 6} more columns)" if len(outside) > 6 else ""
    same = len(set(zip(limits.low, limits.high))) == 1
    bounds = f"{_bounds(limits.low[0], limits.high[0])} in every column" if same else \
        ", ".join(_bounds(a, b) for a, b in zip(limits.low, limits.high))
    if not rescale:
        raise UserError(f"The dataset {data.source} has actions outside {task.gym_id}'s action space, which accepts "
                        f"{bounds}: {columns}{more}. The model's tanh output can never produce them, so it would "
                        f"learn a distorted policy without a word. Check that the data was recorded on {task.gym_id} "
                        f"(else pass the right --env), or pass --rescale-actions to scale those columns into the bounds.")
    actions = data.actions.astype(np.float64)
    for j in outside:
        actions[:, j] = centre[j] + (actions[:, j] - centre[j]) / reach[j]
    data.actions = np.clip(actions, limits.low, limits.high).astype(np.float32)
    if notes:
        note(f"--rescale-actions: scaled the dataset's actions into {task.gym_id}'s bounds {bounds}: "
             + ", ".join(f"column {j} divided by {reach[j]:.4g}" for j in outside)
             + " (about the bounds' centre); the policy is trained and evaluated in the environment's own units.")


def check_episode_lengths(data: Trajectories, cfg: Config, task: Task, notes: bool = True) -> None:
    """Timesteps index an embedding of --max-ep-len rows: a longer episode would share the last row
    for all its later steps; far more rows than any episode needs only cost memory."""
    limits = task_limits(task)
    longest = int(data.lengths.max())
    if longest > cfg.max_ep_len:
        episode = int(np.argmax(data.lengths))
        raise UserError(f"The dataset {data.source} has episodes longer than --max-ep-len {cfg.max_ep_len}: the "
                        f"longest (episode {episode}) has {longest} steps, and every timestep past {cfg.max_ep_len - 1} "
                        f"would get the same embedding. Pass --max-ep-len {longest} (or more). If no episode should be "
                        f"longer than {limits.time_limit} steps ({task.gym_id}'s time limit), the file does not mark "
                        f"where its episodes end (D4RL: 'terminals' and 'timeouts').")
    needed = max(longest, limits.time_limit)
    if cfg.max_ep_len > MAX_EP_LEN_FACTOR * needed:
        raise UserError(f"--max-ep-len {cfg.max_ep_len} is far more than any episode needs (the longest in the dataset "
                        f"has {longest} steps and {task.gym_id} ends episodes after {limits.time_limit}); it sizes the "
                        f"timestep embedding and the evaluation's buffers, which would only take memory. Pass "
                        f"--max-ep-len {needed}.")
    if notes and cfg.max_ep_len < limits.time_limit:
        note(f"--max-ep-len {cfg.max_ep_len} is below {task.gym_id}'s time limit of {limits.time_limit} steps: "
             f"evaluation episodes stop after {cfg.max_ep_len} steps, so returns and scores are those of episodes that "
             f"short and do not compare with published ones.")


def check_observations(data: Trajectories) -> None:
    """States are normalised by the dataset's mean and std in float32: both must be finite."""
    mean, std = data.state_stats()
    bad = np.flatnonzero(~(np.isfinite(mean) & np.isfinite(std)))
    if len(bad):
        j = int(bad[0])
        raise UserError(f"The dataset {data.source} has observations too large to normalise in float32: column {j} "
                        f"reaches {np.abs(data.observations[:, j]).max():.3g}, and its mean or standard deviation "
                        f"overflows. Check the data (a unit or scaling mistake?) and rescale those columns.")


def check_targets(targets: list[float], reward_scale: float | None, flag: str = "--targets") -> None:
    """Targets the model can be conditioned on: finite, and within ±SCALED_RETURN_LIMIT once divided by
    --reward-scale (beyond that the return embedding overflows float32 and every return is NaN);
    ``reward_scale`` None: only finite."""
    bad = [t for t in targets if not math.isfinite(t)]
    if bad:
        raise UserError(f"{flag} must be finite returns (got {' '.join(f'{t:g}' for t in targets)}). Give the "
                        f"returns to condition on, e.g. the task's usual targets.")
    huge = [t for t in targets if reward_scale is not None and not abs(t / reward_scale) <= SCALED_RETURN_LIMIT]
    if huge:
        raise UserError(f"{flag} {' '.join(f'{t:g}' for t in huge)} divided by --reward-scale {reward_scale:g} gives "
                        f"a conditioning return of {huge[0] / reward_scale:.3g}, beyond the ±{SCALED_RETURN_LIMIT:.0e} "
                        f"the model's float32 arithmetic handles safely (from about 1e19 on its return embedding "
                        f"overflows and every result is NaN). Give targets near the returns the task can reach.")


def check_returns(data: Trajectories, targets: list[float], reward_scale: float, task: Task,
                  notes: bool = True) -> None:
    """The dataset's returns-to-go must stay within the same bounds as the targets once scaled; a target
    far above every return in the data is noted (the model never saw one like it)."""
    check_targets(targets, None)
    ends = data.starts + data.lengths
    tail = np.cumsum(data.rewards[::-1].astype(np.float64))[::-1]
    rtg = tail - np.append(tail, 0.0)[np.repeat(ends, data.lengths)]
    largest = float(np.abs(rtg).max())
    if not largest / reward_scale <= SCALED_RETURN_LIMIT:
        suggest = 10.0 ** (round(math.log10(largest)) - 1)
        raise UserError(f"The dataset {data.source} has returns-to-go up to {largest:.3g}, which divided by "
                        f"--reward-scale {reward_scale:g} give {largest / reward_scale:.3g}: beyond the "
                        f"±{SCALED_RETURN_LIMIT:.0e} the model's float32 arithmetic handles safely. Pass a larger "
                        f"--reward-scale (--reward-scale {suggest:g} brings them to about 10), or check the rewards.")
    check_targets(targets, reward_scale)
    if not notes:
        return
    returns = data.episode_returns()
    best, worst = float(returns.max()), float(returns.min())
    scale = max(abs(best), best - worst, reward_scale)
    far = [t for t in targets if t - best > FAR_ABOVE * scale]
    if far:
        note(f"--targets {' '.join(f'{t:g}' for t in far)} {'is' if len(far) == 1 else 'are'} far above every return "
             f"in the dataset (its best episode returns {best:.4g}): the model never saw a return-to-go near "
             f"{'it' if len(far) == 1 else 'them'}, so what it does there is pure extrapolation. {task.gym_id}'s default "
             f"targets are {' and '.join(f'{t:g}' for t in task.targets)}.")


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _available_bytes(device: str) -> tuple[int, str]:
    """Memory a run can still take on ``device`` (0 when unknown), and what it is called."""
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            return 0, "GPU memory"
        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        return torch.cuda.mem_get_info(index)[0], "free GPU memory"
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kib << 10, "available memory"
    except (OSError, StopIteration, ValueError, IndexError):
        return _memory_bytes(), "memory"


def batch_bytes(cfg: Config) -> int:
    """A lower estimate of what one member's training step holds for its batch: per layer and token
    the activations kept for the backward pass (measured: 9-16 floats per d_model unit, 8 taken) and
    per head the attention's token x token matrices, in fp32."""
    tokens = 3 * cfg.context
    return cfg.batch_size * cfg.n_layer * tokens * (8 * cfg.d_model + 4 * cfg.n_head * tokens) * 4


def check_batch_memory(cfg: Config, members: int) -> None:
    """Refuse a --batch-size whose training step cannot fit in the memory this machine (or its GPU)
    has free, before the operating system kills the process for taking more."""
    world = max(1, int(os.environ.get("WORLD_SIZE", "1")))  # each torchrun process holds its share
    need = batch_bytes(cfg) * members // world
    free, memory = _available_bytes(cfg.device)
    if free and need > free:
        fits = max(0, cfg.batch_size * free // need)
        raise UserError(f"--batch-size {cfg.batch_size} needs at least {_gib(need)} for the activations of one training "
                        f"step ({members} seed{'s' if members > 1 else ''} at once, d_model {cfg.d_model}, "
                        f"{cfg.n_layer} layers, context {cfg.context}), more than the {_gib(free)} of {memory} here. "
                        f"Lower --batch-size (about {fits:,} fits at most), or train fewer --seeds at once.")


def check_evaluation_memory(episodes: int, context: int, obs_dim: int, act_dim: int, device: str, what: str,
                            fix: str) -> None:
    """All evaluation episodes run at once: an environment each and buffers of their last ``context``
    steps on the device. Refuse a count that cannot fit in this machine's memory (or its GPU's)."""
    buffers = episodes * context * (obs_dim + act_dim + 1) * 4
    host = episodes * ENV_BYTES
    on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    problems = []
    ram = _memory_bytes()
    if ram and host + (0 if on_gpu else buffers) > ram:
        problems.append(f"about {_gib(host + (0 if on_gpu else buffers))} of memory for their environments"
                        f"{'' if on_gpu else ' and buffers'}, more than this machine's {_gib(ram)}")
    if on_gpu and torch.cuda.is_available():
        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        if buffers > total:
            problems.append(f"{_gib(buffers)} of GPU memory for their buffers, more than the GPU's {_gib(total)}")
    if problems:
        raise UserError(f"The evaluation would run {episodes:,} episodes at once ({what}), which needs "
                        f"{' and '.join(problems)}. {fix}")


# --- evaluate.py ---

def _is_report(path: Path) -> bool:
    """Whether ``path`` holds a report that evaluate.py wrote (which it may replace)."""
    try:
        if path.stat().st_size > 256 << 20:
            return False
        return "across_checkpoints" in json.loads(path.read_text())
    except (OSError, ValueError, TypeError, UnicodeDecodeError):
        return False


def check_evaluate_args(args) -> None:
    """evaluate.py's options, before any checkpoint is loaded: ``args`` has ``checkpoints, episodes,
    out, env_workers`` and optionally ``targets, seed, device, precision``."""
    if args.episodes < 1:
        raise UserError(f"--episodes must be at least 1 (got {args.episodes}).")
    if args.env_workers is not None and args.env_workers < 1:
        raise UserError(f"--env-workers must be at least 1 (got {args.env_workers}); leave it out for the default.")
    problems = []
    device = getattr(args, "device", None)
    if device is not None:
        try:
            Config(device=device).validate()
        except UserError:
            problems.append(f"--device must be auto, cpu, cuda or cuda:N (got {device!r})")
    precision = getattr(args, "precision", None)
    if precision is not None and precision not in PRECISIONS:
        problems.append(f"--precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed <= MAX_SEED:
        problems.append(f"--seed must be between 0 and {MAX_SEED} (got {seed})")
    if problems:
        raise UserError("Invalid options: " + "; ".join(problems) + ". Fix these options and run again.")
    if getattr(args, "targets", None):
        check_targets(args.targets, None)  # finite; the scaled bounds are checked with each checkpoint's scale
    if device is not None:
        check_device(device)
    check_report_path(Path(args.out), [Path(c) for c in args.checkpoints])


def check_report_path(out: Path, checkpoints: list[Path] = ()) -> None:
    """``out`` (and the Markdown table beside it) can be written, and writing them destroys no other file."""
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give the JSON file to write, e.g. --out {out / 'eval.json'} "
                        f"(the Markdown table goes beside it).")
    for path in (out, out.with_suffix(".md")):
        if any(path.exists() and c.exists() and path.resolve() == c.resolve() for c in checkpoints):
            raise UserError(f"--out {out} would overwrite the checkpoint {path} with the report; give another file, "
                            f"e.g. --out {out.with_name('eval.json')}.")
    if out.exists() and not _is_report(out):
        raise UserError(f"--out {out} already exists and is not an evaluation report, so writing the report would "
                        f"destroy it; give another file (an earlier report there would be replaced).")
    parent = next((p for p in [out.parent, *out.parent.parents] if p.exists()), Path("."))
    if not parent.is_dir():
        raise UserError(f"--out {out} lies under {parent}, which is a file, not a folder; give another path.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {out} cannot be written: {parent} is not writable (read-only or not yours). Give a "
                        f"path in a folder you can write to.")


def env_sizes(task: Task) -> tuple[int, int]:
    """Observation and action sizes of the task's environment."""
    env = task.make()
    sizes = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    return sizes


def check_evaluate_run(args, ckpts: list[dict]) -> None:
    """evaluate.py once its checkpoints are loaded: each model's sizes against its task's environment,
    the targets against each checkpoint's --reward-scale, and whether all the episodes fit in memory at once."""
    episodes_total = 0
    for path, ckpt in zip(args.checkpoints, ckpts):
        cfg, arch = ckpt["config"], ckpt["model_config"]
        task = Task.from_record(ckpt["task"])
        sizes = env_sizes(task)
        if (arch["state_dim"], arch["act_dim"]) != sizes:
            raise UserError(f"{path} holds a model for observations of size {arch['state_dim']} and actions of size "
                            f"{arch['act_dim']}, but its task {task.gym_id} has {sizes[0]} and {sizes[1]}: the file is "
                            f"damaged. Use an earlier copy or retrain.")
        targets = list(getattr(args, "targets", None) or cfg["targets"] or task.targets)
        check_targets(targets, cfg["reward_scale"])
        episodes_total += args.episodes * len(targets)
    cfg = ckpts[0]["config"]
    arch = ckpts[0]["model_config"]
    check_evaluation_memory(episodes_total, max(c["model_config"]["context"] for c in ckpts), arch["state_dim"],
                            arch["act_dim"], getattr(args, "device", None) or "auto",
                            f"--episodes {args.episodes} per target of {len(ckpts)} checkpoint{'s' if len(ckpts) > 1 else ''}",
                            "Lower --episodes, or evaluate fewer checkpoints per command.")
