"""The field's rotary families and the hybrid per-layer patterns (issue 54, items 3 and 4): collect's
un-rotated q is the checkpoint's own projection in every pair layout, a schedule reaches the rope
layers only and says so, inspect shows the per-layer pattern, and MLA / Falcon are refused by name
before any weights are read. Parity of each family is test_layer_rotary.py's (over PARITY_KINDS)."""

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
from poslab.pretrained.architectures import ARCHITECTURES  # noqa: E402
from poslab.pretrained.checks import require_capable  # noqa: E402
from poslab.pretrained.table import entry_from_config, inspect_rows, table_rows  # noqa: E402
from poslab.pretrained.tiny import PARITY_KINDS  # noqa: E402
from poslab.tasks.base import Batch  # noqa: E402

TOL = 1e-5
FAMILIES = ("phi", "stablelm", "cohere", "cohere2", "starcoder2", "mixtral", "qwen2_moe", "qwen3_moe", "granite",
            "glm", "glm4", "smollm3", "llama4", "falcon", "falcon-mq")
LINEAR = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}


def tokens(s=24, seed=5):
    return torch.randint(0, 256, (1, s), generator=torch.Generator().manual_seed(seed))


def batch_of(x):
    return Batch(tokens=x, targets=x, loss_mask=torch.ones_like(x, dtype=torch.bool),
                 lengths=torch.full((x.shape[0],), x.shape[1]))


def test_every_family_is_a_parity_kind():
    assert set(FAMILIES) <= set(PARITY_KINDS)


@pytest.mark.parametrize("kind", ["cohere", "cohere2", "glm", "phi", "smollm3", "granite"])
def test_collect_unrotates_to_the_projection(tiny, kind, collect_capturing):
    """q from collect equals the q_proj output on every layer: interleaved pairs handed repeated (Cohere)
    or as halves (GLM), partial rotary (Phi, GLM), layers without rope (Cohere2, SmolLM3)."""
    model = load(tiny(kind))
    x = tokens()
    inter, projections = collect_capturing(model, batch_of(x), [layer.self_attn.q_proj for layer in model.layers])
    for i, (layer, q_proj) in enumerate(zip(inter.layers, projections, strict=True)):
        q = q_proj.view(1, x.shape[1], model.n_heads, model.d_head).transpose(1, 2)
        torch.testing.assert_close(layer.q, q, rtol=1e-5, atol=1e-5)
        assert (float((layer.rot_q - q).abs().max()) > 1e-3) == model.layer_rope[i]  # rotated where it has rope


def test_llama4_collect_gives_the_normed_query_before_rotation(tiny, collect_capturing):
    """Llama 4's rope layers norm q after rotating it (a rotation keeps the norm): collect's q is the
    normed projection; its no-rope layer's q is the projection times the temperature scale."""
    model = load(tiny("llama4"))
    cfg = model.config
    x = tokens(20)  # floor_scale 4: the scale steps up every 4 positions
    inter, projections = collect_capturing(model, batch_of(x), [layer.self_attn.q_proj for layer in model.layers])
    pos = torch.arange(20, dtype=torch.float32)
    scale = torch.log1p(torch.floor((pos + 1) / cfg.floor_scale)) * cfg.attn_scale + 1
    for i, (layer, q_proj) in enumerate(zip(inter.layers, projections, strict=True)):
        q = q_proj.view(1, 20, model.n_heads, model.d_head).transpose(1, 2)
        want = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) if model.layer_rope[i] \
            else q * scale[:, None]
        torch.testing.assert_close(layer.q, want, rtol=1e-5, atol=1e-5)
    assert model.layer_rope == [True, True, True, False] and model.layer_chunks == [8, 8, 8, None]
    # chunked attention on the rope layers: no query sees a key of an earlier chunk of 8
    pattern = inter.layers[0].pattern[0, 0]
    assert float(pattern[8:, :8].abs().max()) == 0 and float(inter.layers[3].pattern[0, 0, 8:, :8].min()) > 0


@pytest.mark.parametrize("kind, targets, nope", [("smollm3", ("full_attention",), [3]),
                                                ("llama4", ("chunked_attention",), [3]),
                                                ("cohere2", ("sliding_attention",), [3]),
                                                ("cohere", ("full_attention",), [])])
