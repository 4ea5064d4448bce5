"""poslab's rotary per layer type: every tiny architecture's own logits from poslab's rotary and
collect (parity), Gemma 3's rope setting per type, schedules on the full-attention layers by
default, Gemma 2's soft cap in collect, and the decoded-token length check."""

from __future__ import annotations

import json
import warnings

import pytest

transformers = pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from poslab.cli import main  # noqa: E402
from poslab.errors import ConfigError  # noqa: E402
from poslab.pretrained import load  # noqa: E402
from poslab.pretrained.model import parity  # noqa: E402
from poslab.pretrained.table import inspect_rows, layer_pattern  # noqa: E402
from poslab.pretrained.tiny import PARITY_KINDS  # noqa: E402
from poslab.tasks.base import Batch  # noqa: E402

TOL = 1e-5


def batch_of(tokens):
    return Batch(tokens=tokens, targets=tokens, loss_mask=torch.ones_like(tokens, dtype=torch.bool),
                 lengths=torch.full((tokens.shape[0],), tokens.shape[1]))


def tokens(s=48, seed=3):
    return torch.randint(0, 256, (1, s), generator=torch.Generator().manual_seed(seed))


def theta(base, dim=16):
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


@pytest.mark.parametrize("kind", PARITY_KINDS)
def test_poslab_rotary_and_collect_give_the_checkpoints_logits(tiny, kind):
    for row in parity(load(tiny(kind)), (16, 48)):
        assert row["forward"] <= TOL and row["collect"] <= TOL, (kind, row)


def test_gemma3_has_a_rope_setting_per_layer_type(tiny):
    model = load(tiny("gemma3-linear"))
    assert model.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert model.per_type_rope and model.default_type == "full_attention"
    assert model.layer_windows == [16, None, 16] and model.window is None  # not every layer slides
    own = model.own_scalings()
    assert own["sliding_attention"]["rope_theta"] == 1e4 and own["full_attention"]["rope_theta"] == 1e6
    assert own["full_attention"]["rope_type"] == "linear" and own["full_attention"]["factor"] == 8.0
    hf = {t: model.rotary_frequencies(t) for t in model.rope_types}  # the checkpoint's own buffers
    model.set_schedule(None)
    ours = model.rotary_frequencies_by_type()
    torch.testing.assert_close(ours["sliding_attention"].double(), theta(1e4), rtol=1e-6, atol=0)
    torch.testing.assert_close(ours["full_attention"].double(), theta(1e6) / 8, rtol=1e-6, atol=0)
    for t in model.rope_types:
        torch.testing.assert_close(ours[t], hf[t], rtol=3e-7, atol=0)
    with pytest.raises(ConfigError, match="layer_type"):
        model.rotary_frequencies("chunked_attention")


def test_schedule_goes_to_the_full_layers_by_default(tiny):
    """gemma3 + linear x8 by set_schedule equals the checkpoint saved with linear x8 on its full layers."""
    x = tokens()
    scheduled = load(tiny("gemma3"))
    scheduled.set_schedule({"rope_type": "linear", "factor": 8.0})
    assert scheduled.schedules["sliding_attention"]["rope_type"] == "default"
    torch.testing.assert_close(scheduled(x), load(tiny("gemma3-linear"))(x), rtol=0, atol=TOL)
    scheduled.set_schedule({"rope_type": "linear", "factor": 8.0}, layer_types="all")
    torch.testing.assert_close(scheduled.rotary_frequencies("sliding_attention").double(), theta(1e4) / 8,
                               rtol=1e-6, atol=0)
    scheduled.set_schedule({"rope_type": "dynamic", "factor": 2.0}, layer_types=("full_attention",))
    assert not scheduled.kv_cache  # a length-dependent schedule on any layer type
    scheduled.restore()
    assert scheduled.kv_cache and scheduled.schedules is None
    for bad in (("chunked_attention",), "full_attention", ()):
        with pytest.raises(ConfigError, match="schedule_layers"):
            scheduled.set_schedule({"rope_type": "linear", "factor": 2.0}, layer_types=bad)


