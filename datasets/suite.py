"""The offline suite: D4RL-style Minari datasets ``dt-primal/<env>/<level>-v<N>`` built on this
machine from committed behaviour policies (the D4RL recipe, docs/method.md, "Datasets").

random = uniform actions; medium = the policy first reaching about a third of expert score;
medium-replay = every transition its learner collected until then; expert = the learner's policy
once it measures at least its version's target over 100 episodes (``EXPERT_TARGETS``; or the best
of a run that ended below it); medium-expert = medium + expert. Each task's levels have versions
(``VERSIONS``: the newest is built by default, older ones by their id): medium-vN and medium-replay-vN
come from learner N, expert-vN from the expert of version N, medium-expert-vN from the parts
``MEDIUM_EXPERT`` names. Episodes end on termination or at 1000 steps. ``steps`` scales every level
down (tests use tiny builds).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import torch

from datasets.behaviour import (
    ALGOS,
    EXPERT_EPISODES,
    EXPERT_TARGETS,
    EXPERT_VERSION,
    MEDIUM_SCORE,
    POLICY_DIR,
    GaussianActor,
    expert_file,
    learner_suffix,
)
from datasets.rollout import Keyed, collect_rows, merge
from datasets.transitions import HALF, load_transitions
from dt_primal.errors import UserError
from dt_primal.files.writing import write_file
from dt_primal.process import exit_with_parent
from envs import TASKS, Task

SUITE_NAMESPACE = "dt-primal"
LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert")
# each task's newest version of each level; a version's files are committed under datasets/policies/<env>/
VERSIONS = {
    "random": {"halfcheetah": 0, "hopper": 0, "walker2d": 0},
    "medium": {"halfcheetah": 1, "hopper": 2, "walker2d": 1},
    "medium-replay": {"halfcheetah": 1, "hopper": 2, "walker2d": 1},
    "expert": {"halfcheetah": EXPERT_VERSION, "hopper": EXPERT_VERSION, "walker2d": EXPERT_VERSION},
    "medium-expert": {"halfcheetah": 2, "hopper": 3, "walker2d": 2},
}
# medium-expert-vN: the versions of its medium and its expert
MEDIUM_EXPERT = {0: (0, 0), 1: (0, 1), 2: (1, 1), 3: (2, 1)}
FULL_STEPS = 1_000_000
ROLLOUT_PARTS = 2  # fixed, so that a seed gives the same rollout seeds on any machine
PART_ENVS = 32  # envs batched in a part; they may run in several processes (the same data)
ROLLOUT_LEVELS = ("random", "medium", "expert")  # the levels built by rolling a policy out (the others: seconds)
RECIPES = {
    "random": "{steps} steps of uniformly random actions.",
    "medium": "{steps} steps of the stochastic {algo} policy exported the first time its "
    "learner reached a normalised score of {medium}, about a third of an expert's return.",
    "medium-replay": "Every transition the {algo} learner collected (its replay buffer, from its first random "
    "episodes) until it first reached medium level{subsample}.",
    "expert": "{steps} steps of the stochastic {algo} policy exported at an evaluation of its learner, promoted to "
    "expert when it measured at least {expert} normalised over {expert_episodes} episodes (or the best "
    "export of a run that ended below that).",
    "medium-expert": "The episodes of medium-v{medium_version} followed by those of expert-v{expert_version} (built "
    "with the same steps and seed).",
}


def suite_id(env: str, level: str, version: int | None = None) -> str:
    """The id of a suite dataset; ``version`` None: the level's newest for ``env``."""
    return f"{SUITE_NAMESPACE}/{env}/{level}-v{VERSIONS[level][env] if version is None else version}"


def parse_suite_id(dataset_id: str) -> tuple[Task, str, int]:
    m = re.fullmatch(rf"{SUITE_NAMESPACE}/([a-z0-9]+)/([a-z-]+)-v([0-9]+)", dataset_id)
    if (
        not m
        or m.group(1) not in TASKS
        or m.group(2) not in LEVELS
        or int(m.group(3)) > VERSIONS[m.group(2)][m.group(1)]
    ):
        raise UserError(
            f"Unknown suite dataset {dataset_id!r}: suite ids are {SUITE_NAMESPACE}/<env>/<level>-v<N> with "
            f"env in {', '.join(TASKS)}, level in {', '.join(LEVELS)} and N at most the newest version: "
            f"{versions_text()}."
        )
    return TASKS[m.group(1)], m.group(2), int(m.group(3))


