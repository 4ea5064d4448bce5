"""Every registry entry: forward and backward through attention, the fused path equal to the
explicit one, explicit position tensors, every hook under vmap over ensemble members, metadata
derived from the code (sites, KV cache, rotary frequencies), bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from poslab.attention import attention, build_mask
from poslab.errors import ConfigError
from poslab.positional import (
    ENCODINGS,
    SITES,
    PositionalEncoding,
    build_encoding,
    encoding_class,
    rotary_encodings,
    small_encoding,
)
from poslab.positional.base import KINDS, relative_positions
from poslab.positional.rope import LAYOUTS, rotate

D, H, DH, MAX_LEN, B, S = 16, 2, 8, 32, 2, 12
NAMES = list(ENCODINGS)
GEOM = dict(d_model=D, n_heads=H, d_head=DH, max_len=MAX_LEN)


def build(name: str, seed: int = 0, **options):
    torch.manual_seed(seed)
    enc = build_encoding(name, d_model=D, n_heads=H, d_head=DH, max_len=MAX_LEN, **options)
    with torch.no_grad():  # members differ even where a parameter is initialized to a constant
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    # deterministic hooks: a task-position entry draws its random start in training only (its own tests)
    return enc.eval() if enc.task_positions else enc


def project(seed: int = 0):
    g = torch.Generator().manual_seed(100 + seed)
    return [torch.randn(D, H * DH, generator=g) / D ** 0.5 for _ in range(3)]


def forward(enc, x, pos, need_weights: bool, weights=None):
    """The whole protocol: embed, project to heads, attention (every other hook inside)."""
    z = enc.embed(x, pos)  # [b, s, D]
    q, k, v = (torch.einsum("bsm,mn->bsn", z, W).unflatten(-1, (H, DH)).transpose(1, 2)
               for W in (weights or project()))  # [b, h, s, d]
    return attention(q, k, v, enc, pos, pos, mask=build_mask(S, S, causal=True), need_weights=need_weights,
                     stream=z).out


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward_and_fused_path_equal_explicit(name):
    enc = build(name)
    x, pos = torch.randn(B, S, D, requires_grad=True), torch.arange(S)
    fused = forward(enc, x, pos, need_weights=False)
    explicit = forward(enc, x, pos, need_weights=True)
    assert fused.shape == (B, H, S, DH)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    for out in (fused, explicit):
        enc.zero_grad()
        x.grad = None
        out.square().mean().backward()
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
        for pname, p in enc.named_parameters():
            assert p.grad is not None, f"{name}.{pname} got no gradient"
            assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{name}.{pname}"


@pytest.mark.parametrize("name", NAMES)
def test_explicit_positions(name):
    enc = build(name)
    x = torch.randn(B, S, D)
    pos = torch.arange(S)
    out = forward(enc, x, pos, need_weights=True)
    # [s] positions equal the same positions given per row, as int or float
    torch.testing.assert_close(forward(enc, x, pos.expand(B, S), need_weights=True), out)
    torch.testing.assert_close(forward(enc, x, pos.float(), need_weights=True), out, atol=1e-5, rtol=1e-5)
    # rows of [b, s] positions are independent sequences
    rows = torch.stack((torch.arange(S), torch.arange(S) * 2 + 3))
    batched = forward(enc, x, rows, need_weights=True)
    for r in range(B):
        torch.testing.assert_close(batched[r:r + 1], forward(enc, x[r:r + 1], rows[r], need_weights=True),
                                   atol=1e-5, rtol=1e-5)


# a length-dependent encoding (no KV cache) reads the longest position, which a shift moves
SHIFT_INVARIANT = [n for n in NAMES if encoding_class(n).kind in ("relative", "rotary", "none")
                   and small_encoding(n).kv_cache]


@pytest.mark.parametrize("name", SHIFT_INVARIANT)
def test_relative_encodings_ignore_a_common_shift(name):
    enc = build(name)
    x = torch.randn(B, S, D)
    out = forward(enc, x, torch.arange(S), need_weights=True)
    torch.testing.assert_close(forward(enc, x, torch.arange(S) + 7, need_weights=True), out, atol=1e-5, rtol=1e-5)


class Hooks(nn.Module):
    """All four hooks in one call, so functional_call can drive them; Nones are dropped."""

    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def forward(self, x, q, k, w, q_pos, k_pos):
        out = {"embed": self.enc.embed(x, q_pos)}
        out["rot_q"], out["rot_k"] = self.enc.rotate_qk(q, k, q_pos, k_pos)
        stream = {"x": x} if self.enc.reads_stream else {}  # the forget gate reads the layer's input
        out["score_bias"] = self.enc.score_bias(out["rot_q"], out["rot_k"], q_pos, k_pos, **stream)
        out["value_bias"] = self.enc.value_bias(w, q_pos, k_pos)
        return {key: value for key, value in out.items() if value is not None}


@pytest.mark.parametrize("mapped_positions", [False, True], ids=["shared-positions", "member-positions"])
@pytest.mark.parametrize("name", NAMES)
def test_every_hook_under_vmap_equals_each_member(name, mapped_positions):
    E = 3
    members = [Hooks(build(name, seed=e)) for e in range(E)]
    params, buffers = stack_module_state(members)  # [e, ...]
    template = copy.deepcopy(members[0]).to("meta")
    xs, qs, ks = torch.randn(E, B, S, D), torch.randn(E, B, H, S, DH), torch.randn(E, B, H, S, DH)
    ws = torch.rand(E, B, H, S, S).softmax(-1)
    if mapped_positions:
        q_pos = torch.stack([torch.arange(S) * (e + 1) for e in range(E)])  # [e, s]
        k_pos = q_pos
    else:
        q_pos = k_pos = torch.arange(S)

    def call(p, b, x, q, k, w, qp, kp):
        return functional_call(template, (p, b), (x, q, k, w, qp, kp))

    in_dims = (0, 0, 0, 0, 0, 0) + ((0, 0) if mapped_positions else (None, None))
    stacked = vmap(call, in_dims=in_dims)(params, buffers, xs, qs, ks, ws, q_pos, k_pos)
    for e, member in enumerate(members):
        qp, kp = (q_pos[e], k_pos[e]) if mapped_positions else (q_pos, k_pos)
        alone = member(xs[e], qs[e], ks[e], ws[e], qp, kp)
        assert stacked.keys() == alone.keys()
        for key in alone:
            torch.testing.assert_close(stacked[key][e], alone[key].expand_as(stacked[key][e]),
                                       atol=1e-5, rtol=1e-5, msg=f"{name}: {key}")


# ----------------------------------------------------------------------------- metadata


def overrides(cls: type) -> tuple[str, ...]:
    """The hooks defined in the class body of ``cls`` or of a class between it and the base."""
    below_base = cls.__mro__[:cls.__mro__.index(PositionalEncoding)]
    return tuple(hook for hook in SITES if any(hook in vars(c) for c in below_base))


@pytest.mark.parametrize("name", NAMES)
def test_sites_are_the_hooks_the_class_overrides(name):
    enc = build(name)
    expected = overrides(encoding_class(name))
    assert enc.sites == expected and enc.meta.sites == expected
    assert [hook for hook in SITES if enc.uses(hook)] == list(expected)


@pytest.mark.parametrize("name", NAMES)
def test_survey_fields_are_written_by_each_class(name):
    cls = encoding_class(name)
    assert cls.kind in KINDS
    for field in ("kind", "extra_parameters", "cost", "reference"):
        assert field in vars(cls) and getattr(cls, field), f"{name} does not write {field}"
    meta = build(name).meta
    assert (meta.kind, meta.parameters, meta.cost, meta.reference) == (
        cls.kind, cls.extra_parameters, cls.cost, cls.reference)


@pytest.mark.parametrize("name, options, kv_cache", [
    ("rope", {}, True), ("rope_yarn", {}, True), ("rope_llama3", {}, True),
    ("rope_dynamic", {}, False), ("rope_longrope", {}, False),
    ("rope", {"scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16}}, False),
    ("learned", {}, True), ("learned", {"out_of_range": "clamp"}, True),
    ("learned", {"out_of_range": "interpolate"}, False), ("learned", {"out_of_range": "rescale"}, False),
    ("alibi", {}, True), ("shaw", {}, True), ("mope", {}, True), ("mope_additive", {}, True),
])
def test_kv_cache_is_computed_from_the_options(name, options, kv_cache):
    enc = build(name, **options)
    assert enc.kv_cache is kv_cache and enc.meta.kv_cache is kv_cache


ROTARY = [n for n in NAMES if n.startswith("rope") or n in ("mope", "xpos", "p_rope")]
ROTARY_BUILTIN = [n for n in ROTARY if n not in ("xpos",)]  # xPos's decay is a scale, not a rotation


def test_rotary_encodings():
    torch.manual_seed(0)
    expected_draw = torch.rand(3)
    torch.manual_seed(0)
    assert rotary_encodings() == [n for n in NAMES if n in ROTARY]
    torch.testing.assert_close(torch.rand(3), expected_draw, rtol=0, atol=0)  # asking drew no numbers
    for name in ("learned", "alibi", "t5", "nope", "sinusoidal", "shaw", "transformer_xl", "mope_additive"):
        enc = build(name)
        assert not enc.is_rotary and enc.rotary_frequencies() is None, name


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ROTARY_BUILTIN)
def test_rotary_frequencies_and_layout_reproduce_the_rotation(name, layout):
    enc = build(name, layout=layout)
    assert enc.is_rotary and enc.layout == layout
    theta = enc.rotary_frequencies()
    # rope_partial rotates the first r = d/4 channels: r/2 = d/8 pairs
    assert theta.shape == (DH // 8 if name == "rope_partial" else DH // 2,)
    q, k = torch.randn(B, H, MAX_LEN, DH), torch.randn(B, H, MAX_LEN, DH)
    pos = torch.arange(MAX_LEN)  # L = max_len: where a length-dependent schedule reports theta
    rot_q, rot_k = enc.rotate_qk(q, k, pos, pos)
    factor = getattr(enc, "attention_factor", 1.0)  # RoPE's scale on cos and sin, not a rotation
    torch.testing.assert_close(rot_q, rotate(q, pos, theta, layout, factor))
    torch.testing.assert_close(rot_k, rotate(k, pos, theta, layout, factor))


class OffsetValues(PositionalEncoding):
    """Test-only: out_i += sum_j w_ij u[clip(i - j)], one learned vector per offset. It declares
    nothing about its sites; attention must find the value hook on its own."""

    kind = "relative"
    extra_parameters = "max_len x d_head"
    cost = "O(i j d) per head"
    reference = "this test"

    def __init__(self, **geometry):
        super().__init__(**geometry)
        self.u = nn.Parameter(torch.randn(self.max_len, self.d_head))  # [max_len, d]

    def value_bias(self, weights, q_pos, k_pos):
        offset = relative_positions(q_pos, k_pos).long().clamp(0, self.max_len - 1)  # [1, i, j]
        return (weights[..., None] * self.u[offset]).sum(-2)  # [b, h, i, j, d] -> [b, h, i, d]


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused-eligible", "explicit"])
def test_an_undeclared_value_bias_is_not_lost(need_weights):
    torch.manual_seed(0)
    enc = OffsetValues(**GEOM)
    assert enc.sites == ("value_bias",) and enc.uses("value_bias") and enc.meta.kv_cache
    q, k, v = torch.randn(1, H, S, DH), torch.randn(1, H, S, DH), torch.randn(1, H, S, DH)
    pos = torch.arange(S)
    out = attention(q, k, v, enc, pos, pos, mask=build_mask(S, S, causal=True), need_weights=need_weights).out
    u = enc.u.detach()
    for h in range(H):
        for i in range(S):
            logits = torch.tensor([float(q[0, h, i] @ k[0, h, j]) / math.sqrt(DH) for j in range(i + 1)])
            w = logits.softmax(0)
            expected = sum(w[j] * (v[0, h, j] + u[i - j]) for j in range(i + 1))
            torch.testing.assert_close(out[0, h, i].detach(), expected, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- bad input


def raises(field: str, *allowed: str):
    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(ConfigError)
            self.info = self.ctx.__enter__()

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            err = self.info.value
            assert err.field == field, str(err)
            for word in allowed:
                assert word in err.allowed, str(err)
            assert field in str(err)
            return handled
    return Check()


def test_unknown_encoding_names_the_choices():
    with raises("encoding", "rope", "alibi", "mope"):
        build_encoding("rope2", **GEOM)


def test_unknown_option_names_the_options():
    with raises("encoding.max_dist", "max_distance"):
        build_encoding("shaw", max_dist=3, **GEOM)


@pytest.mark.parametrize("name", ROTARY)
def test_odd_head_dim_for_rotary_encodings(name):
    with raises("d_head", "even"):
        build_encoding(name, **{**GEOM, "d_head": 5})


def test_bad_layout_policy_and_rope_type():
    with raises("layout", "interleaved", "half"):
        build_encoding("rope_yarn", layout="gptj", **GEOM)
    with raises("out_of_range", "error", "clamp", "interpolate", "rescale"):
        build_encoding("learned", out_of_range="wrap", **GEOM)
    with raises("rope_scaling.rope_type", "linear", "dynamic", "yarn", "longrope", "llama3"):
        build_encoding("rope", scaling={"rope_type": "su"}, **GEOM)


def test_position_past_a_learned_table():
    enc = build_encoding("learned", **GEOM)
    enc.check_positions(MAX_LEN - 1)
    with raises("length", "at most 32", "clamp"):
        enc.check_positions(MAX_LEN)


def test_uses_names_the_hooks():
    with raises("hook", "embed", "value_bias"):
        build("rope").uses("value")
