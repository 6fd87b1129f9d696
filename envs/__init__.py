"""The supported MuJoCo tasks: Gymnasium ids, D4RL reference scores, target returns, env factories.

Reference scores are D4RL's (random and expert policy returns), used for the normalised score
``100 * (return - ref_min) / (ref_max - ref_min)`` (SPEC §5).
"""
from __future__ import annotations

import multiprocessing
import re
import warnings
from dataclasses import dataclass

import gymnasium as gym
import mujoco
import numpy as np


def _mujoco_warning(message: str) -> None:
    """MuJoCo prints its warnings on stderr each time an env is made. Gymnasium's HalfCheetah model
    uses the deprecated 'settotalmass' attribute, which would repeat that line for every episode
    of an evaluation; it is harmless and dropped. Any other MuJoCo warning becomes a Python warning."""
    if "settotalmass" not in message:
        warnings.warn(f"MuJoCo: {message.strip()}", RuntimeWarning, stacklevel=2)


mujoco.set_mju_user_warning(_mujoco_warning)


@dataclass(frozen=True)
class Task:
    name: str
    gym_id: str
    ref_min: float
    ref_max: float
    targets: tuple[float, ...]  # return-to-go conditioning targets, highest first

    def normalize(self, returns):
        """D4RL normalised score (SPEC §5); works on floats and numpy arrays."""
        return 100.0 * (returns - self.ref_min) / (self.ref_max - self.ref_min)

    def make(self, **kwargs) -> gym.Env:
        return gym.make(self.gym_id, **kwargs)


TASKS: dict[str, Task] = {
    "halfcheetah": Task("halfcheetah", "HalfCheetah-v5", -280.178953, 12135.0, (12000.0, 6000.0)),
    "hopper": Task("hopper", "Hopper-v5", -20.272305, 3234.3, (3600.0, 1800.0)),
    "walker2d": Task("walker2d", "Walker2d-v5", 1.629008, 4592.3, (5000.0, 2500.0)),
}


def find_task(text: str) -> Task | None:
    """The task named anywhere in ``text``: 'hopper', 'Hopper-v5', 'mujoco/hopper/medium-v0',
    'hopper-medium-replay-v2', a file path... ``None`` when no supported task is named."""
    low = text.lower()
    for name, task in TASKS.items():
        if re.search(rf"(^|[^a-z]){name}([^a-z]|$)", low):
            return task
    return None


def get_task(text: str) -> Task:
    task = find_task(text)
    if task is None:
        raise ValueError(f"unknown task {text!r}: supported tasks are {', '.join(TASKS)} "
                         f"({', '.join(t.gym_id for t in TASKS.values())}).")
    return task


def make_vector_env(task: Task, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of the task in one in-process vector env that resets an episode's env in
    the step that ends it (for recording datasets; evaluation uses ``Episodes``)."""
    return gym.vector.SyncVectorEnv([lambda: task.make() for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def _step_envs(envs: list[gym.Env], actions: np.ndarray, alive: np.ndarray):
    """Step the ``alive`` ones of ``envs``; the others report zeros (observations, rewards, ends)."""
    obs = np.zeros((len(envs), *envs[0].observation_space.shape))
    rewards, terms, truncs = np.zeros(len(envs)), np.zeros(len(envs), bool), np.zeros(len(envs), bool)
    for i in np.flatnonzero(alive):
        obs[i], rewards[i], terms[i], truncs[i], _ = envs[i].step(actions[i])
    return obs, rewards, terms, truncs


def _worker(conn, task: Task, count: int) -> None:
    envs = [task.make() for _ in range(count)]
    while True:
        command, payload = conn.recv()
        if command == "reset":
            conn.send(np.stack([env.reset(seed=s)[0] for env, s in zip(envs, payload)]))
        elif command == "step":
            conn.send(_step_envs(envs, *payload))
        else:
            for env in envs:
                env.close()
            conn.close()
            return


class Episodes:
    """``num_envs`` environments of a task that each run one episode, split into ``workers`` groups
    stepped at the same time in worker processes (each group one env after another); ``workers`` <= 1
    steps them all in this process. Gymnasium's AsyncVectorEnv would start one process per
    environment, hundreds for an ensemble's evaluation."""

    def __init__(self, task: Task, num_envs: int, workers: int = 1):
        self.num_envs, self.workers = num_envs, max(1, min(workers, num_envs))
        bounds = np.linspace(0, num_envs, self.workers + 1).round().astype(int)
        self.slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        probe = task.make()
        self.observation_shape, self.action_shape = probe.observation_space.shape, probe.action_space.shape
        probe.close()
        if self.workers == 1:
            self.envs = [task.make() for _ in range(num_envs)]
            return
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        for s in self.slices:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, task, s.stop - s.start), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent); self.procs.append(proc)

    def reset(self, seeds: list[int]) -> np.ndarray:
        """Start every episode, environment i with seed ``seeds[i]``; their first observations (n, obs)."""
        if self.workers == 1:
            return np.stack([env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)])
        for conn, s in zip(self.conns, self.slices):
            conn.send(("reset", seeds[s]))
        return np.concatenate([conn.recv() for conn in self.conns])

    def step(self, actions: np.ndarray, alive: np.ndarray):
        """Step the environments whose episode is ``alive``: observations, rewards, terminated, truncated
        (zeros for the others)."""
        if self.workers == 1:
            return _step_envs(self.envs, actions, alive)
        for conn, s in zip(self.conns, self.slices):
            conn.send(("step", (actions[s], alive[s])))
        parts = [conn.recv() for conn in self.conns]
        return tuple(np.concatenate(x) for x in zip(*parts))

    def close(self) -> None:
        if self.workers == 1:
            for env in self.envs:
                env.close()
            return
        for conn, proc in zip(self.conns, self.procs):
            conn.send(("close", None))
            proc.join()
