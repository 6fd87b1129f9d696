"""Decision Transformer whose blocks use softmax or Causal Primal-Attention (docs/method.md, "The model").

Tokens per timestep: return-to-go, state, action, interleaved (R̂₁, s₁, a₁, R̂₂, …); a learned
timestep embedding is added to the three tokens of a step; pre-LN GPT blocks; the action a_t is
predicted from the hidden state of the s_t token through tanh.

The model is M members of one architecture (``dt_primal.model.members``): every weight has a leading
member dimension and every tensor below a leading M, e.g. tokens (M, B, L, d_model). A single run
is M = 1; members never mix.
"""

from __future__ import annotations

import torch
from torch import nn

from dt_primal.model.architecture import ModelConfig
from dt_primal.model.attention import CausalPrimalAttention, SoftmaxAttention
from dt_primal.model.dropout import Dropout
from dt_primal.model.members import MemberEmbedding, MemberLayerNorm, MemberLinear, init_

ACTIVATION_LAYERS = {"relu": nn.ReLU, "gelu": nn.GELU}


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(LN(x)), then x + MLP(LN(x)) with MLP width 4·d_model and
    the config's activation (ReLU in both papers' code)."""

    def __init__(self, cfg: ModelConfig, primal: bool, members: int):
        super().__init__()
        d, M = cfg.d_model, members
        self.ln1, self.ln2 = MemberLayerNorm(M, d), MemberLayerNorm(M, d)
        self.attn = (
            CausalPrimalAttention(M, d, cfg.n_head, cfg.s, cfg.dropout)
            if primal
            else SoftmaxAttention(M, d, cfg.n_head, cfg.dropout)
        )
        self.mlp = nn.Sequential(
            MemberLinear(M, d, 4 * d),
            ACTIVATION_LAYERS[cfg.activation](),
            MemberLinear(M, 4 * d, d),
            Dropout(cfg.dropout),
        )

    def forward(self, x, valid, rows: slice | None = None, ksvd: bool = True):
        """Outputs at the positions ``rows`` only (None: all); attention still reads every token.
        ``ksvd``: whether a primal attention computes its KSVD objective J."""
        a, J = self.attn(self.ln1(x), valid, rows, ksvd)
        x = (x if rows is None else x[:, :, rows]) + a
        return x + self.mlp(self.ln2(x)), J


def primal_layers(cfg: ModelConfig) -> list[bool]:
    """Which blocks are primal: none (dt), the last (primal, the paper's Primal.+DT), all (primalformer)."""
    return [cfg.model == "primalformer" or (cfg.model == "primal" and i == cfg.n_layer - 1) for i in range(cfg.n_layer)]


class DecisionTransformer(nn.Module):
    """``members`` Decision Transformers of the architecture ``cfg`` (``dt_primal.model.members``)."""

    def __init__(self, cfg: ModelConfig, members: int = 1):
        super().__init__()
        d, M = cfg.d_model, members
        self.config, self.members = cfg, M
        self.max_ep_len = cfg.max_ep_len
        self.embed_return = MemberLinear(M, 1, d)
        self.embed_state = MemberLinear(M, cfg.state_dim, d)
        self.embed_action = MemberLinear(M, cfg.act_dim, d)
        self.embed_timestep = MemberEmbedding(M, self.max_ep_len, d)
        self.embed_ln = MemberLayerNorm(M, d)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, primal, M) for primal in primal_layers(cfg))
        self.ln_f = MemberLayerNorm(M, d)
        self.predict_action = MemberLinear(M, d, cfg.act_dim)
        self.apply(self._init_weights)  # GPT-2 init; primal W_e, W_r, Λ keep their own (eq. 9; appendix B.1)
        # --embed-init torch (default): the return, state and action embeddings and the action head keep PyTorch's
        # default init, as in the DT paper's code and d3rlpy: with N(0, 0.02) there DT learnt far slower at the DT
        # paper's lr 1e-4 (docs/results.md, "DT baselines" and "Initialisation")
        if cfg.embed_init == "torch":
            for layer in (self.embed_return, self.embed_state, self.embed_action, self.predict_action):
                layer.reset_parameters()
        # --timestep-init torch (default): the timestep table keeps nn.Embedding's N(0, 1), as in both papers' code
        # (built outside their GPT-2 module); gpt2: N(0, 0.02), as d3rlpy and dt-primal before 2026-11-25
        if cfg.timestep_init == "torch":
            self.embed_timestep.reset_parameters()

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (MemberLinear, MemberEmbedding)):
            init_(m.weight, lambda w: nn.init.normal_(w, std=0.02))
        if isinstance(m, MemberLinear):
            nn.init.zeros_(m.bias)

    def forward(self, states, actions, returns_to_go, timesteps, valid=None, last_only: bool = False):
        """states (M, B, K, o), actions (M, B, K, a), returns_to_go (M, B, K, 1), timesteps (M, B, K)
        long, valid (M, B, K) bool or None: member m's inputs at [m]. Returns predicted actions
        (M, B, K, a) and the list of per-layer KSVD objectives J (each (M, B)) of the primal blocks.
        ``last_only`` is the inference path: the action of the newest step only, (M, B, 1, a), and
        no KSVD objectives (an empty list).

        Only s_t tokens predict, so the last block computes its output at those tokens alone
        (at the newest one with ``last_only``): exact, and 1/3 (or 1/3K) of its MLP's work."""
        M, B, K, _ = states.shape
        t = self.embed_timestep(timesteps.clamp(max=self.max_ep_len - 1))
        tokens = torch.stack(
            [self.embed_return(returns_to_go) + t, self.embed_state(states) + t, self.embed_action(actions) + t], dim=3
        ).reshape(M, B, 3 * K, -1)
        x = self.drop(self.embed_ln(tokens))
        token_valid = None if valid is None else valid.repeat_interleave(3, dim=2)
        Js = []
        state_rows = slice(3 * K - 2, 3 * K - 1) if last_only else slice(1, None, 3)
        for i, block in enumerate(self.blocks):
            x, J = block(x, token_valid, state_rows if i == len(self.blocks) - 1 else None, ksvd=not last_only)
            if J is not None:
                Js.append(J)
        return torch.tanh(self.predict_action(self.ln_f(x))), Js  # x: hidden states of the s_t tokens


def dt_loss(model, batch: dict, eta: float):
    """Per member: action MSE over valid timesteps + η · mean_layers mean_b J_b² (eq. 10; docs/method.md,
    "The KSVD loss"); ``model`` is a DecisionTransformer or any callable with its signature, ``batch``
    (M, B, K, ...) tensors. Returns (loss, action_loss, mean J²), each (M,), mean J² being 0 without
    primal layers."""
    pred, Js = model(batch["states"], batch["actions"], batch["returns_to_go"], batch["timesteps"], batch["valid"])
    w = batch["valid"].unsqueeze(-1).to(pred.dtype)
    action_loss = (((pred.float() - batch["actions"]) ** 2) * w).sum((1, 2, 3)) / (w.sum((1, 2, 3)) * pred.shape[-1])
    j2 = torch.stack([(J.float() ** 2).mean(1) for J in Js]).mean(0) if Js else torch.zeros_like(action_loss)
    return action_loss + eta * j2, action_loss, j2
