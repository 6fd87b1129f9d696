"""Batched evaluation (docs/method.md, "Evaluation protocol"): every episode of every target of every
ensemble member runs at once, with one forward pass of the ensemble per environment step for all live
episodes."""

from __future__ import annotations

import contextlib
import os
import warnings

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
        self.steps, self.live = [], []
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


class _Part:
    """The episodes of some ``columns`` of every member (``rollout``'s layout: target-major, ``seeds[m] + column``
    each): their environments, an acting state for them (``policy``) and what they have earned. ``act`` sends
    their next step to the environments, ``receive`` takes it back."""

    def __init__(self, policy, tasks: list[Task], columns: np.ndarray, targets: np.ndarray, seeds, workers, phase):
        M, n = len(tasks), len(columns)
        self.policy, self.columns, self.shape, self.phase = policy, columns, (M, n), phase
        with phase("start"):
            self.env = Episodes([t for t in tasks for _ in columns], M * n, workers)
            self.obs = self.env.reset([s + int(c) for s in seeds for c in columns])
        policy.reset(targets[:, columns])
        self.rewards, self.returns = np.zeros((M, n)), np.zeros((M, n))
        self.lengths, self.alive = np.zeros((M, n), dtype=np.int64), np.ones((M, n), dtype=bool)
        self.pending = False

    def act(self) -> np.ndarray:
        """This step's actions (M, n, act_dim) for the live episodes, sent to their environments."""
        M, n = self.shape
        actions = self.policy.act(self.obs.reshape(M, n, -1), self.rewards, live=self.alive).reshape(M, n, -1)
        with self.phase("stepping"):
            self.env.send(actions.reshape(M * n, -1), self.alive.reshape(-1))
        self.pending = True
        return actions

    def receive(self) -> None:
        M, n = self.shape
        with self.phase("stepping"):
            self.obs, rewards, terms, truncs = self.env.receive()
        self.rewards, ended = rewards.reshape(M, n), (terms | truncs).reshape(M, n)
        self.returns[self.alive] += self.rewards[self.alive]
        self.lengths[self.alive] += 1
        self.alive &= ~ended
        self.pending = False


def _play(parts: list[_Part], n: int, steps: int, progress: bool, recorder: Recorder | None = None) -> None:
    """Step every part's episodes until all have ended or reached ``steps`` steps. In each round every part takes
    back its last step and sends the next, so that one part's environments step in their workers while this
    process computes the next part's actions."""
    M = parts[0].shape[0]
    bar = tqdm(total=steps, disable=not progress, desc=f"evaluating {M * n} episodes", unit="step", mininterval=2)
    for _ in range(steps):
        acted = []
        for part in parts:
            if part.pending:
                part.receive()
            if part.alive.any():
                acted.append((part, part.alive.copy(), part.act()))
        if not acted:
            break
        if recorder is not None:
            actions, alive = np.zeros((M, n, acted[0][2].shape[-1]), np.float32), np.zeros((M, n), bool)
            for part, live, a in acted:
                actions[:, part.columns], alive[:, part.columns] = a, live
            recorder.step(actions, alive)
        bar.update(1)
    for part in parts:
        if part.pending:
            part.receive()
    bar.close()


def _episodes(policy, tasks, targets, episodes: int, seeds, workers: int, halves, progress, recorder, phase):
    """``rollout``'s episodes (in two pipelined halves with ``halves``): their returns and lengths (members,
    episodes per member)."""
    n = episodes * len(targets[0])
    columns = np.array_split(np.arange(n), 2 if halves else 1)
    acting = [[0.0 if t is None else t for t in member] for member in targets]  # None: the policy ignores it
    per_episode = np.repeat(acting, episodes, axis=1)
    parts = []
    if recorder is not None:
        recorder.start(episodes, targets, seeds)
    try:
        for acting, c in zip([policy, policy.twin()] if halves else [policy], columns):
            parts.append(_Part(acting, tasks, c, per_episode, seeds, workers, phase))
        with policy.evaluating():
            _play(parts, n, policy.max_ep_len, progress, recorder)
    finally:
        for part in parts:
            with contextlib.suppress(OSError), phase("start"):  # a worker that has died
                part.env.close()
    return tuple(np.concatenate([getattr(part, k) for part in parts], axis=1) for k in ("returns", "lengths"))


def rollout(
    policy: Policy,
    task: Task | list[Task],
    targets: list[float] | list[list[float]],
    episodes: int,
    seeds: list[int] | None = None,
    env_workers: int | None = None,
    progress: bool = False,
    recorder: Recorder | None = None,
    pipeline: bool | None = None,
    phase=contextlib.nullcontext,
) -> list[list[dict]]:
    """Run ``episodes`` episodes per target for every member of ``policy`` (member m's environments
    seeded ``seeds[m]``, ``seeds[m] + 1``, ...; default 0 for all), at most ``max_ep_len`` steps each.
    ``task`` and ``targets``: one for all members, or one per member (tasks with the same observation
    and action sizes, as many targets each; None: a policy that ignores the target, reported as such).
    Returns per member one report per target with the keys ``target, return_mean, return_std, normalized_mean,
    normalized_std, episodes`` (+ raw returns and lengths). ``recorder``: keeps the actions of the episodes it
    names (``Recorder``). ``pipeline``
    (default: where the environments step in worker processes, ``env_workers`` > 1): the episodes in two halves,
    each with its own ``env_workers`` workers and acting state (``policy.twin()``), so that one half's
    environments step while the other's actions are computed; the same episodes, acted on in forward passes of
    half the width. ``phase(name)``: a profiling hook as the training step's, around the environments' start-up and
    closing ("start") and each step's sending and receiving ("stepping"); the forward pass has its own
    (``Policy``'s)."""
    M = policy.members
    tasks = task if isinstance(task, list) else [task] * M
    targets = targets if isinstance(targets[0], list) else [targets] * M
    n = episodes * len(targets[0])
    workers = env_workers or default_env_workers(policy.device, M * n)
    seeds = seeds or [0] * M
    halves = (pipeline if pipeline is not None else workers > 1) and n > 1
    run = (policy, tasks, targets, episodes, seeds, workers)
    try:
        returns, lengths = _episodes(*run, halves, progress, recorder, phase)
    except (RuntimeError, EOFError, OSError) as exc:  # a CUDA error of a capture, a worker that died
        if not halves:
            raise
        warnings.warn(
            f"the pipelined evaluation failed ({type(exc).__name__}: {str(exc)[:200]}); it runs again, its "
            f"episodes acting and stepping in turn",
            RuntimeWarning,
            stacklevel=2,
        )
        returns, lengths = _episodes(*run, False, progress, recorder, phase)
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
