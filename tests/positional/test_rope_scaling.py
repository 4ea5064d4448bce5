"""rope_frequencies: every schedule against a per-pair re-derivation with the math module."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.errors import ConfigError
from poslab.positional import build_encoding, rope_scaling
from poslab.positional.rope_scaling import rope_frequencies


def naive_theta(d: int, base: float) -> list[float]:
    return [base ** (-2 * i / d) for i in range(d // 2)]


def close(actual: torch.Tensor, expected: list[float], rtol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=rtol, atol=0.0)


def test_default_is_the_roformer_table():
    inv_freq, factor = rope_frequencies(16, 10000.0)
    close(inv_freq, naive_theta(16, 10000.0))
    assert factor == 1.0


def test_linear_divides_by_the_factor():
    inv_freq, factor = rope_frequencies(32, 10000.0, {"rope_type": "linear", "factor": 4.0})
    close(inv_freq, [t / 4.0 for t in naive_theta(32, 10000.0)])
    assert factor == 1.0


def test_ntk_changes_the_base():
    d, s = 32, 8.0
    inv_freq, _ = rope_frequencies(d, 10000.0, {"rope_type": "ntk", "factor": s})
    close(inv_freq, naive_theta(d, 10000.0 * s ** (d / (d - 2))))
    # the base change keeps the highest frequency and divides the lowest by exactly the factor
    assert inv_freq[0] == 1.0
    assert inv_freq[-1].item() == pytest.approx(naive_theta(d, 10000.0)[-1] / s, rel=1e-6)


def test_yarn_attention_factor():
    _, factor = rope_frequencies(64, 1e4, {"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 8192})
    assert factor == pytest.approx(0.1 * math.log(4) + 1)
    _, factor = rope_frequencies(64, 1e4, {"rope_type": "yarn", "factor": 40.0, "mscale": 0.707,
                                           "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096})
    assert factor == pytest.approx((0.1 * 0.707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))
    _, factor = rope_frequencies(64, 1e4, {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5,
                                           "original_max_position_embeddings": 8192})
    assert factor == 1.5


def naive_ramp_frequencies(d, base, s, orig, beta_fast=32.0, beta_slow=1.0, truncate=True):
    def pair(rotations):  # the pair whose wavelength fits `rotations` turns into orig
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = pair(beta_fast), pair(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    out = []
    for i, t in enumerate(naive_theta(d, base)):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append(t / s * ramp + t * (1 - ramp))
    return out, lo, hi


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_and_ntk_by_parts_frequencies(truncate):
    d, base, s, orig = 64, 1e4, 4.0, 8192
    expected, lo, hi = naive_ramp_frequencies(d, base, s, orig, truncate=truncate)
    cfg = {"factor": s, "original_max_position_embeddings": orig, "truncate": truncate}
    yarn, _ = rope_frequencies(d, base, {"rope_type": "yarn", **cfg})
    parts, factor = rope_frequencies(d, base, {"rope_type": "ntk_by_parts", **cfg})
    close(yarn, expected)
    torch.testing.assert_close(parts, yarn, rtol=0, atol=0)
    assert factor == 1.0  # NTK-by-parts is YaRN without the temperature
    theta = naive_theta(d, base)
    lo_i, hi_i = math.floor(lo), math.ceil(hi)
    close(yarn[:lo_i], theta[:lo_i])  # fast pairs extrapolate
    close(yarn[hi_i:], [t / s for t in theta[hi_i:]])  # slow pairs interpolate


def test_llama3_frequencies():
    d, base, s, low, high, orig = 128, 500000.0, 8.0, 1.0, 4.0, 8192
    expected = []
    for t in naive_theta(d, base):
        wavelen = 2 * math.pi / t
        if wavelen < orig / high:
            expected.append(t)
        elif wavelen > orig / low:
            expected.append(t / s)
        else:
            a = (orig / wavelen - low) / (high - low)
            expected.append((1 - a) * t / s + a * t)
    inv_freq, factor = rope_frequencies(d, base, {
        "rope_type": "llama3", "factor": s, "low_freq_factor": low, "high_freq_factor": high,
        "original_max_position_embeddings": orig})
    close(inv_freq, expected)
    assert factor == 1.0
    bands = {"kept": 0, "divided": 0, "blended": 0}
    for t in naive_theta(d, base):
        w = 2 * math.pi / t
        bands["kept" if w < orig / high else "divided" if w > orig / low else "blended"] += 1
    assert min(bands.values()) > 0  # the config exercises all three bands


def test_dynamic_grows_the_base_past_the_original_length():
    d, s, orig = 16, 2.0, 32
    cfg = {"rope_type": "dynamic", "factor": s, "original_max_position_embeddings": orig}
    for length in (1, 16, 32):
        close(rope_frequencies(d, 1e4, cfg, seq_len=length)[0], naive_theta(d, 1e4))
    for length in (33, 64, 100):
        new_base = 1e4 * (s * length / orig - (s - 1)) ** (d / (d - 2))
        close(rope_frequencies(d, 1e4, cfg, seq_len=length)[0], naive_theta(d, new_base))
    table, _ = rope_frequencies(d, 1e4, cfg, seq_len=torch.arange(101))
    assert table.shape == (101, d // 2)
    for length in (0, 5, 32, 33, 100):
        torch.testing.assert_close(table[length], rope_frequencies(d, 1e4, cfg, seq_len=length)[0])
    # Hugging Face reads the model's max_position_embeddings for dynamic
    via_model, _ = rope_frequencies(d, 1e4, {"rope_type": "dynamic", "factor": s}, max_position_embeddings=orig,
                                    seq_len=64)
    torch.testing.assert_close(via_model, rope_frequencies(d, 1e4, cfg, seq_len=64)[0])


def test_longrope_selects_short_or_long_factors():
    d, orig, s = 8, 16, 4.0
    short, long = [1.0, 1.5, 2.0, 2.5], [1.0, 2.0, 4.0, 8.0]
    cfg = {"rope_type": "longrope", "factor": s, "original_max_position_embeddings": orig,
           "short_factor": short, "long_factor": long}
    theta = naive_theta(d, 1e4)
    for length, factors in ((None, short), (1, short), (16, short), (17, long), (64, long)):
        inv_freq, factor = rope_frequencies(d, 1e4, cfg, seq_len=length)
        close(inv_freq, [t / f for t, f in zip(theta, factors, strict=False)])
        assert factor == pytest.approx(math.sqrt(1 + math.log(s) / math.log(orig)))
    table, _ = rope_frequencies(d, 1e4, cfg, seq_len=torch.tensor([16, 17]))
    close(table[0], [t / f for t, f in zip(theta, short, strict=False)])
    close(table[1], [t / f for t, f in zip(theta, long, strict=False)])
    # factor defaults to max_position_embeddings / original, and a scalar is one factor for every pair
    _, factor = rope_frequencies(d, 1e4, {**cfg, "factor": None, "short_factor": 1.0}, max_position_embeddings=64)
    assert factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))
    _, factor = rope_frequencies(d, 1e4, {**cfg, "factor": 1.0})
    assert factor == 1.0


def test_partial_rotary_factor_theta_and_legacy_type_key():
    inv_freq, _ = rope_frequencies(16, 1e4, {"partial_rotary_factor": 0.5})
    close(inv_freq, naive_theta(8, 1e4))
    inv_freq, _ = rope_frequencies(16, 1e4, {"rope_type": "default", "rope_theta": 500000.0})
    close(inv_freq, naive_theta(16, 500000.0))
    legacy, _ = rope_frequencies(16, 1e4, {"type": "linear", "factor": 2.0})
    close(legacy, [t / 2 for t in naive_theta(16, 1e4)])


@pytest.mark.parametrize("cfg, field, allowed", [
    ({"rope_type": "xpos"}, "rope_scaling.rope_type", "yarn"),
    ({"rope_type": "linear", "factr": 2.0}, "rope_scaling.factr", "factor"),
    ({"rope_type": "linear"}, "rope_scaling.factor", "required"),
    ({"rope_type": "linear", "factor": -1.0}, "rope_scaling.factor", "positive"),
    ({"rope_type": "yarn", "factor": 4.0}, "rope_scaling.original_max_position_embeddings", "required"),
    ({"rope_type": "dynamic", "factor": 4.0}, "rope_scaling.original_max_position_embeddings", "max_position"),
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
     "rope_scaling.low_freq_factor", "required"),
    ({"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 16, "short_factor": [1.0, 1.0],
      "long_factor": 4.0}, "rope_scaling.short_factor", "4 positive"),
])
def test_bad_configs_name_the_field(cfg, field, allowed):
    with pytest.raises(ConfigError) as err:
        rope_frequencies(8, 1e4, cfg)
    assert err.value.field == field
    assert allowed in err.value.allowed


def test_the_types_are_the_schedule_registry():
    assert rope_scaling.ROPE_TYPES == tuple(rope_scaling.ROPE_SCHEDULES)
    assert set(rope_scaling.LENGTH_DEPENDENT) <= set(rope_scaling.ROPE_SCHEDULES)
    with pytest.raises(ConfigError) as err:
        rope_frequencies(8, 1e4, {"rope_type": "xpos"})
    assert err.value.allowed == ", ".join(sorted(rope_scaling.ROPE_SCHEDULES))


def test_a_new_schedule_is_one_function_and_one_entry(monkeypatch):
    def halved(dim, base, cfg, *, max_position_embeddings, seq_len):
        theta = rope_scaling.roformer_theta(dim, base)
        return (theta / (2 * cfg["factor"])).float(), 3.0

    monkeypatch.setitem(rope_scaling.ROPE_SCHEDULES, "halved", halved)
    scaling = {"rope_type": "halved", "factor": 2.0}
    inv_freq, factor = rope_frequencies(16, 1e4, scaling)
    close(inv_freq, [t / 4 for t in naive_theta(16, 1e4)])
    assert factor == 3.0
    rope = build_encoding("rope", scaling=scaling, d_model=16, n_heads=1, d_head=16, max_len=32)
    close(rope.rotary_frequencies(), [t / 4 for t in naive_theta(16, 1e4)])
    assert rope.attention_factor == 3.0 and rope.kv_cache
    q = torch.randn(1, 1, 5, 16)
    rot_q, _ = rope.rotate_qk(q, q, torch.arange(5), torch.arange(5))
    torch.testing.assert_close(rot_q.norm(dim=-1), 3.0 * q.norm(dim=-1))  # A scales, the rotation keeps norms


@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_longrope_n_hat_angles_against_the_naive_formula(partial):
    """LongRoPE's n-hat: m theta_i for m < n_hat, m theta_i / f_i beyond (short or long f by L)."""
    d, orig, s, n_hat, base = 16, 16, 4.0, 5, 1e4
    r = int(d * partial)
    short = [1.0 + 0.25 * i for i in range(r // 2)]
    long = [1.0 + i for i in range(r // 2)]
    cfg = {"rope_type": "longrope", "factor": s, "original_max_position_embeddings": orig,
           "short_factor": short, "long_factor": long, "n_hat": n_hat, "partial_rotary_factor": partial}
    theta = naive_theta(r, base)
    positions = [0, 1, 4, 5, 6, 15, 40]
    for seq_len, factors in ((16, short), (64, long)):
        angles = rope_scaling.rope_angles(d, base, cfg, torch.tensor(positions), seq_len=seq_len)
        expected = [[m * t if m < n_hat else m * t / f for t, f in zip(theta, factors, strict=True)]
                    for m in positions]
        torch.testing.assert_close(angles, torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0.0)
    # n_hat = 0 (or absent) is the Hugging Face longrope schedule exactly
    no_hat = {k: v for k, v in cfg.items() if k != "n_hat"}
    for seq_len in (16, 64):
        plain, a = rope_frequencies(d, base, no_hat, seq_len=seq_len)
        zero, a0 = rope_frequencies(d, base, {**cfg, "n_hat": 0}, seq_len=seq_len)
        assert torch.equal(plain, zero) and a == a0
        angles = rope_scaling.rope_angles(d, base, {**cfg, "n_hat": 0}, torch.tensor(positions), seq_len=seq_len)
        assert torch.equal(angles, torch.tensor(positions, dtype=torch.float64)[:, None] * plain.double())


@pytest.mark.parametrize("cfg,allowed", [
    ({"n_hat": -1}, "non-negative integer"),
    ({"n_hat": 2.5}, "non-negative integer"),
    ({"n_hat": True}, "non-negative integer"),
    ({"rope_type": "linear", "factor": 2.0, "n_hat": 4}, "longrope"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "n_hat": 0}, "longrope"),
])
def test_bad_n_hat_names_the_field(cfg, allowed):
    base = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 16, "short_factor": 1.0,
            "long_factor": 4.0}
    with pytest.raises(ConfigError) as err:
        rope_frequencies(8, 1e4, {**base, **cfg} if "rope_type" not in cfg else cfg)
    assert err.value.field == "rope_scaling.n_hat" and allowed in err.value.allowed
