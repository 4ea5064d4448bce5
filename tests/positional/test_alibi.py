"""ALiBi: the published slopes and the bias -m (i - j) / -m |i - j| against loops."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.attention import attention
from poslab.errors import ConfigError
from poslab.positional import alibi_slopes, build_encoding

# the reference implementation's get_slopes(n), printed for these n
PUBLISHED = {
    8: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625],
    12: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
         0.7071067811865476, 0.35355339059327384, 0.17677669529663692, 0.08838834764831849],
    6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125],
    1: [0.00390625],
}


@pytest.mark.parametrize("n", sorted(PUBLISHED))
def test_slopes_equal_the_published_values(n):
    torch.testing.assert_close(alibi_slopes(n), torch.tensor(PUBLISHED[n], dtype=torch.float32))


@pytest.mark.parametrize("symmetric", [False, True])
def test_bias_against_loops(symmetric):
    torch.manual_seed(0)
    h, d = 3, 4
    enc = build_encoding("alibi", d_model=12, n_heads=h, d_head=d, max_len=32, symmetric=symmetric)
    q, k, v = torch.randn(2, h, 5, d), torch.randn(2, h, 7, d), torch.randn(2, h, 7, d)
    q_pos, k_pos = torch.tensor([2, 3, 4, 5, 6.5]), torch.arange(7)
    scores = attention(q, k, v, enc, q_pos, k_pos, need_weights=True).attn_scores
    slopes = [2 ** -4, 2 ** -8, 2 ** -2]  # 3 heads: the 2-head sequence, then the first of the 4-head one
    expected = torch.empty(2, h, 5, 7)
    for b in range(2):
        for head in range(h):
            for i in range(5):
                for j in range(7):
                    dist = float(q_pos[i]) - float(k_pos[j])
                    dist = abs(dist) if symmetric else dist
                    content = float(q[b, head, i] @ k[b, head, j]) / math.sqrt(d)
                    expected[b, head, i, j] = content - slopes[head] * dist
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)


def test_bad_symmetric_option():
    with pytest.raises(ConfigError) as err:
        build_encoding("alibi", d_model=8, n_heads=2, d_head=4, max_len=8, symmetric="yes")
    assert err.value.field == "symmetric"


@pytest.mark.parametrize("learned", [False, True])
@pytest.mark.parametrize("slope", [None, 0.5])
def test_slope_options_bias_is_minus_m_times_distance(slope, learned):
    h, d = 2, 4
    enc = build_encoding("alibi", d_model=8, n_heads=h, d_head=d, max_len=16, slope=slope, learned_slope=learned)
    q = k = torch.zeros(1, h, 6, d)
    pos = torch.arange(6)
    bias = enc.score_bias(q, k, pos, pos).detach()  # [h, i, j] for shared positions
    m = [2 ** -4, 2 ** -8] if slope is None else [slope, slope]
    for head in range(h):
        for i in range(6):
            for j in range(6):
                assert float(bias[..., head, i, j]) == pytest.approx(-m[head] * (i - j), abs=1e-6)
    assert [n for n, _ in enc.named_parameters()] == (["log_slopes"] if learned else [])


def test_learned_slope_gets_a_gradient_and_stays_positive():
    enc = build_encoding("alibi", d_model=4, n_heads=1, d_head=4, max_len=16, slope=0.5, learned_slope=True)
    q, k = torch.zeros(1, 1, 5, 4), torch.zeros(1, 1, 5, 4)
    pos = torch.arange(5)
    enc.score_bias(q, k, pos, pos).sum().backward()
    # d/dr sum_ij -exp(r)(i - j) = -m sum_ij (i - j) = 0 on a square grid; take the causal part
    enc.zero_grad()
    bias = enc.score_bias(q, k, pos, pos)
    bias.tril().sum().backward()  # sum over j <= i of -m (i - j) = -20 m
    assert float(enc.log_slopes.grad) == pytest.approx(-20 * 0.5, rel=1e-5)
    with torch.no_grad():
        enc.log_slopes.fill_(-50.0)  # any real log-slope is a positive slope
    assert float(enc.slopes.detach()) > 0


@pytest.mark.parametrize("options, field", [
    (dict(slope=0.0), "slope"), (dict(slope=-1.0), "slope"), (dict(slope="big"), "slope"),
    (dict(slope=float("inf")), "slope"), (dict(learned_slope="yes"), "learned_slope"),
])
def test_bad_slope_options(options, field):
    with pytest.raises(ConfigError) as err:
        build_encoding("alibi", d_model=8, n_heads=2, d_head=4, max_len=8, **options)
    assert err.value.field == field
