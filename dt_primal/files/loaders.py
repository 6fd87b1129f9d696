"""Read a dataset in a standard format into the one in-memory format (``Trajectories``):

- a Minari dataset id (``mujoco/hopper/medium-v0``), read from ``$MINARI_DATASETS_PATH``, downloaded
  with ``download``;
- a D4RL hdf5 file (keys ``observations, actions, rewards, terminals, timeouts``);
- a decision-transformer pickle (a list of trajectory dicts with ``observations, actions,
  rewards`` and ``terminals`` or ``dones``).

Every file is read as untrusted (``dt_primal.files``). A checkout's offline suite
(``dt-primal/<env>/<level>-v0``, built on first use) is read by ``datasets.loaders``, which builds the
dataset and then calls ``load_dataset`` here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from pathlib import Path

import gymnasium as gym
import numpy as np

from dt_primal.data import Trajectories, flags, numeric
from dt_primal.errors import UserError
from dt_primal.files import minari_arrow, minari_hdf5, pickles
from dt_primal.files.hdf5 import open_hdf5
from dt_primal.files.minari import is_local, open_minari
from dt_primal.files.reading import read_json
from envs import Task, derived_targets, find_task, task_for

D4RL_KEYS = ("observations", "actions", "rewards", "terminals")
MINARI_ID = re.compile(r"[\w.+-]{1,100}(/[\w.+-]{1,100}){0,4}")
HDF5_SUFFIXES, PICKLE_SUFFIXES = (".hdf5", ".h5"), (".pkl", ".pickle")


def load_dataset(
    spec: str,
    env: str | None = None,
    download: bool = False,
    *,
    build: bool = True,
    ref_scores: tuple[float, float] | None = None,
) -> Trajectories:
    """Trajectories from ``spec``, with ``.task`` the evaluation task (``evaluation_task``) and ``.env``
    its Gymnasium id. ``download``: fetch a hosted Minari dataset that is not local, unless ``build`` is
    off (in multi-process runs, where every process would fetch it at once). ``ref_scores``: the user's
    reference returns (--ref-min, --ref-max), finite and different, as ``Config.validate`` checks them."""
    if not spec.strip():
        raise UserError(
            "--dataset is empty. Give a Minari dataset id (in a checkout of dt-primal, one of its suite such "
            "as dt-primal/hopper/medium-v0), or the path of a D4RL .hdf5 or decision-transformer .pkl file."
        )
    path = Path(spec).expanduser()
    if path.is_dir() and _minari_id(path) != spec:
        raise UserError(_directory_message(spec, path))
    if path.suffix in HDF5_SUFFIXES + PICKLE_SUFFIXES or path.is_file():
        if not path.is_file():
            raise UserError(
                f"Dataset file {spec} does not exist. Give the path of a D4RL .hdf5 file, a "
                f"decision-transformer .pkl file, or a Minari dataset id such as mujoco/hopper/medium-v0."
            )
        if path.suffix in HDF5_SUFFIXES:
            data = load_d4rl_hdf5(path)
        elif path.suffix in PICKLE_SUFFIXES:
            data = load_pickle(path)
        else:
            raise UserError(
                f"Cannot tell the format of {spec}: use a .hdf5/.h5 (D4RL) or .pkl/.pickle "
                f"(decision-transformer) file, or a Minari dataset id."
            )
    else:
        data = load_minari(spec, download, build)
    data.task = evaluation_task(spec, env, data, ref_scores)
    data.env = data.task.gym_id
    return data


ENV_HINT = "a registered Gymnasium id such as InvertedPendulum-v5, or halfcheetah, hopper or walker2d"


def evaluation_task(spec: str, env: str | None, data: Trajectories, ref_scores: tuple[float, float] | None) -> Task:
    """The task to evaluate on: ``env``, else exactly the environment the dataset's metadata records,
    else a D4RL task named in ``spec`` (``hopper-medium-v2.hdf5``). Its reference scores:
    ``ref_scores``, else the metadata's, else D4RL's (halfcheetah, hopper, walker2d), else none. Its
    targets, for a task without defaults: ``derived_targets`` of the dataset's returns."""
    try:
        requested = task_for(env) if env else None
    except gym.error.Error as exc:
        raise UserError(f"--env {env} is not an environment Gymnasium knows ({exc}); give {ENV_HINT}.") from None
    try:
        recorded = task_for(data.env, data.env_spec) if data.env else None
    except gym.error.Error as exc:
        raise UserError(
            f"The dataset {spec} was recorded on {data.env}, which Gymnasium does not know here ({exc}). "
            f"Install the package that registers it, or pass --env with {ENV_HINT}."
        ) from None
    if requested is not None and recorded is not None and _family(requested) != _family(recorded):
        raise UserError(
            f"The dataset {spec} was recorded on {data.env} (its metadata says so), but --env {env} asks "
            f"for {requested.gym_id}: the policy would be trained on one robot and evaluated on another. "
            f"Leave --env out (the metadata's task is used), or give the dataset of {requested.name}."
        )
    if recorded is not None and (requested is None or requested.gym_id == recorded.gym_id):
        task = recorded
    else:
        task = requested or find_task(spec)
    if task is None:
        raise UserError(f"The dataset {spec} does not name the task it was recorded on; pass --env with {ENV_HINT}.")
    if ref_scores is None and data.ref_scores is not None:  # the user's are checked with the config (--ref-min)
        try:
            ref_scores = tuple(float(x) for x in data.ref_scores)
        except (TypeError, ValueError, OverflowError):
            ref_scores = (float("nan"), float("nan"))
        if not (np.isfinite(ref_scores).all() and ref_scores[0] != ref_scores[1]):
            raise UserError(
                f"The dataset {spec}'s metadata gives the reference returns ref_min_score "
                f"{str(data.ref_scores[0])[:40]} and ref_max_score {str(data.ref_scores[1])[:40]}, which cannot "
                f"normalise a score (they must be finite "
                f"and differ). Give --ref-min and --ref-max."
            )
    if ref_scores is not None:
        task = dataclasses.replace(task, ref_min=float(ref_scores[0]), ref_max=float(ref_scores[1]))
    if not task.targets:
        task = dataclasses.replace(task, targets=derived_targets(data.episode_returns()))
    return task


