"""MoPE: per-pair damped RoPE and Gabor atoms against loops; the sigma -> infinity limits;
one class per form."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.attention import attention
from poslab.errors import ConfigError
from poslab.positional import build_encoding, encoding_class
from poslab.positional.mope import MoPEAdditive, MoPERelative

GEOM = dict(d_model=8, n_heads=2, d_head=6, max_len=64)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_relative_form_equals_rope_as_sigma_grows(layout):
    torch.manual_seed(0)
    mope = build_encoding("mope", init_sigma=1e9, layout=layout, **GEOM)
    rope = build_encoding("rope", layout=layout, **GEOM)
    q, k, v = torch.randn(2, 2, 9, 6), torch.randn(2, 2, 9, 6), torch.randn(2, 2, 9, 6)
    pos = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 60])
    a = attention(q, k, v, mope, pos, pos, need_weights=True)
    b = attention(q, k, v, rope, pos, pos, need_weights=True)
    torch.testing.assert_close(a.attn_scores, b.attn_scores, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(a.out, b.out, atol=1e-6, rtol=1e-6)


def test_additive_form_equals_sinusoidal_as_sigma_grows():
    mope = build_encoding("mope_additive", init_sigma=1e9, **GEOM)
    sinusoidal = build_encoding("sinusoidal", **GEOM)
    x, pos = torch.randn(2, 9, 8), torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 60])
    torch.testing.assert_close(mope.embed(x, pos), sinusoidal.embed(x, pos), atol=1e-6, rtol=1e-6)


def perturbed(name: str, **options):
    torch.manual_seed(3)
    enc = build_encoding(name, init_sigma=4.0, **options, **GEOM)
    with torch.no_grad():  # learned-looking frequencies and widths
        enc.log_omega_scale.normal_(0, 0.3)
        enc.log_sigma_scale.normal_(0, 0.5)
    return enc


def test_relative_form_against_damped_pairs():
    enc = perturbed("mope")
    omega, sigma = enc.omega.detach().tolist(), enc.sigma.detach().tolist()
    q, k = torch.randn(1, 2, 4, 6), torch.randn(1, 2, 5, 6)
    q_pos, k_pos = torch.tensor([3, 4, 7, 9]), torch.tensor([0, 2, 3, 6, 9])
    scores = attention(q, k, k, enc, q_pos, k_pos, need_weights=True).attn_scores.detach()
    for head in range(2):
        for i in range(4):
            for j in range(5):
                delta = float(q_pos[i] - k_pos[j])
                total = 0.0
                for f in range(3):
                    a = float(k_pos[j] - q_pos[i]) * omega[f]  # q^T R(omega (p_j - p_i)) k
                    q1, q2 = float(q[0, head, i, 2 * f]), float(q[0, head, i, 2 * f + 1])
                    k1, k2 = float(k[0, head, j, 2 * f]), float(k[0, head, j, 2 * f + 1])
                    rotated = q1 * (k1 * math.cos(a) - k2 * math.sin(a)) + q2 * (k1 * math.sin(a) + k2 * math.cos(a))
                    total += rotated * math.exp(-delta ** 2 / (2 * sigma[f] ** 2))
                assert float(scores[0, head, i, j]) == pytest.approx(total / math.sqrt(6), abs=1e-5)


def test_additive_form_against_gabor_atoms():
    enc = perturbed("mope_additive")
    omega, sigma = enc.omega.detach().tolist(), enc.sigma.detach().tolist()
    pos = torch.tensor([0.0, 1.0, 2.5, 7.0])
    pe = enc.embed(torch.zeros(1, 4, 8), pos).detach()
    for s, p in enumerate(pos.tolist()):
        for f in range(4):
            envelope = math.exp(-p ** 2 / (2 * sigma[f] ** 2))
            assert float(pe[0, s, 2 * f]) == pytest.approx(envelope * math.sin(omega[f] * p), abs=1e-6)
            assert float(pe[0, s, 2 * f + 1]) == pytest.approx(envelope * math.cos(omega[f] * p), abs=1e-6)


def test_initialization_is_the_rope_table():
    enc = build_encoding("mope", **GEOM)
    torch.testing.assert_close(enc.omega, build_encoding("rope", **GEOM).theta, rtol=0, atol=0)
    assert torch.all(enc.sigma == 1e4)


def test_one_class_per_form_and_no_inheritance_between_them():
    assert encoding_class("mope") is MoPERelative and encoding_class("mope_additive") is MoPEAdditive
    assert not issubclass(MoPERelative, MoPEAdditive) and not issubclass(MoPEAdditive, MoPERelative)
    assert build_encoding("mope", **GEOM).sites == ("rotate_qk", "score_bias")
    assert build_encoding("mope_additive", **GEOM).sites == ("embed",)


def test_relative_form_rotates_by_its_learned_omega():
    enc = perturbed("mope")
    assert enc.is_rotary and enc.layout == "interleaved"
    torch.testing.assert_close(enc.rotary_frequencies(), enc.omega, rtol=0, atol=0)
    assert not build_encoding("mope_additive", **GEOM).is_rotary


@pytest.mark.parametrize("name, options, field", [
    ("mope", dict(init_sigma=0.0), "init_sigma"),
    ("mope", dict(d_head=5), "d_head"),
    ("mope", dict(layout="gptj"), "layout"),
    ("mope_additive", dict(init_sigma=-1.0), "init_sigma"),
    ("mope_additive", dict(d_model=7), "d_model"),
    ("mope", dict(form="additive"), "encoding.form"),  # the form is the registry name now
    ("mope_additive", dict(layout="half"), "encoding.layout"),  # no rotary pairs to lay out
])
def test_bad_options(name, options, field):
    geometry = {k: options.pop(k) for k in list(options) if k in GEOM}
    with pytest.raises(ConfigError) as err:
        build_encoding(name, **{**GEOM, **geometry}, **options)
    assert err.value.field == field
