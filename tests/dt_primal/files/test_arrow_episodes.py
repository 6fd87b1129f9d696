"""Minari datasets in the Arrow format: read as Minari reads them, and every file checked against the
dataset's metadata and against itself before its data is decoded."""

import json
import struct

import numpy as np
import pytest
from conftest import make_episodes, write_minari

from dt_primal.errors import UserError
from dt_primal.files.loaders import load_minari

pa = pytest.importorskip("pyarrow")

LENGTHS = (20, 30)


@pytest.fixture
def arrow_dataset(minari_home):
    """A local Arrow Minari dataset of two Hopper episodes: (its id, its data folder)."""
    write_minari("tests/hopper/arrow-v0", make_episodes(lengths=LENGTHS, seed=1), data_format="arrow")
    data = minari_home / "tests/hopper/arrow-v0" / "data"
    ORIGINAL[data] = pa.ipc.open_file(episode_file(data)).get_batch(0)
    return "tests/hopper/arrow-v0", data


ORIGINAL = {}  # each dataset's first episode as Minari wrote it


def episode_file(data, i=0):
    return data / str(i) / "part-0.arrow"


def rewrite(data, batches, compression=None):
    """The first episode's file rewritten holding ``batches`` (functions of the batch Minari wrote)."""
    path = episode_file(data)
    made = [f(ORIGINAL[data]) for f in batches]
    with pa.ipc.new_file(path, made[0].schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for b in made:
            w.write_batch(b)


def patch(path, old: int, new: int):
    """Every little-endian int64 ``old`` in the file ``path`` replaced by ``new``; how many there were."""
    blob = path.read_bytes()
    path.write_bytes(blob.replace(struct.pack("<q", old), struct.pack("<q", new)))
    return blob.count(struct.pack("<q", old))


def refused(dataset_id, match):
    with pytest.raises(UserError, match=match):
        load_minari(dataset_id)


def test_an_arrow_dataset_loads_as_minari_reads_it(arrow_dataset):
    import minari

    dataset_id, data = arrow_dataset
    theirs = list(minari.load_dataset(dataset_id).iterate_episodes())
    ours = load_minari(dataset_id)
    assert list(ours.lengths) == list(LENGTHS)
    starts = np.cumsum([0, *LENGTHS])
    for ep, a, b in zip(theirs, starts, starts[1:]):
        assert np.allclose(ours.observations[a:b], ep.observations[:-1])
        assert np.allclose(ours.actions[a:b], ep.actions) and np.allclose(ours.rewards[a:b], ep.rewards)
    assert list(ours.terminals) == [bool(ep.terminations[-1]) for ep in theirs]
    rewrite(data, [lambda b: b], compression="zstd")  # compressed, as pyarrow may write it: the same episode
    assert np.array_equal(load_minari(dataset_id).observations, ours.observations)


def test_rows_that_the_buffers_do_not_hold_are_refused(arrow_dataset):
    dataset_id, data = arrow_dataset
    rows = LENGTHS[0] + 1
    assert patch(episode_file(data), rows, rows + 1) >= 2  # the batch's length and its columns' lengths
    refused(dataset_id, "rows")
    for meta, key in ((data / "0" / "metadata.json", "total_steps"), (data / "metadata.json", "total_steps")):
        record = json.loads(meta.read_text())
        meta.write_text(json.dumps(record | {key: record[key] + 1}))
    refused(dataset_id, "columns' lengths")
    for width in (11, 3):  # the lists' values too: every length agrees, and the buffers are too short
        patch(episode_file(data), rows * width, (rows + 1) * width)
    refused(dataset_id, "(?i)buffer.*too small|smaller than")


def test_a_length_of_2_to_the_40_is_refused_before_anything_is_read(arrow_dataset):
    dataset_id, data = arrow_dataset
    patch(episode_file(data), LENGTHS[0] + 1, 2**40)
    refused(dataset_id, "rows")


def test_a_compressed_buffer_declaring_more_than_its_rows_need_is_never_decompressed(arrow_dataset):
    dataset_id, data = arrow_dataset
    rewrite(data, [lambda b: b], compression="zstd")
    need = (LENGTHS[0] + 1) * 11 * 8  # the observations' values
    assert patch(episode_file(data), need, 40_000 * need) == 1
    refused(dataset_id, "declares")


def test_one_batch_and_one_file_per_episode(arrow_dataset):
    dataset_id, data = arrow_dataset
    rewrite(data, [lambda b: b.slice(0, 10), lambda b: b.slice(10)])  # the same rows, cut in two batches
    refused(dataset_id, "rows|more than one record batch")
    rewrite(data, [lambda b: b, lambda b: b])
    refused(dataset_id, "more than one record batch")
    write_minari("tests/hopper/other-v0", make_episodes(lengths=LENGTHS, seed=1), data_format="arrow")
    rewrite(data, [lambda b: b])
    other = data.parent.parent / "other-v0" / "data"
    episode_file(other).rename(data / "0" / "part-1.arrow")
    refused(dataset_id, "holds 2 data files")


def test_columns_of_other_types_or_counts_of_other_steps_are_refused(arrow_dataset):
    dataset_id, data = arrow_dataset
    as_float32 = pa.list_(pa.float32(), 11)
    rewrite(data, [lambda b: b.set_column(0, "observations", b.column(0).cast(as_float32))])
    refused(dataset_id, "columns are not")
    rewrite(data, [lambda b: b])
    meta = data / "1" / "metadata.json"
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"total_steps": 3}))
    refused(dataset_id, "hold 23 steps|rows")
