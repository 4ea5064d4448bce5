"""Probes on hand-built heads whose answers are known, on hand-built intermediates, and on synthetic
inputs with exact answers.

The RoPE head: every token embedding shares the direction e_0, W_Q and W_K read only e_0, so
every query is u and every key is w = R_K u (built here with explicit 2x2 rotations, not with
the library's ``rotate``). The logit at offset delta = t - n is then u . R_delta R_K u / sqrt(d),
largest at delta = -K; values copy a one-hot token code that U reads out, so the head solves
fixed-offset retrieval exactly. The APE head: one position vector W_pos[P] is the only key
direction W_K reads, so attention is pinned at absolute position P whatever the length.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from poslab import probes
from poslab.errors import ConfigError
from poslab.models.intermediates import Intermediates, LayerIntermediates
from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.probes import (
    accuracy,
    attention_at_offset,
    carrier,
    carrier_energy,
    carrier_profile,
    dilution_fit,
    kernel_ratio,
    margin,
    margin_bound,
    mean_attention,
    peak,
    pinned_position,
    rank_concentration,
    rotary_kernel,
    rotary_theta,
)
from poslab.tasks import build_task, eval_batch

M, D = 8, 32  # vocabulary, width (one head, d_head = D)
N = 256  # sequences per evaluation batch


def naive_rotation(p: float, d: int, layout: str, base: float = 10000.0) -> np.ndarray:
    """R_p as a dense [d, d] matrix: pair i rotated counter-clockwise by p * base^(-2i/d)."""
    theta = base ** (-np.arange(0, d, 2) / d)
    R = np.zeros((d, d))
    for i, t in enumerate(theta):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + d // 2)
        c, s = math.cos(p * t), math.sin(p * t)
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def code_embedding(model: RetrievalHead) -> None:
    """W_E[a] = e_0 + e_{1+a}; W_V copies the code e_{1+a}; U reads it back as token a."""
    W_E = torch.zeros(M, D, dtype=torch.float64)
    W_E[:, 0] = 1.0
    W_E[torch.arange(M), 1 + torch.arange(M)] = 1.0
    model.W_E.copy_(W_E)
    model.W_V.zero_()
    model.W_V[1 + torch.arange(M), 1 + torch.arange(M)] = 1.0
    model.U.zero_()
    model.U[torch.arange(M), 1 + torch.arange(M)] = 1.0


def rope_head(K: int, energy: float = 2000.0, layout: str = "interleaved", temperature: float = 1.0,
              seed: int = 0) -> tuple[RetrievalHead, np.ndarray, np.ndarray]:
    """The hand-built RoPE head with a carrier pre-rotated to -K; returns (model, u, w)."""
    cfg = RetrievalHeadConfig(vocab_size=M, d_model=D, encoding="rope", encoding_options={"layout": layout},
                              max_len=48, temperature=temperature)
    model = RetrievalHead(cfg).double()
    rng = np.random.default_rng(seed)
    phases = rng.uniform(0, 2 * math.pi, D // 2)
    pairs = np.stack((np.cos(phases), np.sin(phases)), -1) * math.sqrt(energy / (D // 2))  # equal energy per pair
    u = np.zeros(D)
    for i in range(D // 2):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + D // 2)
        u[a], u[b] = pairs[i]
    w = naive_rotation(K, D, layout) @ u
    with torch.no_grad():
        code_embedding(model)
        model.W_Q.zero_()
        model.W_K.zero_()
        model.W_Q[:, 0] = torch.from_numpy(u)
        model.W_K[:, 0] = torch.from_numpy(w)
    return model, u, w


def ape_head(P: int, strength: float = 20.0) -> RetrievalHead:
    """A learned-APE head whose only key direction is the position vector W_pos[P]."""
    cfg = RetrievalHeadConfig(vocab_size=M, d_model=D, encoding="learned", max_len=48)
    model = RetrievalHead(cfg).double()
    u = torch.ones(D, dtype=torch.float64)
    with torch.no_grad():
        code_embedding(model)
        model.encoding.W_pos.zero_()
        model.encoding.W_pos[P, D - 1] = 1.0
        model.W_Q.zero_()
        model.W_K.zero_()
        model.W_Q[:, 0] = u
        model.W_K[:, D - 1] = u * strength * math.sqrt(D) / D  # logit at P = strength
    return model


def batch_at(L: int, K: int = 2, n: int = N, seed: int = 0):
    return eval_batch(build_task("fixed_offset", m=M, K=K), L, n, seed)


# ----------------------------------------------------------------------------- accuracy, attention peak

@pytest.mark.parametrize("K", [2, 3])
def test_hand_built_rope_head_selects_minus_K_at_every_length(K):
    model, _, _ = rope_head(K)
    for L in (12, 24, 48):
        batch = batch_at(L, K)
        assert accuracy(model, batch) == 1.0
        att = mean_attention(model, batch)
        assert att.shape == (1, L)
        np.testing.assert_allclose(att.sum(-1), 1.0, rtol=1e-12)
        p = peak(att[0], L)
        assert p["peak_offset"] == -K and p["peak_position"] == L - 1 - K
        assert p["peak_height"] == pytest.approx(attention_at_offset(att[0], L, -K)) and p["peak_height"] > 0.99


def test_accuracy_respects_loss_mask_and_matches_argmax():
    torch.manual_seed(0)
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, n_heads=2, max_len=48))
    batch = eval_batch(build_task("fixed_offset", m=M, K=2), (8, 16), 300, seed=1)
    expected = (model(batch.tokens, batch.lengths).argmax(-1) == batch.targets).double().mean().item()
    assert accuracy(model, batch, chunk=64) == pytest.approx(expected)

    perfect, _, _ = rope_head(2)
    batch = batch_at(20)
    batch.loss_mask[::2] = False
    batch.targets[::2] = (batch.targets[::2] + 1) % M  # wrong labels, masked out
    assert accuracy(perfect, batch) == 1.0


def test_mean_attention_is_chunk_invariant_and_wants_one_length():
    torch.manual_seed(0)
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, n_heads=2, max_len=48))
    batch = batch_at(16)
    whole = mean_attention(model, batch)
    np.testing.assert_allclose(mean_attention(model, batch, chunk=37), whole, rtol=1e-6, atol=1e-9)
    _, inter = model(batch.tokens, batch.lengths, return_intermediates=True)
    np.testing.assert_allclose(whole, inter.layers[0].pattern[:, :, 0].mean(0).double().detach().numpy(), atol=1e-6)
    with pytest.raises(ConfigError) as err:
        mean_attention(model, eval_batch(build_task("fixed_offset", m=M, K=2), (8, 16), 64, seed=0))
    assert err.value.field == "lengths"


def test_peak_and_attention_at_offset_on_a_row():
    row = np.array([0.1, 0.6, 0.2, 0.1])
    assert peak(row, 4) == dict(peak_offset=-2, peak_position=1, peak_height=0.6)
    assert peak(row[None], 4)["peak_position"] == 1  # a [1, L] row is accepted
    assert attention_at_offset(row, 4, -1) == pytest.approx(0.2)
    with pytest.raises(ConfigError):
        attention_at_offset(row, 4, -4)


def test_pinned_position_tells_ape_from_rope():
    ape = pinned_position({L: mean_attention(ape_head(P=5), batch_at(L))[0] for L in (20, 32, 48)},
                          train_max_len=16)
    assert ape["pinned"] and ape["position"] == 5 and ape["spread"] == 0 and ape["in_range"]
    assert not ape["relative"] and ape["offsets"] == {20: -14, 32: -26, 48: -42}
    model, _, _ = rope_head(K=3)
    rope = pinned_position({L: mean_attention(model, batch_at(L, 3))[0] for L in (20, 32, 48)},
                           train_max_len=16)
    assert not rope["pinned"] and rope["spread"] == 28 and not rope["in_range"]
    assert rope["relative"] and rope["offset"] == -3 and rope["positions"] == {20: 16, 32: 28, 48: 44}
    near = pinned_position({12: np.eye(12)[4], 20: np.eye(20)[6], 24: np.eye(24)[4]}, tolerance=2)
    assert near["pinned"] and near["spread"] == 2 and near["position"] == 4 and near["in_range"] is None


# ----------------------------------------------------------------------------- carrier

def test_carrier_energy_extremes():
    x = torch.randn(16)
    assert carrier_energy(x.expand(10, 16)) == pytest.approx(1.0)
    assert carrier_energy(torch.stack([x, -x] * 5)) == pytest.approx(0.0, abs=1e-12)
    assert carrier_energy(np.eye(4)) == pytest.approx(0.25)  # orthonormal rows: 1/N


def test_carrier_of_hand_built_head_is_one_and_matches_naive_on_a_random_head():
    model, _, _ = rope_head(2)
    c = carrier(model, batch_at(24))
    assert c["carrier_q"] == pytest.approx(1.0) and c["carrier_k"] == pytest.approx(1.0)

    torch.manual_seed(0)
    cfg = RetrievalHeadConfig(vocab_size=M, d_model=D, n_heads=2, encoding="learned", max_len=48)
    model = RetrievalHead(cfg)
    batch = eval_batch(build_task("fixed_offset", m=M, K=2), (8, 16), 200, seed=3)
    c = carrier(model, batch, chunk=64)
    with torch.no_grad():
        z = model.encoding.embed(model.W_E[batch.tokens], torch.arange(batch.tokens.shape[1]))  # [b, s, D]
        real = torch.arange(z.shape[1]) < batch.lengths[:, None]  # [b, s]
        last = z[torch.arange(len(z)), batch.lengths - 1]  # [b, D]
        for h in range(2):
            W_Q, W_K = model.W_Q[h * 16:(h + 1) * 16], model.W_K[h * 16:(h + 1) * 16]
            keys, queries = z[real] @ W_K.T, last @ W_Q.T
            assert c["carrier_k_heads"][h] == pytest.approx(carrier_energy(keys), rel=1e-5)
            assert c["carrier_q_heads"][h] == pytest.approx(carrier_energy(queries), rel=1e-5)
    assert c["carrier_k"] == c["carrier_k_heads"][0]
    assert carrier(model, batch, head=None)["carrier_q"] == pytest.approx(c["carrier_q_heads"].mean())


def test_untrained_carrier_baseline_is_small():
    torch.manual_seed(0)
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=20, d_model=64, max_len=48))
    c = carrier(model, eval_batch(build_task("fixed_offset", m=20, K=2), 48, 1024, seed=0))
    assert c["carrier_q"] < 0.2 and c["carrier_k"] < 0.2  # ~1/m for token-only keys


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("K", [2, 3])
def test_carrier_profile_equals_mean_logits_and_peaks_at_minus_K(layout, K):
    model, u, w = rope_head(K, layout=layout)
    L = 40
    batch = batch_at(L, K, n=32)
    offsets = np.arange(-(L - 1), 1)
    profile = carrier_profile(model, batch, offsets)
    assert offsets[profile.argmax()] == -K
    # independent formula: m_Q^T R_delta m_K with dense 2x2-block rotations
    naive = np.array([u @ naive_rotation(delta, D, layout) @ w for delta in offsets])
    np.testing.assert_allclose(profile, naive, rtol=1e-6)  # the encoding keeps theta in float32
    # and the logits the model actually computes, key t = L - 1 + delta
    _, inter = model(batch.tokens, batch.lengths, return_intermediates=True)
    mean_logits = inter.layers[0].attn_scores[:, 0, 0].mean(0).detach().numpy()
    np.testing.assert_allclose(profile / math.sqrt(D), mean_logits, rtol=1e-9, atol=1e-9)
    cosine = carrier_profile(model, batch, [-K, 0], normalize=True)
    assert cosine[0] == pytest.approx(1.0)


def test_carrier_profile_refuses_non_rotary_encodings():
    with pytest.raises(ConfigError) as err:
        carrier_profile(ape_head(P=3), batch_at(16), [-2])
    assert err.value.field == "encoding" and "rope" in err.value.allowed


# ----------------------------------------------------------------------------- dilution, margin

def test_dilution_fit_recovers_an_exact_law():
    lengths = [12, 16, 20, 24, 32, 40, 48]
    a_star = [1 / (0.05 * (L - 1) + 1.2) for L in lengths]
    fit = dilution_fit(lengths, a_star)
    assert fit["slope"] == pytest.approx(0.05) and fit["intercept"] == pytest.approx(1.2)
    assert fit["r2"] == pytest.approx(1.0)
    noisy = dilution_fit(lengths, [a * (1 + 0.05 * (-1) ** i) for i, a in enumerate(a_star)])
    assert 0 < noisy["r2"] < 1


@pytest.mark.parametrize("K", [2, 3])
def test_margin_of_hand_built_head_and_its_bound(K):
    energy, L = 300.0, 24
    model, _, _ = rope_head(K, energy=energy)
    batch = batch_at(L, K, n=64)
    # logit at offset delta is (energy / (d/2)) g(delta + K) / sqrt(d); competitors: every other delta
    others = np.array([delta + K for delta in range(-(L - 1), 1) if delta != -K])
    g = rotary_kernel(rotary_theta(model), np.concatenate([[0.0], others]))
    expected = energy / (D // 2) * (g[0] - g[1:].max()) / math.sqrt(D)
    mu = margin(model, batch, K)
    assert mu == pytest.approx(expected, rel=1e-6)  # the model's float32 theta vs float64 here
    assert margin(model, batch, K, reduce="none").shape == (64,)
    a_star = attention_at_offset(mean_attention(model, batch)[0], L, -K)
    assert margin_bound(mu, L) <= a_star < 1.0
    hot, _, _ = rope_head(K, energy=energy, temperature=2.0)
    assert margin(hot, batch, K) == pytest.approx(mu / 2, rel=1e-9)


def test_margin_per_sequence_matches_naive_on_mixed_lengths():
    torch.manual_seed(0)
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, n_heads=2, max_len=48))
    batch = eval_batch(build_task("fixed_offset", m=M, K=3), (8, 16), 100, seed=2)
    with torch.no_grad():
        _, inter = model(batch.tokens, batch.lengths, return_intermediates=True)
    scores = inter.layers[0].attn_scores[:, 1, 0].double()  # head 1, [b, s]
    naive, naive_mean = [], []
    for b, L in enumerate(batch.lengths.tolist()):
        row = scores[b, :L].tolist()
        target = row.pop(L - 1 - 3)
        naive.append(target - max(row))
        naive_mean.append(target - sum(row) / len(row))
    np.testing.assert_allclose(margin(model, batch, 3, head=1, reduce="none", chunk=16), naive, rtol=1e-12)
    np.testing.assert_allclose(margin(model, batch, 3, head=1, reduce="none", chunk=16, against="mean"), naive_mean,
                               rtol=1e-10)
    with pytest.raises(ConfigError, match="against"):
        margin(model, batch, 3, head=1, against="median")
    assert margin(model, batch, 3, head=1, reduce="min") == pytest.approx(min(naive))
    with pytest.raises(ConfigError):
        margin(model, batch, 3, head=2)


def test_profile_margin_is_the_mean_logit_lead_over_every_other_offset_and_refuses_mixed_lengths():
    torch.manual_seed(0)
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, n_heads=2, max_len=48))
    batch = eval_batch(build_task("fixed_offset", m=M, K=3), 24, 100, seed=2)
    with torch.no_grad():
        _, inter = model(batch.tokens, batch.lengths, return_intermediates=True)
    f = inter.layers[0].attn_scores[:, 1, 0].double().mean(0).tolist()  # head 1, mean logit per key, [24]
    target = f.pop(24 - 1 - 3)
    assert probes.profile_margin(model, batch, 3, head=1, chunk=16) == pytest.approx(target - max(f), rel=1e-10)
    # content averaged out first: never below the mean of the per-sequence max margins
    assert probes.profile_margin(model, batch, 3, head=1) >= margin(model, batch, 3, head=1) - 1e-12
    with pytest.raises(ConfigError, match="lengths"):
        probes.profile_margin(model, eval_batch(build_task("fixed_offset", m=M, K=3), (8, 16), 10, seed=2), 3)


def test_margin_bound_formula():
    assert margin_bound(0.0, 10) == pytest.approx(0.1)
    assert margin_bound(math.log(9), 10) == pytest.approx(0.5)
    np.testing.assert_allclose(margin_bound(np.array([0.0, 50.0]), 48), [1 / 48, 1 / (1 + 47 * math.exp(-50))])
    assert margin_bound(-1e4, 48) == 0.0


# ----------------------------------------------------------------------------- rank, kernel

def test_rank_concentration():
    model, _, _ = rope_head(2)
    assert rank_concentration(model) == pytest.approx(1.0)  # W = (u . w) e_0 e_0^T
    cfg = RetrievalHeadConfig(vocab_size=M, d_model=4, n_heads=2, max_len=48)
    model = RetrievalHead(cfg)
    with torch.no_grad():
        model.W_Q.copy_(torch.eye(4))
        model.W_K.copy_(torch.diag(torch.tensor([3.0, 1.0, 2.0, 0.0])))
    assert rank_concentration(model, head=0) == pytest.approx(0.9)  # sigma^2 = 9, 1
    assert rank_concentration(model, head=1) == pytest.approx(1.0)  # sigma^2 = 4, 0
    assert rank_concentration(model, head=None) == pytest.approx(0.95)


def test_rotary_kernel_and_ratio():
    theta = torch.tensor(10000.0) ** (-torch.arange(0, 64, 2) / 64)
    assert rotary_kernel(theta, 0) == pytest.approx(32.0)  # g(0) = d/2
    s = np.array([[1.0, 5.0], [17.0, 40.0]])
    naive = np.array([[sum(math.cos(x * t) for t in theta.tolist()) for x in row] for row in s])
    np.testing.assert_allclose(rotary_kernel(theta, s), naive, rtol=1e-12)
    # the paper's Fig. 4 range for d = 64 over bases 1e3 .. 1e5
    for base in (1e3, 1e4, 1e5):
        ratio = kernel_ratio(torch.tensor(base) ** (-torch.arange(0, 64, 2) / 64))
        assert 0.66 < ratio < 0.8
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=64, max_len=48))
    torch.testing.assert_close(rotary_theta(model), theta)
    with pytest.raises(ConfigError):
        kernel_ratio(theta, s_min=5, s_max=4)


@pytest.mark.parametrize("encoding", ["rope", "learned", "shaw"])
def test_fast_accuracy_and_attention_equal_the_direct_probes(encoding):
    torch.manual_seed(0)
    model = RetrievalHead(RetrievalHeadConfig(encoding=encoding, d_model=16, max_len=24))
    batch = eval_batch(build_task("fixed_offset", K=2), 20, 300, seed=1)
    acc, attn = probes.accuracy_and_attention(model, batch, chunk=128)
    assert acc == probes.accuracy(model, batch)
    np.testing.assert_allclose(attn, probes.mean_attention(model, batch), atol=1e-6)


# ----------------------------------------------------------------------------- pure functions of intermediates

def hand_built(q, k, scores, lengths, prefix=0) -> Intermediates:
    """Intermediates with the given q [b, h, i, d], k [b, h, s, d] and attn_scores [b, h, i, s]."""
    b, _, s, _ = k.shape
    z = torch.zeros(b, s, 1, dtype=torch.float64)
    layer = LayerIntermediates(attn_scores=scores, pattern=scores, q=q, k=k, rot_q=q, rot_k=k, v=k, resid_pre=z,
                               resid_post=z)
    return Intermediates(embed=z, positions=torch.arange(s), layers=[layer], lengths=lengths, prefix=prefix)


def test_projection_moments_and_carrier_energies_by_hand():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64).view(2, 1, 1, 2)  # one query row each
    k = torch.tensor([[1.0, 0.0]], dtype=torch.float64).expand(2, 1, 3, 2).clone()
    k[1, 0, 2] = 100.0  # sequence 1 has length 2: its third key is padding
    mom = probes.projection_moments(hand_built(q, k, torch.zeros(2, 1, 1, 3), torch.tensor([3, 2])))
    assert (mom.n_q, mom.n_k) == (2, 5)
    torch.testing.assert_close(mom.m_Q, torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(mom.m_K, torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    cq, ck = mom.carrier_energies()
    assert cq.tolist() == [0.5] and ck.tolist() == [1.0]
    # with BOS at index 0 the first key is not a token: it is left out of the key moments
    k_bos = k.clone()
    k_bos[:, 0, 0] = torch.tensor([0.0, 7.0], dtype=torch.float64)
    mom_bos = probes.projection_moments(hand_built(q, k_bos, torch.zeros(2, 1, 1, 3), torch.tensor([2, 1]), prefix=1))
    assert mom_bos.n_k == 3 and mom_bos.carrier_energies()[1].tolist() == [1.0]
    # chunks add up
    lengths = torch.tensor([3, 2])
    halves = [hand_built(q[i:i + 1], k[i:i + 1], torch.zeros(1, 1, 1, 3), lengths[i:i + 1]) for i in (0, 1)]
    added = probes.projection_moments(halves[0]) + probes.projection_moments(halves[1])
    for name in ("sum_q", "sq_q", "sum_k", "sq_k"):
        torch.testing.assert_close(getattr(added, name), getattr(mom, name))
    assert (added.n_q, added.n_k) == (mom.n_q, mom.n_k)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_carrier_profile_of_one_pair_is_a_cosine(layout):
    offsets = np.arange(-6, 1)
    e0, e1 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    theta = torch.tensor([0.7], dtype=torch.float64)
    np.testing.assert_allclose(probes.carrier_profile_of(e0, e0, theta, layout, offsets)[0], np.cos(0.7 * offsets),
                               atol=1e-12)
    np.testing.assert_allclose(probes.carrier_profile_of(e1, e0, theta, layout, offsets)[0], np.sin(0.7 * offsets),
                               atol=1e-12)
    cos = probes.carrier_cosine(3 * e0, 2 * e0, theta, layout, offsets)
    np.testing.assert_allclose(cos[0], np.cos(0.7 * offsets), atol=1e-12)
    two_heads = probes.carrier_profile_of(torch.stack([e0, e1]), torch.stack([e0, e0]), theta, layout, offsets)
    assert two_heads.shape == (2, len(offsets))


def test_margins_by_hand_with_padding_and_bos():
    scores = torch.tensor([[0.0, 5.0, 1.0, 2.0, 99.0], [4.0, 1.0, 3.0, 99.0, 99.0]], dtype=torch.float64)
    one_row = scores.view(2, 1, 1, 5)  # the head's single query row
    k = torch.zeros(2, 1, 5, 2, dtype=torch.float64)
    mu = probes.margins(hand_built(k[:, :, :1], k, one_row, torch.tensor([4, 3])), K=2)
    # L=4: target key 1 (5.0) against keys 0, 2, 3; L=3: target key 0 (4.0) against keys 1, 2
    assert mu[:, 0].tolist() == [3.0, 1.0]
    # full rows (a Transformer) with BOS: tokens at 1 .. L; BOS competes, padding does not
    full = torch.full((2, 1, 5, 5), -50.0, dtype=torch.float64)
    full[0, 0, 3] = torch.tensor([4.5, 1.0, 5.0, 0.0, 99.0])  # L=3: query at 3, target token 0 = key 1
    full[1, 0, 4] = torch.tensor([0.0, 1.0, 6.0, 2.0, 3.0])  # L=4: query at 4, target token 1 = key 2
    mu = probes.margins(hand_built(k, k, full, torch.tensor([3, 4]), prefix=1), K=2)
    assert mu[:, 0].tolist() == [1.0 - 5.0, 6.0 - 3.0]
    with pytest.raises(ConfigError) as err:
        probes.margins(hand_built(k, k, full, torch.tensor([3, 4]), prefix=1), K=3)
    assert err.value.field == "K"


def test_rank_concentrations_from_weights():
    W_Q = torch.eye(4)
    W_K = torch.diag(torch.tensor([3.0, 1.0, 2.0, 0.0]))
    np.testing.assert_allclose(probes.rank_concentrations(W_Q, W_K, n_heads=2), [0.9, 1.0])
    np.testing.assert_allclose(probes.rank_concentrations(W_Q, W_K, n_heads=1), [9 / 14])


def test_rotary_theta_comes_from_the_encoding():
    mope = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, encoding="mope", max_len=48))
    with torch.no_grad():
        mope.encoding.log_omega_scale.fill_(0.5)
    torch.testing.assert_close(rotary_theta(mope), mope.encoding.omega)
    scaled = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, encoding="rope_pi", max_len=48))
    torch.testing.assert_close(rotary_theta(scaled), scaled.encoding.inv_freq)
    with pytest.raises(ConfigError) as err:
        rotary_theta(RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, encoding="alibi", max_len=48)))
    assert err.value.field == "encoding" and "mope" in err.value.allowed and "rope_yarn" in err.value.allowed


@pytest.mark.parametrize("bos", [False, True])
def test_carrier_and_margin_of_a_transformer_match_naive(bos):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=M, d_model=D, n_layers=2, n_heads=4, max_len=24, bos=bos)
    model = Transformer(cfg).double()
    batch = eval_batch(build_task("shift", m=M, K=2), (4, 12), 40, seed=0)
    c = carrier(model, batch, chunk=16)
    inter = model.collect(batch)
    layer = inter.layers[0]
    last = batch.lengths - 1 + bos
    for h in range(4):
        queries = layer.q[torch.arange(40), h, last]  # [b, d]
        j = torch.arange(layer.k.shape[2])
        token = (j >= bos) & (j < (batch.lengths + bos)[:, None])  # real tokens, BOS left out
        keys = layer.k[:, h][token]  # [N, d]
        assert c["carrier_q_heads"][h] == pytest.approx(carrier_energy(queries), rel=1e-10)
        assert c["carrier_k_heads"][h] == pytest.approx(carrier_energy(keys), rel=1e-10)
    profile = carrier_profile(model, batch, np.arange(-3, 1), head=None, chunk=16)
    assert profile.shape == (4,)
    mu = margin(model, batch, 2, head=3, reduce="none", chunk=16)
    naive = []
    for b in range(40):
        row = layer.attn_scores[b, 3, int(last[b]), :int(last[b]) + 1].tolist()
        target = row.pop(int(last[b]) - 2)
        naive.append(target - max(row))
    np.testing.assert_allclose(mu, naive, rtol=1e-12)
