"""RetrievalHead: the direct forward against a naive formula, the grid fast path against the
direct forward for every registry entry, and errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from poslab.errors import ConfigError
from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.positional import registered
from poslab.tasks import Batch

torch.manual_seed(0)


def head(encoding="rope", **kw):
    torch.manual_seed(1)
    return RetrievalHead(RetrievalHeadConfig(encoding=encoding, d_model=16, max_len=24, **kw))


def batch(b=6, T=12, lo=5):
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 20, (b, T), generator=g), torch.randint(lo, T + 1, (b,), generator=g)


def test_direct_forward_equals_naive_rope_formula():
    """l_t = (R_n W_Q x_n) . (R_t W_K x_t) / sqrt(d); o = sum softmax(l)_t W_V x_t; y = U o."""
    model = head("rope")
    tokens, lengths = batch()
    out = model(tokens, lengths)
    theta = 10000.0 ** (-torch.arange(0, 16, 2).double() / 16)

    def rot(v, p):  # explicit 2x2 blocks on (2i, 2i+1)
        r = v.clone()
        for i, th in enumerate(theta):
            c, s = math.cos(p * th), math.sin(p * th)
            r[2 * i], r[2 * i + 1] = c * v[2 * i] - s * v[2 * i + 1], s * v[2 * i] + c * v[2 * i + 1]
        return r

    W = {k: v.detach().double() for k, v in model.state_dict().items()}
    for b in range(tokens.shape[0]):
        L = int(lengths[b])
        x = W["W_E"][tokens[b, :L]]
        q = rot(W["W_Q"] @ x[L - 1], L - 1)
        logits = torch.stack([q @ rot(W["W_K"] @ x[t], t) for t in range(L)]) / 4.0
        o = (logits.softmax(0)[:, None] * (x @ W["W_V"].T)).sum(0)
        torch.testing.assert_close(out[b].double(), W["U"] @ o, rtol=1e-5, atol=1e-5)


def test_direct_forward_equals_naive_ape_formula_with_linear_attention():
    model = head("learned", attention="linear", temperature=2.0)
    tokens, lengths = batch()
    out = model(tokens, lengths)
    W = {k: v.detach().double() for k, v in model.state_dict().items()}
    for b in range(tokens.shape[0]):
        L = int(lengths[b])
        z = W["W_E"][tokens[b, :L]] + W["encoding.W_pos"][:L]
        logits = (z @ W["W_K"].T) @ (W["W_Q"] @ z[L - 1]) / 4.0 / 2.0
        torch.testing.assert_close(out[b].double(), W["U"] @ (logits @ (z @ W["W_V"].T)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", registered())
@pytest.mark.parametrize("n_heads", [1, 2])
def test_grid_fast_path_equals_direct_forward(name, n_heads):
    model = head(name, n_heads=n_heads)
    tokens, lengths = batch()
    direct = model(tokens, lengths)
    torch.testing.assert_close(model.forward_table(tokens, lengths), direct, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.forward_table(tokens, lengths, 4, 8), direct, rtol=1e-5, atol=1e-5)
    same = torch.full_like(lengths, 9)  # one length per batch: a single query position
    torch.testing.assert_close(model.forward_table(tokens, same, 8, 1), model(tokens, same), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", registered())
def test_every_encoding_forward_backward_and_intermediates(name):
    model = head(name)
    tokens, lengths = batch()
    logits, inter = model(tokens, lengths, return_intermediates=True)
    assert logits.shape == (6, 20)
    layer = inter.layers[0]
    assert layer.pattern.shape == (6, 1, 1, 12)
    torch.testing.assert_close(layer.pattern.sum(-1), torch.ones(6, 1, 1))
    assert (layer.pattern[..., 0, :][torch.arange(12) >= lengths[:, None, None].expand(6, 1, 12)] == 0).all()
    loss = model.loss(Batch(tokens=tokens, targets=tokens[:, 0], loss_mask=torch.ones(6, dtype=torch.bool),
                            lengths=lengths))
    assert float(loss) == pytest.approx(float(F.cross_entropy(logits, tokens[:, 0])), rel=1e-5)  # fast path = direct
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


def test_positions_past_a_learned_table_are_refused_before_work():
    model = head("learned", encoding_options={"max_position": 16})
    model.check_length(16)
    with pytest.raises(ConfigError, match="length.*out_of_range"):
        model.check_length(17)
    with pytest.raises(ConfigError, match="length"):
        head("rope").check_length(25)


@pytest.mark.parametrize("cfg, field", [(dict(encoding="rope", d_head=7), "d_head"),
                                        (dict(encoding="bogus"), "encoding"),
                                        (dict(attention="relu"), "attention"),
                                        (dict(n_heads=3), "n_heads")])
def test_bad_config_names_the_field(cfg, field):
    with pytest.raises(ConfigError, match=field):
        RetrievalHead(RetrievalHeadConfig(d_model=16, **cfg))


@pytest.mark.parametrize("d_model, message", [(1, "head dimension"), (3, "head dimension"), (0, "positive integer")])
def test_a_width_the_encoding_refuses_is_reported_as_d_model(d_model, message):
    # found by the --set fuzz test: d_model=1 used to be reported as d_head, a field nobody set
    with pytest.raises(ConfigError, match=message) as e:
        RetrievalHead(RetrievalHeadConfig(encoding="rope", d_model=d_model))
    assert e.value.field == "d_model"
