"""A checkpoint answers collect(batch) with poslab's intermediates, read through hooks on its own modules."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
import torch

from poslab.errors import ConfigError
from poslab.pretrained import load
from poslab.probes.leakage import leakage
from poslab.tasks.base import Batch

KINDS = ("llama", "mistral", "gpt_neox", "gptj", "gpt2")


def lm_batch(b=3, s=40, seed=0):
    tokens = torch.randint(0, 256, (b, s), generator=torch.Generator().manual_seed(seed))
    targets = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[:, -1] = False
    return Batch(tokens=tokens, targets=targets, loss_mask=mask, lengths=torch.full((b,), s))


@pytest.mark.parametrize("kind", KINDS)
def test_collect_matches_the_checkpoints_own_forward(tiny, kind):
    model = load(tiny(kind))
    batch = lm_batch()
    inter = model.collect(batch)
    assert len(inter.layers) == model.n_layers
    torch.testing.assert_close(inter.logits, model(batch.tokens), rtol=1e-5, atol=1e-5)  # sdpa vs recorded eager
    b, s = batch.tokens.shape
    for layer in inter.layers:
        assert layer.attn_scores.shape == layer.pattern.shape == (b, model.n_heads, s, s)
        assert layer.q.shape == layer.rot_k.shape == (b, model.n_heads, s, model.d_head)
        torch.testing.assert_close(layer.pattern.sum(-1), torch.ones(b, model.n_heads, s))
        future = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
        assert float(layer.pattern[..., future].abs().max()) == 0.0  # causal
    # the residual stream: each layer's output is the next layer's input
    for a, c in zip(inter.layers, inter.layers[1:], strict=False):
        assert torch.equal(a.resid_post, c.resid_pre)


def test_sliding_window_is_the_checkpoints_own(tiny):
    model = load(tiny("mistral"))
    assert model.window == 16
    pattern = model.collect(lm_batch()).layers[0].pattern
    i, j = torch.meshgrid(torch.arange(40), torch.arange(40), indexing="ij")
    assert float(pattern[..., (i - j) >= 16].abs().max()) == 0.0
    assert float(pattern[..., (i - j) == 15].min()) > 0.0


def test_queries_before_rotation_are_the_projection(tiny):
    model = load(tiny("llama"))
    batch = lm_batch()
    seen = {}
    attn = model.layers[1].self_attn
    handle = attn.q_proj.register_forward_hook(lambda m, a, out: seen.setdefault("q", out))
    try:
        inter = model.collect(batch)
    finally:
        handle.remove()
    q = seen["q"].view(3, 40, model.n_heads, model.d_head).transpose(1, 2)
    torch.testing.assert_close(inter.layers[1].q, q, rtol=1e-5, atol=1e-5)
    assert float((inter.layers[1].rot_q - q)[:, :, 1:].abs().max()) > 1e-3  # positions > 0 are rotated


def test_gpt2_keeps_its_projection_and_refuses_a_schedule(tiny):
    model = load(tiny("gpt2"))
    assert model.encoding == "learned"
    inter = model.collect(lm_batch())
    assert torch.equal(inter.layers[0].q, inter.layers[0].rot_q)
    with pytest.raises(ConfigError, match="rotary position embedding"):
        model.set_schedule({"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ConfigError, match="learned position table"):
        model.check_length(65)


def test_existing_leakage_probe_runs_unchanged(tiny):
    model = load(tiny("llama"))
    out = leakage(model, lm_batch(b=4, s=24), early=8)
    assert out["received_0"].shape == out["sink"].shape == (model.n_layers, model.n_heads)
    # causal mask: query 0 attends only to key 0, so key 0 receives everything there
    assert bool((out["received"][..., 0] > 0).all())


def test_length_whose_attention_cannot_fit_is_refused(tiny):
    model = load(tiny("llama"))
    with pytest.raises(ConfigError, match="GiB"):
        model.check_length(10**6)  # a 10^12-byte mask
    model.check_length(16384)  # the fused forward holds no L x L scores
    with pytest.raises(ConfigError, match="collect"):
        model.check_length(2**15, intermediates=True)  # 2 layers x 4 heads x 2 x 4 bytes x 2^30 = 64 GiB


@pytest.mark.parametrize("kind", ("llama", "gpt2"))
def test_bos_embedding_intervention_equals_that_token_at_position_0(tiny, kind):
    from poslab.models.intervention import Intervention

    model = load(tiny(kind))
    batch = lm_batch()
    swapped = batch.tokens.clone()
    swapped[:, 0] = 7
    other = Batch(tokens=swapped, targets=batch.targets, loss_mask=batch.loss_mask, lengths=batch.lengths)
    x0 = model.hf.get_input_embeddings().weight[7].detach()
    got = model.collect(batch, intervention=Intervention(bos_embedding=x0))
    want = model.collect(other)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    assert float((got.logits - model.collect(batch).logits).abs().max()) > 1e-4  # it did change something
    torch.testing.assert_close(model.collect(batch).logits, model(batch.tokens), rtol=1e-5, atol=1e-5)  # hook gone


def test_pretrained_intervention_takes_bos_embedding_only(tiny):
    from poslab.models.intervention import Intervention

    model = load(tiny("llama"))
    with pytest.raises(ConfigError, match="intervention.resid0"):
        model.collect(lm_batch(), intervention=Intervention(resid0=torch.zeros(model.d_model)))
    with pytest.raises(ConfigError, match="intervention.bos_embedding"):
        model.collect(lm_batch(), intervention=Intervention(bos_embedding=torch.zeros(model.d_model + 1)))


def test_inference_window_masks_far_keys_and_is_undone(tiny):
    model = load(tiny("llama"))
    batch = lm_batch()
    plain = model.collect(batch).layers[0].pattern
    model.set_window(8)
    assert model.cfg.window == 8
    pattern = model.collect(batch).layers[0].pattern
    i, j = torch.meshgrid(torch.arange(40), torch.arange(40), indexing="ij")
    assert float(pattern[..., (i - j) >= 8].abs().max()) == 0.0
    assert float(pattern[..., ((i - j) < 8) & (i >= j)].min()) > 0.0
    torch.testing.assert_close(pattern[..., :8, :], plain[..., :8, :])  # queries inside the window: unchanged
    model.set_window(None)
    assert model.cfg.window is None
    torch.testing.assert_close(model.collect(batch).layers[0].pattern, plain)
    with pytest.raises(ConfigError, match="window"):
        model.set_window(0)


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_token_losses_equal_the_full_forward(tiny, kind):
    model = load(tiny(kind))
    tokens = lm_batch(b=2, s=50).tokens
    full = torch.nn.functional.cross_entropy(model(tokens)[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(),
                                             reduction="none").view(2, -1)
    for chunk in (7, 49, 1024):  # uneven, exact and larger than the window
        torch.testing.assert_close(model.token_losses(tokens, chunk=chunk), full, rtol=1e-5, atol=1e-5)


def test_bench_pretrained_times_both_paths_side_by_side(tiny):
    from poslab.bench import bench_pretrained

    lines = []
    (row,) = bench_pretrained(model=str(tiny("llama")), lengths=(48,), threads=1, echo=lines.append)
    assert row["forward_s"] > 0 and row["losses_s"] > 0 and row["ratio"] == pytest.approx(
        row["losses_s"] / row["forward_s"])
    assert "x the forward's time" in lines[0]
    with pytest.raises(ConfigError, match="--lengths"):
        bench_pretrained(model=str(tiny("llama")), lengths=(10**9,), echo=lines.append)
