"""Leakage probes on synthetic heads with known answers, and the interventions of
models/intervention.py on a small Transformer: each changes only what it claims to."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from poslab.errors import ConfigError
from poslab.models.intermediates import Intermediates, LayerIntermediates
from poslab.models.intervention import Intervention
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.probes import leakage as lk
from poslab.tasks.base import Batch

N = 12  # internal sequence length of the synthetic heads


def synthetic(b: int, absolute: float = 0.0, key0: float = 0.0, noise: float = 0.5, seed: int = 0,
              query=None, key=None, interaction=None) -> torch.Tensor:
    """Logits [b, 1, 1, N, N] = f(i - j) + absolute * i / N + key0 [j = 0] + query(i) + key(j)
    + interaction(i, j) + content noise, with f(d) = cos(0.7 d) + 0.1 d."""
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(N, dtype=torch.float64)[:, None]
    j = torch.arange(N, dtype=torch.float64)[None, :]
    y = torch.cos(0.7 * (i - j)) + 0.1 * (i - j) + absolute * i / N + key0 * (j == 0)
    for term in (query and query(i), key and key(j), interaction and interaction(i, j)):
        if term is not None:
            y = y + term
    y = y + noise * torch.randn(b, N, N, generator=g, dtype=torch.float64)
    return y[:, None, None]


def delta(y: torch.Tensor, queries: int | None = None) -> float:
    keep = lk.keep_mask(N)
    i, j = lk.pairs(keep, queries)
    return float(lk.delta_r2(lk.pair_sums(y, lk.held_out_sequences(y.shape[0])), i, j)["delta"].reshape(-1)[0])


def as_intermediates(scores: torch.Tensor, window: int | None = None) -> Intermediates:
    """Logits [b, l, h, N, N] as the intermediates a model's collect returns (softmax weights)."""
    keep = lk.keep_mask(scores.shape[-1], window)
    pattern = torch.softmax(scores.masked_fill(~keep, -math.inf), -1)
    layers = [LayerIntermediates(attn_scores=scores[:, k], pattern=pattern[:, k], q=None, k=None, rot_q=None,
                                 rot_k=None, v=None, resid_pre=None, resid_post=None) for k in range(scores.shape[1])]
    return Intermediates(embed=None, positions=None, layers=layers)


def components(y: torch.Tensor, window: int | None = None, early: int | None = None) -> dict[str, float]:
    out = lk.leakage_of([as_intermediates(y, window)], window=window, early=early)
    return {k: float(v.reshape(-1)[0]) for k, v in out.items() if v.ndim == 2}


def test_delta_r2_is_zero_for_an_offset_only_head_and_positive_with_the_absolute_index():
    assert abs(delta(synthetic(200))) < 0.01
    assert delta(synthetic(200, absolute=2.0)) > 0.1
    assert delta(synthetic(200, key0=2.0)) > 0.05  # a sink column is absolute key position
    assert abs(delta(synthetic(200), queries=5)) < 0.02


def test_delta_r2_held_out_and_chunked_sums_agree():
    y = synthetic(40, absolute=1.0)
    keep = lk.keep_mask(N)
    i, j = lk.pairs(keep)
    whole = lk.pair_sums(y, lk.held_out_sequences(40))
    parts = lk.pair_sums(y[:15], lk.held_out_sequences(15, 0)) + lk.pair_sums(y[15:], lk.held_out_sequences(25, 15))
    assert whole.n_fit == parts.n_fit == 20
    np.testing.assert_allclose(lk.delta_r2(whole, i, j)["delta"], lk.delta_r2(parts, i, j)["delta"], atol=1e-9)
    chunked = lk.leakage_of([as_intermediates(y[:15]), as_intermediates(y[15:])], early=5)
    at_once = lk.leakage_of([as_intermediates(y)], early=5)
    for key in ("component_a", "component_b", "early_component_a", "early_component_b", "old_component_b"):
        np.testing.assert_allclose(chunked[key], at_once[key], atol=1e-9)