def _family(task: Task) -> str:
    """The environment without its version: hopper, invertedpendulum, ..."""
    return re.sub(r"-v[0-9]+$", "", task.name).lower()


def _minari_id(path: Path) -> str | None:
    """The dataset id of a Minari dataset folder (or of its ``data`` folder, or of a file in it)."""
    for meta in (path / "data" / "metadata.json", path / "metadata.json", path.parent / "metadata.json"):
        if meta.is_file():
            try:  # Minari's are a few kB: a larger one, or one that is not JSON, is not read
                dataset_id = read_json(meta, "The metadata", "").get("dataset_id")
            except (UserError, AttributeError):
                return None
            # an id as Minari writes them; anything else (shell syntax, escape codes) is never shown or suggested
            return dataset_id if isinstance(dataset_id, str) and MINARI_ID.fullmatch(dataset_id) else None
    return None


def _minari_hint(path: Path) -> str:
    """How to load the Minari dataset stored at ``path``; "" if it is not one."""
    dataset_id = _minari_id(path)
    if not dataset_id:
        return ""
    folder = path if (path / "data").is_dir() else path.parent if path.name == "data" else path.parent.parent
    root = folder
    for _ in dataset_id.split("/"):
        root = root.parent
    return (
        f" It is the Minari dataset {dataset_id}: give its id instead, with $MINARI_DATASETS_PATH pointing at the "
        f"folder that holds it (MINARI_DATASETS_PATH={shlex.quote(str(root))} and --dataset "
        f"{dataset_id})."
    )


def _directory_message(spec: str, path: Path) -> str:
    hint = _minari_hint(path)
    if not hint:
        found = sorted(str(f) for f in path.iterdir() if f.suffix in HDF5_SUFFIXES + PICKLE_SUFFIXES)[:5]
        hint = f" It holds {', '.join(found)}: give one of them." if found else ""
    return (
        f"--dataset {spec} is a directory, not a dataset file. Give the path of a D4RL .hdf5 file or a "
        f"decision-transformer .pkl file, or a Minari dataset id such as mujoco/hopper/medium-v0.{hint}"
    )