def versions_text() -> str:
    """Each level's newest versions, per task where they differ (for messages and help)."""
    newest = lambda level: sorted(set(VERSIONS[level].values()))
    return "; ".join(
        f"{level} -v{newest(level)[0]}"
        if len(newest(level)) == 1
        else f"{level} " + ", ".join(f"{env} -v{v}" for env, v in VERSIONS[level].items())
        for level in LEVELS
    )


def source_files(level: str, version: int) -> list[str]:
    """The committed files (under datasets/policies/<env>/) a suite dataset of ``level`` and ``version`` is
    made from; a medium-expert's are its parts'."""
    if level == "medium":
        return [f"medium{learner_suffix(version)}.pt"]
    if level == "medium-replay":
        return [f"medium_replay{learner_suffix(version)}.npz", f"medium{learner_suffix(version)}.pt"]
    if level == "expert":
        return [expert_file(version)]
    if level == "medium-expert":
        medium, expert = MEDIUM_EXPERT[version]
        return source_files("medium", medium) + source_files("expert", expert)
    return []


def policy_file(task: Task, name: str) -> Path:
    """A committed file of ``task``'s behaviour learners; one that is missing is named with what to do."""
    path = POLICY_DIR / task.name / name
    if path.exists():
        return path
    newest = {f for level in LEVELS for f in source_files(level, VERSIONS[level][task.name])}
    if name not in newest:  # an older version's file, no longer in the tree
        rel = f"datasets/policies/{task.name}/{name}"
        raise UserError(
            f"{path} is missing: it belongs to an older version, which left the tree. In a clone of the repository, "
            f"restore it from the commit before the one that removed it: `git show $(git log -1 --format=%h -- "
            f"{rel})~1:{rel} > {rel}`."
        )
    raise UserError(
        f"{path} is missing: the {task.name} behaviour learner has not exported it yet. Train it with "
        f"`python -m datasets train-policy --env {task.name}` (hours of CPU; it resumes), or use the "
        f"random level, which needs no policy."
    )


def missing_policy(dataset_id: str) -> str | None:
    """What a suite dataset that is not built here needs and the tree lacks (a learner has not exported it yet,
    or an older version's file left the tree), or None."""
    task, level, version = parse_suite_id(dataset_id)
    if is_built(dataset_id):
        return None
    missing = [f for f in source_files(level, version) if not (POLICY_DIR / task.name / f).exists()]
    return f"datasets/policies/{task.name}/{missing[0]} is not in this checkout" if missing else None


def buildable(dataset_ids: list[str]) -> list[str]:
    """``dataset_ids`` less the suite datasets this tree cannot build yet, each named (``missing_policy``)."""
    why = {d: missing_policy(d) for d in dataset_ids}
    for d in dataset_ids:
        if why[d]:
            print(f"left out: {d} ({why[d]}; docs/datasets.md)", flush=True)
    return [d for d in dataset_ids if not why[d]]


def _rollout_part(task_name: str, policy: str | None, steps: int, seed: int, rows: list[int], progress: bool) -> Keyed:
    """The envs ``rows`` of a part: ``steps`` transitions of uniform random actions (``policy`` None) or of a
    committed policy, ``PART_ENVS`` envs batched (``collect_rows``)."""
    torch.set_num_threads(1)
    task = TASKS[task_name]
    if policy is None:
        rng = np.random.default_rng(seed)
        act_dim = task.make().action_space.shape[0]
        act = lambda o: rng.uniform(-1, 1, (len(o), act_dim)).astype(np.float32)
    else:
        actor, _ = GaussianActor.load(policy_file(task, policy))
        gen = torch.Generator().manual_seed(seed)
        act = lambda o: actor.act(o, gen)
    return collect_rows(task, act, rows, num_steps=steps, seed=seed, num_envs=PART_ENVS, progress=progress)


