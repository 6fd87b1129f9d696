"""Checks of a run's inputs against each other and against the task, made before anything trains:
what neither the loaders (one file at a time) nor ``Config.validate`` (one option at a time) can
see. A problem is a ``UserError`` that says what is wrong and what to do; something that may be
meant but is worth knowing is one ``note:`` line on stderr.

  check_run_inputs(data, cfg, seeds)    train.py, right after the dataset is loaded
"""

from __future__ import annotations

import math
import sys

import numpy as np

from dt_primal.config import Config, seed_problems
from dt_primal.data import Trajectories
from dt_primal.errors import UserError
from dt_primal.evaluation.checks import (
    SCALED_RETURN_LIMIT,
    check_evaluation_memory,
    check_targets,
    env_sizes,
    task_limits,
)
from dt_primal.machine import check_device
from dt_primal.model.architecture import evaluation_targets
from dt_primal.training.memory import check_batch_memory
from envs import Task

# A target counts as far above the data when it exceeds the best episode's return by more than this
# many times the data's return scale (the largest of |best|, best - worst and --reward-scale).
FAR_ABOVE = 10

# --max-ep-len only sizes the timestep embedding and the evaluation buffers: beyond this many times
# what the data and the task need it only costs memory.
MAX_EP_LEN_FACTOR = 10
# Actions this far (relative to the half-width of the bounds) beyond the action space are rounding.
ACTION_TOLERANCE = 1e-3


def note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def check_run_inputs(
    data: Trajectories, cfg: Config, seeds: list[int] | None = None, rescale_actions: bool = False, notes: bool = True
) -> None:
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
    targets = evaluation_targets(cfg.model, cfg.targets or task.targets)
    check_returns(data, [t for t in targets if t is not None], cfg.reward_scale, task, notes=notes)
    check_top_percent(data, cfg, notes=notes)
    members = len(seeds or [cfg.seed])
    check_batch_memory(cfg, members)
    for episodes, flag in (
        (cfg.eval_episodes, "--eval-episodes"),
        (cfg.eval_episodes_during, "--eval-episodes-during"),
    ):
        check_evaluation_memory(
            episodes * len(targets) * members,
            cfg.context,
            data.obs_dim,
            data.act_dim,
            cfg.device,
            f"{flag} {episodes} x {len(targets)} targets x {members} seed{'s' if members > 1 else ''}",
            f"Lower {flag} (it may change when a run continues with --resume).",
        )
    if notes and cfg.steps and cfg.warmup_steps > cfg.steps:
        note(
            f"--warmup-steps {cfg.warmup_steps} is more than --steps {cfg.steps}: the linear warm-up never ends, and "
            f"the learning rate reaches only {cfg.steps / cfg.warmup_steps:.0%} of --lr {cfg.lr:g} by the last step. "
            f"Pass a smaller --warmup-steps (e.g. a tenth of --steps, as --preset quick does) if that is not meant."
        )


def check_seeds(seeds: list[int]) -> None:
    problems = seed_problems(seeds, "--seeds")
    if problems:
        raise UserError(f"{problems[0]}: they seed NumPy's and PyTorch's generators. Give other seeds.")


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
    bounds = (
        f"{_bounds(limits.low[0], limits.high[0])} in every column"
        if same
        else ", ".join(_bounds(a, b) for a, b in zip(limits.low, limits.high))
    )
    if not rescale:
        raise UserError(
            f"The dataset {data.source} has actions outside {task.gym_id}'s action space, which accepts "
            f"{bounds}: {columns}{more}. The model's tanh output can never produce them, so it would "
            f"learn a distorted policy without a word. Check that the data was recorded on {task.gym_id} "
            f"(else pass the right --env), or pass --rescale-actions to scale those columns into the bounds."
        )
    actions = data.actions.astype(np.float64)
    for j in outside:
        actions[:, j] = centre[j] + (actions[:, j] - centre[j]) / reach[j]
    data.actions = np.clip(actions, limits.low, limits.high).astype(np.float32)
    if notes:
        note(
            f"--rescale-actions: scaled the dataset's actions into {task.gym_id}'s bounds {bounds}: "
            + ", ".join(f"column {j} divided by {reach[j]:.4g}" for j in outside)
            + " (about the bounds' centre); the policy is trained and evaluated in the environment's own units."
        )