def test_gemma2_layers_of_another_setting_get_their_own_rotary(tiny, collect_capturing):
    """Gemma 2 computes one (cos, sin) for every layer: a schedule on its full layers only reaches them
    through a layer hook; on every layer it equals the checkpoint saved with that schedule."""
    x = tokens()
    linear = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    model = load(tiny("gemma2"))
    own = model(x)
    model.set_schedule(dict(linear), layer_types="all")
    assert not model._hooks
    torch.testing.assert_close(model(x), load(tiny("gemma2", rope_parameters=linear))(x), rtol=0, atol=TOL)
    model.set_schedule({"rope_type": "yarn", "factor": 4.0})  # full layer only; A != 1 there
    assert len(model._hooks) == 1
    ours = model(x)
    assert float((ours - own).detach().abs().max()) > 1e-4
    # collect un-rotates each layer with its own type's factor: q equals the projection itself
    inter, projections = collect_capturing(model, batch_of(x), [layer.self_attn.q_proj for layer in model.layers])
    torch.testing.assert_close(inter.logits, ours, rtol=0, atol=TOL)
    for layer, q_proj in zip(inter.layers, projections, strict=True):
        q = q_proj.view(1, x.shape[1], model.n_heads, model.d_head).transpose(1, 2)
        torch.testing.assert_close(layer.q, q, rtol=1e-5, atol=1e-5)
    model.restore()
    assert not model._hooks and torch.equal(model(x), own)


