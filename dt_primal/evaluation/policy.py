"""Acting with trained Decision Transformers: ``load_policy(path)`` for one checkpoint, and the
``Policy`` that evaluation drives for several at once. Needs torch and NumPy only.

  policy = load_policy("runs/hopper/last.pt")
  policy.reset(target_return=3600.0)
  action = policy.act(obs)                   # the first step: no reward yet
  action = policy.act(obs, reward=reward)    # each later step: the reward the last action earned
"""

from __future__ import annotations

import os

import numpy as np
import torch

from dt_primal.checkpoint import model_from_checkpoints, read_checkpoint
from dt_primal.model.transformer import DecisionTransformer
from dt_primal.precision import acting_precision, autocast, tf32


class Policy:
    """Acts with the members of ``model`` (a ``DecisionTransformer`` of one member or several, which
    run as one forward pass), conditioned on a target return that drops by each reward /
    ``reward_scale`` (docs/method.md): each action is the model's prediction from the last ``context``
    steps of normalised observations ``(obs - state_mean) / state_std``, returns-to-go and earlier
    actions, at its timesteps.

    ``state_mean``/``state_std``: (obs_dim,) or one row per member. ``model``: a ``DecisionTransformer``
    or anything with its ``members``, ``config.act_dim``, ``device`` (else its parameters'), ``training``,
    ``train(mode)``, ``max_ep_len`` and its call on (members, N, K, ...) inputs with ``last_only``."""

    def __init__(
        self,
        model: DecisionTransformer,
        state_mean,
        state_std,
        reward_scale: float,
        context: int,
        precision: str = "fp32",
    ):
        self.model, self.reward_scale, self.context, self.precision = model, reward_scale, context, precision
        self.members = model.members
        self.device = getattr(model, "device", None) or next(model.parameters()).device
        self.config = model.config  # the members' ModelConfig
        self.act_dim = self.config.act_dim
        self.state_mean, self.state_std = (np.asarray(a, np.float32) for a in (state_mean, state_std))
        self._mean, self._std = (
            torch.as_tensor(a, device=self.device).reshape(-1, 1, a.shape[-1])
            for a in (self.state_mean, self.state_std)
        )
        self.run_config: dict = {}  # the run's settings, for a policy loaded from a checkpoint
        self.reset(0.0)

    def reset(self, target_return) -> None:
        """Start new episodes conditioned on ``target_return``: a number, or one per environment (as
        the observations' leading dimensions)."""
        self.target, self.t, self.history = target_return, 0, None

    @torch.no_grad()
    def act(self, obs, reward=0.0, live=None) -> np.ndarray:
        """The action (float32, in [-1, 1]) for observation ``obs``, given ``reward``, the reward
        received since the last action (ignored on an episode's first step). ``obs``: (obs_dim,) for
        one environment, (N, obs_dim) for N; a policy of several members takes (members, N, obs_dim).
        ``live``: which environments still run, as ``obs``'s leading shape (the others get zeros and
        may be skipped). Returns the actions, shaped as ``obs`` with act_dim last."""
        obs = torch.as_tensor(np.asarray(obs), dtype=torch.float32, device=self.device)
        lead = obs.shape[:-1]
        state = (obs.reshape(self.members, -1, obs.shape[-1]) - self._mean) / self._std
        M, n = state.shape[:2]
        per_env = lambda x: (
            torch.as_tensor(np.asarray(x), dtype=torch.float32, device=self.device).expand(lead).reshape(M, n)
        )
        if self.t == 0:
            rtg = per_env(self.target) / self.reward_scale
            self.history = [state.new_zeros(M, n, 0, d) for d in (state.shape[-1], self.act_dim, 1)]
        else:
            rtg = self.history[2][:, :, -1, 0] - per_env(reward) / self.reward_scale
        new = (state, state.new_zeros(M, n, self.act_dim), rtg[:, :, None])
        self.history = [torch.cat([h, x[:, :, None]], 2)[:, :, -self.context :] for h, x in zip(self.history, new)]
        timesteps = torch.arange(self.t + 1 - self.history[0].shape[2], self.t + 1, device=self.device)
        action = self._predict(*self.history, timesteps, None if live is None else np.asarray(live, bool).reshape(M, n))
        self.history[1][:, :, -1] = action
        self.t += 1
        return action.reshape(*lead, self.act_dim).cpu().numpy()

    def _predict(self, states, actions, rtg, timesteps, live: np.ndarray | None) -> torch.Tensor:
        """The newest step's action (M, N, act_dim) of every member's live episodes (zeros for the others),
        in one forward pass of the model: on as many episodes per member as the member with the most live
        ones has (the others' lists padded with a repeat), so that ended episodes cost nothing once every
        member has some."""
        M, n = states.shape[:2]
        live = np.ones((M, n), bool) if live is None else live
        rows = [np.flatnonzero(a) for a in live]
        width = max(map(len, rows))
        out = states.new_zeros(M, n, self.act_dim)
        if width == 0:
            return out
        index = (
            torch.arange(M, device=self.device)[:, None],
            torch.as_tensor(np.stack([np.resize(r if len(r) else [0], width) for r in rows]), device=self.device),
        )
        with autocast(self.precision, self.device.type), tf32(self.precision):
            pred, _ = self.model(
                states[index], actions[index], rtg[index], timesteps.expand(M, width, -1), last_only=True
            )
        out[index] = pred[:, :, -1].float()
        return out * torch.as_tensor(live, device=self.device)[..., None]


def policy_from_checkpoints(
    ckpts: list[dict], device: torch.device | str = "cpu", precision: str | None = None
) -> Policy:
    """One Policy of the models of ``ckpts`` (``read_checkpoint``'s; one architecture, one reward
    scale), each with its own normalisation; ``precision`` (None or auto: the first run's, see
    ``acting_precision``)."""
    model = model_from_checkpoints(ckpts, device).train(False)
    run = ckpts[0]["config"]
    mean, std = (
        np.stack([c[k] for c in ckpts]) if len(ckpts) > 1 else ckpts[0][k] for k in ("state_mean", "state_std")
    )
    precision = acting_precision(precision, run["precision"], torch.device(device), model.config.d_model)[0]
    policy = Policy(model, mean, std, run["reward_scale"], model.config.context, precision)
    policy.run_config = run
    return policy


def load_policy(path: str | os.PathLike, device: torch.device | str = "cpu", precision: str | None = None) -> Policy:
    """The policy of the checkpoint at ``path`` (a ``last.pt`` written by train.py), read without
    running any code from the file, on ``device``, at the run's precision (bf16 becomes fp32 on a CPU
    where bf16 is slow) unless ``precision`` (fp32, tf32 or bf16) is given."""
    return policy_from_checkpoints([read_checkpoint(path)], device, precision)
