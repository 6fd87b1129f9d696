"""Run a batched policy in a vector env and record whole episodes (Minari layout: T+1 observations)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tqdm import tqdm

from envs import Task, make_vector_env

ActFn = Callable[[np.ndarray], np.ndarray]  # (n, obs_dim) observations -> (n, act_dim) actions


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
    (observations (T+1, o), actions (T, a), rewards, terminations, truncations (T,)).

    ``num_steps``: run episodes back to back in ``num_envs`` envs until exactly that many
    transitions exist; the episodes cut by the budget end truncated.
    ``num_episodes``: run that many envs for exactly one episode each (no bias towards short ones).
    """
    if (num_steps is None) == (num_episodes is None):
        raise ValueError("give exactly one of num_steps and num_episodes")
    n = num_episodes if num_episodes is not None else min(num_envs, num_steps)
    env = make_vector_env(task, n)
    obs, _ = env.reset(seed=seed)
    bufs = [dict(observations=[o], actions=[], rewards=[], terminations=[], truncations=[]) for o in obs]
    episodes, live, steps = [], np.ones(n, bool), 0
    bar = tqdm(
        total=num_steps or num_episodes,
        disable=not progress,
        unit="step" if num_steps else "ep",
        desc=f"{task.name} rollout",
        mininterval=2,
    )

    def finish(b):
        episodes.append(
            {k: np.asarray(v, dtype=bool if k in ("terminations", "truncations") else np.float32) for k, v in b.items()}
        )

    while live.any():
        actions = act_fn(obs)
        obs, rewards, terms, truncs, info = env.step(actions)
        ids = np.flatnonzero(live)
        if num_steps is not None:  # the budget may leave some envs out of the last step
            ids = ids[: num_steps - steps]
            steps += len(ids)
        bar.update(len(ids) if num_steps is not None else int(np.sum(terms[ids] | truncs[ids])))
        for i in ids:
            done = bool(terms[i] or truncs[i])
            b = bufs[i]
            b["actions"].append(actions[i])
            b["rewards"].append(rewards[i])
            b["terminations"].append(bool(terms[i]))
            b["truncations"].append(bool(truncs[i]))
            b["observations"].append(info["final_obs"][i] if done else obs[i])
            if done:
                finish(b)
                bufs[i] = dict(observations=[obs[i]], actions=[], rewards=[], terminations=[], truncations=[])
                live[i] = num_steps is not None
        if num_steps is not None and steps >= num_steps:
            break
    for b in bufs:  # episodes cut by the step budget end truncated
        if b["actions"]:
            b["truncations"][-1] = True
            finish(b)
    bar.close()
    env.close()
    return episodes