def test_a_query_only_shift_moves_no_weight_and_no_component():
    """The issue's toy: 2 log(1 + i) added to every logit of query i. The weights do not move, so
    neither may (a) nor (b); the earlier ΔR² definitions did move (kept to show it)."""
    plain = synthetic(400)
    shifted = synthetic(400, query=lambda i: 2 * torch.log1p(i))
    keep = lk.keep_mask(N)
    weights = [torch.softmax(y.masked_fill(~keep, -math.inf), -1) for y in (plain, shifted)]
    assert float((weights[0] - weights[1]).abs().max()) < 1e-6
    before, after = components(plain, early=5), components(shifted, early=5)
    for key in ("component_a", "component_b", "component_b_key", "component_b_interaction", "early_component_a",
                "early_component_b"):
        assert after[key] == pytest.approx(before[key], abs=1e-9), key
    assert abs(after["component_b"]) < 0.01
    assert after["old_component_b"] > 0.3 and after["old_component_b"] - before["old_component_b"] > 0.3
    assert after["old_component_a"] < before["old_component_a"] - 0.3
    # a content-dependent shift per (sequence, query) is invisible too
    noise = torch.randn(400, 1, 1, N, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert components(plain + 3 * noise)["component_b"] == pytest.approx(before["component_b"], abs=1e-9)


def test_pure_relative_logits_under_a_causal_mask_give_a_and_no_b():
    for noise in (0.0, 0.5):
        got = components(synthetic(200, noise=noise))
        assert got["component_a"] > 0.2
        assert abs(got["component_b"]) < 0.01
    uniform = components(torch.zeros(20, 1, 1, N, N))  # log a_ij = -log(i + 1): all of it is the normaliser
    assert uniform["component_a"] == pytest.approx(1.0) and uniform["component_b"] == 0.0
    fit = lk.log_z_fit(lk.log_partition(torch.zeros(N, N), lk.keep_mask(N)).numpy())
    assert fit["slope"] == pytest.approx(1.0) and fit["r2"] == pytest.approx(1.0)  # Z_i = i + 1
    # a window of w keys stops the normaliser from moving at i = w - 1
    f = torch.cos(0.7 * torch.arange(N, dtype=torch.float64))
    lam = lk.log_normaliser(f, lk.keep_mask(N, 4))
    assert float(lam[3:].std()) < 1e-12 and float(lam[:4].std()) > 0.1
    windowed = components(synthetic(200), window=4)
    assert 0 < windowed["component_a"] < components(synthetic(200))["component_a"] / 2


def test_b_is_unbiased_where_a_held_out_r2_gain_of_the_per_pair_means_is_not():
    """Nothing beyond f(i - j): over many small batches (b) averages 0, while the held-out R² gain
    of the per-pair means pays for their parameters."""
    keep = lk.keep_mask(N)
    i, j = lk.pairs(keep)
    b, r2_gain = [], []
    for seed in range(30):
        y = lk.centred(synthetic(16, seed=seed), keep)
        sums = lk.pair_sums(y, lk.held_out_sequences(16))
        b.append(float(lk.component_b(sums, i, j)["component_b"].reshape(-1)[0]))
        r2_gain.append(float((lk.r_squared(sums, i, j, "pair") - lk.r_squared(sums, i, j, "query")).reshape(-1)[0]))
    assert abs(np.mean(b)) < 3 * np.std(b) / np.sqrt(len(b)) + 1e-3
    assert np.mean(r2_gain) < -0.02


@pytest.mark.parametrize("window", [None, 1, 3, 7])
def test_log_normaliser_running_sum_equals_the_grid_on_every_band(window):
    # the O(n) running logsumexp over offsets against the [n, n] grid it replaces, NaNs included
    torch.manual_seed(0)
    f = torch.randn(3, 2, 9, dtype=torch.float64)
    f[1, 0, 5] = math.nan
    keep = lk.keep_mask(9, window)
    assert lk.band_width(keep) == (9 if window is None else window)
    offset = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).clamp(0, 8)
    grid = f[..., offset].masked_fill(~keep, -math.inf).logsumexp(-1)
    torch.testing.assert_close(lk.log_normaliser(f, keep), grid, rtol=1e-12, atol=1e-12, equal_nan=True)
    other = keep.clone()
    other[4, 4] = False  # a query that does not see itself: not a band, the grid itself
    assert lk.band_width(other) is None
    torch.testing.assert_close(lk.log_normaliser(f, other), f[..., offset].masked_fill(~other, -math.inf).logsumexp(-1),
                               equal_nan=True)


