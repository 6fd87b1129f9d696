"""Which model a config names: its class and its loss."""

from __future__ import annotations

from torch import nn

from dt_primal.model.architecture import ModelConfig
from dt_primal.model.bc import MLPPolicy, bc_loss
from dt_primal.model.transformer import DecisionTransformer, dt_loss


def build_model(cfg: ModelConfig, members: int = 1) -> nn.Module:
    """``members`` models of the architecture ``cfg``: BC's MLP (``bc``), else a Decision Transformer."""
    return MLPPolicy(cfg, members) if cfg.model == "bc" else DecisionTransformer(cfg, members)


def loss_of(model: str):
    """The training loss of the model named ``model``: ``loss(model, batch, eta)`` -> (loss, action MSE,
    mean J²), each (M,)."""
    return bc_loss if model == "bc" else dt_loss
