import numpy as np
import torch
from conftest import make_episodes, write_minari, write_pickle

from datasets.loaders import load_dataset
from datasets.synthetic import write_d4rl
from dt_primal.data import Trajectories, WindowSampler


def test_three_sources_give_the_same_store(tmp_path):
    eps = make_episodes()
    write_minari("tests/hopper/tiny-v0", eps)
    write_d4rl(tmp_path / "tiny.hdf5", eps)
    write_pickle(tmp_path / "tiny.pkl", eps)
    stores = [
        load_dataset("tests/hopper/tiny-v0"),
        load_dataset(str(tmp_path / "tiny.hdf5"), env="hopper"),
        load_dataset(str(tmp_path / "tiny.pkl"), env="Hopper-v5"),
    ]
    ref = stores[0]
    assert ref.env == "Hopper-v5"  # from the Minari metadata
    assert ref.lengths.tolist() == [7, 3, 12] and ref.terminals.tolist() == [True, True, False]
    np.testing.assert_array_equal(ref.observations[:7], eps[0]["observations"][:-1])
    for other in stores[1:]:
        for k in ("observations", "actions", "rewards", "lengths", "terminals"):
            np.testing.assert_array_equal(getattr(other, k), getattr(ref, k), err_msg=k)
        assert other.env in ("hopper", "Hopper-v5")


def test_env_comes_from_file_name_when_metadata_is_missing(tmp_path):
    write_d4rl(tmp_path / "hopper-medium-v2.hdf5", make_episodes())
    assert load_dataset(str(tmp_path / "hopper-medium-v2.hdf5")).env == "Hopper-v5"


def test_windows_have_right_returns_to_go_timesteps_and_masks():
    eps = make_episodes(lengths=(5, 2, 9))
    data = Trajectories.from_episodes([dict(e, terminals=e["terminations"]) for e in eps])
    mean, std = data.state_stats()
    K, scale = 4, 10.0
    sampler = WindowSampler(data, K, scale, mean, std)
    batch = sampler.sample(500, torch.Generator().manual_seed(0))
    starts = data.starts
    for b in range(500):
        # recover which step the window starts at from its first normalised state
        first = batch["states"][b, 0].numpy() * std + mean
        i = int(np.argmin(np.abs(data.observations - first).sum(1)))
        ep = int(np.searchsorted(starts, i, side="right") - 1)
        end = starts[ep] + data.lengths[ep]
        n = min(K, end - i)
        assert batch["valid"][b].tolist() == [True] * n + [False] * (K - n)
        assert batch["timesteps"][b, :n].tolist() == list(range(i - starts[ep], i - starts[ep] + n))
        rtg = [data.rewards[j:end].astype(np.float64).sum() / scale for j in range(i, i + n)]
        np.testing.assert_allclose(batch["returns_to_go"][b, :n, 0].numpy(), rtg, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(batch["actions"][b, :n].numpy(), data.actions[i : i + n])
        assert (batch["states"][b, n:] == 0).all() and (batch["returns_to_go"][b, n:] == 0).all()


def test_window_starts_are_proportional_to_episode_length():
    eps = make_episodes(lengths=(10, 30))
    for i, e in enumerate(eps):
        e["observations"][:, 0] = i  # the episode id, readable back from the states
    data = Trajectories.from_episodes([dict(e, terminals=e["terminations"]) for e in eps])
    mean, std = data.state_stats()
    batch = WindowSampler(data, 3, 1.0, mean, std).sample(20000, torch.Generator().manual_seed(0))
    episode = np.rint(batch["states"][:, 0, 0].numpy() * std[0] + mean[0])
    assert abs(np.mean(episode == 0) - 10 / 40) < 0.015
    # and the start is uniform inside the episode: every timestep of episode 1 appears
    assert set(batch["timesteps"][episode == 1, 0].tolist()) == set(range(30))
