"""Dropout whose masks are cheap to draw on a CPU.

PyTorch's CPU dropout draws one Bernoulli sample per element from one generator, serially: at
the Primal.+DT paper's size a bf16 training step with its masks takes 1.1x the CPU time. Here one
64-bit draw gives four 16-bit uniforms, so a mask costs a quarter of the draws, and an element is
kept when its uniform is at least round(p·2¹⁶)/2¹⁶: dropout at p rounded to a multiple of 2⁻¹⁶,
with kept elements scaled by the inverse of the exact keep probability, so E[output] = input.
On other devices this is ``F.dropout`` (:func:`cheap_masks`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[torch.Tensor, float]:
    """A bool mask of ``shape``, each element True with probability 1 − round(p·2¹⁶)/2¹⁶ (at least
    2⁻¹⁶) and independent of the others, from torch's default generator; and that probability."""
    n, threshold = shape.numel(), min(round(p * 65536), 65535)  # at least one value in 2¹⁶ is kept
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)  # all 64 bits
    uniform16 = bits.view(torch.int16)[:n].view(shape)  # each in [−2¹⁵, 2¹⁵), uniformly
    return uniform16 >= threshold - 32768, 1.0 - threshold / 65536


_TORCH_MASKS = [False]  # inside torch_masks(): PyTorch's masks on every device


def cheap_masks(x: torch.Tensor) -> bool:
    """Whether dropout on ``x`` draws the cheap masks of this module (on a CPU, where they make a bf16
    training step 1.1x faster at the Primal.+DT paper's size, and an fp32 one no slower: docs/benchmarks.md
    "Profile") instead of PyTorch's own: the model path's one device-specific choice. CUDA's fused
    Philox kernel is fast, and CUDA graphs need PyTorch's dropout."""
    return x.device.type == "cpu" and not _TORCH_MASKS[0]


@contextlib.contextmanager
def torch_masks():
    """PyTorch's own dropout masks on every device inside, as on a GPU: what the benchmarks set beside the cheap
    ones. For the models built and stepped inside it (a compiled step keeps the masks it was traced with)."""
    before, _TORCH_MASKS[0] = _TORCH_MASKS[0], True
    try:
        yield
    finally:
        _TORCH_MASKS[0] = before


def drop(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout of ``x`` with rate ``p`` (identity when not training or p == 0)."""
    if not training or p == 0.0:
        return x
    if not cheap_masks(x):
        return F.dropout(x, p, True)
    keep, keep_prob = keep_mask(x.shape, p, x.device)
    return x * keep * (1.0 / keep_prob)


class Dropout(nn.Module):
    """``nn.Dropout`` with the cheaper CPU masks of :func:`drop`."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