def test_a_schedule_goes_on_the_rope_layers_only_and_says_so(tiny, kind, targets, nope):
    """The default schedule (full-attention layers) lands on the rope layers, where the full layers have
    none (Llama 4, Cohere2); it equals the checkpoint saved with that schedule; the summary says where."""
    x = tokens()
    model = load(tiny(kind))
    own = model(x)
    model.set_schedule(dict(LINEAR))
    assert model.schedule_targets == targets and model.schedule["rope_type"] == "linear"
    ours = model(x)
    assert float((ours - own).detach().abs().max()) > 1e-4  # the schedule reaches the attention
    torch.testing.assert_close(ours, load(tiny(kind, rope_parameters=LINEAR))(x), rtol=0, atol=TOL)
    summary = model.schedule_summary()
    rope_layers = sum(model.layer_rope)
    assert summary.startswith(f"linear x4 on {rope_layers} of {model.n_layers} layers")
    assert ("the rope layers only: layer 3 has no rope" in summary) == bool(nope)
    with pytest.raises(ConfigError, match="schedule_layers.*with rope layers"):
        model.set_schedule(dict(LINEAR), layer_types=("nope_attention",))
    model.restore()
    assert torch.equal(model(x), own) and model.schedule_summary() == "the checkpoint's own rotary"


def test_inspect_shows_the_per_layer_pattern(tiny):
    rows = {k: inspect_rows(str(tiny(k))) for k in ("smollm3", "llama4", "cohere2")}
    assert [r["layers"] for r in rows["smollm3"]] == ["3 full : 1 full (no rope)"] * 2
    assert [r["encoding"] for r in rows["smollm3"]] == ["rope", "none"]
    chunked, full = rows["llama4"]
    assert chunked["layers"] == "3 chunked : 1 full (no rope)" and chunked["window"] == "chunk 8"
    assert full["name"].endswith("full (no rope) x1") and full["encoding"] == "none" and full["theta"] == "-"
    assert "QK L2 norm" in chunked["notes"]
    sliding, full = rows["cohere2"]
    assert (sliding["layers"], sliding["window"], full["window"]) == ("3 sliding : 1 full (no rope)", "16", "-")
    out = CliRunner().invoke(main, ["inspect", str(tiny("llama4")), "--parity"])
    assert out.exit_code == 0, out.output
    assert "layers also: QK L2 norm" in out.output and out.output.rstrip().endswith("parity: pass")
    # a Llama 4 config whose no_rope_layers is empty: the record's interval (every fourth layer) holds
    config = dict(model_type="llama4_text", num_hidden_layers=8, no_rope_layers=[], hidden_size=64,
                  num_attention_heads=4, max_position_embeddings=64, attention_chunk_size=8,
                  layer_types=["chunked_attention"] * 3 + ["full_attention"] + ["chunked_attention"] * 3
                  + ["full_attention"])
    assert entry_from_config(config)["layers"]["pattern"] == "3 chunked : 1 full (no rope) (x2)"


MLA = dict(model_type="deepseek_v3", num_attention_heads=16, hidden_size=64, qk_nope_head_dim=8,
           qk_rope_head_dim=8, v_head_dim=8, num_hidden_layers=2, max_position_embeddings=64, vocab_size=256,
           rope_theta=10000.0)


@pytest.mark.parametrize("config, why", [(MLA, "multi-head latent attention"),
                                         (dict(MLA, model_type="deepseek_v2"), "multi-head latent attention")])
def test_mla_is_refused_by_name_before_any_weights(tmp_path, config, why):
    for needs in (("record",), ("schedule",)):
        with pytest.raises(ConfigError, match=f"this '{config['model_type']}' model: .*{why}"):
            require_capable(config, needs)
    folder = tmp_path / config["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))  # no weights: a refusal must come first
    out = CliRunner().invoke(main, ["inspect", str(folder), "--parity"])
    assert out.exit_code == 2 and why in out.output and config["model_type"] in out.output


def test_mla_heads_are_the_configs_with_their_rotated_part():
    row = inspect_rows_of(MLA)
    assert row["head"] == "16 (8)"  # qk_nope 8 + qk_rope 8 per head, 8 rotated
    published = {r["name"]: r for r in table_rows()}["DeepSeek-V2"]
    assert published["head"] == "192 (64)" and published["wavelengths"].startswith("6.3 ..")


def inspect_rows_of(config):
    from poslab.pretrained.table import describe_rows

    return describe_rows(entry_from_config(config))[0]


def test_token_losses_divide_by_granites_logit_scaling(tiny):
    model = load(tiny("granite"))
    x = tokens(30)
    logits = model(x)
    want = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:], reduction="none")
    torch.testing.assert_close(model.token_losses(x)[0], want, rtol=1e-5, atol=1e-5)


def test_records_of_the_refused_do_nothing():
    for name in ("deepseek_v2",):
        arch = ARCHITECTURES[name]
        assert arch.why_not and not arch.record and not arch.replace and not arch.tiny
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert transformers.AutoConfig.for_model("deepseek_v3").model_type == "deepseek_v3"


