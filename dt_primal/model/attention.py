"""Causal self-attention: one interface, two implementations.

Both take ``x`` (M, B, L, d_model) of M members (``dt_primal.model.members``), ``valid`` (M, B, L) bool
(True for real tokens, or None when there is no padding), ``rows``, a slice of the positions whose
output is wanted (None: all), and ``ksvd``, whether the KSVD objective is wanted, and return
``(y, J)``: the output (M, B, len(rows), d_model) and the per-sequence KSVD objective J (M, B) over
all tokens — None for softmax attention and when ``ksvd`` is False (inference, where the primal
layer then works at ``rows`` alone). No output at a real token depends on padding or on a later
token. The members' sequences are one batch of M·B sequences wherever the weights are shared (the
attention itself), so that SDPA runs its fused kernels for all members at once.
Softmax attention can also be written out (``use_attention_kernel(model, "math")``), for a compiler to
fuse; both compute the same function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dt_primal.model.dropout import Dropout, cheap_masks, drop
from dt_primal.model.members import MemberLinear


def attention_probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d_k) over the keys that ``mask`` allows: (B, H, L_q, L_k)."""
    return (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~mask, float("-inf")).softmax(-1)


class SoftmaxAttention(nn.Module):
    """Canonical causal multi-head attention through ``scaled_dot_product_attention``. Where dropout
    draws cheap masks (:func:`dt_primal.model.dropout.cheap_masks`: in training on a CPU, where SDPA's
    dropout would run its unfused math path with PyTorch's slow CPU masks), the same math is
    written out with :func:`dt_primal.model.dropout.drop`."""

    def __init__(self, members: int, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.sdpa = True  # False: the math written out (``use_attention_kernel``)
        self.qkv = MemberLinear(members, d_model, 3 * d_model)
        self.proj = MemberLinear(members, d_model, d_model)
        self.resid_drop = Dropout(dropout)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None, rows: slice | None = None, ksvd: bool = True):
        M, B, L, D = x.shape
        q, k, v = self.qkv(x).view(M * B, L, 3, self.n_head, D // self.n_head).permute(2, 0, 3, 1, 4)
        valid = None if valid is None else valid.reshape(M * B, L)
        p = self.dropout if self.training else 0.0
        sdpa = self.sdpa and (p == 0.0 or not cheap_masks(x))
        if valid is None and rows is None and sdpa:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:  # causal and key-padding mask; every token sees itself so no row is empty
            idx = torch.arange(L, device=x.device)
            at = idx if rows is None else idx[rows]
            mask = at[:, None] >= idx[None, :]
            if valid is not None:
                mask = mask & valid[:, None, None, :] | (at[:, None] == idx[None, :])
            q = q if rows is None else q[:, :, rows]
            y = (
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
                if sdpa
                else drop(attention_probs(q, k, mask), p) @ v
            )
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(M, B, y.shape[2], D))), None

    def attention_matrix(self, x: torch.Tensor) -> torch.Tensor:
        """The causal attention probabilities (M, B, H, L, L) of unpadded ``x``."""
        M, B, L, D = x.shape
        q, k, _ = self.qkv(x).view(M, B, L, 3, self.n_head, D // self.n_head).permute(3, 0, 1, 4, 2, 5)
        return attention_probs(q, k, torch.ones(L, L, dtype=torch.bool, device=x.device).tril())


def use_attention_kernel(model: nn.Module, kernel: str) -> nn.Module:
    """``model`` with its softmax attention run by ``kernel``: ``sdpa`` (PyTorch's fused kernels) or
    ``math`` (q kᵀ, mask, softmax and the product with v written out)."""
    for m in model.modules():
        if isinstance(m, SoftmaxAttention):
            m.sdpa = kernel == "sdpa"
    return model


def causal_mean(z: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Running mean over the valid tokens up to each position, z: (..., L, d), valid (..., L), in fp32
    (docs/method.md, "Causal Primal-Attention", step 2)."""
    z = z.float()
    if valid is None:
        n = torch.arange(1, z.shape[-2] + 1, device=z.device, dtype=z.dtype)[:, None]
        return z.cumsum(-2) / n
    w = valid[..., None].to(z.dtype)
    return (z * w).cumsum(-2) / w.cumsum(-2).clamp_min(1.0)


def ksvd_objective(
    e: torch.Tensor,
    r: torch.Tensor,
    lam: torch.Tensor,
    W_e: torch.Tensor,
    W_r: torch.Tensor,
    valid: torch.Tensor | None,
) -> torch.Tensor:
    """KSVD primal objective J of eq. 11 for each sequence, as docs/method.md ("The KSVD loss") writes it:

        J_b = ½ mean_{h,t} ‖e_{h,t} ⊙ Λ_h‖² + ½ mean_{h,t} ‖r_{h,t} ⊙ Λ_h‖² − Tr(mean_h W_e[h]ᵀ W_r[h])

    per member: e, r (M, B, H, L, s) scores; lam (M, H, s); W_e, W_r (M, H, d_k, s); valid (M, B, L);
    means over valid tokens only. Returns (M, B).
    """
    lam = lam[:, None, :, None, :].float()
    energy = 0.5 * ((e.float() * lam) ** 2).sum(-1) + 0.5 * ((r.float() * lam) ** 2).sum(-1)  # (M, B, H, L)
    if valid is None:
        mean = energy.mean((2, 3))
    else:
        w = valid[:, :, None, :].to(energy.dtype)
        mean = (energy * w).sum((2, 3)) / (w.sum((2, 3)) * energy.shape[2]).clamp_min(1.0)
    return mean - (W_e.float() * W_r.float()).sum((2, 3)).mean(1, keepdim=True)


class CausalPrimalAttention(nn.Module):
    """Causal Primal-Attention with data-independent projection weights (eq. 9, appendix B.1,
    docs/method.md): running-mean queries/keys, cosine feature map φ(z) = z/‖z‖, scores
    e = φ(q̄)ᵀW_e and r = φ(k̄)ᵀW_r, output Linear([e; r]). No value projection; O(L·d_k·s)."""

    def __init__(self, members: int, d_model: int, n_head: int, s: int, dropout: float):
        super().__init__()
        M, self.n_head, d_k = members, n_head, d_model // n_head
        self.qk = MemberLinear(M, d_model, 2 * d_model)
        self.W_e = nn.Parameter(torch.stack([nn.init.orthogonal_(torch.empty(n_head, d_k, s)) for _ in range(M)]))
        self.W_r = nn.Parameter(torch.stack([nn.init.orthogonal_(torch.empty(n_head, d_k, s)) for _ in range(M)]))
        self.Lambda = nn.Parameter(torch.rand(M, n_head, s))  # used by the KSVD loss only
        self.head_out = MemberLinear(M, 2 * s, d_k)  # shared by all heads
        self.proj = MemberLinear(M, d_model, d_model)
        self.resid_drop = Dropout(dropout)

    def scores(self, x: torch.Tensor, valid: torch.Tensor | None, rows: slice | None = None):
        """Features φ(q̄), φ(k̄) (M, B, H, L', d_k) and scores e, r (M, B, H, L', s) at the positions
        ``rows`` (None: all L). The running means q̄, k̄ are projections of the running mean of x:
        equal by linearity (the mean's weights sum to one), and only ``rows`` are projected."""
        x_mean = causal_mean(x, valid)
        if rows is not None:
            x_mean = x_mean[:, :, rows]
        M, B, L, D = x_mean.shape
        q, k = self.qk(x_mean.to(x.dtype)).view(M, B, L, 2, self.n_head, D // self.n_head).permute(3, 0, 1, 4, 2, 5)
        phi_q, phi_k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
        e = torch.einsum("mbhld,mhds->mbhls", phi_q, self.W_e.float())
        r = torch.einsum("mbhld,mhds->mbhls", phi_k, self.W_r.float())
        return phi_q, phi_k, e, r

    def attention_matrix(self, x: torch.Tensor) -> torch.Tensor:
        """The asymmetric kernel matrix K_ij = <φ(q̄_i), φ(k̄_j)> (M, B, H, L, L) of unpadded ``x``
        (section 4: the dual counterpart of the primal scores)."""
        phi_q, phi_k, _, _ = self.scores(x, None)
        return phi_q @ phi_k.transpose(-1, -2)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None, rows: slice | None = None, ksvd: bool = True):
        M, B, _, D = x.shape
        _, _, e, r = self.scores(x, valid, None if ksvd else rows)
        J = ksvd_objective(e, r, self.Lambda, self.W_e, self.W_r, valid) if ksvd else None
        if ksvd and rows is not None:
            e, r = e[:, :, :, rows], r[:, :, :, rows]
        y = self.head_out(torch.cat([e, r], dim=-1).to(x.dtype))  # (M, B, H, len(rows), d_k)
        return self.resid_drop(self.proj(y.transpose(2, 3).reshape(M, B, y.shape[3], D))), J