def _quiet_ctrl_c() -> None:
    """In a rollout worker: Ctrl-C ends it without a traceback (the parent says once that the build stopped), and
    so does its parent's end, killed or not (``exit_with_parent``)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    exit_with_parent()


def rollout_processes(jobs: int = 1) -> int:
    """Rollout processes per dataset when ``jobs`` datasets are built at once: this machine's cores shared."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def rollouts(task: Task, policy: str | None, steps: int, seed: int, processes: int | None = None) -> list[dict]:
    """``steps`` transitions in ``ROLLOUT_PARTS`` parts with seeds seed·P + k, each part's envs split over
    ``processes`` worker processes (default: every core, when there are 50k steps or more; starting one costs
    seconds). The same data however many processes (``collect_rows``)."""
    if processes is None:
        processes = rollout_processes() if steps >= 50_000 else 1
    sizes = {k: steps // ROLLOUT_PARTS + (k < steps % ROLLOUT_PARTS) for k in range(ROLLOUT_PARTS)}
    parts = [k for k, n in sizes.items() if n > 0]
    shards = max(1, min(PART_ENVS, processes // len(parts)))
    jobs = [(k, list(range(min(PART_ENVS, sizes[k])))[i::shards]) for k in parts for i in range(shards)]
    jobs = [(k, rows) for k, rows in jobs if rows]
    args = [(task.name, policy, sizes[k], seed * ROLLOUT_PARTS + k, rows, j == 0) for j, (k, rows) in enumerate(jobs)]
    if processes == 1:
        done = [_rollout_part(*a) for a in args]
    else:
        with ProcessPoolExecutor(
            min(processes, len(jobs)), mp_context=multiprocessing.get_context("spawn"), initializer=_quiet_ctrl_c
        ) as pool:
            done = list(pool.map(_rollout_part, *zip(*args)))
    return [ep for k in parts for ep in merge([d for (part, _), d in zip(jobs, done) if part == k])]


def _replay_episodes(task: Task, version: int, steps: int) -> tuple[list[dict], int]:
    """The transitions of learner ``version`` until medium level, as episodes (arrays stored at half precision
    as float32); when ``steps`` is below their total, whole episodes evenly spread over the learner's history,
    so it still runs from the first episodes to medium level."""
    z = load_transitions(policy_file(task, source_files("medium-replay", version)[0]))
    for key in HALF:
        z[key] = z[key].astype(np.float32)
    ends = np.cumsum(z["lengths"])
    starts = ends - z["lengths"]
    eps = [
        dict(
            observations=np.concatenate([z["observations"][s:e], z["final_observations"][i : i + 1]]),
            actions=z["actions"][s:e],
            rewards=z["rewards"][s:e],
            terminations=z["terminations"][s:e],
            truncations=z["truncations"][s:e],
        )
        for i, (s, e) in enumerate(zip(starts, ends))
    ]
    total = int(ends[-1])
    if steps < total:
        eps = [eps[i] for i in _spread(z["lengths"], steps)]
    return eps, total


def _spread(lengths: np.ndarray, steps: int) -> np.ndarray:
    """Indices of the fewest evenly spread episodes (first and last included) holding >= steps."""
    pick = lambda k: np.unique(np.linspace(0, len(lengths) - 1, k).round().astype(int))
    lo, hi = 1, len(lengths)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if lengths[pick(mid)].sum() >= steps else (mid + 1, hi)
    return pick(lo)


def _write(dataset_id: str, task: Task, episodes: list[dict], algorithm: str, description: str) -> None:
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = [
        EpisodeBuffer(
            id=i,
            observations=ep["observations"],
            actions=ep["actions"],
            rewards=ep["rewards"].tolist(),
            terminations=ep["terminations"].tolist(),
            truncations=ep["truncations"].tolist(),
        )
        for i, ep in enumerate(episodes)
    ]
    shutil.rmtree(dataset_dir(dataset_id), ignore_errors=True)  # an older or half-written build
    with warnings.catch_warnings():  # Minari asks for an author e-mail; a built dataset has none
        warnings.filterwarnings("ignore", message=".*author_email.*")
        minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            env=task.gym_id,
            eval_env=task.gym_id,
            algorithm_name=algorithm,
            author="dt-primal",
            code_permalink="datasets/suite.py",
            ref_min_score=task.ref_min,
            ref_max_score=task.ref_max,
            description=description,
        )


class BuildInterrupted(KeyboardInterrupt):
    """Ctrl-C while a suite dataset was being built: its message says what became of the build."""

    def __init__(self, dataset_id: str):
        super().__init__(
            f"while building {dataset_id}; the partly built dataset does not count, so the next run "
            f"that needs it builds it again from the start"
        )


def build(
    task: Task,
    level: str,
    steps: int = FULL_STEPS,
    seed: int = 0,
    version: int | None = None,
    processes: int | None = None,
) -> str:
    """Build ``dt-primal/<env>/<level>-v<version>`` (default: the level's newest version; replacing an
    existing one); returns its id. One process at a time builds a dataset (``build_lock``): a run that
    needs it meanwhile waits for it instead of building it again. Ctrl-C or a rollout worker that dies
    stop it with one message; a build that did not finish does not count."""
    dataset_id = suite_id(task.name, level, version)
    with build_lock(dataset_id):
        return _build_now(task, level, dataset_id, steps, seed, processes)


@contextlib.contextmanager
def build_lock(dataset_id: str):
    """Held while ``dataset_id`` is built: an exclusive ``flock``, released when the process ends, however."""
    folder = dataset_dir(dataset_id)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.build-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build_now(task: Task, level: str, dataset_id: str, steps: int, seed: int, processes: int | None) -> str:
    _, _, version = parse_suite_id(dataset_id)
    if steps < 1:
        raise UserError(f"--steps must be at least 1 (got {steps}).")
    try:
        return _build(task, level, version, dataset_id, steps, seed, processes)
    except KeyboardInterrupt:
        raise BuildInterrupted(dataset_id) from None
    except BrokenProcessPool as exc:  # a worker was killed: Ctrl-C reached it first, or it ran out of memory
        raise UserError(
            f"Building {dataset_id} stopped: a worker process ended abruptly ({exc}), as Ctrl-C or "
            f"running out of memory does. Nothing of the build is kept; run the same command again "
            f"to build it from the start (python -m datasets build --env {task.name} --level {level} "
            f"--version {version} builds it alone)."
        ) from None


def build_id(
    dataset_id: str, steps: int = FULL_STEPS, seed: int = 0, missing: bool = False, processes: int | None = None
) -> str:
    """Build (or replace) the suite dataset ``dataset_id``; with ``missing``, only if it is not built yet;
    ``processes``: its rollout's (``rollouts``)."""
    if missing:
        return build_if_missing(dataset_id, steps, seed, processes)
    task, level, version = parse_suite_id(dataset_id)
    return build(task, level, steps=steps, seed=seed, version=version, processes=processes)


def build_at_once(
    dataset_ids: list[str], jobs: int, steps: int = FULL_STEPS, seed: int = 0, missing=False, processes=None
) -> None:
    """Build (or replace; with ``missing``, only where not built yet) the suite datasets ``dataset_ids``, ``jobs``
    at once, each in a child process (``python -m datasets build``) whose rollout runs in ``processes``
    processes (default: the cores shared by the rollouts running at once): the same datasets as one by one.
    A medium-expert dataset's parts are built first where missing, then it is combined here."""
    parsed = {d: parse_suite_id(d) for d in dataset_ids}  # (task, level, version)
    combined = [d for d, (_, level, _) in parsed.items() if level == "medium-expert"]
    parts = [
        suite_id(parsed[d][0].name, level, v)
        for d in combined
        for level, v in zip(("medium", "expert"), MEDIUM_EXPERT[parsed[d][2]])
    ]
    first = list(dict.fromkeys([d for d in dataset_ids if d not in combined] + [d for d in parts if not is_built(d)]))
    rolled = sum(parse_suite_id(d)[1] in ROLLOUT_LEVELS for d in first)
    processes = processes or rollout_processes(min(max(1, jobs), max(1, rolled)))

    def child(dataset_id: str) -> tuple[str, subprocess.CompletedProcess]:
        argv = ["--dataset", dataset_id, "--steps", str(steps), "--seed", str(seed), "--processes", str(processes)]
        argv += ["--missing"] * missing
        return dataset_id, subprocess.run(
            [sys.executable, "-m", "datasets", "build", *argv],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )

    with ThreadPoolExecutor(max(1, jobs)) as pool:  # each reported as soon as it is built
        for done in as_completed([pool.submit(child, d) for d in first]):
            dataset_id, res = done.result()
            lines = (res.stdout + res.stderr).strip().splitlines()
            if res.returncode:
                raise UserError(f"Building {dataset_id} failed (exit {res.returncode}):\n" + "\n".join(lines[-5:]))
            print(
                next((line for line in reversed(lines) if line.startswith("built ")), f"built {dataset_id}"), flush=True
            )
    for dataset_id in combined:
        build_id(dataset_id, steps, seed, missing, processes)


def _collect(task: Task, level: str, version: int, steps: int, seed: int, processes) -> tuple[list[dict], str, str]:
    """The episodes of a suite dataset, the algorithm that made them and its description's recipe and seeds."""
    rollout_seeds = (
        f"rollout seeds {', '.join(str(seed * ROLLOUT_PARTS + k) for k in range(ROLLOUT_PARTS))} (one per half)"
    )
    if level == "random":
        recipe = RECIPES[level].format(steps=steps)
        return (
            rollouts(task, None, steps, seed, processes),
            "uniform random actions",
            f"{recipe} Seeds: {rollout_seeds}.",
        )
    if level == "medium-expert":
        medium, expert = MEDIUM_EXPERT[version]
        for name in source_files(level, version):  # before building either part: a missing file stops here
            policy_file(task, name)
        episodes = []
        for part, part_version in (("medium", medium), ("expert", expert)):
            part_id = build_if_missing(suite_id(task.name, part, part_version), steps, seed, processes)
            episodes += _minari_episodes(part_id)
        recipe = RECIPES[level].format(medium_version=medium, expert_version=expert)
        return episodes, f"medium-v{medium} + expert-v{expert}", f"{recipe} Seeds: {rollout_seeds} for both parts."
    policy = source_files(level, version)[-1]  # medium-replay's policy: the medium one its learner exported
    meta = GaussianActor.load(policy_file(task, policy))[1]
    algo = f"{meta.get('algo', ALGOS[task.name])} (stable-baselines3)"
    medium = medium_score(task, version) if level != "expert" else None
    fmt = dict(steps=steps, algo=algo, medium=medium, expert_episodes=EXPERT_EPISODES)
    seeds = f"learner seed {meta['train_seed']}"
    if level == "medium-replay":
        episodes, total = _replay_episodes(task, version, steps)
        subsample = (
            f" (scaled down: whole episodes spread evenly over the {total} transitions)" if steps < total else ""
        )
        recipe = RECIPES[level].format(**fmt, subsample=subsample)
        return episodes, f"{algo} replay buffer, learner steps 0-{meta['step']}", f"{recipe} Seeds: {seeds}."
    expert = f"{EXPERT_TARGETS[version][task.name]:g}" if level == "expert" else ""
    recipe = RECIPES[level].format(**fmt, expert=expert)
    episodes = rollouts(task, policy, steps, seed, processes)
    return (
        episodes,
        f"{algo}, policy exported at learner step {meta['step']}",
        f"{recipe} Seeds: {seeds}, {rollout_seeds}.",
    )


def medium_score(task: Task, version: int) -> float:
    """The score at which learner ``version`` of ``task`` exported its medium policy (its ``learner.json``)."""
    path = POLICY_DIR / task.name / f"learner{learner_suffix(version)}.json"
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):  # the first learners' lack it
        return float(json.loads(path.read_text())["medium_score"])
    return MEDIUM_SCORE


def _build(task: Task, level: str, version: int, dataset_id: str, steps: int, seed: int, processes: int | None) -> str:
    t0 = time.time()
    episodes, algorithm, recipe = _collect(task, level, version, steps, seed, processes)
    description = (
        f"D4RL-style {task.name} {level} dataset on {task.gym_id}. {recipe} Built by dt-primal's `python -m datasets "
        f"build --env {task.name} --level {level} --version {version} --steps {steps} --seed {seed}`."
    )
    collected = time.time()
    _write(dataset_id, task, episodes, algorithm, description)
    seconds = time.time() - t0
    record = json.dumps(
        {
            "seconds": seconds,
            "write_seconds": seconds - (collected - t0),
            "steps": steps,
            "seed": seed,
            "load_average": os.getloadavg()[0],
        }
    )
    write_file(dataset_dir(dataset_id) / "build.json", record, "The build record")
    print(
        f"built {dataset_id}: {len(episodes)} episodes, {sum(len(e['actions']) for e in episodes)} steps in "
        f"{seconds:.0f} s "
        f"({seconds - (collected - t0):.0f} s of it writing the Minari files)"
    )
    return dataset_id


def dataset_dir(dataset_id: str) -> Path:
    from minari.storage.datasets_root_dir import get_dataset_path

    return Path(get_dataset_path(dataset_id))


def _minari_episodes(dataset_id: str) -> list[dict]:
    import minari

    return [
        dict(
            observations=ep.observations,
            actions=ep.actions,
            rewards=ep.rewards,
            terminations=ep.terminations,
            truncations=ep.truncations,
        )
        for ep in minari.load_dataset(dataset_id).iterate_episodes()
    ]


def is_built(dataset_id: str) -> bool:
    """``build.json`` is written last: a build that was interrupted does not count."""
    return (dataset_dir(dataset_id) / "build.json").exists()


def build_if_missing(dataset_id: str, steps: int = FULL_STEPS, seed: int = 0, processes: int | None = None) -> str:
    """Build a suite dataset unless it is built; processes asking for the same one at once (the groups
    of a sweep) wait for the one that builds it."""
    task, level, _ = parse_suite_id(dataset_id)
    if is_built(dataset_id):
        return dataset_id
    with build_lock(dataset_id):
        if not is_built(dataset_id):
            print(f"{dataset_id} is not built yet: building it now (once).")
            _build_now(task, level, dataset_id, steps, seed, processes)
    return dataset_id
