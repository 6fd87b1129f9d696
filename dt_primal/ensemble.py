"""Several Decision Transformers of one architecture (one per seed) as one model whose weights have
a leading member dimension.

The members' weights are stacked once (``torch.func.stack_module_state``) and every call runs the
one ``DecisionTransformer`` module functionally (``torch.func.functional_call``) with a member's
weights. Members never mix: member i's outputs and gradients depend on its weights and inputs only.

How the members run is the one device-specific choice, made here: on CUDA one ``vmap`` over the
member dimension for two members or more (one batched kernel per operation for all members, which
is what a GPU needs; a single member runs plainly, 1.1-1.25x faster on an H100); elsewhere a loop
over the members, which on a CPU is 1.3-1.5x faster than ``vmap`` (its SDPA has no batching rule
there) and keeps the CPU's cheap dropout masks (docs/benchmarks.md, "Ensembles").
"""
from __future__ import annotations

import copy

import torch
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._pytree import tree_map

from dt_primal.model import DecisionTransformer


class Ensemble:
    """``len(models)`` members with stacked weights ``params`` / ``buffers`` (name -> (M, ...))."""

    def __init__(self, models: list[DecisionTransformer]):
        self.template = copy.deepcopy(models[0]).to("meta")  # the architecture; weights come with each call
        self.params, self.buffers = stack_module_state(models)
        self.size = len(models)
        self.device = next(iter(self.params.values())).device
        self.vmap = self.device.type == "cuda" and self.size > 1

    @property
    def max_ep_len(self) -> int:
        return self.template.max_ep_len

    @property
    def act_dim(self) -> int:
        return self.template.config.act_dim

    def train(self, mode: bool = True) -> "Ensemble":
        self.template.train(mode)
        return self

    def map(self, fn, *inputs):
        """``fn(member, *inputs_i)`` for every member, stacked along a new dimension 0: ``member`` is a
        callable DecisionTransformer with member i's weights, and ``inputs_i`` the i-th slices of
        ``inputs`` (tensors, or dicts/lists of them, with a leading member dimension). ``fn`` returns a
        tensor or a tuple of them."""
        def one(params, buffers, *x):
            return fn(lambda *a, **k: functional_call(self.template, (params, buffers), a, k), *x)

        if self.vmap:  # SDPA's math path: vmapped, its fused kernels' backward fails ("LSE is not correctly aligned")
            with sdpa_kernel(SDPBackend.MATH):
                return vmap(one, randomness="different")(self.params, self.buffers, *inputs)
        # unbind: one backward node hands every member its gradient (indexing would add M full-size zeros each);
        # a single member's weights by a view, whose gradient is the member's own (no copy into a stack)
        split = (lambda v: v.unbind(0)) if self.size > 1 else (lambda v: (v.squeeze(0),))
        params, buffers = ({k: split(v) for k, v in d.items()} for d in (self.params, self.buffers))
        outs = [one({k: v[i] for k, v in params.items()}, {k: v[i] for k, v in buffers.items()},
                    *tree_map(lambda x: x[i], inputs)) for i in range(self.size)]
        return torch.stack(outs) if isinstance(outs[0], torch.Tensor) else tuple(map(torch.stack, zip(*outs)))

    def member_call(self, i: int):
        """Member i as a callable DecisionTransformer (its weights are views of the stacked ones)."""
        params = {k: v[i] for k, v in self.params.items()}
        buffers = {k: v[i] for k, v in self.buffers.items()}
        return lambda *a, **k: functional_call(self.template, (params, buffers), a, k)

    def state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Member i's weights, as ``DecisionTransformer.state_dict()`` gives them (detached copies)."""
        return {k: v[i].detach().clone() for k, v in {**self.params, **self.buffers}.items()}

    def all_finite(self) -> torch.Tensor:
        """(M,) bool: whether each member's weights are all finite (one tensor, no host sync)."""
        return torch.stack([torch.isfinite(p.detach()).flatten(1).all(1) for p in self.params.values()]).all(0)
