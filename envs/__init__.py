"""Tasks: a Gymnasium environment (any registered id, or exactly the one a dataset was recorded in),
its reference scores and its target returns; env factories.

Reference scores (random and expert policy returns) give the normalised score
``100 * (return - ref_min) / (ref_max - ref_min)`` (docs/method.md, "Normalisation"). The three D4RL
tasks (``TASKS``) have aliases, D4RL's reference scores and default targets; any other task has what
its dataset says.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import multiprocessing
import os
import re
import sys
import warnings
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec


def _import_mujoco():
    """MuJoCo, which sets up OpenGL for ``MUJOCO_GL`` as it loads: a value it refuses, or a backend whose library
    this machine lacks, would stop every command here. That becomes a note, and MuJoCo loads with rendering off
    (``MUJOCO_GL=disable``): training and evaluation go on, and ``--video`` writes nothing."""
    try:
        import mujoco
    except (RuntimeError, ImportError, AttributeError, OSError) as exc:
        chosen = os.environ.get("MUJOCO_GL")
        if not chosen:
            raise
        print(
            f"note: MUJOCO_GL={chosen} cannot be used here ({type(exc).__name__}: {str(exc)[:120]}); MuJoCo runs "
            "without rendering, so no video is written. Unset MUJOCO_GL, or set it to egl or osmesa.",
            file=sys.stderr,
        )
        for name in [m for m in sys.modules if m == "mujoco" or m.startswith("mujoco.")]:
            del sys.modules[name]
        os.environ["MUJOCO_GL"] = "disable"
        import mujoco
    return mujoco


mujoco = _import_mujoco()


def _mujoco_warning(message: str) -> None:
    if "settotalmass" not in message:
        warnings.warn(f"MuJoCo: {message.strip()}", RuntimeWarning, stacklevel=2)


def quiet_mujoco_warnings() -> None:
    """MuJoCo prints its warnings on stderr each time an env is made. Gymnasium's HalfCheetah model
    uses the deprecated 'settotalmass' attribute, which would repeat that line for every episode of an
    evaluation; it is harmless and dropped, and any other MuJoCo warning becomes a Python warning.
    Process-wide: the commands call it (``dt_primal.process.configure_process``), never an import."""
    mujoco.set_mju_user_warning(_mujoco_warning)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class ForeignEntryPoint(gym.error.Error, ValueError):
    """An environment id or EnvSpec from a file that would choose the code that builds its environment."""


# what a file's EnvSpec may pass to the environment's constructor: the numeric options and flags of Gymnasium's
# MuJoCo environments (weights, ranges, noise, frame skip, what the observation includes), never a file (xml_file),
# a camera or a renderer
ENV_OPTIONS = frozenset(
    {
        "frame_skip",
        "forward_reward_weight",
        "ctrl_cost_weight",
        "contact_cost_weight",
        "healthy_reward",
        "terminate_when_unhealthy",
        "healthy_state_range",
        "healthy_z_range",
        "healthy_angle_range",
        "contact_force_range",
        "contact_cost_range",
        "reset_noise_scale",
        "exclude_current_positions_from_observation",
        "use_contact_forces",
        "include_cfrc_ext_in_observation",
        "include_cinert_in_observation",
        "include_cvel_in_observation",
        "include_qfrc_actuator_in_observation",
        "reward_dist_weight",
        "reward_control_weight",
        "reward_near_weight",
        "render_mode",
    }
)
MAX_TIME_LIMIT = 100_000  # a file's time limit beyond this would let one evaluation episode run for hours


def check_id(gym_id: object) -> None:
    """An environment id from a file: a registered id, never ``module:id`` (``gym.make`` would import the
    module); ``gymnasium.error.Error`` for an id Gymnasium does not know."""
    if not isinstance(gym_id, str) or ":" in gym_id or not re.fullmatch(r"[\w./-]{1,200}", gym_id):
        raise ForeignEntryPoint(
            f"the environment id {str(gym_id)[:80]!r} is not a registered Gymnasium id (an id "
            f"with 'module:' would make Gymnasium import that module); a file may not choose "
            f"code to run, so it is refused"
        )
    gym.spec(gym_id)


def _plain_option(value: object) -> bool:
    """A number, a flag, None, or a short list of numbers (a range)."""
    if isinstance(value, (list, tuple)):
        return len(value) <= 8 and all(isinstance(v, (int, float)) for v in value)
    return value is None or isinstance(value, (int, float, bool))


def check_spec(spec: str) -> None:
    """A JSON EnvSpec from a file (a dataset's metadata, a checkpoint's task) may set its environment's
    numeric options (``ENV_OPTIONS``) and time limit, never the code that builds it: its id is registered,
    its entry points are those Gymnasium registers for the id, and it adds no wrappers."""
    try:
        parsed = EnvSpec.from_json(spec)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ForeignEntryPoint(
            f"its environment spec is not a Gymnasium EnvSpec ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None
    check_id(parsed.id)
    registered = gym.spec(parsed.id)
    foreign = [
        str(e)
        for e in (parsed.entry_point, parsed.vector_entry_point)
        if e not in (registered.entry_point, registered.vector_entry_point)
    ]
    foreign += [str(w.entry_point) for w in parsed.additional_wrappers]
    if foreign:
        raise ForeignEntryPoint(
            f"its environment spec names the code {', '.join(foreign)[:200]} to build "
            f"{parsed.id}, where Gymnasium registers {registered.entry_point} and no wrappers; a "
            f"file may not choose code to run, so it is refused"
        )
    options = parsed.kwargs if isinstance(parsed.kwargs, dict) else {"(not a dict)": parsed.kwargs}
    odd = [
        k
        for k, v in options.items()
        if k not in ENV_OPTIONS or not _plain_option(v) or (k == "render_mode" and v is not None)
    ]
    if odd:
        raise ForeignEntryPoint(
            f"its environment spec passes {', '.join(map(str, odd))[:200]} to {parsed.id}'s "
            f"constructor, where a file may set only numeric options (a file name, for one, would "
            f"make this machine open a file the sender chose), so it is refused"
        )
    limit = parsed.max_episode_steps
    if limit is not None and not (isinstance(limit, int) and 0 < limit <= MAX_TIME_LIMIT):
        raise ForeignEntryPoint(
            f"its environment spec sets the time limit {str(limit)[:40]}, where 1 to "
            f"{MAX_TIME_LIMIT} steps are admitted"
        )


@dataclass(frozen=True)
class Task:
    name: str  # a D4RL task's alias (hopper), else the Gymnasium id
    gym_id: str
    ref_min: float | None = None  # None: no reference scores, so no normalised score
    ref_max: float | None = None
    targets: tuple[float, ...] = ()  # return-to-go conditioning targets, highest first; () until known
    spec: str | None = None  # the environment as a JSON EnvSpec (a dataset's: kwargs, time limit); None: the id's

    def __post_init__(self):
        check_id(self.gym_id)
        refs = (self.ref_min, self.ref_max)
        if refs != (None, None) and not (all(_finite(r) for r in refs) and refs[0] != refs[1]):
            raise ValueError(f"the reference returns {refs} cannot normalise a score (they must be finite and differ)")
        if not (isinstance(self.targets, tuple) and all(_finite(t) for t in self.targets)):
            raise ValueError(f"the targets {str(self.targets)[:80]} are not finite returns")
        if self.spec is not None:
            check_spec(self.spec)

    def normalize(self, returns):
        """D4RL normalised score (docs/method.md, "Normalisation") of floats or numpy arrays; None without reference
        scores."""
        if self.ref_min is None or self.ref_max is None:
            return None
        return 100.0 * (returns - self.ref_min) / (self.ref_max - self.ref_min)

    def make(self, **kwargs) -> gym.Env:
        return gym.make(EnvSpec.from_json(self.spec) if self.spec else self.gym_id, **kwargs)

    def limits(self) -> TaskLimits:
        """The sizes, action bounds and time limit of the task's environment, made once per process to read
        them (``_limits``). A ValueError where it cannot be made or its spaces are not flat boxes."""
        return _limits(self)

    @property
    def time_limit(self) -> int | None:
        """Steps after which the environment ends an episode (None: never)."""
        return (EnvSpec.from_json(self.spec) if self.spec else gym.spec(self.gym_id)).max_episode_steps

    @classmethod
    def from_record(cls, record: str | dict) -> Task:
        """The task a checkpoint stores: ``dataclasses.asdict(task)``, or a D4RL alias (older checkpoints)."""
        if isinstance(record, str):
            return get_task(record)
        return cls(**{**record, "targets": tuple(record["targets"])})


@dataclass(frozen=True)
class TaskLimits:
    obs_dim: int
    low: np.ndarray  # (act_dim,) action bounds
    high: np.ndarray
    time_limit: int  # steps after which the environment ends an episode


@functools.cache
def _limits(task: Task) -> TaskLimits:
    try:
        env = task.make()
    except Exception as exc:  # a missing package, bad kwargs in the dataset's EnvSpec, ...
        raise ValueError(
            f"Cannot make the environment {task.gym_id} ({type(exc).__name__}: {exc}); install what it needs, or "
            f"pass --env with another environment."
        ) from exc
    try:
        spaces = (env.observation_space, env.action_space)
        if not all(isinstance(space, gym.spaces.Box) and len(space.shape) == 1 for space in spaces):
            raise ValueError(
                f"{task.gym_id} has the observation space {spaces[0]} and the action space {spaces[1]}; a "
                f"Decision Transformer here needs vectors of real numbers for both (continuous control, as the "
                f"MuJoCo tasks)."
            )
        low, high = (np.asarray(bound, np.float64) for bound in (spaces[1].low, spaces[1].high))
        return TaskLimits(spaces[0].shape[0], low, high, int(env.spec.max_episode_steps or 1000))
    finally:
        env.close()


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
        raise ValueError(
            f"unknown task {text!r}: supported tasks are {', '.join(TASKS)} "
            f"({', '.join(t.gym_id for t in TASKS.values())})."
        )
    return task


def task_for(env: str, spec: str | None = None) -> Task:
    """The task of ``env``, a D4RL alias (hopper: Hopper-v5) or any registered Gymnasium id, in the
    environment ``spec`` describes when given (a dataset's EnvSpec as JSON: its id, kwargs and time
    limit). HalfCheetah, Hopper and Walker2d keep their alias, D4RL reference scores and targets in
    every version. Raises gymnasium.error.Error for an id Gymnasium does not know."""
    if spec is None and env.lower() in TASKS:
        return TASKS[env.lower()]
    gym_id = json.loads(spec)["id"] if spec else env
    if spec is None:
        gym.spec(gym_id)
    d4rl = find_task(gym_id)
    if d4rl is None:
        return Task(gym_id, gym_id, spec=spec)
    return dataclasses.replace(d4rl, gym_id=gym_id, spec=spec)


def derived_targets(returns: np.ndarray) -> tuple[float, ...]:
    """Targets for a task without defaults, from its dataset's episode returns: the best one and the
    middle of their range (halfway between the worst and the best), to 4 significant digits."""
    best, middle = (float(f"{x:.4g}") for x in (returns.max(), (returns.max() + returns.min()) / 2))
    return (best, middle) if middle < best else (best,)


def make_vector_env(task: Task, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of the task in one in-process vector env that resets an episode's env in
    the step that ends it (for recording datasets; evaluation uses ``Episodes``)."""
    return gym.vector.SyncVectorEnv(
        [lambda: task.make() for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def _step_envs(envs: list[gym.Env], actions: np.ndarray, alive: np.ndarray):
    """Step the ``alive`` ones of ``envs``; the others report zeros (observations, rewards, ends)."""
    obs = np.zeros((len(envs), *envs[0].observation_space.shape))
    rewards, terms, truncs = np.zeros(len(envs)), np.zeros(len(envs), bool), np.zeros(len(envs), bool)
    for i in np.flatnonzero(alive):
        obs[i], rewards[i], terms[i], truncs[i], _ = envs[i].step(actions[i])
    return obs, rewards, terms, truncs


def _worker(conn, tasks: list[Task]) -> None:
    envs = [task.make() for task in tasks]
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
    """``num_envs`` environments of a task (or of ``task[i]`` each, tasks with the same observation and
    action sizes) that each run one episode, split into ``workers`` groups stepped at the same time
    in worker processes (each group one env after another); ``workers`` <= 1 steps them all in this
    process. Gymnasium's AsyncVectorEnv would start one process per environment, hundreds for an
    ensemble's evaluation."""

    def __init__(self, task: Task | list[Task], num_envs: int, workers: int = 1):
        tasks = task if isinstance(task, list) else [task] * num_envs
        task = tasks[0]
        self.num_envs, self.workers = num_envs, max(1, min(workers, num_envs))
        bounds = np.linspace(0, num_envs, self.workers + 1).round().astype(int)
        self.slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        probe = task.make()
        self.observation_shape, self.action_shape = probe.observation_space.shape, probe.action_space.shape
        probe.close()
        if self.workers == 1:
            self.envs = [t.make() for t in tasks]
            return
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        for s in self.slices:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, tasks[s]), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

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
        self.send(actions, alive)
        return self.receive()

    def send(self, actions: np.ndarray, alive: np.ndarray) -> None:
        """``step``'s first half: the workers start stepping, and this process may do other work meanwhile
        (with ``workers`` 1 the stepping waits for ``receive``)."""
        if self.workers == 1:
            self.sent = actions, alive
            return
        for conn, s in zip(self.conns, self.slices):
            conn.send(("step", (actions[s], alive[s])))

    def receive(self):
        """``step``'s second half: what the step ``send`` started returns, once every worker has stepped."""
        if self.workers == 1:
            return _step_envs(self.envs, *self.sent)
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
