"""RoPE: per-pair rotation against a naive 2x2 formula, offset-only logits, layouts, length tables."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.attention import attention
from poslab.errors import ConfigError
from poslab.positional import ENCODINGS, build_encoding, encoding_options
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
        expected = naive_rotate(q[..., :length, :], pos, [t / f for t, f in zip(theta, factors, strict=False)], factor)
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


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_longrope_n_hat_rotates_the_first_positions_by_the_original_theta(layout):
    """Per position of q and of k: theta_i below n_hat, theta_i / f_i from n_hat on; n_hat = 0 is the old table."""
    torch.manual_seed(3)
    short, long, n_hat = [1.0, 1.5, 2.0, 3.0], [1.0, 2.0, 4.0, 8.0], 3
    scaling = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 16,
               "short_factor": short, "long_factor": long}
    enc = RoPE(**GEOM, layout=layout, scaling={**scaling, "n_hat": n_hat})
    plain = RoPE(**GEOM, layout=layout, scaling=scaling)
    zero = RoPE(**GEOM, layout=layout, scaling={**scaling, "n_hat": 0})
    theta = [10000.0 ** (-2 * i / 8) for i in range(4)]
    factor = math.sqrt(1 + math.log(4) / math.log(16))
    perm = list(range(0, 8, 2)) + list(range(1, 8, 2))  # interleaved channel order -> half
    inverse = [perm.index(c) for c in range(8)]
    for length, factors in ((10, short), (24, long)):
        x = torch.randn(2, 2, length, 8)
        for pos in (torch.arange(length), torch.stack([torch.arange(length), torch.arange(length)])):
            rq, rk = enc.rotate_qk(x, x.flip(-2), pos, pos)
            x_il = x if layout == "interleaved" else x[..., inverse]
            scaled = [t / f for t, f in zip(theta, factors, strict=True)]
            expected = torch.stack([naive_rotate(x_il[..., m:m + 1, :], torch.tensor([m]),
                                                 theta if m < n_hat else scaled, factor)[..., 0, :]
                                    for m in range(length)], -2)
            if layout == "half":
                expected = expected[..., perm]
            torch.testing.assert_close(rq, expected, atol=1e-5, rtol=1e-5)
            zq, zk = zero.rotate_qk(x, x.flip(-2), pos, pos)
            pq, pk = plain.rotate_qk(x, x.flip(-2), pos, pos)
            assert torch.equal(zq, pq) and torch.equal(zk, pk)
            # positions from n_hat on rotate exactly as without n_hat
            torch.testing.assert_close(rq[..., n_hat:, :], pq[..., n_hat:, :], atol=0, rtol=0)
    assert torch.equal(enc.rotary_frequencies(), plain.rotary_frequencies())  # the positions >= n_hat


def test_n_hat_through_a_model_and_the_consumers_that_refuse_it():
    """A causal LM with attention factor 1: positions < n_hat see only positions < n_hat, so their logits
    equal those of the unscaled RoPE model; later ones differ from it and from longrope without n_hat.
    Rotary probes and the streamed evaluation refuse n_hat > 0."""
    from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
    from poslab.models.transformer import Transformer, TransformerConfig
    from poslab.probes import rotary_theta
    from poslab.probes.streaming import TensorTokens, stream_attend

    scaling = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 8, "short_factor": 2.0,
               "long_factor": 4.0, "attention_factor": 1.0}
    torch.manual_seed(4)
    models = {}
    for key, sc in (("rope", None), ("longrope", scaling), (4, {**scaling, "n_hat": 4})):
        torch.manual_seed(4)  # RoPE has no parameters: the same weights for all three
        models[key] = Transformer(TransformerConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, max_len=32,
                                                    encoding_options={"scaling": sc} if sc else {})).eval()
    tokens = torch.randint(11, (2, 20))
    with torch.no_grad():
        rope, longrope, b = models["rope"](tokens), models["longrope"](tokens), models[4](tokens)
    torch.testing.assert_close(b[:, :4], rope[:, :4], atol=1e-5, rtol=1e-5)
    assert (b[:, :4] - longrope[:, :4]).abs().amax() > 1e-3
    assert (b[:, 4:] - rope[:, 4:]).abs().amax() > 1e-3 and (b[:, 4:] - longrope[:, 4:]).abs().amax() > 1e-3
    with pytest.raises(ConfigError) as err:
        rotary_theta(models[4])
    assert err.value.field == "encoding_options.scaling.n_hat"
    head = RetrievalHead(RetrievalHeadConfig(vocab_size=11, d_model=16, n_heads=2, max_len=32,
                                             encoding_options={"scaling": {**scaling, "n_hat": 4}}))
    with pytest.raises(ConfigError):
        stream_attend(head, TensorTokens(torch.randint(11, (2, 20))), 20)



@pytest.mark.parametrize("options", [{}, {"layout": "half"}, {"rotary_fraction": 0.5}])
@pytest.mark.parametrize("heads, d", [(1, 8), (4, 16), (2, 32), (1, 64)])
@pytest.mark.parametrize("name", [n for n in ENCODINGS if build_encoding(n, **GEOM).broadcasts_positions])
def test_broadcast_rotation_equals_the_rotation_of_the_copies(name, heads, d, options):
    """An encoding that says ``broadcasts_positions`` rotates a [.., h, g, 1, d] vector against
    positions [s] into the rotation of its s copies (the grid fast path relies on it): to float
    rounding, forward and back, and bit for bit forward where at least 16 channels rotate (every
    rotary study's head width, d_head >= 16), where both run the same vector kernel on this CPU."""
    torch.manual_seed(4)
    if not set(options) <= set(encoding_options(name)):
        pytest.skip(f"{name} takes no {', '.join(options)}")
    enc = build_encoding(name, d_model=heads * d, n_heads=heads, d_head=d, max_len=64, **options)
    x = torch.randn(1, heads, 20, 1, d, requires_grad=True)  # 20 tokens, one vector each
    pos = torch.tensor([0, 1, 2, 3, 7, 15, 30, 31])
    copies = x.expand(-1, -1, -1, len(pos), -1).reshape(1, heads, -1, d)
    expected, _ = enc.rotate_qk(copies, copies, pos.repeat(20), pos.repeat(20))
    got, _ = enc.rotate_qk(x, x, pos, pos)
    assert got.shape == (1, heads, 20, len(pos), d)
    got = got.reshape(expected.shape)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    if 2 * enc.rotary_frequencies().shape[-1] >= 16:  # rotated channels
        assert torch.equal(got, expected)
    w = torch.randn(expected.shape)
    g_expected, = torch.autograd.grad((expected * w).sum(), x)
    g_got, = torch.autograd.grad((got * w).sum(), x)
    torch.testing.assert_close(g_got, g_expected, rtol=1e-5, atol=1e-5)