def test_log_normaliser_equals_the_naive_sum():
    f = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5], dtype=torch.float64)
    keep = lk.keep_mask(5, 3)
    lam = lk.log_normaliser(f, keep)
    for i in range(5):
        naive = math.log(sum(math.exp(float(f[i - j])) for j in range(5) if j <= i and i - j < 3))
        assert float(lam[i]) == pytest.approx(naive)


def test_key_position_and_interaction_terms_give_b():
    key = components(synthetic(400, key=lambda j: 1.0 * (j == 0)))  # a sink column
    assert key["component_b"] > 0.05 and key["component_b_key"] > 0.05
    assert abs(key["component_b_interaction"]) < 0.01
    inter = components(synthetic(400, interaction=lambda i, j: 1.5 * torch.sin(1.3 * i) * torch.cos(2.1 * j)))
    assert inter["component_b_interaction"] > 0.05 and inter["component_b"] > 0.05
    np.testing.assert_allclose(inter["component_b"], inter["component_b_key"] + inter["component_b_interaction"])


def test_weights_that_are_not_the_causal_softmax_are_refused():
    y = synthetic(20)
    inter = as_intermediates(y)
    inter.layers[0].pattern = inter.layers[0].pattern * 0.5
    with pytest.raises(ConfigError, match="model"):
        lk.leakage_of([inter])
    with pytest.raises(ConfigError, match="layers"):
        lk.leakage_of([as_intermediates(y)], layers=[1])
    with pytest.raises(ConfigError, match="early"):
        lk.leakage_of([as_intermediates(y)], early=N + 1)
    two = torch.cat([y, 2 * y], 1)  # two layers; read only the second
    np.testing.assert_allclose(lk.leakage_of([as_intermediates(two)], layers=[1])["component_a"],
                               lk.leakage_of([as_intermediates(2 * y)])["component_a"])


def test_received_attention_sink_heads_and_mean_cosine():
    keep = lk.keep_mask(4)
    sink = torch.zeros(1, 4, 4)
    sink[0, :, 0] = 1.0  # every query puts all weight on key 0
    uniform = keep.float() / keep.sum(-1, keepdim=True)
    pattern = torch.stack([sink[0], uniform])[None]  # [b=1, h=2, 4, 4]
    got = lk.received_attention(pattern, keep)
    assert got[0, 0] == pytest.approx(1.0)
    assert got[1, 0] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert torch.isnan(got[:, 3]).all()  # no other query sees the last key
    assert lk.sink_heads(got[:, 0]).tolist() == [True, True]
    assert lk.sink_heads(torch.tensor([0.29, 0.3])).tolist() == [False, True]
    x = torch.randn(1, 8).repeat(5, 1)
    assert lk.mean_cosine(x) == pytest.approx(1.0)
    assert lk.mean_cosine(torch.eye(4)) == pytest.approx(0.0)
    with pytest.raises(ConfigError):
        lk.mean_cosine(x[:1])


# ----------------------------------------------------------------------------- on a Transformer

