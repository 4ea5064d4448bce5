"""Each context-extension schedule, built through the RoPE encoding, against its paper's formula.

Several configs per schedule, including partial rotary fractions (r = fraction * d rotated
channels): the frequencies and the attention factor each paper defines, written per pair with the
math module, independent of poslab.positional.rope_scaling.
"""

from __future__ import annotations

import math

import pytest
import torch

from poslab.models.transformer import Transformer, TransformerConfig
from poslab.positional import build_encoding

CONFIGS = [  # (d_head, base, rotary fraction, s, L0)
    (32, 10000.0, 1.0, 4.0, 64),
    (64, 10000.0, 0.5, 8.0, 128),
    (128, 500000.0, 0.25, 2.0, 4096),
    (32, 1000.0, 0.75, 16.0, 16),
]


def theta(r, base):
    return [base ** (-2 * i / r) for i in range(r // 2)]


def built(d, frac, scaling, max_len=256, base=10000.0):
    return build_encoding("rope", d_model=d, n_heads=1, d_head=d, max_len=max_len, rotary_fraction=frac,
                          scaling=scaling, base=base)


def close(actual, expected, rtol=2e-6):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=rtol, atol=0.0)


@pytest.mark.parametrize("d, base, frac, s, L0", CONFIGS)
def test_position_interpolation(d, base, frac, s, L0):
    # Chen et al. 2023: f'(x, m) = f(x, m L0 / L'), i.e. every theta_i divided by s = L'/L0
    enc = built(d, frac, {"rope_type": "linear", "factor": s}, base=base)
    r = int(d * frac)
    close(enc.rotary_frequencies(), [t / s for t in theta(r, base)])
    assert enc.attention_factor == 1.0


@pytest.mark.parametrize("d, base, frac, s, L0", CONFIGS)
def test_ntk_aware(d, base, frac, s, L0):
    # bloc97 2023: base' = base s^(r / (r - 2)) so the slowest pair is interpolated by exactly s
    enc = built(d, frac, {"rope_type": "ntk", "factor": s, "rope_theta": base})
    r = int(d * frac)
    expected = theta(r, base * s ** (r / (r - 2)))
    close(enc.rotary_frequencies(), expected)
    assert expected[-1] == pytest.approx(theta(r, base)[-1] / s, rel=1e-9)


@pytest.mark.parametrize("d, base, frac, s, L0", CONFIGS)
def test_yarn_frequencies_and_attention_factor(d, base, frac, s, L0):
    # Peng et al. 2023: r(i) = L0 / lambda_i, lambda_i = 2 pi / theta_i; pairs with r > beta = 32
    # keep theta_i, pairs with r < alpha = 1 get theta_i / s; sqrt(1/t) = 0.1 ln s + 1.
    # Between them the reference code ramps linearly in the pair index between the pairs where
    # r = beta and r = alpha (floored / ceiled): written here as that code defines it.
    r = int(d * frac)
    enc = built(d, frac, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0,
                          "rope_theta": base})
    got = enc.rotary_frequencies()
    th = theta(r, base)

    def index(rotations):
        return r * math.log(L0 / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(math.floor(index(32)), 0), min(math.ceil(index(1)), r - 1)
    hi = hi + 0.001 if lo == hi else hi
    expected = []
    for i, t in enumerate(th):
        gamma = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: extrapolate, 1: interpolate
        expected.append(t * (1 - gamma) + t / s * gamma)
    close(got, expected)
    for i, t in enumerate(th):  # the paper's two end regions, by wavelength
        ratio = L0 / (2 * math.pi / t)
        if ratio > 32:
            assert got[i].item() == pytest.approx(t, rel=1e-6)
        if ratio < 1:
            assert got[i].item() == pytest.approx(t / s, rel=1e-6)
    assert enc.attention_factor == pytest.approx(0.1 * math.log(s) + 1)
    parts = built(d, frac, {"rope_type": "ntk_by_parts", "factor": s, "original_max_position_embeddings": L0,
                            "rope_theta": base})
    torch.testing.assert_close(parts.rotary_frequencies(), got)  # NTK-by-parts = YaRN without temperature
    assert parts.attention_factor == 1.0


@pytest.mark.parametrize("d, base, frac, s, L0", CONFIGS)
def test_longrope_per_pair_factors(d, base, frac, s, L0):
    # Ding et al. 2024: theta'_i = theta_i / lambda_i, short factors for L <= L0, long beyond;
    # attention scaled by sqrt(1 + ln s / ln L0)
    r = int(d * frac)
    short = [1.0 + 0.1 * i for i in range(r // 2)]
    long = [1.0 + (s - 1) * i / max(1, r // 2 - 1) for i in range(r // 2)]
    enc = built(d, frac, {"rope_type": "longrope", "factor": s, "original_max_position_embeddings": L0,
                          "short_factor": short, "long_factor": long, "rope_theta": base}, max_len=2 * L0)
    th = theta(r, base)
    close(enc.inv_freq_by_length[L0], [t / f for t, f in zip(th, short, strict=False)])
    close(enc.inv_freq_by_length[L0 + 1], [t / f for t, f in zip(th, long, strict=False)])
    assert enc.attention_factor == pytest.approx(math.sqrt(1 + math.log(s) / math.log(L0)))


@pytest.mark.parametrize("d, base, frac, s, L0", CONFIGS)
def test_llama3(d, base, frac, s, L0):
    # Llama 3.1: wavelengths above L0 / low are interpolated, below L0 / high kept, smooth between
    r, low, high = int(d * frac), 1.0, 4.0
    enc = built(d, frac, {"rope_type": "llama3", "factor": s, "original_max_position_embeddings": L0,
                          "low_freq_factor": low, "high_freq_factor": high, "rope_theta": base})
    expected = []
    for t in theta(r, base):
        lam = 2 * math.pi / t
        if lam < L0 / high:
            expected.append(t)
        elif lam > L0 / low:
            expected.append(t / s)
        else:
            a = (L0 / lam - low) / (high - low)
            expected.append((1 - a) * t / s + a * t)
    close(enc.rotary_frequencies(), expected)
    assert enc.attention_factor == 1.0


@pytest.mark.parametrize("d, base, frac, s, L0", CONFIGS)
def test_dynamic_ntk_per_length(d, base, frac, s, L0):
    # emozilla 2023: the NTK base with s replaced by max(s L / L0 - (s - 1), 1)
    r = int(d * frac)
    enc = built(d, frac, {"rope_type": "dynamic", "factor": s, "original_max_position_embeddings": L0,
                          "rope_theta": base}, max_len=3 * L0)
    for L in (1, L0, L0 + 1, 2 * L0, 3 * L0):
        scale = max(s * L / L0 - (s - 1), 1.0)
        close(enc.inv_freq_by_length[L], theta(r, base * scale ** (r / (r - 2))), rtol=1e-5)


def test_dynamic_ntk_equals_plain_rope_up_to_the_original_length():
    L0 = 16
    common = dict(vocab_size=11, d_model=32, n_layers=2, n_heads=2, max_len=4 * L0, encoding="rope")
    torch.manual_seed(0)
    plain = Transformer(TransformerConfig(**common)).eval()
    dyn = Transformer(TransformerConfig(**common, encoding_options={"scaling": {
        "rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": L0}})).eval()
    dyn.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 11, (3, 4 * L0), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for L in (1, 7, L0):
            torch.testing.assert_close(dyn(tokens[:, :L]), plain(tokens[:, :L]), rtol=0, atol=0)
        longer = 3 * L0
        assert not torch.allclose(dyn(tokens[:, :longer]), plain(tokens[:, :longer]), atol=1e-4)
