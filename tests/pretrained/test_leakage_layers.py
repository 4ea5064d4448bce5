"""pretrained-leakage per layer (issue 36 item 4) and the quick presets' bounded context (item 5):
windows read per layer from the model (Gemma 3's sliding and full layers), the streamed lean
leakage sums against collect with every definition, NTK on the full layers only by default, the
depth slope of (b) at key 0, two checkpoints side by side, and the quick preset of
pretrained-extension at a few hundred tokens whatever the model's context."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
import torch
from click.testing import CliRunner

from poslab.cli import main
from poslab.experiments import run_study
from poslab.store import Store
from poslab.studies import get_experiment
from poslab.studies import pretrained_leakage as pl

TEXT = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer. " * 8
EXP = get_experiment("pretrained-leakage")


def config(**kw):
    return dict(dict(bos="with BOS", length=40, windows=4, groups=2, first_query=16, ntk_factor=4.0, window=8,
                     schedule_layers=["full_attention"], name="g"), **kw)


def batch_of(tokens):
    from poslab.tasks.base import Batch

    return Batch(tokens=tokens, targets=tokens, lengths=torch.full((len(tokens),), tokens.shape[1]),
                 loss_mask=torch.ones_like(tokens, dtype=torch.bool))


class Collected:
    """The model read through collect only (no stream), for the reference numbers."""

    def __init__(self, model):
        self.model, self.cfg, self.attended_windows = model, model.cfg, model.attended_windows

    def collect(self, *args, **kwargs):
        return self.model.collect(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()


def test_streamed_lean_sums_equal_collect_with_every_definition_per_layer_window(tiny):
    """Gemma 3 (tiny): sliding layers keep 16 keys, the full layer all; 40 tokens, so the window
    binds. The stream (one layer at a time, lean sums, fits per layer) gives collect's numbers."""
    from poslab.pretrained import encode_text, load
    from poslab.probes import leakage as lk

    model = load(str(tiny("gemma3")))
    assert model.attended_windows == [16, None, 16]
    tokens = encode_text(model, TEXT)[:4 * 40].view(4, 40)
    lean = lk.leakage(model, batch_of(tokens), early=16, chunk=2, old=False)
    full = lk.leakage(Collected(model), batch_of(tokens), early=16, chunk=2, old=True)
    assert "old_component_b" in full and "old_component_b" not in lean
    for key in ("component_a", "component_b", "component_b_key0", "component_b_rest", "early_component_b",
                "early_component_b_key0", "received_0", "to_key0"):
        torch.testing.assert_close(torch.as_tensor(lean[key]), torch.as_tensor(full[key]), rtol=0, atol=1e-9)
    assert float(abs(full["to_key0"][0, :, 16:]).max()) == 0.0  # key 0 out of the sliding layer's window
    model.set_window(8)  # an inference window on top: the shorter one per layer
    assert model.attended_windows == [8, 8, 8]
    model.set_window(None)


def test_gemma3_ntk_reaches_the_full_layers_by_default_and_every_layer_as_a_control(tiny):
    from poslab.pretrained import encode_text, load

    model = load(str(tiny("gemma3")))
    rows = pl.evaluate_mode(model, encode_text(model, TEXT), config())
    heads = [r for r in rows if r["probe"] == "head"]
    assert {r["variant"] for r in heads} == {pl.STANDARD, pl.NTK, pl.NTK_ALL}  # its own windows: no inference one
    assert {r["layer"]: r["layer_type"] for r in heads} == {0: "sliding_attention", 1: "full_attention",
                                                           2: "sliding_attention"}
    at = {(r["variant"], r["layer"], r["head"], r["seed"]): r["component_b"] for r in heads}
    layer0 = [k for k in at if k[0] == pl.STANDARD and k[1] == 0]
    # a sliding layer before any full one is untouched (its own theta, computed by poslab: float rounding only)
    assert max(abs(at[(pl.NTK,) + k[1:]] - at[k]) for k in layer0) < 1e-5
    assert max(abs(at[(pl.NTK_ALL,) + k[1:]] - at[k]) for k in layer0) > 1e-4  # "all": the sliding layers too
    assert max(abs(at[(pl.NTK, 1) + k[2:]] - at[(pl.STANDARD, 1) + k[2:]]) for k in layer0) > 1e-4
    assert model.schedule is None
    derived = pl.derived_rows(rows)
    types = {(r["variant"], r["layer_type"]): r for r in derived if r["probe"] == "layer_type" and r["seed"] == 0}
    assert types[pl.STANDARD, "sliding_attention"]["layers"] == 2 and types[pl.STANDARD, "full_attention"]["heads"] == 4
    (depth,) = [r for r in derived if r["probe"] == "depth" and r["seed"] == 0]
    assert depth["sliding_layers"] == 2 and depth["full_layers"] == 1 and depth["slope_full"] is None


