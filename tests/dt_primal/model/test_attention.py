import pytest
import torch

from dt_primal.config import Config
from dt_primal.model.attention import CausalPrimalAttention, SoftmaxAttention, causal_mean, ksvd_objective
from dt_primal.model.transformer import DecisionTransformer

D, H, S, M = 32, 4, 6, 2  # M members: every input (M, B, L, D)


def attentions():
    torch.manual_seed(0)
    return [SoftmaxAttention(M, D, H, dropout=0.0).eval(), CausalPrimalAttention(M, D, H, S, dropout=0.0).eval()]


@pytest.mark.parametrize("attn", attentions(), ids=["softmax", "primal"])
def test_causal_later_tokens_do_not_change_earlier_outputs(attn):
    x = torch.randn(M, 2, 10, D)
    y, _ = attn(x)
    x2 = x.clone()
    x2[:, :, 6:] = torch.randn(M, 2, 4, D) * 10
    y2, _ = attn(x2)
    torch.testing.assert_close(y[:, :, :6], y2[:, :, :6])
    assert not torch.allclose(y[:, :, 6:], y2[:, :, 6:])


@pytest.mark.parametrize("attn", attentions(), ids=["softmax", "primal"])
def test_members_never_mix(attn):
    """Member m's outputs are those of its own weights alone: changing another member's inputs or
    weights changes nothing of its."""
    x = torch.randn(M, 3, 9, D)
    y, J = attn(x)
    x2 = x.clone()
    x2[1] = torch.randn(3, 9, D)
    with torch.no_grad():
        for p in attn.parameters():
            p[1] += 0.1
    y2, J2 = attn(x2)
    torch.testing.assert_close(y2[0], y[0])
    assert not torch.allclose(y2[1], y[1])
    if J is not None:
        torch.testing.assert_close(J2[0], J[0])