def check_episode_lengths(data: Trajectories, cfg: Config, task: Task, notes: bool = True) -> None:
    """Timesteps index an embedding of --max-ep-len rows: a longer episode would share the last row
    for all its later steps; far more rows than any episode needs only cost memory."""
    limits = task_limits(task)
    longest = int(data.lengths.max())
    if longest > cfg.max_ep_len:
        episode = int(np.argmax(data.lengths))
        raise UserError(
            f"The dataset {data.source} has episodes longer than --max-ep-len {cfg.max_ep_len}: the "
            f"longest (episode {episode}) has {longest} steps, and every timestep past {cfg.max_ep_len - 1} "
            f"would get the same embedding. Pass --max-ep-len {longest} (or more). If no episode should be "
            f"longer than {limits.time_limit} steps ({task.gym_id}'s time limit), the file does not mark "
            f"where its episodes end (D4RL: 'terminals' and 'timeouts')."
        )
    needed = max(longest, limits.time_limit)
    if cfg.max_ep_len > MAX_EP_LEN_FACTOR * needed:
        raise UserError(
            f"--max-ep-len {cfg.max_ep_len} is far more than any episode needs (the longest in the dataset "
            f"has {longest} steps and {task.gym_id} ends episodes after {limits.time_limit}); it sizes the "
            f"timestep embedding and the evaluation's buffers, which would only take memory. Pass "
            f"--max-ep-len {needed}."
        )
    if notes and cfg.max_ep_len < limits.time_limit:
        note(
            f"--max-ep-len {cfg.max_ep_len} is below {task.gym_id}'s time limit of {limits.time_limit} steps: "
            f"evaluation episodes stop after {cfg.max_ep_len} steps, so returns and scores are those of episodes that "
            f"short and do not compare with published ones."
        )


def check_top_percent(data: Trajectories, cfg: Config, notes: bool = True) -> None:
    """--top-percent P trains on the best episodes holding P % of the steps: refused where none of them is as long
    as a window (--context), else said."""
    if cfg.top_percent >= 100:
        return
    kept = data.best_episodes(cfg.top_percent)
    what = (
        f"--top-percent {cfg.top_percent:g} keeps the best {len(kept.lengths)} of {len(data.lengths)} episodes "
        f"({len(kept.rewards)} of {len(data.rewards)} steps)"
    )
    if kept.lengths.max() < cfg.context:
        raise UserError(
            f"{what} of {data.source}, and none of them holds a full context of {cfg.context} steps (the longest "
            f"has {kept.lengths.max()}). Give a larger --top-percent, or a smaller --context."
        )
    if notes:
        print(what)


def check_observations(data: Trajectories) -> None:
    """States are normalised by the dataset's mean and std in float32: both must be finite."""
    mean, std = data.state_stats()
    bad = np.flatnonzero(~(np.isfinite(mean) & np.isfinite(std)))
    if len(bad):
        j = int(bad[0])
        raise UserError(
            f"The dataset {data.source} has observations too large to normalise in float32: column {j} "
            f"reaches {np.abs(data.observations[:, j]).max():.3g}, and its mean or standard deviation "
            f"overflows. Check the data (a unit or scaling mistake?) and rescale those columns."
        )


def check_returns(
    data: Trajectories, targets: list[float], reward_scale: float, task: Task, notes: bool = True
) -> None:
    """The dataset's returns-to-go must stay within the same bounds as the targets once scaled; a target
    far above every return in the data is noted (the model never saw one like it)."""
    largest = float(np.abs(data.returns_to_go()).max())
    if not largest / reward_scale <= SCALED_RETURN_LIMIT:
        suggest = 10.0 ** (round(math.log10(largest)) - 1)
        raise UserError(
            f"The dataset {data.source} has returns-to-go up to {largest:.3g}, which divided by "
            f"--reward-scale {reward_scale:g} give {largest / reward_scale:.3g}: beyond the "
            f"±{SCALED_RETURN_LIMIT:.0e} the model's float32 arithmetic handles safely. Pass a larger "
            f"--reward-scale (--reward-scale {suggest:g} brings them to about 10), or check the rewards."
        )
    check_targets(targets, reward_scale)
    if not notes:
        return
    returns = data.episode_returns()
    best, worst = float(returns.max()), float(returns.min())
    scale = max(abs(best), best - worst, reward_scale)
    far = [t for t in targets if t - best > FAR_ABOVE * scale]
    if far:
        note(
            f"--targets {' '.join(f'{t:g}' for t in far)} {'is' if len(far) == 1 else 'are'} far above every return "
            f"in the dataset (its best episode returns {best:.4g}): the model never saw a return-to-go near "
            f"{'it' if len(far) == 1 else 'them'}, so what it does there is pure extrapolation. {task.gym_id}'s "
            f"default "
            f"targets are {' and '.join(f'{t:g}' for t in task.targets)}."
        )


def check_env_matches(data: Trajectories, task: Task) -> None:
    obs_dim, act_dim = env_sizes(task)
    if (data.obs_dim, data.act_dim) != (obs_dim, act_dim):
        raise UserError(
            f"The dataset {data.source} has observations of size {data.obs_dim} and actions of size "
            f"{data.act_dim}, but {task.gym_id} has {obs_dim} and {act_dim}: it was not recorded in that "
            f"environment. Pass the right --env."
        )