def test_the_extension_studys_summary_row_says_where_the_schedule_went(tiny):
    from poslab.studies.pretrained_extension import checkpoint_member_rows

    model = load(tiny("llama4"))
    ids = torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(0))
    config = dict(length=40, windows=2, scaling={"rope_type": "linear", "factor": 2.0}, method="linear", scale=2,
                  depths=[], trials=0, digits=5)
    summary = next(r for r in checkpoint_member_rows(model, ids, config, 32) if r["probe"] == "summary")
    assert summary["schedule_on"] == ("linear x2 on 3 of 4 layers (chunked_attention), the rope layers only: "
                                      "layer 3 has no rope and keeps no position encoding")
    own = next(r for r in checkpoint_member_rows(model, ids, dict(config, scaling=None, method="none"), 32)
               if r["probe"] == "summary")
    assert own["schedule_on"] == "the checkpoint's own rotary"


def test_a_cohere2_config_without_layer_types_reads_its_period():
    """Command A's config.json may name sliding_window_pattern alone: its config class builds the types."""
    config = dict(model_type="cohere2", num_hidden_layers=8, sliding_window_pattern=4, sliding_window=4096,
                  hidden_size=64, num_attention_heads=4, max_position_embeddings=8192, rope_theta=50000.0)
    layers = entry_from_config(config)["layers"]
    assert layers["pattern"] == "3 sliding : 1 full (no rope) (x2)"
    assert layers["types"]["sliding_attention"] == {"count": 6, "rope_theta": 50000.0, "sliding_window": 4096}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = transformers.Cohere2Config(num_hidden_layers=8, sliding_window_pattern=4)
    assert ARCHITECTURES["cohere2"].layer_types(config) == list(built.layer_types)


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_schedule_by_poslab_equals_the_checkpoint_saved_with_it(tiny, kind):
    """poslab's rotary is in place (a linear x4 moves the logits) and equals the family's own rotary
    under the same schedule (the checkpoint saved with it), partial factor kept."""
    from poslab.pretrained.tiny import CONFIGS

    params = {**CONFIGS[kind][1]["rope_parameters"], **LINEAR}
    x = tokens()
    model = load(tiny(kind))
    own = model(x).detach()
    model.set_schedule(dict(LINEAR))
    ours = model(x).detach()
    assert float((ours - own).abs().max()) > 1e-4
    torch.testing.assert_close(ours, load(tiny(kind, rope_parameters=params))(x).detach(), rtol=0, atol=TOL)


def test_pretrained_leakage_refuses_a_length_past_llama4s_chunk_before_any_work(tiny, tmp_path):
    """The leakage probe keeps causal or sliding-window keys, not chunks: past the chunk it is one line,
    exit 2, nothing stored; within it the study runs on Llama 4's pattern (no-rope layer included)."""
    base = ["run", "pretrained-leakage", "--preset", "quick", "--model", str(tiny("llama4")), "--set",
            "model.windows=4", "--store", str(tmp_path / "s.sqlite"), "--no-progress", "--executor", "inline"]
    out = CliRunner().invoke(main, [*base, "--set", "model.length=40", "--out", str(tmp_path / "past")])
    assert out.exit_code == 2 and "model.length" in out.output and "chunks of 8" in out.output
    assert not (tmp_path / "past").exists() and not (tmp_path / "s.sqlite").exists()
    out = CliRunner().invoke(main, [*base, "--set", "model.length=8", "--set", "model.first_query=4",
                                    "--out", str(tmp_path / "within")])
    assert out.exit_code == 0, out.output


def test_an_alibi_falcon_is_recorded_and_not_rescheduled(tmp_path, collect_capturing):
    """ALiBi Falcon builds a rotary module it never calls: its encoding is alibi, collect leaves q as
    projected (the bias is in the mask) and gives its logits, and a schedule is refused by name."""
    from poslab.pretrained.checks import preflight
    from poslab.pretrained.model import parity

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True,
                                           new_decoder_architecture=False, multi_query=False, vocab_size=256,
                                           max_position_embeddings=64)
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "falcon")
    model = load(tmp_path / "falcon", quiet=True)
    assert model.encoding == "alibi" and model.own_rotary  # the unused rotary module is there
    preflight(model, ("record",))
    x = tokens(20)
    inter, projections = collect_capturing(model, batch_of(x),
                                           [layer.self_attention.query_key_value for layer in model.layers])
    torch.testing.assert_close(inter.logits, model(x).detach(), rtol=0, atol=TOL)
    q = projections[0].view(1, 20, model.n_heads, 3, model.d_head)[..., 0, :].transpose(1, 2)
    torch.testing.assert_close(inter.layers[0].q, q, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="schedule"):
        model.set_schedule(None)
    with pytest.raises(ConfigError, match="--parity"):
        parity(model)
    assert entry_from_config(config.to_dict())["encoding"] == "alibi"
