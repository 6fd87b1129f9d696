"""The episodes of a Minari dataset stored in HDF5, read by dt-primal itself from the file that
``minari.open_minari`` opened and checked, and checked against the dataset's metadata.

Minari writes episode ``i`` as the group ``episode_i`` of ``data/main_data.hdf5``: ``observations`` (one row
more than its steps), ``actions``, ``rewards``, ``terminations`` and ``truncations`` (one row per step) and
optional ``infos``, never read here. Each array is read with h5py's low-level calls (with the faster check,
hopper's three datasets load in 0.55 times the time Minari's reader took: docs/datasets.md, "Loading"), after
its dtype and shape are checked against the dataset's spaces; its size was bounded when the file was checked.
"""

from __future__ import annotations

import numpy as np

from dt_primal.errors import UserError
from dt_primal.files.minari import check_steps_add_up, minari_spaces

NUMERIC = "biuf"  # bool, integers, floats


def _read(f, name: str, rows: int | None, width: int | None, where: str) -> np.ndarray:
    """The numeric array ``name`` of the open file ``f``, of ``rows`` rows (None: any) of ``width`` numbers
    (None: one number a row, a 1-D array)."""
    from h5py import h5d, h5s

    try:
        node = h5d.open(f.id, name.encode())
    except (KeyError, ValueError, TypeError):
        raise UserError(f"{where} lacks the array {name} that Minari writes. The dataset is damaged.") from None
    shape = node.shape or ()
    want = "(rows,)" if width is None else f"(rows, {width})"
    fits = len(shape) == (1 if width is None else 2) and (width is None or shape[1] == width)
    if node.dtype.kind not in NUMERIC or not fits or (rows is not None and shape[0] != rows):
        raise UserError(
            f"{where}'s {name} holds {shape} values of {node.dtype} where {want} numbers belong"
            f"{'' if rows is None else f' with {rows} rows'}. The dataset is damaged: download or make it again."
        )
    out = np.empty(shape, node.dtype)
    node.read(h5s.ALL, h5s.ALL, out)
    return out


def read_episodes(f, meta: dict, where: str) -> list[dict]:
    """The episodes of the Minari HDF5 file ``f`` (open and checked; its ``metadata.json``, ``meta``, checked
    by ``minari.check_minari_metadata``), as ``dict(observations, actions, rewards, terminals)`` arrays, as
    Minari returns them."""
    (obs_dim, act_dim), _ = minari_spaces(meta)
    episodes, total = [], 0
    for i in range(meta["total_episodes"]):
        group = f"episode_{i}"
        actions = _read(f, f"{group}/actions", None, act_dim, where)
        steps = len(actions)
        total += steps
        if steps < 1 or total > meta["total_steps"]:
            raise UserError(
                f"{where}'s episode {i} holds {steps} steps, and its metadata.json declares {meta['total_steps']} "
                f"steps in all. The dataset is damaged: download or make it again."
            )
        episodes.append(
            dict(
                observations=_read(f, f"{group}/observations", steps + 1, obs_dim, where),
                actions=actions,
                rewards=_read(f, f"{group}/rewards", steps, None, where),
                terminals=_read(f, f"{group}/terminations", steps, None, where),
            )
        )
    check_steps_add_up(total, meta, where)
    return episodes
