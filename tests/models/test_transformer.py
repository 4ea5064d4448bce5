"""Transformer: every registered encoding forward and backward, masks, BOS, positions, vmap."""

import copy
import warnings
from functools import partial

import pytest
import tiny_model
import torch
from torch.func import functional_call, stack_module_state, vmap

from poslab.errors import ConfigError
from poslab.models.energy_gate import EnergyGate
from poslab.models.transformer import TransformerConfig
from poslab.positional import registered

S = 6  # sequence length: tiny so the whole file runs in seconds
M = tiny_model.M
make = partial(tiny_model.make, max_len=16)
tokens = partial(tiny_model.tokens, s=S)


# ----------------------------------------------------------------------------- every encoding

# iterated at collection: new encodings join in (those reading task positions: tests/positional/test_task_positions)
@pytest.mark.parametrize("name", registered())
@pytest.mark.parametrize("intermediates", [False, True])
def test_forward_backward_reaches_every_parameter(name, intermediates):
    model = make(encoding=name, bos=True, energy_gate=True)
    x = tokens()
    out = model(x, lengths=torch.tensor([S, 4, 2]), return_intermediates=intermediates)
    logits = out[0] if intermediates else out
    assert logits.shape == (3, S, M) and torch.isfinite(logits).all()
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(logits.square().sum(), list(params.values()), allow_unused=True)
    for (pname, _p), g in zip(params.items(), grads, strict=False):
        assert g is not None, f"{name}: no gradient reaches {pname}"
        assert torch.isfinite(g).all() and g.abs().sum() > 0, f"{name}: {pname}"


@pytest.mark.parametrize("name", registered())
def test_causal_mask(name):
    model, x = make(encoding=name), tokens()
    y = x.clone()
    y[:, 4] = (y[:, 4] + 1) % M
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("name, gate", [(name, False) for name in registered()] + [("rope", True)])
def test_vmap_over_members_equals_separate_calls(name, gate):
    """The trainer's pattern: stacked members, one vmapped forward, one backward of the summed loss."""
    members = [make(seed=i, encoding=name, energy_gate=gate) for i in range(3)]
    params, buffers = stack_module_state(members)  # leaves that require grad, [e, ...]
    base = copy.deepcopy(members[0]).to("meta")
    x, lengths = tokens(), torch.tensor([S, 5, 3])

    def call(p, b):
        return functional_call(base, (p, b), (x,), {"lengths": lengths})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no batching rule" for fused attention on CPU
        stacked = vmap(call)(params, buffers)  # [e, b, s, m]
        stacked.square().mean(dim=(1, 2, 3)).sum().backward()
    for e, member in enumerate(members):
        alone = member(x, lengths=lengths)
        torch.testing.assert_close(stacked[e], alone)
        alone.square().mean().backward()
        for pname, p in member.named_parameters():
            torch.testing.assert_close(params[pname].grad[e], p.grad, msg=f"{name}: {pname}")


# ----------------------------------------------------------------------------- intermediates

@pytest.mark.parametrize("bos", [False, True])
def test_intermediates_shapes(bos):
    model = make(bos=bos)
    n = S + bos
    logits, inter = model(tokens(b=2), return_intermediates=True)
    assert logits.shape == (2, S, M)
    assert len(inter.layers) == 2
    assert inter.embed.shape == (2, n, 16) and inter.positions.tolist() == list(range(n))
    for layer in inter.layers:
        assert layer.attn_scores.shape == layer.pattern.shape == (2, 2, n, n)
        assert layer.rot_q.shape == layer.rot_k.shape == layer.v.shape == (2, 2, n, 8)
        assert layer.resid_pre.shape == layer.resid_post.shape == (2, n, 16)
        torch.testing.assert_close(layer.pattern.sum(-1), torch.ones(2, 2, n, dtype=torch.float64))
        assert (layer.pattern.triu(1) == 0).all()  # causal
    torch.testing.assert_close(inter.layers[1].resid_pre, inter.layers[0].resid_post)
    # the fused (no-weights) path computes the same logits
    torch.testing.assert_close(model(tokens(b=2)), logits)


# ----------------------------------------------------------------------------- masks

def test_not_causal_sees_the_future():
    model, x = make(causal=False), tokens()
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % M
    assert not torch.allclose(model(x)[:, 0], model(y)[:, 0])


@pytest.mark.parametrize("window", [1, 3])
def test_sliding_window(window):
    model, x = make(n_layers=1, window=window), tokens(s=8)
    t = 7
    far, near = x.clone(), x.clone()
    far[:, t - window] = (far[:, t - window] + 1) % M  # just outside the window of query t
    near[:, t - window + 1] = (near[:, t - window + 1] + 1) % M  # just inside
    torch.testing.assert_close(model(far)[:, t], model(x)[:, t])
    assert not torch.allclose(model(near)[:, t], model(x)[:, t])
    _, inter = model(x, return_intermediates=True)
    i, j = torch.arange(8)[:, None], torch.arange(8)[None, :]
    assert (inter.layers[0].pattern[..., (i - j >= window) | (j > i)] == 0).all()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bos", [False, True])
def test_padding_equals_the_unpadded_sequence(causal, bos):
    model, x = make(causal=causal, bos=bos, window=4), tokens(b=1, s=8)
    padded = x.clone()
    padded[:, 5:] = 0
    out = model(padded, lengths=torch.tensor([5]))
    assert torch.isfinite(out).all()  # padded rows too: no empty softmax row
    torch.testing.assert_close(out[:, :5], model(x[:, :5]))


