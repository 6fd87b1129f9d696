"""What acting with a Decision Transformer keeps between steps, whatever runs the model: the last
``context`` steps of normalised observations, actions and returns-to-go of every episode, the
return-to-go that drops by each reward / ``reward_scale``, and the timesteps (the model clamps those
past its episode limit). ``Policy`` (PyTorch, dt_primal.evaluation.policy) and ``OnnxPolicy``
(onnxruntime and NumPy, dt_primal.evaluation.onnx_policy) are this class with their own arrays and
forward pass. No torch here.
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np


class NumpyArrays:
    """The array operations acting needs, on NumPy arrays (``Policy`` has torch's, on its device)."""

    def asarray(self, x):
        return np.asarray(x, dtype=np.float32)

    def zeros(self, shape):
        return np.zeros(shape, np.float32)

    def cat(self, arrays, axis):
        return np.concatenate(arrays, axis)

    def broadcast(self, x, shape):
        return np.broadcast_to(x, shape)

    def arange(self, start, stop):
        return np.arange(start, stop, dtype=np.int64)

    def numpy(self, x) -> np.ndarray:
        return np.asarray(x)


class Acting:
    """``reset`` and ``act`` of a policy of ``members`` models (``act``'s observations: (obs_dim,), (N,
    obs_dim), or (members, N, obs_dim)). Subclasses set ``arrays`` (``NumpyArrays``' operations) and give
    ``_predict(states, actions, rtg, timesteps, live)``: the newest step's action (M, N, act_dim) of
    every live episode, zeros for the others."""

    arrays = NumpyArrays()

    def __init__(self, members: int, act_dim: int, state_mean, state_std, reward_scale: float, context: int):
        self.members, self.act_dim, self.reward_scale, self.context = members, act_dim, reward_scale, context
        self.state_mean, self.state_std = (np.asarray(a, np.float32) for a in (state_mean, state_std))
        self._mean, self._std = (
            self.arrays.asarray(a).reshape(-1, 1, a.shape[-1]) for a in (self.state_mean, self.state_std)
        )
        self.run_config: dict = {}  # the run's settings
        self.reset(0.0)

    def reset(self, target_return) -> None:
        """Start new episodes conditioned on ``target_return``: a number, or one per environment (as
        the observations' leading dimensions)."""
        self.target, self.t, self.history = target_return, 0, None

    def twin(self) -> Acting:
        """A second acting state of the same model, for other episodes acted on in turn with these (the pipelined
        evaluation, ``dt_primal.evaluation.rollout``); ``reset`` it before its first ``act``."""
        twin = copy.copy(self)
        twin.reset(0.0)
        return twin

    def act(self, obs, reward=0.0, live=None) -> np.ndarray:
        """The action (float32, in [-1, 1]) for observation ``obs``, given ``reward``, the reward
        received since the last action (ignored on an episode's first step). ``obs``: (obs_dim,) for
        one environment, (N, obs_dim) for N; a policy of several members takes (members, N, obs_dim).
        ``live``: which environments still run, as ``obs``'s leading shape (the others get zeros and
        may be skipped). Returns the actions, shaped as ``obs`` with act_dim last."""
        xp = self.arrays
        obs = xp.asarray(obs)
        lead = tuple(obs.shape[:-1])
        state = (obs.reshape(self.members, -1, obs.shape[-1]) - self._mean) / self._std
        M, n = state.shape[:2]
        per_env = lambda x: xp.broadcast(xp.asarray(x), lead).reshape(M, n)
        if self.t == 0:
            rtg = per_env(self.target) / self.reward_scale
            self.history = [xp.zeros((M, n, 0, d)) for d in (state.shape[-1], self.act_dim, 1)]
        else:
            rtg = self.history[2][:, :, -1, 0] - per_env(reward) / self.reward_scale
        new = (state, xp.zeros((M, n, self.act_dim)), rtg[:, :, None])
        self.history = [xp.cat([h, x[:, :, None]], 2)[:, :, -self.context :] for h, x in zip(self.history, new)]
        timesteps = xp.arange(self.t + 1 - self.history[0].shape[2], self.t + 1)
        action = self._predict(*self.history, timesteps, None if live is None else np.asarray(live, bool).reshape(M, n))
        self.history[1][:, :, -1] = action
        self.t += 1
        return xp.numpy(action).reshape(*lead, self.act_dim)

    def evaluating(self):
        """A context in which the model acts as evaluation wants it (no dropout); nothing to switch here."""
        return contextlib.nullcontext()

    def _predict(self, states, actions, rtg, timesteps, live: np.ndarray | None):
        raise NotImplementedError

    @staticmethod
    def live_rows(live: np.ndarray) -> tuple[np.ndarray, int]:
        """Per member, the indices of its live episodes, padded with a repeat to the most any member has
        (M, width), so that ended episodes cost nothing once every member has some; and that width."""
        rows = [np.flatnonzero(a) for a in live]
        width = max(map(len, rows))
        return np.stack([np.resize(r if len(r) else [0], width) for r in rows]), width