def model_and_batch(window=None, bos=True, b=8, L=10):
    """A small untrained 3-layer, 2-head Transformer and ``b`` random full windows of ``L`` tokens."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=12, d_model=16, n_layers=3, n_heads=2, max_len=32, bos=bos, window=window)
    tokens = torch.randint(0, 12, (b, L), generator=torch.Generator().manual_seed(1))
    return Transformer(cfg).eval(), Batch(tokens=tokens, targets=tokens, lengths=torch.full((b,), L),
                                          loss_mask=torch.ones_like(tokens, dtype=torch.bool))


def test_bos_swap_changes_only_position_0_input():
    model, batch = model_and_batch()
    base = model.collect(batch)
    same = model.collect(batch, Intervention(bos_embedding=model.W_bos.detach()))
    torch.testing.assert_close(same.logits, base.logits)
    swaps = lk.bos_replacements(model, token=3)
    assert float(swaps["random"].norm()) == pytest.approx(float(model.W_bos.detach().norm()), rel=1e-5)
    torch.testing.assert_close(swaps["mean"], model.W_E.detach().mean(0))
    for vec in swaps.values():
        got = model.collect(batch, Intervention(bos_embedding=vec))
        torch.testing.assert_close(got.embed[:, 1:], base.embed[:, 1:])
        torch.testing.assert_close(got.embed[:, 0], vec.expand(8, -1))
        assert not torch.allclose(got.logits, base.logits)
    per_seq = model.W_E.detach()[batch.tokens[:, 0]]  # [b, D]
    torch.testing.assert_close(model.collect(batch, Intervention(bos_embedding=per_seq)).embed[:, 0], per_seq)


def test_resid0_patch_acts_from_its_layer_on_and_only_at_position_0():
    model, batch = model_and_batch()
    base = model.collect(batch)
    own = base.layers[1].resid_pre[:, 0]
    torch.testing.assert_close(model.collect(batch, Intervention(resid0=own, resid0_layer=1)).logits, base.logits)
    other = torch.randn(16)
    got = model.collect(batch, Intervention(resid0=other, resid0_layer=1))
    torch.testing.assert_close(got.layers[0].resid_post, base.layers[0].resid_post)  # before the patch
    torch.testing.assert_close(got.layers[1].resid_pre[:, 0], other.expand(8, -1))
    torch.testing.assert_close(got.layers[1].resid_pre[:, 1:], base.layers[1].resid_pre[:, 1:])
    assert not torch.allclose(got.logits, base.logits)
    last = model.collect(batch, Intervention(resid0=other, resid0_layer=3))  # entering the readout
    torch.testing.assert_close(last.logits, base.logits)  # position 0 (BOS) has no logits


def test_drop_key0_removes_key_0_in_the_chosen_heads_only():
    model, batch = model_and_batch()
    base = model.collect(batch)
    drop = torch.zeros(3, 2, dtype=torch.bool)
    drop[1, 0] = True
    got = model.collect(batch, Intervention(drop_key0=drop))
    torch.testing.assert_close(got.layers[0].pattern, base.layers[0].pattern)
    p = got.layers[1].pattern
    assert (p[:, 0, 1:, 0] == 0).all() and (p[:, 0, 0, 0] == 1).all()  # query 0 keeps itself
    torch.testing.assert_close(p[:, 1], base.layers[1].pattern[:, 1])  # the other head of the layer
    torch.testing.assert_close(got.layers[1].attn_scores, base.layers[1].attn_scores)  # logits before masking
    assert not torch.allclose(got.logits, base.logits)
    window_model, _ = model_and_batch(window=3)
    w = window_model.collect(batch, Intervention(drop_key0=drop)).layers[1].pattern
    assert (w[:, 0, 1:, 0] == 0).all() and (w[:, 0, 3:, :] .sum(-1) - 1).abs().max() < 1e-5


def test_interventions_refuse_what_does_not_fit_before_work():
    model, batch = model_and_batch()
    for bad in (Intervention(bos_embedding=torch.zeros(5)), Intervention(resid0_layer=4),
                Intervention(drop_key0=torch.zeros(3, 2)), Intervention(resid0=torch.zeros(3, 16))):
        with pytest.raises(ConfigError):
            model.collect(batch, bad)
    no_bos, _ = model_and_batch(bos=False)
    with pytest.raises(ConfigError):
        no_bos.collect(batch, Intervention(bos_embedding=torch.zeros(16)))


def test_a_reused_scratch_gives_every_fit_exactly_what_fresh_memory_does():
    model, batch = model_and_batch(b=12)
    scratch: dict = {}
    first = lk.leakage(model, batch, early=4, chunk=5, scratch=scratch)
    held = sorted(t.data_ptr() for ts in scratch.values() for t in ts)
    assert len(held) == 9  # three sums of three quantities, kept for the next call
    second = lk.leakage(model, batch[:8], early=4, chunk=3, scratch=scratch)  # dirty buffers, another batch
    assert sorted(t.data_ptr() for ts in scratch.values() for t in ts) == held  # the same memory, not new pages
    for got, fresh in ((first, lk.leakage(model, batch, early=4, chunk=5)),
                       (second, lk.leakage(model, batch[:8], early=4, chunk=3))):
        for key, value in fresh.items():
            np.testing.assert_array_equal(got[key], value, err_msg=key)
    assert not np.array_equal(first["component_b"], second["component_b"])  # the two calls saw different data


def test_leakage_driver_shapes_closed_system_and_refusals():
    model, batch = model_and_batch(b=12)
    out = lk.leakage(model, batch, early=4, chunk=5)
    assert out["component_b"].shape == (3, 2) and out["log_z"].shape == (3, 2, 11)
    assert (out["component_a"] > 0).all()  # full causal attention: the normaliser moves with i
    assert out["sink"].dtype == bool and "early_component_b" in out
    whole = lk.leakage(model, batch, early=4, chunk=12)
    for key in ("component_a", "component_b", "old_component_b", "early_component_a"):
        np.testing.assert_allclose(out[key], whole[key], atol=1e-8)
    one = lk.leakage(model, batch, early=4, layers=[2])
    np.testing.assert_allclose(one["component_b"], whole["component_b"][2:], atol=1e-10)
    closed = lk.closed_system(model, batch)
    np.testing.assert_allclose(closed["fixed_bos"], 1.0, atol=1e-6)
    assert closed["content"].shape == (4,) and closed["content"].min() < 0.99
    with pytest.raises(ConfigError):
        lk.leakage(model, batch, early=0)
    with pytest.raises(ConfigError):
        lk.leakage(model, batch[:1])
    with pytest.raises(ConfigError):
        lk.closed_system(model_and_batch(bos=False)[0], batch)


def test_per_sequence_interventions_are_sliced_with_the_chunks():
    from poslab.models.intervention import Intervention
    from poslab.probes.leakage import leakage

    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, max_len=12, bos=True)
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 11, (10, 9))
    batch = Batch(tokens=tokens, targets=tokens, loss_mask=torch.ones_like(tokens, dtype=torch.bool),
                  lengths=torch.full((10,), 9))
    iv = Intervention(resid0=torch.randn(10, 16), resid0_layer=1, bos_embedding=torch.randn(10, 16))
    whole = leakage(model, batch, intervention=iv, chunk=10)
    chunked = leakage(model, batch, intervention=iv, chunk=3)
    for key in ("component_a", "component_b", "received_0"):
        np.testing.assert_allclose(chunked[key], whole[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n, window, early", [(9, None, None), (40, 12, None), (48, None, 20)])
@pytest.mark.parametrize("fit", list(lk.FITS))
def test_one_hot_fit_equals_the_dense_pseudo_inverse(n, window, early, fit):
    """OneHotFit never builds the design: its coefficients and predictions equal the dense
    minimum-norm least squares pinv(X) y and X pinv(X) y."""
    i, j = lk.pairs(lk.keep_mask(n, window), early)
    y = torch.randn(4, len(i), generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    X = lk.design(i, j, n, fit)
    X_pinv = torch.linalg.pinv(X)
    fit_ = lk.OneHotFit(i, j, n, fit)
    torch.testing.assert_close(fit_.coefficients(y), (X_pinv @ y.T).T, rtol=0, atol=1e-10)
    torch.testing.assert_close(fit_.predict(y), (X @ (X_pinv @ y.T)).T, rtol=0, atol=1e-10)
    z = torch.randn(4, len(i), generator=torch.Generator().manual_seed(n + 1), dtype=torch.float64)
    dense = ((X @ (X_pinv @ y.T)).T * z).sum(-1)  # sum over pairs of the prediction times z
    torch.testing.assert_close(fit_.projected_dot(y, z)[0], dense, rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(fit_.projected_dot(y, y)[0], (X @ (X_pinv @ y.T)).T.square().sum(-1), rtol=1e-10,
                               atol=1e-9)


@pytest.mark.parametrize("window, early", [(None, None), (5, None), (None, 7)])
def test_r_squared_and_b_equal_the_dense_fits_written_out(window, early):
    """The held-out R² of each fit and (b) against their definitions with the dense design: the
    prediction X pinv(X) m of the fitting means m, its squared error on every held-out sequence,
    and the mean product of the fitting and held-out residuals over the baseline."""
    y = synthetic(7, absolute=0.8, key0=0.5, seed=3, interaction=lambda i, j: 0.2 * torch.sin(i * j))
    held = lk.held_out_sequences(7)
    sums = lk.pair_sums(y, held)
    i, j = lk.pairs(lk.keep_mask(N, window), early)
    pairs_y = y[:, 0, 0][:, i, j]  # [b, C]
    m_fit, test = pairs_y[~held].mean(0), pairs_y[held]
    for fit in (*lk.FITS, "pair"):
        X = lk.design(i, j, N, fit) if fit != "pair" else torch.eye(len(i), dtype=torch.float64)
        pred = X @ torch.linalg.pinv(X) @ m_fit
        want = 1 - (test - pred).square().sum() / (test - test.mean()).square().sum()
        got = lk.r_squared(sums, i, j, fit).reshape(-1)[0]
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    X = lk.design(i, j, N, "query")
    Q = torch.eye(len(i), dtype=torch.float64) - X @ torch.linalg.pinv(X)
    m_test = test.mean(0)
    want_b = (Q @ m_fit) @ (Q @ m_test) / len(i) / (test.square().mean() - test.mean().square())
    got = lk.component_b(sums, i, j)
    torch.testing.assert_close(got["component_b"].reshape(-1)[0], want_b, rtol=1e-9, atol=1e-12)
    at0 = j == 0  # the key-0 part: the same product on the pairs (i, 0) only
    var = test.square().mean() - test.mean().square()
    want_key0 = ((Q @ m_fit) * (Q @ m_test))[at0].sum() / len(i) / var
    torch.testing.assert_close(got["component_b_key0"].reshape(-1)[0], want_key0, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got["component_b_key0"] + got["component_b_rest"], got["component_b"])


def test_the_key0_part_of_b_holds_a_sink_column_and_not_a_key_position_term_elsewhere():
    """(b) at key 0 is what the abstract's mechanism predicts: a column at j = 0 puts most of (b)
    there, the same column at j = 5 puts (b) on the other keys and none at key 0."""
    sink = components(synthetic(400, key=lambda j: 1.0 * (j == 0)))
    assert sink["component_b_key0"] > 0.04 and sink["component_b_key0"] > sink["component_b_rest"]
    elsewhere = components(synthetic(400, key=lambda j: 1.0 * (j == 5)))
    assert elsewhere["component_b"] > 0.05 and abs(elsewhere["component_b_key0"]) < 0.005
    flat = components(synthetic(400))
    assert abs(flat["component_b_key0"]) < 0.002  # unbiased: nothing there, nothing found


def test_leakage_sums_of_chosen_layers_equal_each_layer_alone():
    """Sums added layer by layer in place: two layers at once equal each layer's sums alone."""
    scores = torch.randn(4, 2, 3, 12, 12, generator=torch.Generator().manual_seed(3))  # [b, l, h, n, n]
    inter = as_intermediates(scores)
    both = lk.LeakageSums()
    both.add(inter)
    for k in range(2):
        alone = lk.LeakageSums(layers=[k])
        alone.add(inter)
        for q in lk.QUANTITIES:
            torch.testing.assert_close(both.sums[q].fit_sum[k], alone.sums[q].fit_sum[0])
            torch.testing.assert_close(both.sums[q].test_sq[k], alone.sums[q].test_sq[0])
        assert both.sums["centred"].n_fit == alone.sums["centred"].n_fit == 2