def depth_rows(label, sliding, full, setup="own"):
    """Head rows of one checkpoint whose (b) at key 0 grows by ``sliding`` a layer over layers
    0, 1, 2, 4 (sliding) and by ``full`` over layers 3, 5 (full), in 3 window groups."""
    rows = []
    for seed, wobble in enumerate((-0.001, 0.0, 0.001)):
        for layer in range(6):
            kind = "full_attention" if layer in (3, 5) else "sliding_attention"
            value = (full if kind == "full_attention" else sliding) * layer + wobble * layer
            rows += [dict(probe="head", bos="with BOS", variant="standard", layer=layer, head=h, layer_type=kind,
                          seed=seed, label=label, setup=setup, sink=0.0, sink_share=0.1, component_a=0.1,
                          component_b=0.2, component_b_key0=value, component_b_rest=0.0, early_component_b=0.1,
                          early_component_b_key0=0.05) for h in range(2)]
    return rows


@pytest.mark.parametrize("sliding, full, holds", [(0.02, 0.005, True), (0.005, 0.02, False)])
def test_accumulation_with_depth_is_the_slope_of_key0_b_on_the_layer(sliding, full, holds):
    rows = depth_rows("G", sliding, full)
    derived = pl.derived_rows(rows)
    (depth,) = [r for r in derived if r["probe"] == "depth" and r["seed"] == 1]
    assert depth["slope_sliding"] == pytest.approx(sliding) and depth["slope_full"] == pytest.approx(full)
    claims = {c.name: c for c in pl.judge_all(pl.CLAIMS, rows + derived)}
    faster = claims["G, with BOS, its own set-up: (b) at key 0 accumulates faster with depth in the sliding-window "
                    "layers than in the full-attention layers"]
    assert faster.holds is holds and faster.role == "paper"
    assert claims["G, with BOS, its own set-up: (b) at key 0 accumulates with depth in the sliding-window "
                  "layers"].holds is True


def test_the_cross_checkpoint_slope_compares_sliding_layers_with_the_other_models_full_layers():
    rows = depth_rows("G", 0.02, 0.005)
    other = [dict(r, label="S", layer_type="full_attention", setup="own") for r in depth_rows("S", 0.01, 0.01)]
    derived = pl.derived_rows(rows + other)
    cross = [r for r in derived if r["probe"] == "depth_cross"]
    assert {(r["label"], r["other"]) for r in cross} == {("G", "S")}
    assert all(r["slope_difference"] == pytest.approx(0.01, abs=2e-3) for r in cross)
    claims = {c.name: c for c in pl.judge_all(pl.CLAIMS, rows + other + derived)}
    got = claims["G sliding-window layers accumulate (b) at key 0 faster with depth than S's full-attention layers "
                 "(each in its own set-up)"]
    assert got.holds is True and got.role == "control"
    side = {(r["quantity"], r["label"]) for r in derived if r["probe"] == "side"}
    assert ("slope of (b) at key 0, sliding layers", "G") in side
    assert ("slope of (b) at key 0, full layers", "S") in side


def test_quick_runs_on_a_gemma3_checkpoint_through_the_command_line(tiny, tmp_path):
    """--model with the default executor (worker processes): per-layer windows, layer types."""
    out = CliRunner().invoke(main, ["run", "pretrained-leakage", "--preset", "quick", "--model", str(tiny("gemma3")),
                                    "--set", "model.length=40", "--set", "model.windows=4",
                                    "--out", str(tmp_path / "out"), "--store", str(tmp_path / "s.sqlite"),
                                    "--no-progress"])
    assert out.exit_code == 0, out.output
    text = (tmp_path / "out" / "table.md").read_text()
    assert "## Sink heads and (b) at key 0 per layer type" in text
    assert "| sliding_attention |" in text and "NTK RoPE (inference, all layers)" in text
    assert "sliding window (inference)" not in text  # a model with its own sliding layers keeps them


