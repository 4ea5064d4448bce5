"""Llama 4's position-dependent temperature on a layout's layer (``attn_scale``, ``floor_scale``):
against a naive per-position formula, against transformers' own Llama 4 text attention, and as
a no-op where every position sits below floor_scale - 1."""

import copy
import math
import warnings
from functools import partial

import pytest
import tiny_model
import torch

from poslab.errors import ConfigError
from poslab.models.transformer import TransformerConfig

S = 12
M = tiny_model.M
make = partial(tiny_model.make)
tokens = partial(tiny_model.tokens, s=S)


def naive_scale(p: int, attn_scale: float, floor_scale: int) -> float:
    return math.log(math.floor((p + 1) / floor_scale) + 1) * attn_scale + 1


@pytest.mark.parametrize("bos", [False, True])
def test_the_tuned_layers_queries_and_logits_equal_the_naive_formula(bos):
    model = make(layout="rope,nope:attn_scale=0.5:floor_scale=3:temperature=2", bos=bos)
    _, inter = model(tokens(), return_intermediates=True)
    for layer, tuned in ((0, False), (1, True)):
        block, got = model.block(layer), inter.layers[layer]
        plain_q = block._heads(block.ln_attn(got.resid_pre), block.W_Q)  # [b, h, n, d], untuned
        n = plain_q.shape[2]
        factor = torch.tensor([naive_scale(p, 0.5, 3) if tuned else 1.0 for p in range(n)], dtype=torch.double)
        assert (factor > 1).any() == tuned
        torch.testing.assert_close(got.q, plain_q * factor[:, None], rtol=1e-12, atol=1e-12)
    nope = inter.layers[1]
    d = nope.q.shape[-1]
    want = torch.empty_like(nope.attn_scores)
    for i in range(nope.q.shape[2]):
        for j in range(nope.k.shape[2]):  # NoPE: the logit is the plain dot product, tuned, over tau = 2
            want[:, :, i, j] = (nope.q[:, :, i] * nope.k[:, :, j]).sum(-1) / math.sqrt(d) / 2
    torch.testing.assert_close(nope.attn_scores, want)


def test_below_the_first_floor_step_the_tuning_changes_nothing():
    """Positions p < floor_scale - 1 get factor 1: the default floor_scale (8192) at S tokens is the plain layout."""
    x = tokens()
    tuned, plain = make(layout="rope,nope:attn_scale=0.1"), make(layout="rope,nope")
    assert tuned.block(1).spec.floor_scale == 8192
    torch.testing.assert_close(tuned(x), plain(x), rtol=0, atol=0)
    assert not torch.equal(make(layout="rope,nope:attn_scale=0.1:floor_scale=2")(x), plain(x))


def test_a_tuned_layout_trains_as_an_ensemble_member_as_alone():
    from torch.func import functional_call, stack_module_state, vmap

    kw = dict(layout="rope:chunk=4,nope:attn_scale=0.3:floor_scale=2", qk_norm=True)
    members = [make(seed=i, **kw) for i in range(2)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    x = tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        stacked = vmap(lambda p, b: functional_call(base, (p, b), (x,)))(params, buffers)
    for e, member in enumerate(members):
        torch.testing.assert_close(stacked[e], member(x))


@pytest.mark.parametrize("layout", ["rope,nope:floor_scale=4", "rope,nope:attn_scale=0", "rope,nope:attn_scale=-1",
                                    "rope,nope:attn_scale=0.1:floor_scale=0", "rope,nope:attn_scale=true"])
def test_bad_tuning_is_one_config_error_naming_layout(layout):
    with pytest.raises(ConfigError) as err:
        TransformerConfig(vocab_size=M, d_model=16, n_layers=2, n_heads=2, layout=layout)
    assert err.value.field == "layout"


def test_the_queries_of_a_tuned_layer_need_their_positions():
    block = make(layout="rope,nope:attn_scale=0.1").block(1)
    with pytest.raises(ConfigError):
        block.queries(torch.zeros(1, 4, 16, dtype=torch.double))


def test_equals_transformers_llama4_text_attention_on_a_no_rope_layer():
    """transformers' Llama4TextAttention on a no-rope layer with temperature tuning (eager, causal, no
    GQA, no qk-norm) against the same weights in poslab's tuned NoPE layer."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    D, h, n, floor_scale, attn_scale = 16, 2, 12, 3, 0.4
    config = transformers.Llama4TextConfig(hidden_size=D, num_attention_heads=h, num_key_value_heads=h, head_dim=D // h,
                                           num_hidden_layers=1, no_rope_layers=[0], attn_temperature_tuning=True,
                                           floor_scale=floor_scale, attn_scale=attn_scale, use_qk_norm=False,
                                           attention_bias=False, intermediate_size=32, intermediate_size_mlp=32,
                                           num_local_experts=1, vocab_size=M)
    config._attn_implementation = "eager"
    theirs = Llama4TextAttention(config, layer_idx=0).double().eval()
    assert not theirs.use_rope
    model = make(n_layers=1, encoding="nope", layout=f"nope:attn_scale={attn_scale}:floor_scale={floor_scale}",
                 d_model=D, n_heads=h)
    block = model.block(0)
    with torch.no_grad():
        theirs.q_proj.weight.copy_(block.W_Q)
        theirs.k_proj.weight.copy_(block.W_K)
        theirs.v_proj.weight.copy_(block.W_V)
        theirs.o_proj.weight.copy_(block.W_O)
    a = torch.randn(2, n, D, dtype=torch.double, generator=torch.Generator().manual_seed(3))
    causal = torch.full((n, n), -math.inf, dtype=torch.double).triu(1)[None, None]  # additive, [1, 1, n, n]
    with torch.no_grad():
        want, _ = theirs(a, position_embeddings=None, attention_mask=causal)
        from poslab.attention import attention

        pos = torch.arange(n)
        q, k, v = block.project(a, pos)
        out = attention(q, k, v, model.layer_encoding(0), pos, pos, is_causal=True).out  # [b, h, n, d]
        got = out.transpose(1, 2).reshape(2, n, D) @ block.W_O.T
    assert naive_scale(n - 1, attn_scale, floor_scale) > 1.5  # the tuning is far from 1 at these positions
    torch.testing.assert_close(got, want)