@pytest.mark.parametrize("attn", attentions(), ids=["softmax", "primal"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_never_changes_real_outputs(attn, side):
    x = torch.randn(M, 3, 8, D)
    y, J = attn(x)
    pad = torch.randn(M, 3, 5, D) * 100  # garbage of any size
    xp = torch.cat([pad, x], 2) if side == "left" else torch.cat([x, pad], 2)
    valid = torch.zeros(M, 3, 13, dtype=torch.bool)
    real = slice(5, 13) if side == "left" else slice(0, 8)
    valid[:, :, real] = True
    yp, Jp = attn(xp, valid)
    torch.testing.assert_close(yp[:, :, real], y, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(yp).all()
    if J is not None:  # the KSVD objective also ignores padding
        torch.testing.assert_close(Jp, J, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", attentions(), ids=["softmax", "primal"])
@pytest.mark.parametrize("rows", [slice(1, None, 3), slice(10, 11)], ids=["state-tokens", "newest"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("ksvd", [True, False])
def test_rows_give_exactly_those_outputs_of_the_full_pass(attn, rows, padded, ksvd):
    x = torch.randn(M, 3, 12, D)
    valid = torch.arange(12) < torch.tensor([[[12], [7], [2]], [[5], [12], [1]]]) if padded else None
    y, J = attn(x, valid)
    y_rows, J_rows = attn(x, valid, rows, ksvd)
    torch.testing.assert_close(y_rows, y[:, :, rows], atol=1e-6, rtol=1e-5)
    if not ksvd:
        assert J_rows is None
    elif J is not None:  # the KSVD objective still covers every token
        torch.testing.assert_close(J_rows, J)


def test_primal_scores_are_the_running_means_of_the_projected_queries_and_keys():
    """e_t = φ(q̄_t)ᵀW_e with q̄_t the mean of q_j = x_j W_q + b over j ≤ t (eq. 9; docs/method.md,
    "Causal Primal-Attention"); r alike."""
    attn = attentions()[1]
    x = torch.randn(M, 2, 7, D)
    _, _, e, r = attn.scores(x, None)
    for m in range(M):  # member by member, with nn.Linear's own arithmetic
        qk = torch.nn.functional.linear(x[m], attn.qk.weight[m], attn.qk.bias[m])
        q, k = qk.view(2, 7, 2, H, D // H).permute(2, 0, 3, 1, 4)  # (B, H, L, d_k) each
        n = torch.arange(1, 8.0)[:, None]
        for z, W, got in ((q, attn.W_e[m], e[m]), (k, attn.W_r[m], r[m])):
            phi = torch.nn.functional.normalize(z.cumsum(2) / n, dim=-1)
            torch.testing.assert_close(got, torch.einsum("bhld,hds->bhls", phi, W), atol=1e-5, rtol=1e-5)


def test_model_newest_step_only_matches_the_full_forward():
    torch.manual_seed(0)
    cfg = Config(model="primal", d_model=32, n_head=2, n_layer=2, s=4, dropout=0.0, max_ep_len=50, context=5)
    net = DecisionTransformer(cfg.model_config(3, 2)).eval()
    args = torch.randn(1, 4, 5, 3), torch.randn(1, 4, 5, 2), torch.randn(1, 4, 5, 1), torch.arange(5).expand(1, 4, -1)
    full, Js = net(*args)
    last, no_Js = net(*args, last_only=True)
    assert full.shape == (1, 4, 5, 2) and last.shape == (1, 4, 1, 2)
    assert len(Js) == 1 and no_Js == []
    torch.testing.assert_close(last, full[:, :, -1:], atol=1e-6, rtol=1e-5)


def test_running_mean_counts_valid_tokens_only():
    z = torch.tensor([[[9.0], [1.0], [3.0], [5.0]]])  # (B=1, L=4, d=1)
    valid = torch.tensor([[False, True, True, True]])
    torch.testing.assert_close(causal_mean(z, valid).flatten(), torch.tensor([0.0, 1.0, 2.0, 3.0]))
    torch.testing.assert_close(causal_mean(z, None).flatten(), torch.tensor([9.0, 5.0, 13 / 3, 4.5]))


def test_ksvd_objective_matches_formula_written_out():
    torch.manual_seed(1)
    B, L = 2, 5
    e, r = torch.randn(M, B, H, L, S), torch.randn(M, B, H, L, S)
    lam, W_e, W_r = torch.rand(M, H, S), torch.randn(M, H, 8, S), torch.randn(M, H, 8, S)
    valid = torch.tensor([[True] * 5, [True, True, True, False, False]]).expand(M, -1, -1)
    J = ksvd_objective(e, r, lam, W_e, W_r, valid)
    for m in range(M):
        for b in range(B):
            n = int(valid[m, b].sum())
            se = sr = 0.0
            for h in range(H):
                for t in range(n):
                    se += sum(float(e[m, b, h, t, i] * lam[m, h, i]) ** 2 for i in range(S))
                    sr += sum(float(r[m, b, h, t, i] * lam[m, h, i]) ** 2 for i in range(S))
            trace = sum(float(torch.trace(W_e[m, h].T @ W_r[m, h])) for h in range(H)) / H
            expected = 0.5 * se / (H * n) + 0.5 * sr / (H * n) - trace
            assert abs(float(J[m, b]) - expected) < 1e-4 * max(1.0, abs(expected))


def test_primal_uses_the_papers_parameters():
    attn = CausalPrimalAttention(M, D, H, S, dropout=0.0)
    assert attn.W_e.shape == attn.W_r.shape == (M, H, D // H, S) and attn.Lambda.shape == (M, H, S)
    for m in range(M):
        flat = attn.W_e[m].detach().reshape(H, -1)  # orthogonal_ on each member's 3-D tensor: orthonormal rows
        torch.testing.assert_close(flat @ flat.T, torch.eye(H), atol=1e-5, rtol=0)
    assert not any("v" == n.split(".")[0] for n, _ in attn.named_parameters())  # no value projection


@pytest.mark.parametrize("model", ["dt", "primal", "primalformer"])
def test_action_prediction_ignores_own_and_future_actions(model):
    torch.manual_seed(0)
    cfg = Config(model=model, d_model=32, n_head=4, n_layer=3, s=8, dropout=0.0)
    net = DecisionTransformer(cfg.model_config(11, 3)).eval()
    primal = [type(b.attn).__name__ == "CausalPrimalAttention" for b in net.blocks]
    assert primal == {"dt": [False] * 3, "primal": [False, False, True], "primalformer": [True] * 3}[model]
    s, a, R = torch.randn(1, 2, 6, 11), torch.rand(1, 2, 6, 3), torch.randn(1, 2, 6, 1)
    t = torch.arange(6).repeat(1, 2, 1)
    pred, Js = net(s, a, R, t)
    assert len(Js) == sum(primal)
    a2 = a.clone()
    a2[:, :, 3:] = -a2[:, :, 3:]
    pred2, _ = net(s, a2, R, t)
    torch.testing.assert_close(pred[:, :, :4], pred2[:, :, :4])  # a_3 is not seen when predicting a_3
    assert not torch.allclose(pred[:, :, 4:], pred2[:, :, 4:])