def test_two_checkpoints_run_side_by_side_on_the_checkpoint_axis(tiny, tmp_path):
    quick = EXP.study("quick")
    a, b = str(tiny("llama")), str(tiny("gemma3"))
    study = dataclasses.replace(quick, model={**quick.model, "checkpoint": None, "length": 32, "windows": 4},
                                grid={"model.checkpoint": (a, b), "model.bos": pl.MODES})
    with Store(tmp_path / "s.sqlite") as store:
        got = run_study(EXP, study, store=store, out=tmp_path / "out", progress=False)
    assert got["members"] == 4
    text = (tmp_path / "out" / "table.md").read_text()
    side = text.split("## The checkpoints side by side")[1].split("##")[0]
    header = next(line for line in side.splitlines() if line.startswith("| order | quantity |"))
    assert all(n.rsplit("/", 1)[-1] in header for n in (a, b))  # a column per checkpoint
    assert sum(line.startswith("| 0 | sink heads, own set-up |") for line in side.splitlines()) == 1


def test_settings_per_checkpoint_and_the_checkpoint_axis():
    cpu = EXP.study("cpu")
    assert pl.checkpoints(cpu) == ("smollm2-135m", "gemma3-270m")
    assert pl.settings(cpu, "gemma3-270m")["length"] == 640 and pl.settings(cpu, "smollm2-135m")["length"] == 512
    one = dataclasses.replace(cpu, model={**cpu.model, "checkpoint": "gemma3-270m"})  # what --model sets
    assert pl.checkpoints(one) == ("gemma3-270m",)
    from poslab.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        pl.settings(dataclasses.replace(cpu, model={**cpu.model, "length": {"smollm2-135m": 512}}))
    assert e.value.field == "model.length"


# ----------------------------------------------------------------------------- item 5: quick context, learned tables

def test_quick_pretrained_extension_caps_the_context_whatever_the_model(tiny, tmp_path):
    """A checkpoint declaring a 32k context: the quick preset reads windows of 128 and 256 tokens
    (L0 capped at 128), not 32k and 65k."""
    long = tmp_path / "long"
    shutil.copytree(tiny("llama"), long)
    cfg = json.loads((long / "config.json").read_text())
    (long / "config.json").write_text(json.dumps(dict(cfg, max_position_embeddings=32768)))
    out = CliRunner().invoke(main, ["run", "pretrained-extension", "--preset", "quick", "--model", str(long),
                                    "--set", 'grid.model.method=["none", "pi"]', "--set", "model.reasoning=[]",
                                    "--set", "model.capability=null", "--executor", "inline",
                                    "--out", str(tmp_path / "out"), "--store", str(tmp_path / "s.sqlite"),
                                    "--no-progress"])
    assert out.exit_code == 0, out.output
    with Store(tmp_path / "s.sqlite") as store:
        lengths = {r.get("length") for r in store.rows() if r.get("length") is not None}
    assert lengths == {128, 256}


def test_a_window_past_a_learned_position_table_is_one_config_error_line(tiny, tmp_path):
    out = CliRunner().invoke(main, ["run", "pretrained-extension", "--preset", "quick", "--model", str(tiny("gpt2")),
                                    "--set", 'grid.model.method=["none"]', "--out", str(tmp_path / "out"),
                                    "--store", str(tmp_path / "s.sqlite"), "--no-progress"])
    assert out.exit_code != 0 and "IndexError" not in out.output
    assert "model.scale: got 2" in out.output and "learned position table of 64 rows" in out.output


def test_a_passkey_decoded_past_a_learned_table_is_a_config_error(tiny):
    """The study's passkey decodes through model.greedy, which counts the generated tokens."""
    from poslab.errors import ConfigError
    from poslab.pretrained import load
    from poslab.studies import pretrained_extension as pe

    model = load(str(tiny("gpt2")))
    prompt = torch.zeros(1, 62, dtype=torch.long)
    with pytest.raises(ConfigError) as e:
        model.greedy(prompt, 4)  # 62 + 4 - 1 = 65 positions of a 64-row table
    assert e.value.field == "new_tokens"
    assert pe.schedule_layers({}) == ("full_attention",) and pe.schedule_layers({"schedule_layers": "all"}) == "all"
