import pytest
import torch

from dt_primal.model.attention import SoftmaxAttention
from dt_primal.model.dropout import Dropout, cheap_masks, drop, keep_mask, torch_masks


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_masks_keep_each_element_with_probability_one_minus_p_independently(p):
    torch.manual_seed(0)
    n = 1_000_000
    keep, keep_prob = keep_mask(torch.Size([n]), p, torch.device("cpu"))
    assert keep.dtype == torch.bool and abs(keep_prob - (1 - p)) < 1e-4
    frac = keep.float().mean().item()
    assert abs(frac - keep_prob) < 5 * (keep_prob * (1 - keep_prob) / n) ** 0.5
    # the four 16-bit lanes of one 64-bit draw, and neighbouring draws, are uncorrelated
    m = keep.float().view(-1, 4)
    for a, b in ((m[:, 0], m[:, 1]), (m[:, 1], m[:, 3]), (m[:-1, 3], m[1:, 0])):
        assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.01


def test_dropout_is_unbiased_and_its_gradient_is_the_same_mask():
    torch.manual_seed(1)
    x = torch.full((400_000,), 3.0, requires_grad=True)
    y = drop(x, 0.1)
    assert abs(y.mean().item() - 3.0) < 0.01
    kept = y != 0
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 3.0 / (1 - round(0.1 * 65536) / 65536)))
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, y.detach() / 3.0)


def test_dropout_is_the_identity_in_eval_or_at_zero_and_seeded_masks_repeat():
    x = torch.randn(4, 5, 6)
    layer = Dropout(0.3)
    assert layer.eval()(x) is x and drop(x, 0.0) is x
    layer.train()
    torch.manual_seed(2)
    a = layer(x)
    torch.manual_seed(2)
    assert torch.equal(a, layer(x)) and not torch.equal(a, x)


def test_written_out_training_attention_averages_to_the_sdpa_output():
    """In training on a CPU, SoftmaxAttention drops attention probabilities itself (not through
    SDPA): the mean over many dropout draws must be the no-dropout (SDPA) output, padding and
    causality included, and padded keys must get no weight in any draw."""
    torch.manual_seed(3)
    attn = SoftmaxAttention(1, 16, 2, dropout=0.3)
    x = torch.randn(1, 2, 6, 16)
    valid = torch.tensor([[[True] * 6, [False, False, True, True, True, True]]])
    with torch.no_grad():
        expected = attn.eval()(x, valid)[0]
        attn.train()
        draws = torch.stack([attn(x, valid)[0] for _ in range(6000)])
        x_changed_padding = x.clone()
        x_changed_padding[0, 1, :2] = 100.0
        torch.manual_seed(4)
        a = attn(x, valid)[0]
        torch.manual_seed(4)
        b = attn(x_changed_padding, valid)[0]
    torch.testing.assert_close(draws.mean(0), expected, atol=0.02, rtol=0)
    torch.testing.assert_close(a[0, 1, 2:], b[0, 1, 2:])


def test_inside_torch_masks_a_cpu_draws_pytorchs_own_dropout_masks():
    """The benchmarks' seam: PyTorch's masks on a CPU inside ``torch_masks``, the cheap ones again after it."""
    x = torch.ones(64, 64)
    torch.manual_seed(0)
    theirs = torch.nn.functional.dropout(x, 0.1, True)
    with torch_masks():
        torch.manual_seed(0)
        inside, chosen = drop(x, 0.1), cheap_masks(x)
    torch.manual_seed(0)
    assert not chosen and torch.equal(inside, theirs)
    assert cheap_masks(x) and not torch.equal(drop(x, 0.1), theirs)
