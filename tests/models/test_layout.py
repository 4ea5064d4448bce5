"""Per-layer layouts (issue 57): each layer's encoding, mask, temperature and qk-norm, against the
plain model and naive formulas; every bad pattern is one ConfigError naming ``layout``."""

from functools import partial

import pytest
import tiny_model
import torch

from poslab.attention import build_mask
from poslab.errors import ConfigError
from poslab.experiments import members
from poslab.experiments.config import apply_overrides
from poslab.models.intervention import Intervention, forward_with
from poslab.models.transformer import TransformerConfig
from poslab.positional.nope import NoPE
from poslab.positional.rope import RoPE
from poslab.positional.t5 import T5Bias
from poslab.tasks import build_task

S = 10
M = tiny_model.M
make = partial(tiny_model.make)
tokens = partial(tiny_model.tokens, s=S)


def _batch(b=3, s=S):
    task = build_task("shift", K=1, m=M)
    assert task.vocab_size <= M  # the models here read its tokens
    return task.sample(torch.Generator().manual_seed(0), b, s)


def test_the_pattern_repeats_and_equal_entries_share_one_module():
    model = make(n_layers=6, layout="rope:chunk=4,t5,nope")
    assert [type(model.layer_encoding(i)) for i in range(6)] == [RoPE, T5Bias, NoPE] * 2
    assert model.layer_encoding(1) is model.layer_encoding(4)
    assert model.layer_encoding(0) is model.encoding  # the model's encoding and options: its own module
    assert [(b.window, b.chunk) for b in model.layers] == [(None, 4), (None, None), (None, None)] * 2
    # an entry naming the model's encoding starts from its options; its own override them
    model = make(encoding_options=dict(base=100.0), layout="rope,rope:base=1000")
    assert model.layer_encoding(0) is model.encoding and model.layer_encoding(1).base == 1000
    assert model.encoding.base == 100.0


def test_a_layout_of_the_models_encoding_is_the_plain_model():
    x = tokens()
    for enc, layout in (("rope", "rope"), ("t5", "t5,t5")):
        plain, laid = make(seed=3, encoding=enc), make(seed=3, encoding=enc, layout=layout)
        assert plain.state_dict().keys() == laid.state_dict().keys()
        for name, p in plain.state_dict().items():
            assert torch.equal(p, laid.state_dict()[name]), name
        assert torch.equal(plain(x), laid(x))
        assert torch.equal(plain.loss(_batch()), laid.loss(_batch()))


def test_a_nope_layers_logits_ignore_positions_and_a_rope_layers_do_not():
    model, x = make(layout="nope,rope"), tokens()
    near = torch.arange(S)
    far = torch.arange(S) * 3 + 5  # not a shift: a rope logit depends on offsets, which change here
    _, a = model(x, positions=near, return_intermediates=True)
    _, b = model(x, positions=far, return_intermediates=True)
    torch.testing.assert_close(a.layers[0].attn_scores, b.layers[0].attn_scores, rtol=0, atol=0)
    assert not torch.allclose(a.layers[1].attn_scores, b.layers[1].attn_scores)
    # the plain rope model's layer 0 does depend on them: the nope layer is the layout's doing
    plain = make()
    _, c = plain(x, positions=near, return_intermediates=True)
    _, d = plain(x, positions=far, return_intermediates=True)
    assert not torch.allclose(c.layers[0].attn_scores, d.layers[0].attn_scores)


