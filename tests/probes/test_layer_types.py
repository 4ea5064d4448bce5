"""Probes per layer type (issue 57): each layer's kind from a layout, the key-0 / recency / distance
masses on patterns with known answers, a head blind to content spreading exactly as its mask allows,
the carrier per rope layer, and seed 001's (b) with each layer's own window."""

import numpy as np
import pytest
import torch

from poslab.errors import ConfigError
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.probes import layer_types as lt
from poslab.probes import leakage as lk
from poslab.tasks import build_task, eval_batch

LAYOUT = "rope:window=4,rope:chunk=5,rope,nope"


def make(seed=0, **kw):
    torch.manual_seed(seed)
    options = dict(vocab_size=20, d_model=16, n_layers=4, n_heads=2, max_len=32, layout=LAYOUT) | kw
    return Transformer(TransformerConfig(**options)).double().eval()


def batch(L=12, n=8):
    return eval_batch(build_task("fixed_offset", K=2, m=20), L, n, 0)


def test_layer_kinds_read_the_layout():
    kinds = lt.layer_kinds(make())
    assert [k.type for k in kinds] == ["rope+window 4", "rope+chunk 5", "rope", "nope"]
    assert [(k.rotary, k.window, k.chunk) for k in kinds] == [(True, 4, None), (True, None, 5), (True, None, None),
                                                              (False, None, None)]
    assert [k.type for k in lt.layer_kinds(make(layout=None, encoding="nope"))] == ["nope"] * 4
    with pytest.raises(ConfigError) as err:
        lt.layer_kinds(object())
    assert err.value.field == "model"


def test_attention_targets_on_patterns_with_known_answers():
    n = 6
    sink = np.zeros((n, n))
    sink[:, 0] = 1.0  # every query on key 0
    self_ = np.eye(n)  # every query on itself
    previous = np.zeros((n, n))
    previous[0, 0] = 1.0
    previous[np.arange(1, n), np.arange(n - 1)] = 1.0  # every query on the key before it
    got = lt.attention_targets(np.stack([sink, self_, previous])[None], recent=2)  # [1 layer, 3 heads]
    i = np.arange(1, n)
    np.testing.assert_allclose(got["key0"][0], [1.0, 0.0, 1 / (n - 1)])
    np.testing.assert_allclose(got["recent"][0], [np.mean(i < 2), 1.0, 1.0])  # key 0 is recent for i = 1 only
    np.testing.assert_allclose(got["distance"][0], [i.mean(), 0.0, 1.0])
    with pytest.raises(ConfigError):
        lt.attention_targets(np.zeros((2, 3, 4)))


def test_a_content_blind_head_spreads_exactly_as_its_mask_allows():
    """W_Q = W_K = 0: every logit is 0, so each layer's weights are uniform over the keys its own mask
    keeps, and its key-0 mass is the uniform one (window and chunk read from the layout)."""
    model = make()
    with torch.no_grad():
        for block in model.layers:
            block.W_Q.zero_()
            block.W_K.zero_()
    rows = lt.target_rows(model, batch(), chunk=4)
    assert len(rows) == 4 * 2
    for r in rows:
        for column in ("key0", "recent", "distance"):
            assert r[column] == pytest.approx(r[f"uniform_{column}"], abs=1e-9), (r["layer_type"], column)
    by = {r["layer_type"]: r for r in rows}
    assert by["rope+chunk 5"]["key0"] < by["rope"]["key0"]  # queries past the first chunk never see key 0
    assert by["rope+window 4"]["recent"] == pytest.approx(1.0)  # a window of 4 holds only recent keys


def test_carrier_rows_cover_the_rope_layers_with_their_own_frequencies():
    model = make(layout="rope:base=100,nope,rope,nope")
    rows = lt.carrier_rows(model, batch(), np.arange(-11, 1), chunk=4)
    assert sorted({r["layer"] for r in rows}) == [0, 2] and len(rows) == 2 * 2
    assert all(0 <= r["carrier_q"] <= 1 and 0 <= r["carrier_k"] <= 1 and -11 <= r["carrier_peak"] <= 0 for r in rows)
    # a rope layer's rows are the seed's carrier of that layer (collect_moments at that layer)
    from poslab.probes.carriers import collect_moments

    cq, ck = collect_moments(model, batch(), layer=2, chunk=4).carrier_energies()
    two = [r for r in rows if r["layer"] == 2]
    np.testing.assert_allclose([r["carrier_q"] for r in two], cq)
    np.testing.assert_allclose([r["carrier_k"] for r in two], ck)


def test_leakage_reads_each_layer_with_its_own_window_and_leaves_chunked_layers_out():
    model, b = make(), batch(L=12, n=8)
    rows = lt.leakage_rows(model, b, chunk=4)
    chunked = [r for r in rows if r["chunk"] is not None]
    assert chunked and all(r["component_b"] is None and r["na"] == lt.CHUNKED_WHY for r in chunked)
    # layer 0 (window 4) and layer 3 (full) equal the leakage sums over the same intermediates with those windows
    want = lk.leakage_of([model.collect(b)], window=[4, None, None, None], layers=[0, 2, 3])
    for r in rows:
        if r["chunk"] is None:
            slot = [0, 2, 3].index(r["layer"])
            assert r["component_b"] == pytest.approx(float(want["component_b"][slot, r["head"]]), abs=1e-9)
            assert r["component_b_key0"] == pytest.approx(float(want["component_b_key0"][slot, r["head"]]), abs=1e-9)
    # a full-attention reading of the windowed layer is refused: its weights are not the causal softmax
    with pytest.raises(ConfigError):
        lk.leakage_of([model.collect(b)], window=None, layers=[0])
