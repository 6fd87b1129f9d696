"""HDF5 files (a D4RL file, a Minari ``main_data.hdf5``): groups and datasets stored inside the file (no external
files, external links or virtual datasets), each declaring no more than its stored bytes can hold
(``MAX_RATIO``), all of them together fitting in memory."""

from __future__ import annotations

import contextlib

import numpy as np

from dt_primal.errors import UserError
from dt_primal.files.reading import check_fits_memory, regular_file

# deflate, the strongest compression HDF5 applies without plugins, cannot shrink data more than 1032:1
MAX_RATIO = 1100


def _refuse_links_out(links: list[tuple[bytes, int]], path) -> None:
    """Refuse a file with a link that is neither hard nor soft (an external link, or a user-defined one), before
    any object is opened: a soft link may lead through one."""
    from h5py import h5l

    out = next((name for name, kind in links if kind not in (h5l.TYPE_HARD, h5l.TYPE_SOFT)), None)
    if out is not None:
        raise UserError(
            f"{path} was refused: '{out.decode(errors='replace')}' links to another file, and dt-primal reads no "
            f"file but the one given. Copy the data into the file (h5repack) and try again."
        )


def _check_hdf5_object(f, name: bytes, path) -> int:
    """The bytes the dataset at link ``name`` of the open file ``f`` declares (0 for a group), after checking
    that it is stored in the file and declares no more than its stored bytes can hold. h5py's low-level calls:
    its high-level ones cost about 0.2 ms an object, seconds for a Minari file of thousands of episodes."""
    from h5py import h5d, h5o

    try:
        node = h5o.open(f.id, name)
    except KeyError:  # a soft link to nothing
        return 0
    if not isinstance(node, h5d.DatasetID):
        return 0
    shown, plist = name.decode(errors="replace"), node.get_create_plist()
    if plist.get_external_count() or plist.get_layout() == h5d.VIRTUAL:
        raise UserError(
            f"{path} was refused: '{shown}' keeps its data in other files, and dt-primal reads no file but "
            f"the one given. Copy the data into the file (h5repack) and try again."
        )
    declared = int(np.prod(node.shape, dtype=np.int64)) * node.dtype.itemsize if node.shape else node.dtype.itemsize
    stored = node.get_storage_size()
    if declared > 4096 and declared > MAX_RATIO * max(stored, 1):
        raise UserError(
            f"{path} was refused: '{shown}' declares {node.shape} values ({declared} bytes) but stores "
            f"{stored} bytes, more than any compression can restore; the file is damaged or crafted."
        )
    return declared


@contextlib.contextmanager
def open_hdf5(path):
    """The HDF5 file ``path``, open for reading, every object of it checked (``_refuse_links_out``,
    ``_check_hdf5_object``), and all datasets together small enough for this machine's memory."""
    import h5py

    regular_file(path, "The dataset file")
    with h5py.File(path, "r") as f:
        links: list[tuple[bytes, int]] = []  # every link and its type (h5py reuses the info it passes), none followed
        f.id.links.visit(lambda name, info: links.append((name, info.type)), info=True)
        _refuse_links_out(links, path)
        declared = sum(_check_hdf5_object(f, name, path) for name, _ in links)
        check_fits_memory(declared, path, "arrays")
        yield f
