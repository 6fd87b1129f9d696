"""Synthetic D4RL-style hdf5 files for the tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_d4rl(path: str | Path, episodes: list[dict]) -> None:
    """A D4RL hdf5 file of ``episodes`` in the Minari layout (T + 1 observations, T actions, rewards,
    terminations and truncations each)."""
    import h5py

    with h5py.File(path, "w") as f:
        f["observations"] = np.concatenate([e["observations"][:-1] for e in episodes])
        f["next_observations"] = np.concatenate([e["observations"][1:] for e in episodes])
        f["actions"] = np.concatenate([e["actions"] for e in episodes])
        f["rewards"] = np.concatenate([e["rewards"] for e in episodes])
        f["terminals"] = np.concatenate([e["terminations"] for e in episodes])
        f["timeouts"] = np.concatenate([e["truncations"] for e in episodes])


def hopper_episodes(steps: int, seed: int = 0) -> list[dict]:
    """Hopper-shaped random episodes (obs 11, act 3, rewards in [0, 4)) of ``steps`` steps in all, 50 to
    1000 steps each: a quarter time out at 1000, the others end with a termination."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < steps:
        lengths.append(1000 if rng.random() < 0.25 else int(rng.integers(50, 1000)))
    lengths[-1] -= sum(lengths) - steps
    return [
        dict(
            observations=rng.normal(size=(n + 1, 11)).astype(np.float32),
            actions=rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            rewards=rng.uniform(0, 4, n).astype(np.float32),
            terminations=np.arange(n) == n - 1 if n < 1000 else np.zeros(n, bool),
            truncations=np.arange(n) == n - 1 if n == 1000 else np.zeros(n, bool),
        )
        for n in lengths
    ]