def load_minari(dataset_id: str, download: bool = False, build: bool = True) -> Trajectories:
    """A local Minari dataset, or a hosted one fetched when ``download`` (and ``build``: this process may)."""
    import minari
    from minari.storage.datasets_root_dir import get_dataset_path

    if not is_local(dataset_id):
        home = os.environ.get("MINARI_DATASETS_PATH", "~/.minari/datasets")
        if download and not build:
            raise UserError(
                f"{dataset_id} is not in {home} ($MINARI_DATASETS_PATH), and a multi-process (torchrun) run "
                f"does not download datasets. Download it first with minari download {dataset_id} (on every "
                f"node, unless the folder is shared), then start the run again."
            )
        if not download and _combine_hint(dataset_id):
            raise UserError(f"{dataset_id} is not a local Minari dataset.{_combine_hint(dataset_id)}")
        if not download:
            raise UserError(
                f"{dataset_id} is neither a dataset file nor a Minari dataset in {home} ($MINARI_DATASETS_PATH). "
                f"Pass --download to fetch a hosted Minari dataset (e.g. mujoco/hopper/medium-v0), or copy its "
                f"folder into {home}; give the path of a D4RL .hdf5 or decision-transformer .pkl file; or, in a "
                f"checkout of dt-primal, a dataset of its offline suite (dt-primal/<env>/<level>-v0, e.g. "
                f"dt-primal/hopper/medium-v0), built there on first use."
            )
    if download and not is_local(dataset_id):
        _check_hub()
    try:
        if download and not is_local(dataset_id):
            minari.download_dataset(dataset_id)
        where = f"The Minari dataset {dataset_id}"
        with open_minari(dataset_id) as (meta, hdf5):
            if hdf5 is not None:
                episodes = minari_hdf5.read_episodes(hdf5, meta, where)
            else:
                episodes = minari_arrow.read_episodes(get_dataset_path(dataset_id) / "data", meta, where)
    except UserError:
        raise
    except Exception as exc:  # unknown remote id, damaged or truncated files, no network
        raise UserError(
            f"Could not load Minari dataset {dataset_id} ({type(exc).__name__}: {str(exc)[:200]}). Check "
            f"the id (python -c 'import minari; print(minari.list_local_datasets())'), or download or "
            f"make the dataset again.{_combine_hint(dataset_id)}"
        ) from None
    spec = meta.get("env_spec")
    refs = (meta.get("ref_min_score"), meta.get("ref_max_score"))
    return Trajectories.from_episodes(
        episodes,
        env=spec and json.loads(spec)["id"],
        source=dataset_id,
        env_spec=spec,
        ref_scores=None if None in refs else refs,
    )


def _check_hub() -> None:
    """--download's requirement: Minari fetches hosted datasets (``MINARI_REMOTE``, by default its ``hf://`` one)
    through ``huggingface_hub``."""
    if not os.environ.get("MINARI_REMOTE", "hf://").startswith("hf://"):
        return
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise UserError(
            "--download fetches hosted Minari datasets through the Hugging Face hub, and huggingface_hub is not "
            'installed here: pip install "dt-primal[hf]" (or pip install huggingface_hub), then run again.'
        ) from None


def _combine_hint(dataset_id: str) -> str:
    """How to make a D4RL-style medium-expert that Minari's hosted MuJoCo datasets lack; "" for other ids."""
    m = re.fullmatch(r"(.+)/medium-expert-v[0-9]+", dataset_id)
    if not m:
        return ""
    parts = f"{m.group(1)}/medium-v0 {m.group(1)}/expert-v0"
    return (
        f" Minari's hosted MuJoCo datasets have no medium-expert level: make it from its parts with minari "
        f"download {parts}, then, in a checkout of dt-primal, python -m datasets combine {parts} --into {dataset_id}."
    )


