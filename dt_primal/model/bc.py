"""Behaviour cloning (BC) as the Decision Transformer paper's code trains it: an MLP from the last K
normalised states to the action (docs/method.md, "BC and %BC").

The input is the last K states concatenated, the missing ones before an episode's K-th step as zeros;
``n_layer`` hidden layers of width ``d_model``, each followed by the activation and dropout, then a linear
layer to the action and tanh. The loss is the MSE of the newest step's action. It ignores returns-to-go,
earlier actions and timesteps: one policy whatever the target return. Trained on the best episodes only
(``--top-percent``), it is %BC.

Members as everywhere (``dt_primal.model.members``): weights (M, ...), inputs (M, B, K, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dt_primal.model.architecture import ModelConfig
from dt_primal.model.dropout import Dropout
from dt_primal.model.members import MemberLinear
from dt_primal.model.transformer import ACTIVATION_LAYERS


class MLPPolicy(nn.Module):
    """``members`` BC policies of the architecture ``cfg`` (its ``context``, ``n_layer``, ``d_model``,
    ``dropout`` and ``activation``; PyTorch's initialisation of every layer, as the DT paper's code)."""

    def __init__(self, cfg: ModelConfig, members: int = 1):
        super().__init__()
        self.config, self.members, self.max_ep_len = cfg, members, cfg.max_ep_len
        widths = [cfg.context * cfg.state_dim] + [cfg.d_model] * cfg.n_layer
        layers = []
        for n_in, n_out in zip(widths[:-1], widths[1:]):
            layers += [MemberLinear(members, n_in, n_out), ACTIVATION_LAYERS[cfg.activation](), Dropout(cfg.dropout)]
        self.mlp = nn.Sequential(*layers, MemberLinear(members, cfg.d_model, cfg.act_dim))

    def forward(self, states, actions=None, returns_to_go=None, timesteps=None, valid=None, last_only: bool = True):
        """The action of the newest step (the last of ``states`` (M, B, k, o), k ≤ K steps, the newest last):
        (M, B, 1, act_dim), and no KSVD objectives (an empty list). The other inputs are ignored; they are
        the Decision Transformer's signature, so that the same acting and export code runs either model."""
        M, B, k, o = states.shape
        K = self.config.context
        x = F.pad(states[:, :, -K:], (0, 0, max(K - k, 0), 0))  # the missing earlier states are zeros
        return torch.tanh(self.mlp(x.reshape(M, B, 1, K * o))), []


def newest_last(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A training window's states moved so that its newest valid step is the last (zeros before its first),
    as acting sees them, and that step's action: (M, B, K, o) and (M, B, act_dim). ``batch``: the
    right-padded windows of ``dt_primal.data.WindowSampler``."""
    valid = batch["valid"]
    K = valid.shape[-1]
    n = valid.sum(-1, keepdim=True)  # (M, B, 1): valid steps, at least 1
    source = torch.arange(K, device=valid.device) + n - K  # the window step at each position, < 0: none
    states = batch["states"].gather(-2, source.clamp(min=0).unsqueeze(-1).expand_as(batch["states"]))
    action = batch["actions"].gather(-2, (n - 1).unsqueeze(-1).expand(*n.shape, batch["actions"].shape[-1]))
    return states * (source >= 0).unsqueeze(-1), action.squeeze(-2)


def bc_loss(model, batch: dict, eta: float):
    """Per member: the MSE of each window's newest action (the DT paper's BC loss); ``eta`` is not used.
    Returns (loss, action_loss, zeros) as ``dt_loss``, each (M,)."""
    states, target = newest_last(batch)
    pred, _ = model(states)
    action_loss = ((pred[:, :, 0].float() - target) ** 2).mean((1, 2))
    return action_loss, action_loss, torch.zeros_like(action_loss)
