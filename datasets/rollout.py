"""Run a batched policy in a vector env and record whole episodes (Minari layout: T+1 observations)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from tqdm import tqdm

from envs import Task, make_vector_env

ActFn = Callable[[np.ndarray], np.ndarray]  # (n, obs_dim) observations -> (n, act_dim) actions
Keyed = list[tuple[tuple[int, int], dict[str, np.ndarray]]]  # ((vector step it ended at, env index), episode)


def collect(
    task: Task,
    act_fn: ActFn,
    *,
    num_steps: int | None = None,
    num_episodes: int | None = None,
    num_envs: int = 32,
    seed: int = 0,
    progress: bool = False,
) -> list[dict[str, np.ndarray]]:
    """Roll ``act_fn`` out and return episodes as dicts of numpy arrays
    (observations (T+1, o), actions (T, a), rewards, terminations, truncations (T,)), in the order they ended.

    ``num_steps``: run episodes back to back in ``num_envs`` envs until exactly that many
    transitions exist; the episodes cut by the budget end truncated.
    ``num_episodes``: run that many envs for exactly one episode each (no bias towards short ones).
    """
    if (num_steps is None) == (num_episodes is None):
        raise ValueError("give exactly one of num_steps and num_episodes")
    n = num_episodes if num_episodes is not None else min(num_envs, num_steps)
    return merge([_record(task, act_fn, n, range(n), seed, num_steps, progress)])


def collect_rows(
    task: Task, act_fn: ActFn, rows: Sequence[int], *, num_steps: int, num_envs: int = 32, seed: int = 0, progress=False
) -> Keyed:
    """The envs ``rows`` of ``collect(num_steps=..., num_envs=..., seed=...)``, each episode keyed by when it
    ended: ``merge`` of the results for rows that split ``range(num_envs)`` is that ``collect``'s, bit for bit
    (so one rollout can run in several processes). ``act_fn`` still gets all ``num_envs`` rows, zeros for the
    envs run elsewhere: its random draws and its arithmetic (the shapes of its matrix products) are the whole
    batch's, and each env's action is its row's."""
    n = min(num_envs, num_steps)
    if not rows or min(rows) < 0 or max(rows) >= n or len(set(rows)) != len(rows):
        raise ValueError(f"rows must be distinct env indices below {n}")
    return _record(task, act_fn, n, rows, seed, num_steps, progress)


def merge(parts: list[Keyed]) -> list[dict[str, np.ndarray]]:
    """The episodes of ``collect_rows`` results, in the order one process would have recorded them."""
    return [ep for _, ep in sorted((kv for part in parts for kv in part), key=lambda kv: kv[0])]


def _record(task: Task, act_fn: ActFn, n: int, rows: Sequence[int], seed: int, num_steps: int | None, progress):
    """``collect``'s loop for the envs ``rows`` of ``n`` (env i seeded ``seed + i``), episodes keyed."""
    rows = list(rows)
    env = make_vector_env(task, len(rows))
    obs, _ = env.reset(seed=[seed + i for i in rows])
    bufs = [_buffer(o) for o in obs]
    keyed, live, t = [], np.ones(len(rows), bool), 0
    index = np.asarray(rows)
    mine = len(rows) * (num_steps // n) + int(np.sum(index < num_steps % n)) if num_steps is not None else None
    bar = tqdm(
        total=mine if num_steps is not None else n,
        disable=not progress,
        unit="step" if num_steps else "ep",
        desc=f"{task.name} rollout",
        mininterval=2,
    )
    while live.any():
        full = np.zeros((n, *obs.shape[1:]), obs.dtype)  # a new array each step, as the vector env gives
        full[index] = obs
        actions = act_fn(full)[index]
        obs, rewards, terms, truncs, info = env.step(actions)
        ids = np.flatnonzero(live)
        if num_steps is not None:  # the budget may leave the last envs out of the last step
            ids = ids[index[ids] < num_steps - t * n]
        bar.update(len(ids) if num_steps is not None else int(np.sum(terms[ids] | truncs[ids])))
        for j in ids:
            done = bool(terms[j] or truncs[j])
            b = bufs[j]
            b["actions"].append(actions[j])
            b["rewards"].append(rewards[j])
            b["terminations"].append(bool(terms[j]))
            b["truncations"].append(bool(truncs[j]))
            b["observations"].append(info["final_obs"][j] if done else obs[j])
            if done:
                keyed.append(((t, rows[j]), _finish(b)))
                bufs[j] = _buffer(obs[j])
                live[j] = num_steps is not None
        t += 1
        if num_steps is not None and t * n >= num_steps:
            break
    for j, b in enumerate(bufs):  # episodes cut by the step budget end truncated
        if b["actions"]:
            b["truncations"][-1] = True
            keyed.append(((t, rows[j]), _finish(b)))
    bar.close()
    env.close()
    return keyed


def _buffer(first_obs: np.ndarray) -> dict[str, list]:
    return dict(observations=[first_obs], actions=[], rewards=[], terminations=[], truncations=[])


def _finish(b: dict[str, list]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=bool if k in ("terminations", "truncations") else np.float32) for k, v in b.items()}