def load_d4rl_hdf5(path: Path) -> Trajectories:
    try:
        with open_hdf5(path) as f:
            missing = [k for k in D4RL_KEYS if k not in f]
            if missing:
                hint = _minari_hint(path) if any(k.startswith("episode_") for k in f) else ""
                raise UserError(
                    f"{path} is not a D4RL dataset: it lacks the keys {', '.join(missing)} "
                    f"(needs {', '.join(D4RL_KEYS)} and optionally timeouts).{hint}"
                )
            arrays = {k: f[k][()] for k in D4RL_KEYS}
            timeouts = f["timeouts"][()] if "timeouts" in f else np.zeros_like(arrays["terminals"])
    except (OSError, KeyError, TypeError, ValueError, RuntimeError) as exc:  # truncated or not hdf5; a group
        raise UserError(
            f"Cannot read {path} as a D4RL hdf5 file ({exc}); the file may be truncated or not "
            f"in the D4RL layout. Download or convert it again."
        ) from exc
    for k, v in {**arrays, "timeouts": timeouts}.items():
        if np.ndim(v) == 0:
            raise UserError(
                f"{path}: '{k}' is a single value, not an array with one row per step. Convert the file again."
            )
    n = len(arrays["rewards"])
    for k, v in {**arrays, "timeouts": timeouts}.items():
        if len(v) != n:
            raise UserError(f"{path}: '{k}' has {len(v)} rows but 'rewards' has {n}; every key needs one row per step.")
        if k in ("rewards", "terminals", "timeouts") and np.size(v) != n:
            raise UserError(f"{path}: '{k}' has the shape {np.shape(v)}, where one value per step ({n},) belongs.")
    where = str(path)
    terminals = flags(arrays["terminals"], "'terminals'", where).reshape(-1)
    timeouts = flags(timeouts, "'timeouts'", where).reshape(-1)
    ends = np.flatnonzero(terminals | timeouts) + 1
    if n and (len(ends) == 0 or ends[-1] != n):
        ends = np.append(ends, n)  # a trailing unfinished episode
    lengths = np.diff(np.concatenate([[0], ends]))
    data = Trajectories(
        observations=numeric(arrays["observations"], "'observations'", where),
        actions=numeric(arrays["actions"], "'actions'", where),
        rewards=numeric(arrays["rewards"], "'rewards'", where).reshape(-1),
        lengths=lengths.astype(np.int64),
        terminals=terminals[ends - 1],
        source=str(path),
    )
    return data.validate()


def load_pickle(path: Path) -> Trajectories:
    trajs = pickles.load_pickle(path)  # plain data only: unpickling nothing else runs no code
    if not isinstance(trajs, (list, tuple)) or not all(isinstance(t, dict) for t in trajs):
        hint = (
            " It holds one dict of arrays, as a D4RL file does: write those arrays into an .hdf5 file (keys "
            f"{', '.join(D4RL_KEYS)}, timeouts) and give that."
            if isinstance(trajs, dict) and "observations" in trajs
            else ""
        )
        raise UserError(
            f"{path} must hold a list of trajectory dicts (decision-transformer format), "
            f"found {type(trajs).__name__}.{hint}"
        )
    episodes = []
    for i, t in enumerate(trajs):
        missing = [k for k in ("observations", "actions", "rewards") if k not in t]
        if missing:
            raise UserError(
                f"{path}: trajectory {i} lacks the keys {', '.join(missing)} "
                f"(each needs observations, actions, rewards and terminals or dones)."
            )
        ep = {k: numeric(t[k], f"'{k}' of trajectory {i}", str(path)) for k in ("observations", "actions", "rewards")}
        ep["terminals"] = flags(t.get("terminals", t.get("dones", False)), f"'terminals' of trajectory {i}", str(path))
        if (
            ep["observations"].ndim != 2
            or ep["actions"].ndim != 2
            or ep["rewards"].ndim != 1
            or len(ep["observations"]) < len(ep["actions"])
            or len(ep["rewards"]) != len(ep["actions"])
        ):
            raise UserError(
                f"{path}: trajectory {i} has shapes observations {ep['observations'].shape}, actions "
                f"{ep['actions'].shape}, rewards {ep['rewards'].shape}; expected (T, obs_dim), (T, act_dim), (T,)."
            )
        episodes.append(ep)
    return Trajectories.from_episodes(episodes, source=str(path))
