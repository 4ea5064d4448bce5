"""RoPE: per-pair rotation against a naive 2x2 formula, offset-only logits, layouts, length tables."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.attention import attention
from poslab.errors import ConfigError
from poslab.positional import ENCODINGS, build_encoding
from poslab.positional.rope import RoPE
from poslab.positional.rope_scaling import rope_frequencies

GEOM = dict(d_model=16, n_heads=2, d_head=8, max_len=64)
SCHEDULES = [name for name in ENCODINGS if name.startswith("rope") and name not in ("rope_dynamic", "rope_longrope")]


def naive_rotate(x: torch.Tensor, pos: torch.Tensor, theta: list[float], factor: float = 1.0) -> torch.Tensor:
    """Interleaved layout, one 2x2 rotation per pair and position, in float64 loops."""
    out = x.double().clone()
    for s in range(x.shape[-2]):
        for i, t in enumerate(theta):
            a = float(pos[s]) * t
            x1, x2 = x[..., s, 2 * i].double(), x[..., s, 2 * i + 1].double()
            out[..., s, 2 * i] = factor * (x1 * math.cos(a) - x2 * math.sin(a))
            out[..., s, 2 * i + 1] = factor * (x1 * math.sin(a) + x2 * math.cos(a))
    return out.float()


@pytest.mark.parametrize("name", ["rope", "rope_pi", "rope_yarn", "rope_llama3"])
def test_rotation_matches_naive_pairs(name):
    torch.manual_seed(0)
    enc = build_encoding(name, **GEOM)
    q, k = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    pos = torch.tensor([0, 1, 2, 5, 9, 30])
    rq, rk = enc.rotate_qk(q, k, pos, pos)
    theta = enc.theta.tolist()
    torch.testing.assert_close(rq, naive_rotate(q, pos, theta, enc.attention_factor), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rk, naive_rotate(k, pos, theta, enc.attention_factor), atol=1e-5, rtol=1e-5)
    # and the logits attention reports are those of the rotated vectors
    v = torch.randn(2, 2, 6, 8)
    scores = attention(q, k, v, enc, pos, pos, need_weights=True).attn_scores
    torch.testing.assert_close(scores, naive_rotate(q, pos, theta, enc.attention_factor)
                               @ naive_rotate(k, pos, theta, enc.attention_factor).transpose(-1, -2) / math.sqrt(8),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("name", SCHEDULES)
def test_logit_depends_only_on_the_offset(name, layout):
    torch.manual_seed(1)
    enc = build_encoding(name, layout=layout, **GEOM)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    for offset in (0, 3, 17):
        logits = []
        for start in (0, 5, 40):
            q_pos, k_pos = torch.tensor([float(start + offset)]), torch.tensor([float(start)])
            rq, rk = enc.rotate_qk(q, k, q_pos, k_pos)
            logits.append((rq * rk).sum(-1))
        for other in logits[1:]:
            torch.testing.assert_close(other, logits[0], atol=1e-5, rtol=1e-5)


def test_interleaved_and_half_agree_after_channel_permutation():
    torch.manual_seed(2)
    inter = build_encoding("rope", layout="interleaved", **GEOM)
    half = build_encoding("rope", layout="half", **GEOM)
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # half channel c <- interleaved channel perm[c]
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    pos = torch.tensor([0, 2, 3, 7, 11])
    rq_i, rk_i = inter.rotate_qk(q, k, pos, pos)
    rq_h, rk_h = half.rotate_qk(q[..., perm], k[..., perm], pos, pos)
    torch.testing.assert_close(rq_h, rq_i[..., perm])
    torch.testing.assert_close(rk_h, rk_i[..., perm])
    torch.testing.assert_close(rq_h @ rk_h.transpose(-1, -2), rq_i @ rk_i.transpose(-1, -2))


def test_rotary_fraction_leaves_the_rest_unrotated():
    enc = build_encoding("rope", rotary_fraction=0.5, **GEOM)
    q = torch.randn(1, 2, 4, 8)
    rq, _ = enc.rotate_qk(q, q, torch.arange(4), torch.arange(4))
    torch.testing.assert_close(rq[..., 4:], q[..., 4:])
    torch.testing.assert_close(rq[..., :4], naive_rotate(q[..., :4], torch.arange(4), enc.theta.tolist()))


def test_dynamic_frequencies_follow_each_sequence_length():
    enc = build_encoding("rope_dynamic", **GEOM)
    cfg = enc.scaling
    q = torch.randn(2, 2, 40, 8)
    for length in (10, 16, 17, 40):
        pos = torch.arange(length)
        rq, _ = enc.rotate_qk(q[..., :length, :], q[..., :length, :], pos, pos)
        theta = rope_frequencies(8, 10000.0, cfg, seq_len=length)[0].tolist()
        torch.testing.assert_close(rq, naive_rotate(q[..., :length, :], pos, theta), atol=1e-5, rtol=1e-5)
    # per row of [b, s] positions: each sequence uses its own length
    pos = torch.stack((torch.arange(40), torch.arange(40).clamp(max=12)))
    rq, _ = enc.rotate_qk(q, q, pos, pos)
    for row, length in ((0, 40), (1, 13)):
        theta = rope_frequencies(8, 10000.0, cfg, seq_len=length)[0].tolist()
        torch.testing.assert_close(rq[row], naive_rotate(q[row], pos[row], theta), atol=1e-5, rtol=1e-5)
    enc.check_positions(63)
    with pytest.raises(ConfigError) as err:
        enc.check_positions(64)
    assert err.value.field == "length"


def test_longrope_switches_tables_past_the_original_length():
    short, long = [1.0, 1.5, 2.0, 3.0], [1.0, 2.0, 4.0, 8.0]
    enc = RoPE(**GEOM, scaling={"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 16,
                                "short_factor": short, "long_factor": long})
    theta = [10000.0 ** (-2 * i / 8) for i in range(4)]
    factor = math.sqrt(1 + math.log(4) / math.log(16))
    q = torch.randn(1, 2, 20, 8)
    for length, factors in ((16, short), (17, long)):
        pos = torch.arange(length)
        rq, _ = enc.rotate_qk(q[..., :length, :], q[..., :length, :], pos, pos)
        expected = naive_rotate(q[..., :length, :], pos, [t / f for t, f in zip(theta, factors)], factor)
        torch.testing.assert_close(rq, expected, atol=1e-5, rtol=1e-5)


def test_bad_rope_options():
    with pytest.raises(ConfigError) as err:
        build_encoding("rope", **{**GEOM, "d_head": 7})
    assert err.value.field == "d_head" and "even" in err.value.allowed
    with pytest.raises(ConfigError) as err:
        build_encoding("rope", layout="neox", **GEOM)
    assert err.value.field == "layout" and "interleaved" in err.value.allowed and "half" in err.value.allowed
    with pytest.raises(ConfigError) as err:
        build_encoding("rope", scaling={"rope_type": "xpos"}, **GEOM)
    assert err.value.field == "rope_scaling.rope_type" and "yarn" in err.value.allowed
