"""Batched evaluation (docs/method.md, "Evaluation protocol"): every episode of every target of every
ensemble member runs at once, with one forward pass of the ensemble per environment step for all live
episodes."""

from __future__ import annotations

import os

import numpy as np
import torch
from tqdm import tqdm

from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.reports import report
from envs import Episodes, Task

EVALUATION_SEEDS = 100_000  # a run of seed s evaluates in environments seeded from s + this, apart from training's


def evaluation_seeds(seeds: list[int]) -> list[int]:
    """The first environment seed of each member's evaluation episodes, for runs of ``seeds``."""
    return [s + EVALUATION_SEEDS for s in seeds]


def default_env_workers(device: torch.device | str, num_envs: int) -> int:
    """Worker processes for the environments: none on a CPU, where the forward passes need the cores
    (docs/benchmarks.md, "Evaluation speed"); one per core, at least 8 episodes each, beside a GPU."""
    if torch.device(device).type == "cpu":
        return 1
    return max(1, min(os.cpu_count() or 1, num_envs // 8))


class Recorder:
    """The actions of the first ``episodes`` episodes of every target of every member, as the evaluation took
    them, so that those very episodes can be replayed and rendered (``dt_primal.evaluation.video``): the same
    environment seeds and actions give the same returns, and the batched evaluation is not changed by it."""

    def __init__(self, episodes: int):
        self.episodes, self.steps, self.live = episodes, [], []

    def start(self, per_target: int, targets: list[list[float]], seeds: list[int]) -> None:
        kept = min(self.episodes, per_target)
        self.columns = [i * per_target + j for i in range(len(targets[0])) for j in range(kept)]
        self.episodes_of = [
            dict(member=m, target=targets[m][c // per_target], episode=c % per_target, seed=seeds[m] + c)
            for m in range(len(seeds))
            for c in self.columns
        ]

    def step(self, actions: np.ndarray, alive: np.ndarray) -> None:
        """One step's actions (members, episodes, act_dim) of every live episode."""
        self.steps.append(actions[:, self.columns].copy())
        self.live.append(alive[:, self.columns].copy())

    def recorded(self) -> list[dict]:
        """Per recorded episode: its member, target, environment seed and actions (length, act_dim)."""
        actions = np.stack(self.steps, 0).reshape(len(self.steps), len(self.episodes_of), -1)
        live = np.stack(self.live, 0).reshape(len(self.live), len(self.episodes_of))
        return [dict(e, actions=actions[live[:, k], k]) for k, e in enumerate(self.episodes_of)]


def _play(
    policy, env, obs, shape: tuple[int, int], progress: bool, recorder: Recorder | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Step every episode of ``env`` (started at ``obs``) with ``policy`` until all have ended or reached
    ``policy.max_ep_len`` steps: each episode's return and length, shaped (members, episodes)."""
    M, n = shape
    rewards, returns, lengths = np.zeros((M, n)), np.zeros((M, n)), np.zeros((M, n), dtype=np.int64)
    alive = np.ones((M, n), dtype=bool)
    bar = tqdm(
        total=policy.max_ep_len, disable=not progress, desc=f"evaluating {M * n} episodes", unit="step", mininterval=2
    )
    for _ in range(policy.max_ep_len):
        actions = policy.act(obs.reshape(M, n, -1), rewards, live=alive)
        if recorder is not None:
            recorder.step(actions.reshape(M, n, -1), alive)
        obs, rewards, terms, truncs = env.step(actions.reshape(M * n, -1), alive.reshape(-1))
        rewards, ended = rewards.reshape(M, n), (terms | truncs).reshape(M, n)
        returns[alive] += rewards[alive]
        lengths[alive] += 1
        alive &= ~ended
        bar.update(1)
        if not alive.any():
            break
    bar.close()
    return returns, lengths


def rollout(
    policy: Policy,
    task: Task | list[Task],
    targets: list[float] | list[list[float]],
    episodes: int,
    seeds: list[int] | None = None,
    env_workers: int | None = None,
    progress: bool = False,
    recorder: Recorder | None = None,
) -> list[list[dict]]:
    """Run ``episodes`` episodes per target for every member of ``policy`` (member m's environments
    seeded ``seeds[m]``, ``seeds[m] + 1``, ...; default 0 for all), at most ``max_ep_len`` steps each.
    ``task`` and ``targets``: one for all members, or one per member (tasks with the same observation
    and action sizes, as many targets each). Returns per member one report per target with the keys
    ``target, return_mean, return_std, normalized_mean, normalized_std, episodes`` (+ raw returns and
    lengths). ``recorder``: keeps the actions of the episodes it names (``Recorder``)."""
    M = policy.members
    tasks = task if isinstance(task, list) else [task] * M
    targets = targets if isinstance(targets[0], list) else [targets] * M
    n = episodes * len(targets[0])
    workers = env_workers or default_env_workers(policy.device, M * n)
    env = Episodes([t for t in tasks for _ in range(n)], M * n, workers)
    seeds = seeds or [0] * M
    obs = env.reset([s + j for s in seeds for j in range(n)])
    policy.reset(np.repeat(targets, episodes, axis=1))
    if recorder is not None:
        recorder.start(episodes, targets, seeds)
    with policy.evaluating():
        returns, lengths = _play(policy, env, obs, (M, n), progress, recorder)
    env.close()
    return [
        [
            report(
                tasks[m],
                target,
                returns[m, i * episodes : (i + 1) * episodes],
                lengths[m, i * episodes : (i + 1) * episodes],
            )
            for i, target in enumerate(targets[m])
        ]
        for m in range(M)
    ]