def _naive(n, *, window=None, chunk=None):
    keep = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            keep[i, j] = j <= i and (window is None or i - j < window) and (chunk is None or j // chunk == i // chunk)
    return keep


@pytest.mark.parametrize("bos", [False, True])
def test_chunk_and_window_masks_equal_a_naive_mask(bos):
    assert torch.equal(build_mask(S, S, causal=True, chunk=3), _naive(S, chunk=3))
    assert torch.equal(build_mask(S, S, causal=True, chunk=4, window=3), _naive(S, window=3, chunk=4))
    model, x = make(n_layers=3, layout="rope:chunk=3,rope:window=2,nope", bos=bos), tokens()
    n = S + int(bos)  # masks act on the internal sequence, BOS at index 0
    logits, inter = model(x, return_intermediates=True)
    for layer, kept in zip(inter.layers, (_naive(n, chunk=3), _naive(n, window=2), _naive(n)), strict=True):
        assert torch.equal(layer.pattern > 0, kept.expand_as(layer.pattern))
    torch.testing.assert_close(model(x), logits)  # the fused path (no weights asked) computes the same


def test_qk_norm_gives_unit_rows_on_the_rotating_layers_only():
    model, x = make(layout="rope,nope", qk_norm=True), tokens()
    assert [b.qk_norm for b in model.layers] == [True, False]
    _, inter = model(x, return_intermediates=True)
    rope, nope = inter.layers
    for t in (rope.q, rope.k, rope.rot_q, rope.rot_k):  # rotation is orthogonal: still unit after it
        torch.testing.assert_close(t.norm(dim=-1), torch.ones_like(t[..., 0]))
    assert not torch.allclose(nope.q.norm(dim=-1), torch.ones_like(nope.q[..., 0]))
    off = make(layout="rope,nope")
    _, inter = off(x, return_intermediates=True)
    assert not torch.allclose(inter.layers[0].q.norm(dim=-1), torch.ones_like(inter.layers[0].q[..., 0]))


@pytest.mark.parametrize("layout", [
    "rope,nope,rope",  # 3 does not divide 2
    "",
    "rope,no_such",
    "rope,learned",  # an embed-site encoding: its embed would never be called
    "sinusoidal,nope",
    "rope:colour=3,nope",  # not an option of rope
    "rope:window=0,nope",
    "rope:chunk=2.5,nope",
    "rope:temperature=-1,nope",
    "rope:window,nope",  # no value
    "rope:window=4:window=8,nope",  # a key twice
    "rope:base=abc,nope",  # an option of the wrong type fails to build
    "rope:layout=half:layout=half,nope",
])
def test_every_bad_layout_is_one_config_error_naming_layout(layout):
    with pytest.raises(ConfigError) as err:
        TransformerConfig(vocab_size=M, d_model=16, n_layers=2, n_heads=2, layout=layout)
    assert err.value.field == "layout"


def test_an_embed_site_entry_is_refused_saying_why():
    with pytest.raises(ConfigError, match="adds position to the stream"):
        TransformerConfig(vocab_size=M, d_model=16, n_layers=2, n_heads=2, layout="learned,nope")


def test_a_causal_only_entry_is_refused_in_a_bidirectional_model():
    with pytest.raises(ConfigError) as err:
        TransformerConfig(vocab_size=M, d_model=16, n_layers=2, n_heads=2, causal=False, encoding="nope",
                          layout="fire,nope")
    assert err.value.field == "layout"


def test_forward_backward_through_loss_reaches_every_parameter():
    model = make(n_layers=4, layout="rope:chunk=3,t5:window=4,rope:base=100:temperature=0.5,nope", qk_norm=True,
                 bos=True)
    batch = _batch()
    loss = model.loss(batch)
    params = dict(model.named_parameters())
    assert "layer_encodings.0.relative_attention_bias" in params  # the t5 layer's own bias
    grads = torch.autograd.grad(loss, list(params.values()))
    for name, g in zip(params, grads, strict=True):
        assert torch.isfinite(g).all() and g.abs().sum() > 0, name


def test_forward_with_uses_each_layers_encoding_and_mask():
    model, x = make(n_layers=3, layout="rope:chunk=3,t5:window=2,nope", bos=True), tokens()
    logits, inter = forward_with(model, x, Intervention())
    ref_logits, ref = model(x, return_intermediates=True)
    torch.testing.assert_close(logits, ref_logits)
    for a, b in zip(inter.layers, ref.layers, strict=True):
        torch.testing.assert_close(a.pattern, b.pattern)


def test_a_study_sets_the_layout_and_it_keys_the_member():
    from poslab.studies import get_experiment

    exp = get_experiment("two-layer")
    study = exp.study("quick")
    laid = members(exp, apply_overrides(study, ["model.layout=rope,nope", "model.qk_norm=true"]))
    plain = members(exp, study)
    assert {m.model_config.layout for m in laid} == {"rope,nope"} and all(m.model_config.qk_norm for m in laid)
    assert {m.key for m in laid}.isdisjoint(m.key for m in plain)
    with pytest.raises(ConfigError) as err:
        _ = members(exp, apply_overrides(study, ["model.layout=rope,learned"]))[0].model_config
    assert err.value.field == "layout"


def test_rotary_probes_read_each_layers_own_frequencies_and_the_kv_cache_refuses_a_layout():
    from poslab.probes import rotary_theta
    from poslab.probes.kv_cache import cached_model

    model = make(n_layers=3, layout="rope:base=100,rope:base=10000,nope")
    d = model.cfg.d_head
    for layer, base in ((0, 100.0), (1, 10000.0)):
        expected = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        torch.testing.assert_close(rotary_theta(model, layer).double(), expected)
    with pytest.raises(ConfigError) as err:
        rotary_theta(model, 2)  # the nope layer has no theta
    assert err.value.field == "layout"
    with pytest.raises(ConfigError) as err:
        cached_model(model)
    assert err.value.field == "layout"


def test_a_schedule_swap_refuses_a_layout_with_rotary_layers_of_their_own():
    from poslab.studies.kit.longrope_search import swap, with_scaling

    scaling = {"rope_type": "linear", "factor": 2.0}
    ok = with_scaling(make(layout="rope,nope"), scaling)  # the rope layers use the swapped module
    assert ok.layer_encoding(0) is ok.encoding
    torch.testing.assert_close(ok.layer_encoding(0).rotary_frequencies().double(),
                               make().encoding.rotary_frequencies().double() / 2)
    for model in (make(layout="rope,rope:base=100"), make(encoding="nope", layout="nope,rope")):
        with pytest.raises(ConfigError) as err:
            with_scaling(model, scaling)
        assert err.value.field == "layout"
        with pytest.raises(ConfigError):
            swap(model, model.encoding)


@pytest.mark.parametrize("causal", [True, False])
def test_padding_and_vmap_with_a_layout_equal_the_plain_calls(causal):
    import copy
    import warnings

    from torch.func import functional_call, stack_module_state, vmap

    kw = dict(causal=causal, encoding="nope", layout="rope:chunk=3,t5:window=2:temperature=0.5", qk_norm=True)
    model, x = make(**kw), tokens(b=1, s=8)
    padded = x.clone()
    padded[:, 5:] = 0
    out = model(padded, lengths=torch.tensor([5]))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, :5], model(x[:, :5]))
    members = [make(seed=i, **kw) for i in range(2)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    x, lengths = tokens(), torch.tensor([S, 7, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        stacked = vmap(lambda p, b: functional_call(base, (p, b), (x,), {"lengths": lengths}))(params, buffers)
    for e, member in enumerate(members):
        torch.testing.assert_close(stacked[e], member(x, lengths=lengths))
