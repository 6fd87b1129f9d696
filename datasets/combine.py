"""``python -m datasets combine``: one Minari dataset holding the episodes of several, such as the
D4RL-style medium-expert of Minari's hosted ``mujoco/<env>/medium-v0`` and ``mujoco/<env>/expert-v0``.

Minari's own ``minari.combine_datasets`` does the combining; the parts' reference returns
(``ref_min_score``, ``ref_max_score``), which it leaves out, are carried over when all parts agree,
so the combined dataset is normalised as its parts are.
"""

from __future__ import annotations

import os

from dt_primal.errors import UserError
from dt_primal.files.loaders import load_minari
from dt_primal.files.minari import is_local

REF_KEYS = ("ref_min_score", "ref_max_score")


def combine(parts: list[str], into: str) -> str:
    """Write the Minari dataset ``into`` from the episodes of ``parts`` (local Minari dataset ids), in
    order, each read first through dt-primal's own checked reader (``load_minari``: its files, metadata and
    episodes, as a run would read them); returns its id."""
    import minari
    from minari.storage.datasets_root_dir import get_dataset_path

    home = os.environ.get("MINARI_DATASETS_PATH", "~/.minari/datasets")
    missing = [p for p in parts if not is_local(p)]
    if missing:
        raise UserError(
            f"{', '.join(missing)} not found in {home} ($MINARI_DATASETS_PATH). Download hosted datasets "
            f"first (minari download {' '.join(missing)}), or point $MINARI_DATASETS_PATH at the folder "
            f"that holds them."
        )
    if len(parts) < 2:
        raise UserError(f"Give at least two datasets to combine (got {len(parts)}).")
    if is_local(into) or get_dataset_path(into).exists():
        raise UserError(
            f"{into} already exists in {home}: choose another --into, or delete it first (minari delete {into})."
        )
    for p in parts:  # before Minari reads anything of it (it may make the environment its metadata names)
        load_minari(p, build=False)
    datasets = [minari.load_dataset(p) for p in parts]
    refs = {tuple(d.storage.metadata.get(k) for k in REF_KEYS) for d in datasets}
    get_dataset_path(into).parent.mkdir(parents=True, exist_ok=True)
    try:
        combined = minari.combine_datasets(datasets, into)
    except ValueError as exc:  # different environments or spaces
        raise UserError(f"Cannot combine {', '.join(parts)}: {exc} Combine datasets of one task.") from None
    if len(refs) == 1 and None not in next(iter(refs)):
        combined.storage.update_metadata(dict(zip(REF_KEYS, next(iter(refs)))))
    else:
        print(
            f"The parts give different reference returns ({sorted(refs, key=str)}): {into} has none, and a run "
            f"on it uses its task's default reference returns, if any, or --ref-min and --ref-max."
        )
    print(f"combined {into}: {combined.total_episodes} episodes, {combined.total_steps} steps from {', '.join(parts)}")
    return into
