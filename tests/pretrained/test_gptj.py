"""GPT-J's interleaved rotary layout (pairs (2i, 2i + 1), ``rotary_dim`` of the head, the module
handing (sin, cos) of r/2 channels): poslab's rotary against the model's own, the loss under the
identity schedule, and collect against an eager forward's output_attentions and projections."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
from transformers.models.gptj.modeling_gptj import GPTJRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

from poslab.pretrained import PoslabRotary, load  # noqa: E402
from poslab.pretrained.model import rotate_every_two, unrotate  # noqa: E402
from poslab.pretrained.table import entry_from_config  # noqa: E402
from poslab.tasks.base import Batch  # noqa: E402

HEAD, ROTARY, CONTEXT = 32, 16, 512  # head 32, rotary_dim 16: partial 0.5


def gptj_rotary() -> GPTJRotaryEmbedding:
    config = transformers.GPTJConfig(n_embd=4 * HEAD, n_head=4, n_layer=1, rotary_dim=ROTARY, n_positions=CONTEXT,
                                     vocab_size=256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GPTJRotaryEmbedding(config)


def gptj_inv_freq() -> torch.Tensor:
    """GPT-J's frequencies exactly as its table is built (float32 arithmetic, modeling_gptj)."""
    return 1.0 / (10000 ** (torch.arange(0, ROTARY, 2, dtype=torch.int64) / ROTARY))


def ulps(a, b):
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max())