def test_gemma2_softcap_is_applied_in_collect(tiny):
    model = load(tiny("gemma2"))
    cap = model.config.attn_logit_softcapping
    x = tokens()
    inter = model.collect(batch_of(x))
    model.hf.set_attn_implementation("eager")
    eager = model.hf(input_ids=x, output_attentions=True).attentions
    for i, layer in enumerate(inter.layers):
        raw = layer.rot_q @ layer.rot_k.transpose(-1, -2) * model.layers[i].self_attn.scaling
        assert float((raw - torch.tanh(raw / cap) * cap).abs().max()) > 1e-3  # the cap bites
        torch.testing.assert_close(layer.attn_scores, torch.tanh(raw / cap) * cap, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(layer.pattern, eager[i], rtol=0, atol=1e-6)
    torch.testing.assert_close(inter.logits, model(x), rtol=0, atol=TOL)


def test_an_architecture_poslab_does_not_replace_is_refused_by_name(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.GemmaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                          vocab_size=256, max_position_embeddings=64)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gemma")
    model = load(tmp_path / "gemma")
    with pytest.raises(ConfigError, match="'gemma'"):
        model.set_schedule(None)
    with pytest.raises(ConfigError, match="replaces faithfully"):
        parity(model)
    only_config = tmp_path / "config-only"
    only_config.mkdir()
    (only_config / "config.json").write_text(json.dumps(config.to_dict()))
    out = CliRunner().invoke(main, ["inspect", str(only_config), "--parity"])  # refused before any weights
    assert out.exit_code == 2 and "--parity" in out.output and "'gemma'" in out.output


def test_learned_positions_count_decoded_tokens(tiny):
    model = load(tiny("gpt2"))  # a 64-row position table
    model.check_length(60, new_tokens=5)  # positions 0 .. 63: the last decoded token is never fed back
    with pytest.raises(ConfigError, match="new_tokens.*64"):
        model.check_length(60, new_tokens=6)
    with pytest.raises(ConfigError, match="new_tokens"):
        model.check_length(60, new_tokens=-1)
    prompt = tokens(62)
    with pytest.raises(ConfigError, match="new_tokens"):
        model.greedy(prompt, 4)
    assert len(model.greedy(prompt, 3)) == 3


def test_greedy_uses_the_cache_as_the_plain_forward(tiny):
    model = load(tiny("gemma3"))
    prompt = tokens(20)
    out = model.greedy(prompt, 5)
    seq = prompt
    for want in out:
        nxt = int(model(seq)[0, -1].argmax())
        assert nxt == want
        seq = torch.cat([seq, torch.tensor([[nxt]])], 1)


def test_inspect_shows_the_layer_pattern_and_each_types_setting(tiny):
    rows = inspect_rows(str(tiny("gemma3-linear")))
    assert [r["name"].rsplit(": ", 1)[1] for r in rows] == ["full x1", "sliding x2"]
    full, sliding = rows
    assert full["layers"] == sliding["layers"] == "1 sliding : 1 full : 1 sliding"
    assert (full["theta"], full["rope_type"], full["window"]) == ("1e+06", "linear", "-")
    assert (sliding["theta"], sliding["rope_type"], sliding["window"]) == ("10000", "default", "16")
    assert full["effective"] == "512"  # linear x8 on the full layers' context 64
    assert [r["layers"] for r in inspect_rows(str(tiny("qwen2")))] == ["2 full"]
    assert inspect_rows(str(tiny("llama")))[0]["layers"] == "-"
    out = CliRunner().invoke(main, ["inspect", str(tiny("gemma3")), "--parity", "--lengths", "16,40"])
    assert out.exit_code == 0, out.output
    assert "sliding x2" in out.output and "collect max |d logit|" in out.output and "\n40 " in out.output


def test_layer_pattern():
    gemma3 = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert layer_pattern(gemma3) == "5 sliding : 1 full (x3)"
    assert layer_pattern(["sliding_attention", "full_attention"] * 13) == "1 sliding : 1 full (x13)"
    assert layer_pattern(["full_attention"] * 4) == "4 full"


def test_parity_tolerance_is_relative_and_grows_with_the_angle_rounding():
    from poslab.pretrained.checks import parity_tolerance, parity_verdict

    assert parity_tolerance(16) == parity_tolerance(48) == 1e-5
    assert parity_tolerance(4096) == pytest.approx(4096 * 2.0 ** -23)  # 4.9e-4: the angle's own rounding
    row = dict(length=16, logit_scale=50.0, forward=0.0, collect=0.0)
    just_in, just_out = 50.0 * 1e-5 * (1 - 1e-6), 50.0 * 1e-5 * (1 + 1e-6)
    assert parity_verdict(dict(row, forward=just_in, collect=just_in))["pass"]
    assert not parity_verdict(dict(row, forward=just_out))["pass"]
    assert not parity_verdict(dict(row, collect=just_out))["pass"]
    assert parity_verdict(dict(row, length=4096, forward=50 * 4e-4))["pass"]  # within 4096 x 2^-23 of 57
    assert not parity_verdict(dict(row, logit_scale=0.5, forward=just_in))["pass"]  # the same |d| at a smaller scale


def test_inspect_parity_prints_its_threshold_and_verdict_and_exits_1_on_a_fail(tiny, monkeypatch):
    import poslab.pretrained.model as model_module

    out = CliRunner().invoke(main, ["inspect", str(tiny("llama")), "--parity"])
    assert out.exit_code == 0, out.output
    verdicts = [line.split()[-1] for line in out.stdout.splitlines() if line[:2] in ("16", "48")]
    assert "max(1e-05, L x 2^-23)" in out.output and verdicts == ["pass", "pass"]
    assert out.output.rstrip().endswith("parity: pass")
    real = model_module.rope_frequencies

    def off(*args, **kwargs):  # poslab's frequencies 1% off the checkpoint's
        inv_freq, factor = real(*args, **kwargs)
        return inv_freq * 1.01, factor

    monkeypatch.setattr(model_module, "rope_frequencies", off)
    out = CliRunner().invoke(main, ["inspect", str(tiny("llama")), "--parity"])
    assert out.exit_code == 1, out.output
    verdicts = [line.split()[-1] for line in out.stdout.splitlines() if line[:2] in ("16", "48")]
    assert verdicts == ["FAIL", "FAIL"] and out.stderr.strip() == "parity: FAIL at 16, 48 tokens"
