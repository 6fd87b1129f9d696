"""The learners' transitions as the repository stores them (datasets/transitions.py)."""

import numpy as np
import pytest

import datasets.suite as suite
from datasets.transitions import half_precision, load_transitions
from envs import TASKS


@pytest.mark.parametrize("env", list(TASKS))
def test_the_committed_transitions_are_byte_planes_that_read_as_the_plain_arrays(tmp_path, env):
    """The learners' committed buffers store float arrays as byte planes (smaller), newer ones with half-precision
    observations; they read back as the arrays themselves, and a plain .npz of them reads the same."""
    version = suite.VERSIONS["medium-replay"][env]  # the newest: its files are in the tree
    committed = suite.POLICY_DIR / env / suite.source_files("medium-replay", version)[0]
    assert any(k.startswith("__planes_") for k in np.load(committed).files)
    arrays = load_transitions(committed)
    assert arrays["observations"].dtype == (np.float16 if version else np.float32)
    assert arrays["observations"].shape == (len(arrays["rewards"]), TASKS[env].make().observation_space.shape[0])
    np.savez_compressed(tmp_path / "plain.npz", **arrays)
    plain = load_transitions(tmp_path / "plain.npz")
    assert set(plain) == set(arrays) and all(np.array_equal(plain[k], arrays[k]) for k in arrays)
    assert committed.stat().st_size < 0.95 * (tmp_path / "plain.npz").stat().st_size


def test_half_precision_rounds_observations_and_actions_keeps_rewards_and_refuses_what_it_cannot_hold():
    obs = np.random.default_rng(0).normal(0, 3, (1000, 5)).astype(np.float32)
    arrays = {"observations": obs, "final_observations": obs[:2], "actions": np.tanh(obs[:, :2]), "rewards": obs[:, 0]}
    half = half_precision(arrays)
    assert half["observations"].dtype == half["actions"].dtype == np.float16 and half["rewards"] is arrays["rewards"]
    np.testing.assert_allclose(half["observations"].astype(np.float32), obs, rtol=2**-11, atol=1e-7)
    assert np.abs(half["actions"].astype(np.float32) - arrays["actions"]).max() <= 2**-12
    for bad in (1e5, np.nan):
        with pytest.raises(ValueError, match="half precision cannot store"):
            half_precision({**arrays, "final_observations": np.array([[bad]], np.float32)})


def test_a_transitions_file_is_checked_before_its_arrays_are_read(tmp_path):
    """What an .npz declares decides no allocation and no dtype: an array whose header claims a petabyte is refused
    before its data is read, and byte planes stored under a dtype that is not a float (or a shape they do not hold)
    are refused instead of read as it says."""
    import io
    import zipfile

    from datasets.transitions import DTYPE, PLANES, SHAPE, save_transitions
    from dt_primal.errors import UserError

    huge = io.BytesIO()
    np.lib.format.write_array_header_1_0(huge, {"descr": "<f4", "fortran_order": False, "shape": (2**48,)})
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as archive:
        archive.writestr("rewards.npy", huge.getvalue() + bytes(64))
    with pytest.raises(UserError, match="declares arrays of"):
        load_transitions(tmp_path / "huge.npz")

    save_transitions(tmp_path / "good.npz", {"rewards": np.arange(6, dtype=np.float32)})
    good = dict(np.load(tmp_path / "good.npz"))
    for name, bad in ((DTYPE, np.array("<i4")), (SHAPE, np.array([7], np.int64))):
        np.savez(tmp_path / "bad.npz", **{**good, name + "rewards": bad})
        with pytest.raises(ValueError, match="not what its planes hold"):
            load_transitions(tmp_path / "bad.npz")
    assert PLANES + "rewards" in good and np.array_equal(
        load_transitions(tmp_path / "good.npz")["rewards"], np.arange(6)
    )
