"""Minari dataset folders: no links; a ``metadata.json`` whose spaces are flat Boxes of checked size, whose counts
fit in memory and whose environment spec ``envs.check_spec`` admits (a registered id without ``module:``, the
entry point Gymnasium registers for it, no wrappers, numeric constructor options only); checked before anything
reads its data. Its episodes are read by dt-primal: ``minari_hdf5`` (HDF5, each array checked against the
spaces and steps) and ``minari_arrow`` (Arrow, each file checked against itself)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re

import numpy as np

from dt_primal.errors import UserError
from dt_primal.files.hdf5 import open_hdf5
from dt_primal.files.reading import check_fits_memory, is_count, read_json

SPACE_DTYPES = {"float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8"}


def _check_box(serialized, what: str, where: str) -> None:
    try:
        space = json.loads(serialized)
        shape = tuple(space["shape"])
        ok = (
            space["type"] == "Box"
            and space["dtype"] in SPACE_DTYPES
            and len(shape) == 1
            and all(isinstance(n, int) and 0 < n <= 100_000 for n in shape)
        )
    except (TypeError, ValueError, KeyError):
        ok = False
    if not ok:
        raise UserError(
            f"{where}'s {what} is not a flat Box space of at most 100000 numbers (found "
            f"{str(serialized)[:120]}); only flat observation and action spaces are supported."
        )


def check_minari_metadata(meta: object, where: str) -> None:
    """A Minari dataset's ``metadata.json`` (parsed), checked before Minari reads it: Minari makes the
    environment of a dataset whose spaces are missing, and allocates from the counts it declares."""
    from envs import check_spec

    if not isinstance(meta, dict):
        raise UserError(f"{where}'s metadata.json is not a JSON object; the dataset is damaged.")
    for key in ("observation_space", "action_space"):
        if key not in meta:
            raise UserError(
                f"{where}'s metadata.json lacks its {key}, which Minari then recovers by making the "
                f"environment its env_spec names; a file may not make an environment. Every dataset "
                f"Minari writes records it: ask for a complete copy."
            )
        _check_box(meta[key], key, where)
    if meta.get("data_format") not in ("hdf5", "arrow"):
        raise UserError(
            f"{where}'s metadata.json gives the data format {str(meta.get('data_format'))[:40]!r}; Minari "
            f"writes hdf5 or arrow."
        )
    episodes, steps = (meta.get(k) for k in ("total_episodes", "total_steps"))
    if not all(is_count(n) for n in (episodes, steps)) or episodes > steps:
        raise UserError(
            f"{where}'s metadata.json declares {str(episodes)[:40]} episodes and {str(steps)[:40]} steps; "
            f"they must be counts, with no more episodes than steps."
        )
    check_fits_memory(episodes * 8, where, "an index of its episodes")  # Minari allocates it from the count
    if meta.get("env_spec") is not None:
        try:
            meta["env_spec"] = _current_env_spec(meta["env_spec"])
            check_spec(meta["env_spec"])
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"{where}'s metadata.json: {exc}") from None


def _current_env_spec(text: str) -> str:
    """A Minari env_spec without the fields of older Gymnasium versions that this one's EnvSpec no longer takes
    (Gymnasium 1.0 wrote ``apply_api_compatibility`` and ``autoreset``; Minari drops them when it reads a
    dataset, and so does this): dropping a field can add no code to run."""
    from gymnasium.envs.registration import EnvSpec

    spec = json.loads(text)
    if not isinstance(spec, dict):
        raise ValueError("its env_spec is not a JSON object")
    known = {f.name for f in dataclasses.fields(EnvSpec) if f.init}
    return json.dumps({k: v for k, v in spec.items() if k in known})


def minari_spaces(meta: dict) -> tuple[list[int], list[np.dtype]]:
    """The numbers per step and the dtypes of the observation and action spaces of a Minari ``metadata.json``
    checked by ``check_minari_metadata``."""
    spaces = [json.loads(meta[key]) for key in ("observation_space", "action_space")]
    return [math.prod(s["shape"]) for s in spaces], [np.dtype(s["dtype"]) for s in spaces]


def check_steps_add_up(total: int, meta: dict, where: str) -> None:
    """The ``total`` steps of a Minari dataset's episodes, as read, are the steps its ``metadata.json`` declares."""
    if total != meta["total_steps"]:
        raise UserError(
            f"{where}'s episodes hold {total} steps, its metadata.json declares {meta['total_steps']}. The "
            f"dataset is damaged: download or make it again."
        )


@contextlib.contextmanager
def open_minari(dataset_id: str):
    """The local Minari dataset ``dataset_id``, its files checked: ``(metadata, hdf5)``, its metadata checked
    (``check_minari_metadata``), no links out of its folder, and its HDF5 file checked by ``open_hdf5``, then open
    (``hdf5`` None for the Arrow format: its files fit in memory, and ``dt_primal.files.minari_arrow`` reads and
    checks their episodes)."""
    from minari.storage.datasets_root_dir import get_dataset_path

    data = get_dataset_path(dataset_id) / "data"
    where = f"The Minari dataset {dataset_id}"
    links = [p for p in (data, *data.rglob("*")) if p.is_symlink()]
    if links:
        raise UserError(
            f"{where} was refused: {links[0]} is a link, and dt-primal reads no file outside a dataset's "
            f"folder. Copy the dataset without links."
        )
    meta = read_json(data / "metadata.json", f"{where}'s metadata", "The dataset is damaged.")
    check_minari_metadata(meta, where)
    if meta["data_format"] == "hdf5":
        import h5py

        with open_hdf5(data / "main_data.hdf5"):
            pass
        # opened again for reading: closing it freed what the check cached (about 30 KB an episode)
        with h5py.File(data / "main_data.hdf5", "r") as f:
            yield meta, f
        return
    try:
        import pyarrow  # noqa: F401 (Minari reads Arrow datasets with it)
    except ImportError:
        raise UserError(
            f"{where} is stored in the Arrow format, which dt-primal reads with pyarrow, and pyarrow is not "
            f'installed: pip install "dt-primal[arrow]" (or pip install pyarrow), then run the command again.'
        ) from None
    check_fits_memory(sum(p.stat().st_size for p in data.rglob("*") if p.is_file()), where, "Arrow files")
    yield meta, None


def is_local(dataset_id: str) -> bool:
    """Whether ``dataset_id`` (``namespace/name-vN``, no ``..``) is a local Minari dataset: its folder in
    $MINARI_DATASETS_PATH has a metadata file. Only that dataset's folder is looked at (Minari's own listing reads
    every dataset there, and one damaged elsewhere could hang it); its files are checked when it is read."""
    from minari.storage.datasets_root_dir import get_dataset_path

    parts = dataset_id.split("/")
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)*-v[0-9]+", dataset_id) or ".." in parts or "." in parts:
        return False
    return os.path.lexists(get_dataset_path(dataset_id) / "data" / "metadata.json")


def check_minari_folder(dataset_id: str) -> dict:
    """The metadata of the local Minari dataset ``dataset_id``, its files checked as ``open_minari`` checks them
    (before Minari reads anything of it)."""
    with open_minari(dataset_id) as (meta, _):
        return meta
