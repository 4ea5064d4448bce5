"""Energy-gated attention: the gate against a naive loop, causality, the g = 1 limit, parameter count."""

from __future__ import annotations

import math
from functools import partial

import pytest
import tiny_model
import torch

from poslab.errors import ConfigError
from poslab.models.energy_gate import EnergyGate, gate_parameter_count
from poslab.models.transformer import TransformerConfig

S = 8
M = tiny_model.M
make = partial(tiny_model.make, energy_gate=True)
tokens = partial(tiny_model.tokens, s=S)


@pytest.mark.parametrize("energy", ["power", "amplitude"])
@pytest.mark.parametrize("projection", ["per_head", "shared"])
def test_gate_against_a_naive_loop(energy, projection):
    model = make(energy_gate=EnergyGate(energy=energy, projection=projection))
    block = model.layers[0]
    with torch.no_grad():
        block.gate_tau.copy_(torch.tensor([0.3, 1.2]))
    a = torch.randn(2, 5, 16, dtype=torch.double)
    with torch.no_grad():
        E, g = block.energy_gate(a)
    assert E.shape == g.shape == (2, 2, 5)
    W, tau, T = block.W_gate.detach(), block.gate_tau.detach(), model.cfg.energy_gate.temperature
    for b in range(2):
        for h in range(2):
            w = W[h] if projection == "per_head" else W[0]
            e = [float(w @ a[b, j]) for j in range(5)]
            for j in range(5):
                mean_square = sum(x * x for x in e[: j + 1]) / (j + 1) + 1e-6
                want = e[j] ** 2 / mean_square if energy == "power" else e[j] / math.sqrt(mean_square)
                assert float(E[b, h, j]) == pytest.approx(want, rel=1e-9, abs=1e-12)
                gate = 1 / (1 + math.exp(-(want - float(tau[h])) / T))
                assert float(g[b, h, j]) == pytest.approx(gate, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("bos", [False, True])
def test_gate_is_causal(renormalize, bos):
    """Changing a future token changes no earlier output, and does change the later ones."""
    model = make(energy_gate=EnergyGate(renormalize=renormalize), bos=bos)
    x = tokens()
    for t in (2, 5, S - 1):
        y = x.clone()
        y[:, t] = (y[:, t] + 1) % M
        a, b = model(x), model(y)
        torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=0)
        assert not torch.allclose(a[:, t:], b[:, t:])
        block, inside = model.layers[0], int(bos) + t  # the gates themselves, from the normalized input
        ga = block.energy_gate(block.ln_attn(_embedded(model, x)))[1]
        gb = block.energy_gate(block.ln_attn(_embedded(model, y)))[1]
        torch.testing.assert_close(ga[..., :inside], gb[..., :inside], rtol=0, atol=0)
        assert not torch.allclose(ga[..., inside:], gb[..., inside:])


def _embedded(model, x):
    _, inter = model(x, return_intermediates=True)
    return inter.layers[0].resid_pre


@pytest.mark.parametrize("renormalize", [False, True])
def test_an_open_gate_is_standard_attention(renormalize):
    """tau -> -inf opens every gate (g = 1): the gated model is the plain one with the same weights."""
    gated, plain = make(energy_gate=EnergyGate(renormalize=renormalize)), make(energy_gate=None)
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if "gate" not in k})
    x = tokens()
    assert not torch.allclose(gated(x), plain(x))
    with torch.no_grad():
        for block in gated.layers:
            block.gate_tau.fill_(-1e4)
    torch.testing.assert_close(gated(x), plain(x))


def test_unrenormalized_gate_scales_values_not_weights():
    """Closing every gate (tau -> +inf) silences attention: the block adds only its MLP."""
    model = make(n_layers=1)
    with torch.no_grad():
        model.layers[0].gate_tau.fill_(1e4)
    _, inter = model(tokens(), return_intermediates=True)
    layer = inter.layers[0]
    torch.testing.assert_close(layer.pattern.sum(-1), torch.ones_like(layer.pattern.sum(-1)))  # still softmax
    assert layer.v.abs().max() == 0  # every value contribution gated off


@pytest.mark.parametrize("projection, per_layer", [("per_head", 2 * 16 + 2), ("shared", 16 + 2)])
def test_extra_parameters_are_counted(projection, per_layer):
    model = make(energy_gate=EnergyGate(projection=projection), n_layers=3)
    assert gate_parameter_count(model) == 3 * per_layer
    plain = sum(p.numel() for p in make(energy_gate=None, n_layers=3).parameters())
    assert sum(p.numel() for p in model.parameters()) - plain == 3 * per_layer
    assert gate_parameter_count(make(energy_gate=None)) == 0


def test_gradients_reach_the_gate():
    model = make()
    model(tokens()).square().sum().backward()
    for block in model.layers:
        assert block.W_gate.grad.abs().sum() > 0 and block.gate_tau.grad.abs().sum() > 0


@pytest.mark.parametrize("field, value", [("projection", "per_key"), ("energy", "log"), ("temperature", 0.0),
                                          ("temperature", True), ("renormalize", 1)])
def test_bad_gate_options(field, value):
    with pytest.raises(ConfigError) as err:
        TransformerConfig(vocab_size=M, energy_gate=EnergyGate(**{field: value}))
    assert err.value.field == f"energy_gate.{field}"
    with pytest.raises(ConfigError) as err:  # the same through a config's mapping
        TransformerConfig(vocab_size=M, energy_gate={field: value})
    assert err.value.field == f"energy_gate.{field}"


def test_shorthands_and_unknown_options():
    assert TransformerConfig(vocab_size=M, energy_gate=True).energy_gate == EnergyGate()
    assert TransformerConfig(vocab_size=M, energy_gate=False).energy_gate is None
    assert TransformerConfig(vocab_size=M, energy_gate={"temperature": 1}).energy_gate == EnergyGate(temperature=1.0)
    with pytest.raises(ConfigError) as err:
        TransformerConfig(vocab_size=M, energy_gate={"tau": 1.0})
    assert err.value.field == "energy_gate.tau" and "tau_init" in err.value.allowed
    with pytest.raises(ConfigError) as err:
        TransformerConfig(vocab_size=M, energy_gate="on")
    assert err.value.field == "energy_gate"
