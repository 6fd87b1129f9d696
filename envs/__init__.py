"""The supported MuJoCo tasks: Gymnasium ids, D4RL reference scores, target returns, env factories.

Reference scores are D4RL's (random and expert policy returns), used for the normalised score
``100 * (return - ref_min) / (ref_max - ref_min)`` (SPEC §5).
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import gymnasium as gym
import mujoco


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


def make_vector_env(task: Task, num_envs: int, asynchronous: bool = False) -> gym.vector.VectorEnv:
    """``num_envs`` copies of the task in one vector env; episodes are not auto-reset
    (``autoreset_mode=DISABLED``-like use: callers run each copy for exactly one episode)."""
    fns = [lambda: task.make() for _ in range(num_envs)]
    cls = gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    return cls(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
