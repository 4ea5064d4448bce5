"""The field's encodings (issue 38): each against an independent naive formula written here with
plain loops over i and j, the property that makes it relative, and its refusals.

xPos, KERPLE (log, power), Sandwich, FIRE, CoPE, the dynamic position bias, the forget gate
(data-dependent ALiBi), p-RoPE at both limits, Resonance RoPE (alone and after YaRN), partial
rotary in both conventions, and randomized positions on the Transformer."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from poslab.attention import attention
from poslab.errors import ConfigError
from poslab.models.random_positions import RandomPositions, random_positions
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.positional import build_encoding
from poslab.positional.rope_scaling import rope_frequencies

H, DH, D = 2, 8, 16
GEOM = dict(d_model=D, n_heads=H, d_head=DH, max_len=64)


def build(name, seed=0, **options):
    torch.manual_seed(seed)
    enc = build_encoding(name, **GEOM, **options)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return enc


def scores(enc, q, k, q_pos, k_pos, stream=None):
    """The attention logits attention() computes (explicit path), detached."""
    v = torch.zeros_like(k)
    return attention(q, k, v, enc, q_pos, k_pos, need_weights=True, stream=stream).attn_scores.detach()


def content(q, k, b, h, i, j):
    return float(q[b, h, i] @ k[b, h, j]) / math.sqrt(q.shape[-1])


def data(s_q=5, s_k=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, H, s_q, DH, generator=g), torch.randn(2, H, s_k, DH, generator=g)


def pairs(x):
    """Channel pairs (2p, 2p+1) of a vector as complex numbers (the interleaved layout)."""
    return [complex(float(x[2 * p]), float(x[2 * p + 1])) for p in range(len(x) // 2)]


# ----------------------------------------------------------------------------- xPos

def test_xpos_against_the_formula():
    enc = build("xpos", scale_base=16.0)
    q, k = data()
    q_pos, k_pos = torch.tensor([3, 4, 5, 6, 7]), torch.arange(7)
    got = scores(enc, q, k, q_pos, k_pos)
    for b in range(2):
        for h in range(H):
            for i in range(5):
                for j in range(7):
                    n, m, total = int(q_pos[i]), int(k_pos[j]), 0.0
                    for p, (zq, zk) in enumerate(zip(pairs(q[b, h, i]), pairs(k[b, h, j]), strict=True)):
                        theta = 10000.0 ** (-2 * p / DH)
                        zeta = (2 * p / DH + 0.4) / 1.4
                        rq = zq * complex(math.cos(n * theta), math.sin(n * theta)) * zeta ** (n / 16.0)
                        rk = zk * complex(math.cos(m * theta), math.sin(m * theta)) * zeta ** (-m / 16.0)
                        total += (rq * rk.conjugate()).real
                    assert got[b, h, i, j] == pytest.approx(total / math.sqrt(DH), rel=1e-4, abs=1e-4)


def test_xpos_depends_on_the_offset_only_and_decays():
    enc = build("xpos", scale_base=8.0)
    q = torch.randn(1, 1, 1, DH).expand(1, 1, 4, DH)
    k = q.clone()
    got = scores(enc, q, k, torch.tensor([10, 20, 30, 40]), torch.tensor([10, 20, 30, 40]))[0, 0]
    torch.testing.assert_close(got.diagonal(), got.diagonal()[:1].expand(4))  # offset 0 everywhere
    torch.testing.assert_close(got.diagonal(-1), got.diagonal(-1)[:1].expand(3), rtol=1e-4, atol=1e-4)
    # the same vector against itself at a growing distance: the logit shrinks (|zeta| < 1)
    far = scores(enc, q[:, :, :1], k[:, :, :1], torch.tensor([200]), torch.tensor([0]))
    assert far.abs().item() < got[0, 0].abs().item()


def test_causal_only_encodings_refuse_a_bidirectional_transformer():
    for name in ("xpos", "fire", "cope", "fox"):
        with pytest.raises(ConfigError) as err:
            TransformerConfig(vocab_size=5, encoding=name, causal=False)
        assert err.value.field == "causal" and name in err.value.allowed
    TransformerConfig(vocab_size=5, encoding="kerple_log", causal=False)  # a symmetric bias is fine


# ----------------------------------------------------------------------------- KERPLE, Sandwich, FIRE, DPB

@pytest.mark.parametrize("form", ["log", "power"])
def test_kerple_against_the_formula(form):
    enc = build(f"kerple_{form}")
    r1 = enc.log_r1.detach().exp().tolist()
    r2 = (enc.raw_r2.detach().exp() if form == "log" else 2 / (1 + torch.exp(-enc.raw_r2.detach()))).tolist()
    q, k = data()
    q_pos, k_pos = torch.tensor([2, 3, 4, 5, 6.5]), torch.arange(7)
    got = scores(enc, q, k, q_pos, k_pos)
    for b in range(2):
        for h in range(H):
            for i in range(5):
                for j in range(7):
                    n = abs(float(q_pos[i]) - float(k_pos[j]))
                    bias = -r1[h] * math.log(1 + r2[h] * n) if form == "log" else -r1[h] * n ** r2[h]
                    assert got[b, h, i, j] == pytest.approx(content(q, k, b, h, i, j) + bias, rel=1e-4, abs=1e-4)
    assert all(0 < v <= 2 for v in r2) or form == "log"


def test_sandwich_against_the_inner_product_of_sinusoids():
    enc = build("sandwich", d_sandwich=16)
    q, k = data()
    q_pos, k_pos = torch.tensor([2, 3, 4, 5, 6]), torch.arange(7)
    got = scores(enc, q, k, q_pos, k_pos)

    def p(t):  # Vaswani et al.'s sinusoid of position t in d' = 16 dimensions
        out = []
        for c in range(8):
            w = 10000.0 ** (-2 * c / 16)
            out += [math.sin(t * w), math.cos(t * w)]
        return out

    for b in range(2):
        for h in range(H):
            ratio = 8 * (h + 1) / H
            for i in range(5):
                for j in range(7):
                    inner = sum(a * c for a, c in zip(p(int(q_pos[i])), p(int(k_pos[j])), strict=True))
                    expected = content(q, k, b, h, i, j) + (inner - 8) / ratio
                    assert got[b, h, i, j] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    assert got.shape == (2, H, 5, 7)


def test_fire_against_the_formula():
    enc = build("fire", mlp_width=4, L_init=5.0)
    c, L = enc.log_c.exp().item(), enc.log_L.exp().item()
    W1, b1 = enc.hidden.weight.detach()[:, 0].tolist(), enc.hidden.bias.detach().tolist()
    W2, b2 = enc.out.weight.detach().tolist(), enc.out.bias.detach().tolist()
    q, k = data(s_q=8, s_k=8)
    pos = torch.arange(8)
    got = scores(enc, q, k, pos, pos)
    psi = lambda x: math.log(c * x + 1)  # noqa: E731
    for b in range(2):
        for h in range(H):
            for i in range(8):
                for j in range(i + 1):  # causal: the keys a query sees
                    x = psi(i - j) / psi(max(L, i))
                    hidden = [max(0.0, W1[u] * x + b1[u]) for u in range(4)]
                    bias = sum(W2[h][u] * hidden[u] for u in range(4)) + b2[h]
                    assert got[b, h, i, j] == pytest.approx(content(q, k, b, h, i, j) + bias, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("log_distance", [False, True])
def test_dynamic_position_bias_against_the_formula(log_distance):
    enc = build("dynamic_position_bias", mlp_width=3, depth=3, log_distance=log_distance)
    layers = [m for m in enc.mlp if isinstance(m, torch.nn.Linear)]
    Ws = [(m.weight.detach().tolist(), m.bias.detach().tolist()) for m in layers]
    q, k = data()
    q_pos, k_pos = torch.tensor([2, 3, 4, 5, 6]), torch.arange(7)
    got = scores(enc, q, k, q_pos, k_pos)
    silu = lambda v: v / (1 + math.exp(-v))  # noqa: E731
    for b in range(2):
        for h in range(H):
            for i in range(5):
                for j in range(7):
                    n = float(q_pos[i] - k_pos[j])
                    u = math.copysign(math.log(abs(n) + 1), n) if log_distance else n
                    a = [u]
                    for layer, (W, bias) in enumerate(Ws):
                        a = [sum(W[o][c] * a[c] for c in range(len(a))) + bias[o] for o in range(len(bias))]
                        if layer < len(Ws) - 1:
                            a = [silu(v) for v in a]
                    assert got[b, h, i, j] == pytest.approx(content(q, k, b, h, i, j) + a[h], rel=1e-4, abs=1e-4)


# ----------------------------------------------------------------------------- CoPE, forget gate

def test_cope_against_the_formula():
    enc = build("cope", npos_max=4)
    e = enc.pos_emb.detach()
    q, k = data(s_q=6, s_k=6)
    pos = torch.arange(6)
    got = scores(enc, q, k, pos, pos)
    for b in range(2):
        for h in range(H):
            for i in range(6):
                for j in range(i + 1):
                    p = sum(1 / (1 + math.exp(-float(q[b, h, i] @ k[b, h, t]))) for t in range(j, i + 1))
                    p = min(p, 3.0)
                    lo, hi = math.floor(p), math.ceil(p)
                    term = (p - lo) * float(q[b, h, i] @ e[hi]) + (1 - (p - lo)) * float(q[b, h, i] @ e[lo])
                    assert got[b, h, i, j] == pytest.approx(content(q, k, b, h, i, j) + term, rel=1e-4, abs=1e-4)


def test_forget_gate_against_the_formula_and_alibi():
    enc = build("fox")
    W, b_f = enc.W_f.detach(), enc.b_f.detach()
    q, k = data(s_q=6, s_k=6)
    x = torch.randn(2, 6, D)
    pos = torch.arange(6)
    got = scores(enc, q, k, pos, pos, stream=x)
    for b in range(2):
        for h in range(H):
            for i in range(6):
                for j in range(i + 1):
                    bias = sum(math.log(1 / (1 + math.exp(-(float(W[h] @ x[b, t]) + float(b_f[h])))))
                               for t in range(j + 1, i + 1))
                    assert got[b, h, i, j] == pytest.approx(content(q, k, b, h, i, j) + bias, rel=1e-4, abs=1e-4)
    # a constant gate f = e^{-m} is ALiBi's -m (i - j)
    with torch.no_grad():
        enc.W_f.zero_()
        enc.b_f.fill_(-math.log(math.expm1(0.5)))  # sigmoid(b) = e^{-0.5}
    alibi = build_encoding("alibi", **GEOM, slope=0.5)
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    torch.testing.assert_close(scores(enc, q, k, pos, pos, stream=x)[..., causal],
                               scores(alibi, q, k, pos, pos)[..., causal], rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError):  # no stream: refused, not guessed
        enc.score_bias(q, k, pos, pos)


def test_contextual_encodings_train_and_evaluate_the_retrieval_head():
    from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
    from poslab.tasks import build_task, eval_batch

    task = build_task("fixed_offset", K=2, m=6)
    for name in ("cope", "fox"):
        torch.manual_seed(0)
        head = RetrievalHead(RetrievalHeadConfig(vocab_size=6, d_model=16, encoding=name, max_len=16))
        batch = eval_batch(task, 10, 8, 0)
        fast = head.forward_table(batch.tokens, batch.lengths)  # falls back to the direct forward
        torch.testing.assert_close(fast, head(batch.tokens, batch.lengths))
        head.loss(batch).backward()
        assert all(p.grad is not None for p in head.encoding.parameters())


# ----------------------------------------------------------------------------- RoPE variants

def test_p_rope_limits_are_nope_and_rope_exactly():
    q, k = data(s_q=7, s_k=7)
    pos = torch.arange(7)
    p0 = build("p_rope", rotary_fraction=0.0)
    p1 = build("p_rope", rotary_fraction=1.0)
    assert torch.equal(scores(p0, q, k, pos, pos), scores(build("nope"), q, k, pos, pos))
    assert torch.equal(scores(p1, q, k, pos, pos), scores(build("rope"), q, k, pos, pos))


def test_p_rope_zeroes_the_lowest_frequencies():
    theta = build("p_rope", rotary_fraction=0.5).rotary_frequencies()
    expected = [10000.0 ** (-2 * i / DH) if i < 2 else 0.0 for i in range(DH // 2)]  # floor(0.5 * 8 / 2) = 2
    torch.testing.assert_close(theta, torch.tensor(expected))


def test_partial_rotary_conventions():
    neox = build("rope_partial", rotary_fraction=0.5).rotary_frequencies()  # over the rotated width r = 4
    full = build("rope_partial_full", rotary_fraction=0.5).rotary_frequencies()  # over d = 8
    torch.testing.assert_close(neox, torch.tensor([1.0, 10000.0 ** (-2 / 4)]))
    torch.testing.assert_close(full, torch.tensor([1.0, 10000.0 ** (-2 / 8), 0.0, 0.0]))
    # in the interleaved layout both leave channels 4.. unrotated
    q, k = data()
    for enc in (build("rope_partial", rotary_fraction=0.5), build("rope_partial_full", rotary_fraction=0.5)):
        rq, _ = enc.rotate_qk(q, k, torch.arange(5) + 3, torch.arange(7))
        assert torch.equal(rq[..., 4:], q[..., 4:])


@pytest.mark.parametrize("scaling", [{}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}])
def test_resonance_rounds_every_wavelength(scaling):
    plain, _ = rope_frequencies(DH * 4, 10000.0, scaling or None)
    got, _ = rope_frequencies(DH * 4, 10000.0, {**scaling, "resonance": True})
    for t, r in zip(plain.tolist(), got.tolist(), strict=True):
        assert r == pytest.approx(2 * math.pi / round(2 * math.pi / t), rel=1e-6)
        assert (2 * math.pi / r) == pytest.approx(round(2 * math.pi / r), rel=1e-6)  # an integer wavelength
    enc = build("rope_resonance_yarn")
    assert enc.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)  # YaRN's factor kept


def test_bad_rope_variant_options():
    with pytest.raises(ConfigError) as err:
        build_encoding("rope", **GEOM, scaling={"resonance": "yes"})
    assert err.value.field == "rope_scaling.resonance"
    with pytest.raises(ConfigError) as err:
        build_encoding("p_rope", **GEOM, rotary_fraction=1.5)
    assert err.value.field == "rotary_fraction" and "[0, 1]" in err.value.allowed
    with pytest.raises(ConfigError) as err:
        build_encoding("rope", **GEOM, rotary_fraction=0.0)
    assert err.value.field == "rotary_fraction"


@pytest.mark.parametrize("name, options, field", [
    ("kerple_power", {"r2_init": 2.5}, "r2_init"), ("kerple_log", {"form": "exp"}, "form"),
    ("sandwich", {"d_sandwich": 7}, "d_sandwich"), ("fire", {"L_init": -1.0}, "L_init"),
    ("cope", {"npos_max": 0}, "npos_max"), ("dynamic_position_bias", {"depth": 1}, "depth"),
    ("xpos", {"scale_base": 0}, "scale_base"), ("fox", {"bias_init": float("nan")}, "bias_init"),
])
def test_bad_options_name_the_field(name, options, field):
    with pytest.raises(ConfigError) as err:
        build_encoding(name, **GEOM, **options)
    assert err.value.field == field


# ----------------------------------------------------------------------------- randomized positions

def test_random_positions_are_sorted_distinct_and_in_range():
    torch.manual_seed(0)
    pos = random_positions(64, 10, 40)
    assert pos.shape == (64, 10) and int(pos.max()) < 40 and int(pos.min()) >= 0
    assert bool((pos[:, 1:] > pos[:, :-1]).all())  # sorted, without replacement
    assert len(set(pos[:, 0].tolist())) > 1  # a sample, not 0 .. s - 1
    assert random_positions(2, 40, 40).tolist() == [list(range(40))] * 2  # s = N: every position
    with pytest.raises(ConfigError, match=r"model.random_positions.*40.*at least the 41 tokens"):
        random_positions(2, 41, 40)  # more tokens than positions: it used to return 40 columns for 41


def test_a_draw_per_length_gives_each_sequence_a_uniform_subset_whatever_the_padding():
    lengths = torch.tensor([2, 7, 41, 1])
    torch.manual_seed(3)
    padded = random_positions(4, 41, 256, lengths=lengths)
    torch.manual_seed(3)
    cut = random_positions(4, 7, 256, lengths=lengths.clamp(max=7))
    torch.manual_seed(3)
    width = random_positions(4, 41, 256)  # the same keys, drawn for the padded width
    assert padded.shape == (4, 41) and int(padded.min()) >= 0 and int(padded.max()) < 256
    for i, n in enumerate(lengths.tolist()):
        real = padded[i, :n]
        assert bool((real[1:] > real[:-1]).all()) and len(set(padded[i].tolist())) == 41  # sorted, distinct
        if n <= 7:  # the batch cut to its longest real sequence: the same positions
            assert real.tolist() == cut[i, :n].tolist()
        assert sorted(padded[i].tolist()) == sorted(width[i].tolist())  # the same 41 keys, reordered
    assert padded[2].tolist() == width[2].tolist()  # a sequence as wide as the batch: the width draw
    # a 2-token sequence padded to 41: its last position is the larger of 2 of [0, 256) (mean 2 x 257 / 3 - 1 =
    # 170.3), not the 2nd smallest of 41 (mean 2 x 257 / 42 - 1 = 11.2)
    torch.manual_seed(0)
    two = torch.full((4096,), 2)
    own = random_positions(4096, 41, 256, lengths=two)[:, 1].double().mean()
    torch.manual_seed(0)
    wide = random_positions(4096, 41, 256)[:, 1].double().mean()
    assert abs(own - 170.3) < 3 and abs(wide - 11.2) < 1


def test_the_draw_is_a_named_setting_recorded_only_off_its_default():
    from poslab.experiments.experiment import model_fields
    from poslab.models.random_positions import RandomPositions, from_recorded

    with pytest.raises(ConfigError) as err:
        RandomPositions(N=64, draw="padded")
    assert err.value.field == "random_positions.draw" and "allowed: width, length" in str(err.value)
    for draw in ("width", "length"):
        ext = RandomPositions.setting({"N": 64, "draw": draw})
        assert from_recorded(ext.record()) == ext
        fields = model_fields(TransformerConfig(vocab_size=5, d_model=8, n_layers=1, n_heads=2, random_positions=ext))
        assert ("random_positions_draw" in fields) == (draw == "length")  # every earlier run key stays its run's


def test_a_per_length_draw_follows_at_eval_in_the_loss_too():
    """The loss draws per-length positions where the forward would draw any (training, or evaluation with
    at_eval): with at_eval False an evaluated loss reads 0 .. s - 1, whatever the generator holds."""
    from poslab.tasks import build_task
    from poslab.train import DataStream, TrainConfig

    task = build_task("even_pairs")
    batch = DataStream(task, 0, TrainConfig(batch_size=4, min_length=3, max_length=9, chunk=1)).draw().map(
        lambda x: x[0])
    model = Transformer(TransformerConfig(vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                          max_len=64, causal=False,
                                          random_positions=dict(N=64, draw="length", at_eval=False))).eval()
    losses = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        losses.append(float(model.loss(batch)))
    plain = dataclasses.replace(batch, positions=torch.arange(batch.tokens.shape[1]))
    assert losses[0] == losses[1] == float(model.loss(plain))
    model.train()
    drawn = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        drawn.append(float(model.loss(batch)))
    assert drawn[0] != drawn[1]  # training draws


def test_transformer_samples_positions_in_training_and_as_configured_at_evaluation():
    cfg = dict(vocab_size=7, d_model=16, n_layers=1, n_heads=2, encoding="learned", max_len=64)
    tokens = torch.randint(7, (2, 8))
    for at_eval in (True, False):
        torch.manual_seed(0)
        model = Transformer(TransformerConfig(**cfg, random_positions=RandomPositions(N=64, at_eval=at_eval))).eval()
        torch.manual_seed(0)
        plain = Transformer(TransformerConfig(**cfg))
        torch.manual_seed(1)
        sampled = model.embed(tokens)[1]
        assert sampled.shape == ((2, 8) if at_eval else (8,))
        torch.testing.assert_close(model(tokens), plain(tokens)) if not at_eval else None
        model.train()
        assert model.embed(tokens)[1].shape == (2, 8)


def test_random_positions_must_exceed_every_length():
    model = Transformer(TransformerConfig(vocab_size=7, d_model=16, n_layers=1, encoding="rope", max_len=64,
                                          random_positions=32))
    model.check_length(31)
    with pytest.raises(ConfigError) as err:
        model.check_length(32)
    assert err.value.field == "random_positions" and "> 32" in err.value.allowed
    learned = Transformer(TransformerConfig(vocab_size=7, d_model=16, n_layers=1, encoding="learned", max_len=16,
                                            random_positions=32))
    with pytest.raises(ConfigError):  # N positions do not fit the learned table
        learned.check_length(8)
    with pytest.raises(ConfigError):
        TransformerConfig(vocab_size=7, random_positions=0)


def test_random_positions_train_under_the_ensemble_vmap():
    from poslab.tasks import build_task
    from poslab.train import TrainConfig, train_ensemble

    task = build_task("shift", m=8, K=1)
    cfg = TransformerConfig(vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2, encoding="rope",
                            max_len=64, random_positions=48)
    result = train_ensemble(lambda: Transformer(cfg), [task, task], [0, 1],
                            TrainConfig(steps=3, batch_size=4, min_length=8, max_length=8, chunk=3), progress=False)
    assert result.loss_curve.shape == (3, 2) and all(d is None for d in result.diverged_at)
