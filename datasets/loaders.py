"""``load_dataset`` of a checkout: the library's (``dt_primal.files.loaders``: Minari ids, D4RL hdf5 files,
decision-transformer pickles), and besides the offline suite's ids (``dt-primal/hopper/medium-v0``), each
built on first use. ``train.py``, the sweep and the spectrum read their data through it."""

from __future__ import annotations

from datasets.suite import SUITE_NAMESPACE, build_if_missing, is_built, parse_suite_id
from dt_primal.data import Trajectories
from dt_primal.errors import UserError
from dt_primal.files import loaders


def load_dataset(spec: str, *args, build: bool = True, **kwargs) -> Trajectories:
    """``dt_primal.files.loaders.load_dataset`` (the same arguments), after building a missing suite dataset (with
    ``build``: off in multi-process runs, where every process would)."""
    if spec.startswith(SUITE_NAMESPACE + "/"):
        task, level, version = parse_suite_id(spec)
        if not build and not is_built(spec):
            raise UserError(
                f"{spec} is not built yet, and a multi-process (torchrun) run does not build "
                f"datasets. Build it first with python -m datasets build --env {task.name} --level {level} "
                f"--version {version} (on every node, unless $MINARI_DATASETS_PATH is shared), then start "
                f"the run again."
            )
        build_if_missing(spec)
    return loaders.load_dataset(spec, *args, build=build, **kwargs)
