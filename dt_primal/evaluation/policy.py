"""Acting with trained Decision Transformers in PyTorch: the ``Policy`` of one checkpoint
(``dt_primal.load_policy``) or of several at once (evaluation). Needs torch and NumPy only.

  policy = dt_primal.load_policy("runs/hopper/last.pt")
  policy.reset(target_return=3600.0)
  action = policy.act(obs)                   # the first step: no reward yet
  action = policy.act(obs, reward=reward)    # each later step: the reward the last action earned
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from dt_primal.checkpoint import model_from_checkpoints, read_checkpoint
from dt_primal.evaluation.acting import Acting
from dt_primal.model.transformer import DecisionTransformer
from dt_primal.precision import acting_precision, autocast, tf32


class TorchArrays:
    """``NumpyArrays``' operations on torch tensors on ``device``: acting's state stays there."""

    def __init__(self, device: torch.device):
        self.device = device

    def asarray(self, x):
        return torch.as_tensor(np.asarray(x), dtype=torch.float32, device=self.device)

    def zeros(self, shape):
        return torch.zeros(shape, device=self.device)

    def cat(self, arrays, axis):
        return torch.cat(arrays, axis)

    def broadcast(self, x, shape):
        return x.expand(shape)

    def arange(self, start, stop):
        return torch.arange(start, stop, device=self.device)

    def numpy(self, x) -> np.ndarray:
        return x.cpu().numpy()


class Policy(Acting):
    """Acts with the members of ``model`` (a ``DecisionTransformer`` of one member or several, which
    run as one forward pass), conditioned on a target return that drops by each reward /
    ``reward_scale`` (docs/method.md): each action is the model's prediction from the last ``context``
    steps of normalised observations ``(obs - state_mean) / state_std``, returns-to-go and earlier
    actions, at its timesteps (the bookkeeping: ``dt_primal.evaluation.acting.Acting``).

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
        self.model, self.precision = model, precision
        self.device = getattr(model, "device", None) or next(model.parameters()).device
        self.config = model.config  # the members' ModelConfig
        self.arrays = TorchArrays(self.device)
        super().__init__(model.members, self.config.act_dim, state_mean, state_std, reward_scale, context)

    @property
    def max_ep_len(self) -> int:
        return self.model.max_ep_len

    @contextlib.contextmanager
    def evaluating(self):
        """The model in evaluation mode (no dropout) inside, as it was after (training's periodic evaluation
        acts with the model it trains)."""
        was_training = self.model.training
        self.model.train(False)
        try:
            yield
        finally:
            self.model.train(was_training)

    @torch.no_grad()
    def act(self, obs, reward=0.0, live=None) -> np.ndarray:
        return super().act(obs, reward, live)

    def _predict(self, states, actions, rtg, timesteps, live: np.ndarray | None) -> torch.Tensor:
        """The newest step's action (M, N, act_dim) of every member's live episodes (zeros for the others),
        in one forward pass of the model on as many episodes per member as the member with the most live
        ones has (``Acting.live_rows``)."""
        M, n = states.shape[:2]
        live = np.ones((M, n), bool) if live is None else live
        rows, width = self.live_rows(live)
        out = states.new_zeros(M, n, self.act_dim)
        if width == 0:
            return out
        index = (torch.arange(M, device=self.device)[:, None], torch.as_tensor(rows, device=self.device))
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


def load_checkpoint_policy(
    path: str | os.PathLike, device: torch.device | str = "cpu", precision: str | None = None
) -> Policy:
    """The policy of the checkpoint at ``path`` (a ``last.pt`` written by train.py), read without
    running any code from the file, on ``device``, at the run's precision (bf16 becomes fp32 on a CPU
    where bf16 is slow) unless ``precision`` (fp32, tf32 or bf16) is given."""
    return policy_from_checkpoints([read_checkpoint(path)], device, precision)
