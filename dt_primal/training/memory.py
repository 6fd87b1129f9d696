"""What a run's training step needs in memory, estimated before anything is allocated: a model or a
--batch-size that cannot fit is refused with the option to lower, before the operating system kills the
process for taking more."""

from __future__ import annotations

import os

from dt_primal.config import DEFAULT_MAX_EP_LEN, Config
from dt_primal.errors import UserError
from dt_primal.machine import available_bytes, gib


def batch_bytes(cfg: Config) -> int:
    """A lower estimate of what one member's training step holds for its batch: per layer and token
    the activations kept for the backward pass (measured: 9-16 floats per d_model unit, 8 taken) and
    per head the attention's token x token matrices, in fp32."""
    tokens = 3 * cfg.context
    return cfg.batch_size * cfg.n_layer * tokens * (8 * cfg.d_model + 4 * cfg.n_head * tokens) * 4


def weight_bytes(cfg: Config) -> int:
    """What one member's weights take with their gradients and AdamW's two moments (4 fp32 copies): per
    block 12·d_model² (attention and the MLP), the timestep table, and per primal layer its KSVD weights
    (W_e, W_r: d_model·s each, and the shared head 2·s·d_k); the embeddings of observations and actions
    are left out (small)."""
    d, s = cfg.d_model, cfg.resolved_s()
    primal = 0 if cfg.model == "dt" else cfg.n_layer if cfg.model == "primalformer" else 1
    params = (
        cfg.n_layer * 12 * d * d
        + (cfg.max_ep_len or DEFAULT_MAX_EP_LEN) * d
        + primal * (2 * d * s + 2 * s * d // cfg.n_head)
    )
    return 16 * params


def check_batch_memory(cfg: Config, members: int) -> None:
    """Refuse a model or a --batch-size whose training step cannot fit in the memory this machine (or its
    GPU) has free, before the operating system kills the process for taking more."""
    world = max(1, int(os.environ.get("WORLD_SIZE", "1")))  # each torchrun process holds its share
    weights = weight_bytes(cfg) * members
    need = batch_bytes(cfg) * members // world + weights
    free, memory = available_bytes(cfg.device)
    if free and weights > free // 2:
        raise UserError(
            f"The model's weights, gradients and optimizer state need about {gib(weights)} ({members} "
            f"seed{'s' if members > 1 else ''} at once, d_model {cfg.d_model}, {cfg.n_layer} layers, KSVD rank "
            f"{cfg.resolved_s()}), more than half the {gib(free)} of {memory} free here. Lower --d-model, "
            f"--n-layer or --s, or train fewer --seeds at once."
        )
    if free and need > free:
        fits = (free - weights) * cfg.batch_size // (need - weights)
        if fits < 1:
            raise UserError(
                f"Even one window of context {cfg.context} (d_model {cfg.d_model}, {cfg.n_layer} layers) needs "
                f"more than the {gib(free)} of {memory} free here for its activations: lower --context or "
                f"--d-model."
            )
        raise UserError(
            f"--batch-size {cfg.batch_size} needs at least {gib(need)} for the activations of one training "
            f"step ({members} seed{'s' if members > 1 else ''} at once, d_model {cfg.d_model}, "
            f"{cfg.n_layer} layers, context {cfg.context}), more than the {gib(free)} of {memory} here. "
            f"Lower --batch-size (about {fits:,} fits at most), or train fewer --seeds at once."
        )
