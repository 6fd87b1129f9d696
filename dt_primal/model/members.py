"""The member dimension: M models of one architecture as one model whose every weight has a leading
dimension of M, and whose every activation has the shape (M, B, ..., features).

Members never mix: member m's outputs and gradients depend on its own weights and inputs alone, so
M seeds (or M datasets of one task) train in one process as they would train apart, with one
batched kernel per operation for all of them (a batched matrix product for a linear layer) instead of M.
A single run is an ensemble of one. Attention folds the members into its batch (``attention.py``).

Each member's weights, ``member_state(model, m)``, have the shapes of PyTorch's own layers (a linear
weight (out, in), a LayerNorm's (d,), an embedding table (n, d)): what a checkpoint stores.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class MemberLinear(nn.Module):
    """``nn.Linear`` for every member: x (M, ..., in) -> (M, ..., out), member m's through its own
    weight (out, in) and bias, initialised as ``nn.Linear`` (uniform within ±1/√in). The weight is
    stored in memory as (M, in, out), the layout of its gradient ``xᵀ·grad``, which then accumulates
    without a copy (``torch.bmm``'s backward, unlike ``torch.mm``'s, keeps no other layout)."""

    def __init__(self, members: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, in_features, out_features).transpose(1, 2))
        self.bias = nn.Parameter(torch.empty(members, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As ``nn.Linear``'s, member by member (the same random draws for one member)."""
        for w, b in zip(self.weight, self.bias):
            init_(w, lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5)))
            nn.init.uniform_(b, -1 / math.sqrt(w.shape[1]), 1 / math.sqrt(w.shape[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        M, n_in = x.shape[0], x.shape[-1]
        flat, w, b = x.reshape(M, -1, n_in), self.weight.transpose(1, 2), self.bias.unsqueeze(1)
        if torch.compiler.is_compiling():  # the bias added in the next fused kernel: CUDA's baddbmm copies it
            y = torch.bmm(flat, w)  # into its output first (one activation-sized copy per layer)
            y = y + b.to(y.dtype)
        else:  # eager: baddbmm, faster than the product and an addition on a CPU
            y = torch.baddbmm(b, flat, w)
        return y.view(*x.shape[:-1], -1)

    def extra_repr(self) -> str:
        return (
            f"members={self.weight.shape[0]}, in_features={self.weight.shape[2]}, out_features={self.weight.shape[1]}"
        )


class MemberLayerNorm(nn.Module):
    """``nn.LayerNorm`` over the last dimension with each member's own affine weight and bias (d,)."""

    def __init__(self, members: int, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, d))
        self.bias = nn.Parameter(torch.zeros(members, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        return torch.addcmul(self.bias.view(shape), F.layer_norm(x, x.shape[-1:]), self.weight.view(shape))


class MemberEmbedding(nn.Module):
    """``nn.Embedding`` with one table (n, d) per member: indices (M, ...) -> (M, ..., d), member m's
    looked up in its own table (the tables side by side as one of M·n rows)."""

    def __init__(self, members: int, n: int, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(members, n, d))

    def reset_parameters(self) -> None:
        """As ``nn.Embedding``'s, N(0, 1), member by member."""
        for w in self.weight:
            init_(w, nn.init.normal_)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        M, n, d = self.weight.shape
        first_row = torch.arange(0, M * n, n, device=idx.device).view((M,) + (1,) * (idx.dim() - 1))
        return F.embedding(idx + first_row, self.weight.view(M * n, d))


def init_(param: torch.Tensor, fill: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """``fill`` (an ``nn.init`` function) on a contiguous tensor of ``param``'s shape, copied into
    ``param``: the random draws land where they would in PyTorch's own layer, whatever ``param``'s layout."""
    with torch.no_grad():
        param.copy_(fill(torch.empty(param.shape, dtype=param.dtype, device=param.device)))


def member_state(model: nn.Module, m: int) -> dict[str, torch.Tensor]:
    """Member m's weights (detached copies), each without the member dimension."""
    return {k: v[m].detach().clone() for k, v in model.state_dict().items()}


def all_finite(model: nn.Module) -> torch.Tensor:
    """(M,) bool: whether each member's weights are all finite (one tensor, no host sync)."""
    return torch.stack([torch.isfinite(p.detach()).flatten(1).all(1) for p in model.parameters()]).all(0)


def stack_members(
    build: Callable[[int], nn.Module], states: list[dict[str, torch.Tensor]], device: torch.device | str | None = None
) -> nn.Module:
    """``build(len(states))`` holding ``states[m]`` (a ``member_state``) as member m. The model is built
    on the meta device (no initialisation, no random numbers drawn), given memory of the same
    layout, and takes the stacked weights."""
    with torch.device("meta"):
        model = build(len(states))
    model.to_empty(device=device or next(iter(states[0].values())).device)
    model.load_state_dict({k: torch.stack([s[k] for s in states]) for k in states[0]})
    return model