@pytest.mark.parametrize("length", [200, CONTEXT])
def test_sin_cos_equal_the_models_own_table(length):
    theirs = gptj_rotary()
    ours = PoslabRotary(HEAD, 10000.0, {"partial_rotary_factor": ROTARY / HEAD}, max_position_embeddings=CONTEXT,
                        layout="interleaved")
    pos = torch.arange(length)[None]
    x = torch.zeros(1)
    sin, cos = theirs(x, pos)
    our_sin, our_cos = ours(x, pos)
    assert our_sin.shape == sin.shape == (1, length, ROTARY // 2)  # one angle per pair, GPT-J's (sin, cos)
    assert ulps(ours.frequencies(), gptj_inv_freq()) <= 2
    angle_err = length * 2.4e-7 + 1e-6  # theta_0 = 1: the largest angle rounding
    torch.testing.assert_close(our_sin, sin, rtol=0, atol=angle_err)
    torch.testing.assert_close(our_cos, cos, rtol=0, atol=angle_err)
    # the assembly is the model's, bit for bit: given GPT-J's frequencies, GPT-J's table
    ours.inv_freq = gptj_inv_freq()
    s2, c2 = ours(x, pos)
    assert torch.equal(s2, sin) and torch.equal(c2, cos)


def test_unrotate_inverts_gptjs_own_rotation():
    sin, cos = gptj_rotary()(torch.zeros(1), torch.arange(40)[None])
    x = torch.randn(2, 40, 4, ROTARY, generator=torch.Generator().manual_seed(0))  # [b, s, h, r], GPT-J's order
    rot = apply_rotary_pos_emb(x, sin, cos).transpose(1, 2)  # [b, h, s, r]
    torch.testing.assert_close(unrotate(rot, (sin, cos), 1.0, "interleaved"), x.transpose(1, 2), rtol=1e-5, atol=1e-5)
    v = torch.arange(6.0)
    assert rotate_every_two(v).tolist() == [-1.0, 0.0, -3.0, 2.0, -5.0, 4.0]


def test_config_reads_as_partial_rotary(tiny):
    model = load(tiny("gptj"))
    assert model.encoding == "rotary" and model.layout == "interleaved"
    assert model.own_scaling() == {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}  # rotary_dim 8 of head 16
    torch.testing.assert_close(model.rotary_frequencies(), torch.tensor([1.0, 0.1, 0.01, 0.001]), rtol=1e-6, atol=0)
    entry = entry_from_config(model.config.to_dict())
    assert entry["encoding"] == "rope" and entry["partial_rotary_factor"] == 0.5 and entry["context"] == 64


def test_identity_schedule_keeps_the_loss(tiny):
    model = load(tiny("gptj"))
    tokens = torch.randint(0, 256, (2, 60), generator=torch.Generator().manual_seed(2))
    own = model.token_losses(tokens)
    model.set_schedule(None)  # the checkpoint's own schedule, computed by poslab
    torch.testing.assert_close(model.token_losses(tokens), own, rtol=1e-6, atol=1e-6)
    model.set_schedule({"rope_type": "linear", "factor": 2.0})
    assert float((model.token_losses(tokens) - own).abs().max()) > 1e-4  # a schedule reaches the attention
    model.restore()
    assert torch.equal(model.token_losses(tokens), own)


def test_own_table_length_is_checked_and_poslab_rotary_goes_past_it(tiny):
    from poslab.errors import ConfigError

    model = load(tiny("gptj"))
    with pytest.raises(ConfigError, match="sin/cos table"):
        model.check_length(65)
    model.set_schedule(None)
    model.check_length(65)
    tokens = torch.randint(0, 256, (1, 100), generator=torch.Generator().manual_seed(3))
    assert torch.isfinite(model.token_losses(tokens)).all()


def test_collect_equals_an_eager_forward(tiny):
    model = load(tiny("gptj"))
    b, s = 2, 40
    tokens = torch.randint(0, 256, (b, s), generator=torch.Generator().manual_seed(0))
    batch = Batch(tokens=tokens, targets=tokens, loss_mask=torch.ones_like(tokens, dtype=torch.bool),
                  lengths=torch.full((b,), s))
    seen: dict[int, torch.Tensor] = {}
    attn = model.layers[1].attn
    handle = attn.q_proj.register_forward_hook(lambda m, a, out: seen.setdefault(0, out))
    try:
        inter = model.collect(batch)
    finally:
        handle.remove()
    model.hf.set_attn_implementation("eager")
    with torch.no_grad():
        out = model.hf(input_ids=tokens, output_attentions=True)
    torch.testing.assert_close(inter.logits, out.logits, rtol=1e-5, atol=1e-5)
    for layer, want in zip(inter.layers, out.attentions, strict=True):
        torch.testing.assert_close(layer.pattern, want, rtol=1e-5, atol=1e-6)
        scores = layer.rot_q @ layer.rot_k.transpose(-1, -2) * model.d_head ** -0.5
        torch.testing.assert_close(layer.attn_scores, scores, rtol=1e-5, atol=1e-5)
    q = seen[0].view(b, s, model.n_heads, model.d_head).transpose(1, 2)  # before rotation
    torch.testing.assert_close(inter.layers[1].q, q, rtol=1e-5, atol=1e-5)
    assert float((inter.layers[1].rot_q - q)[:, :, 1:, :8].abs().max()) > 1e-3  # the rotary channels turn
    assert torch.equal(inter.layers[1].rot_q[..., 8:], q[..., 8:])  # the rest pass through


def test_no_scaling_past_the_own_table_runs_on_poslabs_identical_angles(tiny):
    """pretrained-extension's "none" at 2x a GPT-J context: the checkpoint's table stops at
    n_positions, so the study reads the same angles from poslab's rotary; within the table both
    give the same loss."""
    from poslab.studies.pretrained_extension import checkpoint_member_rows

    model = load(tiny("gptj"))
    assert model.own_table_length() == 64
    ids = torch.randint(0, 256, (400,), generator=torch.Generator().manual_seed(4))
    config = dict(method="none", scaling=None, scale=2, length=128, windows=2, depths=[], trials=1, digits=5)
    rows = checkpoint_member_rows(model, ids, config, context=64)
    summary = next(r for r in rows if r["probe"] == "summary")
    assert summary["loss_out"] is not None and torch.isfinite(torch.tensor(summary["loss_out"]))
    inside = dict(config, scale=1, length=64)
    own = next(r for r in checkpoint_member_rows(model, ids, inside, context=64) if r["probe"] == "summary")
    assert model.schedule is None  # within the table the checkpoint's own module ran
    model.set_schedule(None)
    by_poslab = model.token_losses(ids[:128].view(2, 64)).mean()  # the member's two windows
    model.restore()
    assert float(by_poslab) == pytest.approx(own["loss_in"], abs=1e-5)
