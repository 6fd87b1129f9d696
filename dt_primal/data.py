"""One in-memory dataset format whatever the source, and the on-device window sampler."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from dt_primal.errors import UserError

if TYPE_CHECKING:
    from envs import Task


@dataclass
class Trajectories:
    """Episodes concatenated along time. Step ``i`` holds the observation the agent acted on,
    its action and its reward; the episode boundaries are given by ``lengths``."""

    observations: np.ndarray  # (N, obs_dim) float32
    actions: np.ndarray  # (N, act_dim) float32
    rewards: np.ndarray  # (N,) float32
    lengths: np.ndarray  # (E,) int64, sum == N
    terminals: np.ndarray  # (E,) bool: the episode ended by termination (not by a time limit)
    env: str | None = None  # evaluation task named by the source's metadata (e.g. "Hopper-v5")
    source: str = ""
    env_spec: str | None = None  # the environment the source's metadata records (a JSON EnvSpec)
    ref_scores: tuple[float, float] | None = None  # the source's reference returns (Minari's ref_min/max_score)
    task: Task | None = None  # the evaluation task, set by ``dt_primal.files.loaders.load_dataset``

    @classmethod
    def from_episodes(cls, episodes: list[dict], env: str | None = None, source: str = "", **metadata) -> Trajectories:
        """From per-episode dicts with ``observations`` (T or T+1 rows), ``actions``, ``rewards``
        and optionally ``terminals`` (T,); ``metadata``: ``env_spec``, ``ref_scores``."""
        where = f"The dataset {source}" if source else "The dataset"
        if not episodes:
            raise UserError(f"The dataset {source} holds no episodes. Check the file, or build it again.")
        episodes = [
            dict(
                observations=numeric(ep["observations"], f"'observations' of episode {i}", where),
                actions=numeric(ep["actions"], f"'actions' of episode {i}", where),
                rewards=numeric(ep["rewards"], f"'rewards' of episode {i}", where).reshape(-1),
                terminals=flags(ep.get("terminals", False), f"'terminals' of episode {i}", where),
            )
            for i, ep in enumerate(episodes)
        ]
        sizes = {(ep["observations"].shape[1:], ep["actions"].shape[1:]) for ep in episodes}
        if len(sizes) > 1:
            raise UserError(
                f"The episodes of the dataset {source} differ in observation/action shapes "
                f"({', '.join(f'{o} and {a}' for o, a in sorted(sizes))}); a dataset must come from one "
                f"environment. Remove the odd episodes or rebuild the dataset."
            )
        lengths = np.array([len(ep["actions"]) for ep in episodes], dtype=np.int64)
        return cls(
            observations=np.concatenate([ep["observations"][:n] for ep, n in zip(episodes, lengths)]),
            actions=np.concatenate([ep["actions"] for ep in episodes]),
            rewards=np.concatenate([ep["rewards"] for ep in episodes]),
            lengths=lengths,
            terminals=np.array([bool(np.any(ep["terminals"])) for ep in episodes]),
            env=env,
            source=source,
            **metadata,
        ).validate()

    @property
    def obs_dim(self) -> int:
        return self.observations.shape[1]

    @property
    def act_dim(self) -> int:
        return self.actions.shape[1]

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]])

    def returns_to_go(self) -> np.ndarray:
        """(N,) float64: each step's reward summed to its episode's end (γ = 1)."""
        tail = np.cumsum(self.rewards[::-1].astype(np.float64))[::-1]
        return tail - np.append(tail, 0.0)[np.repeat(self.starts + self.lengths, self.lengths)]

    def episode_returns(self) -> np.ndarray:
        return np.add.reduceat(self.rewards.astype(np.float64), self.starts)

    def best_episodes(self, percent: float) -> Trajectories:
        """The episodes with the highest returns, best first, while they hold at most ``percent`` % of the steps
        (the best one always): how the DT paper's code keeps the data of %BC. In their order here."""
        if percent >= 100:
            return self
        budget = max(int(percent / 100 * len(self.rewards)), 1)
        best_first = np.argsort(-self.episode_returns(), kind="stable")
        n = max(1, int(np.searchsorted(np.cumsum(self.lengths[best_first]), budget, side="right")))
        kept = np.zeros(len(self.lengths), bool)
        kept[best_first[:n]] = True
        steps = np.repeat(kept, self.lengths)
        return dataclasses.replace(
            self,
            observations=self.observations[steps],
            actions=self.actions[steps],
            rewards=self.rewards[steps],
            lengths=self.lengths[kept],
            terminals=self.terminals[kept],
        )

    def validate(self) -> Trajectories:
        """Raise a UserError naming what is wrong; otherwise return self."""
        where = f"The dataset {self.source}" if self.source else "The dataset"
        n = len(self.rewards)
        if self.observations.ndim != 2 or self.actions.ndim != 2 or self.rewards.ndim != 1:
            raise UserError(
                f"{where} has wrong shapes: observations {self.observations.shape}, actions "
                f"{self.actions.shape}, rewards {self.rewards.shape}; expected (N, obs_dim), (N, act_dim), (N,)."
            )
        if len(self.observations) != n or len(self.actions) != n or int(self.lengths.sum()) != n:
            raise UserError(
                f"{where} is inconsistent: {len(self.observations)} observations, {len(self.actions)} "
                f"actions, {n} rewards and episodes totalling {int(self.lengths.sum())} steps."
            )
        if n == 0:
            raise UserError(f"{where} holds no steps at all. Check that it is the right file, or rebuild it.")
        if (self.lengths < 1).any():
            empty = np.flatnonzero(self.lengths < 1)
            raise UserError(
                f"{where} has {len(empty)} empty episodes (episode {empty[0]} is the first) with no "
                f"action to learn from; remove them or rebuild the dataset."
            )
        for name in ("observations", "actions", "rewards"):
            bad = ~np.isfinite(getattr(self, name))
            if bad.any():
                raise UserError(f"{where} has {int(bad.sum())} NaN/inf values in '{name}'; clean the data first.")
        return self

    def state_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std (+1e-6) of the observations (docs/method.md, "Hyper-parameters")."""
        return self.observations.mean(0), self.observations.std(0) + 1e-6


# what a numeric array's dtype holds, for the message when it holds no real numbers
_KINDS = {
    "U": "text",
    "S": "text (bytes)",
    "O": "Python objects",
    "c": "complex numbers",
    "M": "dates",
    "m": "time spans",
    "V": "records (a compound dtype)",
}


def numeric(value, what: str, where: str) -> np.ndarray:
    """``value`` as a float32 array. Integers and booleans are converted (integer observations are
    fine); text, dicts, ragged lists, complex numbers and finite values beyond float32's range are a
    UserError naming ``what`` (e.g. "'rewards'") in ``where`` (e.g. "The dataset X")."""
    if isinstance(value, dict):
        raise UserError(
            f"{where}: {what} is a dict (keys {', '.join(map(str, list(value)[:6]))}), not an array: only "
            f"flat (Box) observation and action spaces are supported. Use a dataset of one of the "
            f"supported MuJoCo tasks, or flatten the observations into one array per step."
        )
    try:
        array = np.asarray(value)
        if array.dtype.kind == "O":  # lists of numbers, None (NaN, refused later), or something else
            array = array.astype(np.float64)
    except (ValueError, TypeError, OverflowError) as exc:
        raise UserError(
            f"{where}: {what} is not an array of numbers ({exc}). Every key needs one row of numbers per "
            f"step, all rows of the same length; convert the data and try again."
        ) from None
    if array.dtype.kind not in "biuf":
        raise UserError(
            f"{where}: {what} holds {_KINDS.get(array.dtype.kind, 'no numbers')} (dtype {array.dtype}), "
            f"not real numbers. Store it as a float array (float32 or float64) and try again."
        )
    with np.errstate(over="ignore"):  # values beyond float32 are reported below, without NumPy's warning
        out = array.astype(np.float32)
    if array.dtype.kind == "f" and array.dtype.itemsize > 4:
        over = np.isfinite(array) & ~np.isfinite(out)
        if over.any():
            raise UserError(
                f"{where}: {what} has {int(over.sum())} values beyond float32's range (±3.4e38), up to "
                f"{np.abs(array[over]).max():.3g}; dt-primal computes in float32. Rescale or clean the data."
            )
    return out


def flags(value, what: str, where: str) -> np.ndarray:
    """``value`` (booleans, or numbers 0 and 1) as a bool array; any other value is a UserError: a
    NaN or a 2 in ``terminals`` would silently end episodes where they do not end."""
    array = numeric(value, what, where)
    bad = (array != 0) & (array != 1)
    if bad.any():
        raise UserError(
            f"{where}: {what} must be true/false (or 0/1) at each step, but has {int(bad.sum())} other "
            f"values, such as {array[bad][0]:g}. Check that the right key was written there."
        )
    return array.astype(bool)


class WindowSampler:
    """Draws training windows of K steps, right-padded, entirely on ``device``, from one dataset or
    several (``data``, ``state_mean`` and ``state_std`` then lists, one entry per dataset), whose
    steps lie one after another in one store so that all members' windows are one gather.

    A window starts at a uniformly drawn step of its dataset, which is the same as drawing the
    episode with probability proportional to its length and then a start inside it. Returns-to-go
    use γ = 1 and are divided by ``reward_scale``; states are normalised with their dataset's statistics.
    """

    def __init__(
        self,
        data: Trajectories | list[Trajectories],
        context: int,
        reward_scale: float,
        state_mean: np.ndarray | list[np.ndarray],
        state_std: np.ndarray | list[np.ndarray],
        device: torch.device | str = "cpu",
    ):
        parts = list(zip(*(x if isinstance(data, list) else [x] for x in (data, state_mean, state_std))))
        sizes = [len(d.rewards) for d, _, _ in parts]
        self.sizes, self.first = sizes, np.cumsum([0] + sizes[:-1])
        store = [self._arrays(d, mean, std, reward_scale) for d, mean, std in parts]
        as_t = lambda i, dt: torch.as_tensor(np.concatenate([a[i] for a in store]), dtype=dt, device=device)
        self.states, self.actions, self.rtg = (as_t(i, torch.float32) for i in range(3))
        self.timesteps = as_t(3, torch.long)
        self.end = as_t(4, torch.long) + torch.as_tensor(np.repeat(self.first, sizes), device=device)
        self.offsets = torch.arange(context, device=device)
        self.context, self.device = context, device

    @staticmethod
    def _arrays(data: Trajectories, state_mean, state_std, reward_scale: float) -> tuple[np.ndarray, ...]:
        """One dataset's normalised states, actions, scaled returns-to-go, step in episode, and the
        exclusive end of each step's episode (indices within the dataset)."""
        starts, ends = data.starts, data.starts + data.lengths
        ep_of_step = np.repeat(np.arange(len(data.lengths)), data.lengths)
        rtg = data.returns_to_go()
        step_in_ep = np.arange(len(data.rewards)) - starts[ep_of_step]
        return (
            (data.observations - state_mean) / state_std,
            data.actions,
            rtg / reward_scale,
            step_in_ep,
            ends[ep_of_step],
        )

    def first_steps(self, datasets: list[int]) -> torch.Tensor:
        """Where each of ``datasets`` (indices) starts in the store: (len(datasets),) long."""
        return torch.as_tensor(self.first[datasets], dtype=torch.long, device=self.device)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """``batch_size`` windows: (B, K, ...) tensors ``states``, ``actions``, ``returns_to_go``,
        ``timesteps``, ``valid``."""
        return self.windows(self.starts(batch_size, generator))

    def starts(self, batch_size: int, generator: torch.Generator | None = None, dataset: int = 0) -> torch.Tensor:
        """The first steps of ``batch_size`` windows, drawn uniformly from ``generator``: (B,) long,
        indices within the dataset ``dataset`` (add ``first_steps`` for the store's)."""
        return torch.randint(self.sizes[dataset], (batch_size,), device=self.device, generator=generator)

    def windows(self, start: torch.Tensor) -> dict[str, torch.Tensor]:
        """The windows beginning at the steps ``start`` (any shape S): (*S, K, ...) tensors. One gather
        for all of them, e.g. for every member of an ensemble at once (S = (members, B))."""
        idx = start[..., None] + self.offsets  # (*S, K)
        valid = idx < self.end[start][..., None]
        idx = torch.where(valid, idx, start[..., None])  # padding reads a real step, then is zeroed
        m = valid.unsqueeze(-1)
        return {
            "states": self.states[idx] * m,
            "actions": self.actions[idx] * m,
            "returns_to_go": (self.rtg[idx] * valid).unsqueeze(-1),
            "timesteps": self.timesteps[idx] * valid,
            "valid": valid,
        }
