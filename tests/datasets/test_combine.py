"""``python -m datasets combine``: the D4RL-style medium-expert of Minari's hosted datasets, tested
on tiny local datasets written under the hosted ids (no download)."""

import numpy as np
import pytest
from conftest import make_episodes

from datasets.__main__ import main
from datasets.loaders import load_dataset
from datasets.suite import _write
from dt_primal.errors import UserError
from envs import TASKS

HOPPER = TASKS["hopper"]
HOSTED_REFS = (-20.27, 3234.3)  # any pair: what matters is that the parts' pair is kept


def hosted(dataset_id: str, seed: int, refs=HOSTED_REFS, env: str = "Hopper-v5") -> None:
    """A tiny dataset under a hosted id, with reference returns in its metadata as Minari's hosted ones have."""
    import dataclasses

    import minari

    if dataset_id in minari.list_local_datasets():
        minari.delete_dataset(dataset_id)
    task = dataclasses.replace(HOPPER, gym_id=env, ref_min=refs[0], ref_max=refs[1])
    obs_dim = 11 if env == "Hopper-v5" else 17
    act_dim = 3 if env == "Hopper-v5" else 6
    _write(dataset_id, task, make_episodes((5, 8), obs_dim, act_dim, seed=seed), "hosted", "a stand-in")


@pytest.fixture
def parts():
    hosted("mujoco/hopper/medium-v0", seed=1)
    hosted("mujoco/hopper/expert-v0", seed=2)
    yield ["mujoco/hopper/medium-v0", "mujoco/hopper/expert-v0"]
    import minari

    for d in ("mujoco/hopper/medium-expert-v0", "mujoco/walker2d/expert-v0"):
        if d in minari.list_local_datasets():
            minari.delete_dataset(d)


def test_one_command_makes_the_medium_expert_of_the_hosted_datasets(parts):
    import minari

    main(["combine", *parts, "--into", "mujoco/hopper/medium-expert-v0"])
    medium, expert = (load_dataset(p) for p in parts)
    both = load_dataset("mujoco/hopper/medium-expert-v0")  # found locally: no --download needed
    np.testing.assert_array_equal(both.lengths, np.concatenate([medium.lengths, expert.lengths]))
    for k in ("observations", "actions", "rewards"):
        np.testing.assert_array_equal(getattr(both, k), np.concatenate([getattr(medium, k), getattr(expert, k)]))
    assert both.env == "Hopper-v5" and both.task.name == medium.task.name
    assert (both.task.ref_min, both.task.ref_max) == HOSTED_REFS  # normalised as its parts are
    meta = minari.load_dataset("mujoco/hopper/medium-expert-v0").storage.metadata
    assert meta["combined_datasets"] == parts


def test_combining_refuses_missing_parts_an_existing_target_and_other_tasks(parts):
    with pytest.raises(UserError, match="mujoco/hopper/simple-v0 not found.*minari download mujoco/hopper/simple-v0"):
        main(["combine", parts[0], "mujoco/hopper/simple-v0", "--into", "mujoco/hopper/medium-expert-v0"])
    with pytest.raises(UserError, match="mujoco/hopper/expert-v0 already exists"):
        main(["combine", *parts, "--into", "mujoco/hopper/expert-v0"])
    hosted("mujoco/walker2d/expert-v0", seed=3, env="Walker2d-v5")
    with pytest.raises(UserError, match="Cannot combine .* Combine datasets of one task"):
        main(["combine", parts[0], "mujoco/walker2d/expert-v0", "--into", "mujoco/hopper/medium-expert-v0"])


def test_parts_with_different_reference_returns_give_a_dataset_without_any(parts, capsys):
    hosted("mujoco/hopper/expert-v0", seed=2, refs=(0.0, 1000.0))
    main(["combine", *parts, "--into", "mujoco/hopper/medium-expert-v0"])
    assert "different reference returns" in capsys.readouterr().out
    both = load_dataset("mujoco/hopper/medium-expert-v0")
    assert (both.task.ref_min, both.task.ref_max) == (HOPPER.ref_min, HOPPER.ref_max)  # the task's own (D4RL's)


def test_a_medium_expert_that_is_not_local_says_how_to_make_it():
    with pytest.raises(
        UserError,
        match="mujoco/walker2d/medium-expert-v0 is not a local Minari dataset. Minari's hosted "
        "MuJoCo datasets have no medium-expert level: make it from its parts with minari "
        "download mujoco/walker2d/medium-v0 mujoco/walker2d/expert-v0, then, in a checkout of dt-primal, "
        "python -m datasets combine mujoco/walker2d/medium-v0 mujoco/walker2d/expert-v0 --into "
        "mujoco/walker2d/medium-expert-v0",
    ):
        load_dataset("mujoco/walker2d/medium-expert-v0")


def test_suite_datasets_built_at_once_are_those_built_one_by_one(tmp_path, monkeypatch, capsys):
    """``build --jobs``: child processes build the datasets (and a medium-expert's missing parts) side by side;
    the data is what building them one after the other gives."""
    ids = ["dt-primal/hopper/medium-replay-v2", "dt-primal/hopper/medium-expert-v1"]
    built = {}
    for folder, jobs in (("together", "3"), ("apart", "1")):
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / folder))
        main(["build", "--dataset", *ids, "--steps", "300", "--jobs", jobs])
        built[folder] = {d: load_dataset(d, build=False) for d in [*ids, "dt-primal/hopper/expert-v1"]}
    assert capsys.readouterr().out.count("built dt-primal/hopper/") >= 2 * 4  # each part, then the combination
    for d, data in built["together"].items():
        other = built["apart"][d]
        for k in ("observations", "actions", "rewards", "lengths", "terminals"):
            np.testing.assert_array_equal(getattr(data, k), getattr(other, k), err_msg=f"{d} {k}")


def test_combining_reads_each_part_through_the_checked_reader_and_no_other_dataset(parts):
    """An episode without actions was a traceback inside Minari; a FIFO as another dataset's metadata in the same
    folder hung the listing of local datasets. Only the named datasets are looked at, each read as a run reads it."""
    import os

    import h5py
    from minari.storage.datasets_root_dir import get_dataset_path

    elsewhere = get_dataset_path("mujoco/pen/broken-v0") / "data"
    elsewhere.mkdir(parents=True, exist_ok=True)
    if not (elsewhere / "metadata.json").exists():
        os.mkfifo(elsewhere / "metadata.json")
    try:
        main(["combine", *parts, "--into", "mujoco/hopper/medium-expert-v0"])  # no hang
        with h5py.File(get_dataset_path(parts[1]) / "data" / "main_data.hdf5", "a") as f:
            del f["episode_0"]["actions"]
        with pytest.raises(UserError, match=parts[1]):
            main(["combine", *parts, "--into", "mujoco/hopper/other-v0"])
        assert not get_dataset_path("mujoco/hopper/other-v0").exists()
    finally:
        (elsewhere / "metadata.json").unlink()
        os.rmdir(elsewhere)
        os.rmdir(elsewhere.parent)