# ----------------------------------------------------------------------------- positions and BOS

@pytest.mark.parametrize("name", registered())
@pytest.mark.parametrize("bos", [False, True])
def test_explicit_positions_equal_default(name, bos):
    model, x = make(encoding=name, bos=bos), tokens()
    default = model(x)
    arange = torch.arange(int(bos), S + int(bos))
    torch.testing.assert_close(model(x, positions=arange), default)
    torch.testing.assert_close(model(x, positions=arange.expand(3, S)), default)


def test_shifted_positions_change_an_absolute_encoding_only():
    x = tokens()
    shifted = torch.arange(3, S + 3)
    rope, ape = make(encoding="rope"), make(encoding="learned")
    torch.testing.assert_close(rope(x, positions=shifted), rope(x))  # RoPE sees offsets only
    assert not torch.allclose(ape(x, positions=shifted), ape(x))


def test_bos_is_attended_and_trimmed():
    model, x = make(bos=True), tokens()
    logits, inter = model(x, return_intermediates=True)
    assert logits.shape == (3, S, M)
    assert (inter.layers[0].pattern[..., 0] > 0).all()  # every query can read the BOS key
    assert not torch.allclose(logits, make(bos=False)(x))


def test_check_length():
    model = make(encoding="learned", max_len=8)
    model.check_length(8)
    with pytest.raises(ConfigError):
        model.check_length(9)
    with pytest.raises(ConfigError):  # BOS takes position 0, so 8 tokens need 9 rows
        make(encoding="learned", max_len=8, bos=True).check_length(8)
    make(encoding="rope", max_len=8).check_length(100)  # no table: nothing to refuse


# ----------------------------------------------------------------------------- attention variants

def test_linear_attention_runs():
    model = make(attention="linear")
    logits, inter = model(tokens(), lengths=torch.tensor([S, 4, 2]), return_intermediates=True)
    assert torch.isfinite(logits).all()
    assert not torch.allclose(inter.layers[0].pattern.sum(-1), torch.ones(()).double())  # unnormalized
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_constant_energy_gate_is_plain_softmax_attention():
    gated, plain = make(energy_gate=EnergyGate(renormalize=True)), make(energy_gate=None)
    state = {k: v for k, v in gated.state_dict().items() if "gate" not in k}
    plain.load_state_dict(state)
    for layer in gated.layers:  # a constant gate shifts every logit of a row equally
        torch.nn.init.zeros_(layer.W_gate)
    x = tokens()
    torch.testing.assert_close(gated(x), plain(x))
    assert not torch.allclose(make(energy_gate=EnergyGate(renormalize=True))(x), plain(x))


def test_temperature_and_no_layer_norm_run():
    model = make(temperature=0.5, layer_norm=False, d_mlp=8)
    assert model.layers[0].MLP[0].out_features == 8
    assert torch.isfinite(model(tokens())).all()
    assert make().layers[0].MLP[0].out_features == 64


# ----------------------------------------------------------------------------- bad configs

@pytest.mark.parametrize("overrides, field", [
    (dict(n_heads=3), "n_heads"),
    (dict(encoding="no_such_encoding"), "encoding"),
    (dict(encoding_options={"colour": 1}), "encoding.colour"),
    (dict(attention="sparse"), "attention"),
    (dict(window=0), "window"),
    (dict(temperature=0.0), "temperature"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(init="gpt2"), "init"),
])
def test_bad_config(overrides, field):
    options = dict(vocab_size=M, d_model=16, n_heads=2) | overrides
    with pytest.raises(ConfigError) as err:
        TransformerConfig(**options)
    assert err.value.field == field


# ----------------------------------------------------------------------------- init="normal"

def test_normal_init_is_nanogpts_and_torch_init_is_unchanged():
    """init="normal": every matrix N(0, 0.02^2), W_O and the MLP's output 0.02 / sqrt(2 L), MLP biases 0,
    LayerNorms and the encoding's own table untouched; the "torch" draws are the default's, bit for bit."""
    from poslab.models.transformer import Transformer

    options = dict(vocab_size=97, d_model=128, n_heads=4, n_layers=3, encoding="learned", bos=True, max_len=256,
                   energy_gate=True)
    torch.manual_seed(0)
    plain = Transformer(TransformerConfig(**options))
    torch.manual_seed(0)
    same = Transformer(TransformerConfig(**options, init="torch"))
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), same.parameters(), strict=True))
    torch.manual_seed(0)
    normal = Transformer(TransformerConfig(**options, init="normal"))
    params = dict(normal.named_parameters())
    residual = 0.02 / (2 * 3) ** 0.5
    for name, p in params.items():
        if name.endswith(("W_O", "MLP.2.weight")):
            want = residual
        elif name.endswith(("W_E", "U", "W_bos", "W_Q", "W_K", "W_V", "W_gate", "MLP.0.weight")):
            want = 0.02
        else:
            continue
        assert abs(float(p.std()) - want) < 0.1 * want and abs(float(p.mean())) < 0.1 * want, name
    assert all(float(params[n].abs().max()) == 0 for n in params if n.endswith(("MLP.0.bias", "MLP.2.bias")))
    assert all(torch.equal(params[n], dict(plain.named_parameters())[n]) for n in params
               if "ln_" in n or n.startswith("encoding.") or n.endswith("gate_tau"))
