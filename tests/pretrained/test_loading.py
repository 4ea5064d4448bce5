"""Bad input stops before any work with one ConfigError; the models table is computed from published values."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
from click.testing import CliRunner

from poslab.cli import main
from poslab.errors import ConfigError
from poslab.pretrained import load, resolve
from poslab.pretrained.table import describe, entries, entry_from_config, inspect_path, table_rows


def test_missing_path(tmp_path):
    with pytest.raises(ConfigError, match="an existing path"):
        resolve(str(tmp_path / "none"))


def test_file_that_is_not_a_model(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(ConfigError, match="this file is neither"):
        load(str(f))


def test_directory_without_config(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        load(str(tmp_path))


def test_gguf_of_an_architecture_transformers_cannot_load(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "poslab-odd")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match="architecture transformers can load.*poslab-odd"):
        load(str(path))


def test_bfloat16_only_on_a_gpu(tiny):
    with pytest.raises(ConfigError, match="dtype"):
        load(tiny("llama"), dtype="bfloat16", device="cpu")


def test_content_hash_keys_the_weights(tiny):
    a, b = load(tiny("llama")), load(tiny("llama", seed=1))
    assert a.key != b.key and a.key == load(tiny("llama")).key


def test_table_has_the_survey_models():
    names = " ".join(e["name"] for e in entries())
    for model in ("Llama 2", "Llama 3.1", "Mistral", "Qwen2.5", "Phi-3", "DeepSeek-V2", "GPT-NeoX", "Gemma",
                  "SmolLM2", "GPT-2", "BLOOM", "MPT", "T5"):
        assert model in names


def test_models_shows_the_per_layer_pattern_of_a_published_config(tmp_path):
    """An entry with its published config (SmolLM3-3B: no rope on every fourth layer) is read as
    inspect reads that config: `poslab models` prints its pattern and a row per layer kind, the same
    rows `poslab inspect` gives for the same config.json."""
    (entry,) = [e for e in entries() if e["name"] == "SmolLM3-3B"]
    raw = json.loads(resources.files("poslab").joinpath("data/llm_positions.json").read_text())
    (published,) = [m["config"] for m in raw["models"] if m["name"] == "SmolLM3-3B"]
    flags = published["no_rope_layers"]
    assert entry["layers"]["pattern"] == "3 full : 1 full (no rope) (x9)"
    assert entry["layers"]["types"]["full_attention (no rope)"]["count"] == flags.count(0) == 9
    out = CliRunner().invoke(main, ["models"])
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if line.startswith("SmolLM3-3B")]
    assert [line.split("  ")[0] for line in lines] == ["SmolLM3-3B: full x27", "SmolLM3-3B: full (no rope) x9"]
    assert all("3 full : 1 full (no rope) (x9)" in line for line in lines)
    assert " 5e+06 " in lines[0] and " none " in lines[1]  # theta on the rope layers; none on the others
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**published, "name": "SmolLM3-3B"}))
    shown = CliRunner().invoke(main, ["inspect", str(config)])
    cells = lambda text: [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()  # noqa: E731
                          if line.startswith("SmolLM3-3B")]
    assert cells(shown.output) == cells(out.output)  # the same cells (the tables' widths differ)


def test_computed_columns_follow_the_scaling_laws():
    rows = {r["name"]: r for r in table_rows()}
    assert rows["Llama 2 7B"]["critical"] == "92"  # Liu et al. 2023's own example: d=128, base 10^4, 4096
    assert rows["GPT-NeoX-20B"]["head"] == "96 (24)"  # partial rotary 0.25
    assert rows["DeepSeek-V2"]["effective"] == "163,840"  # factor 40 x 4096
    assert rows["Phi-3 mini 128k"]["kv_cache"].startswith("no")  # longrope switches factors with length
    assert rows["Mistral 7B v0.1"]["window"] == "4096"
    assert rows["BLOOM"]["encoding"] == "alibi" and rows["GPT-2"]["encoding"] == "learned"
    # linear scaling stretches the longest wavelength by its factor
    base = describe({"name": "x", "encoding": "rope", "rope_theta": 1e4, "context": 4096, "head_dim": 128})
    pi = describe({"name": "x", "encoding": "rope", "rope_theta": 1e4, "context": 16384, "head_dim": 128,
                   "rope_scaling": {"rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 4096}})
    longest = lambda row: float(row["wavelengths"].split("..")[1].replace(",", ""))  # noqa: E731
    assert longest(pi) == pytest.approx(4 * longest(base), rel=1e-4)


def test_inspect_reads_configs(tiny):
    row = inspect_path(str(tiny("gpt_neox") / "config.json"))
    assert row["encoding"] == "rope" and row["head"] == "16 (4)"
    assert inspect_path(str(tiny("gpt2")))["encoding"] == "learned"
    assert inspect_path(str(tiny("mistral")))["window"] == "16"
    cfg = json.loads((tiny("llama") / "config.json").read_text())
    assert entry_from_config(cfg)["rope_theta"] == 10000.0


def test_cli_models_and_inspect(tiny, tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["models"])
    assert out.exit_code == 0 and "DeepSeek-V2" in out.output and "critical dim" in out.output
    out = runner.invoke(main, ["inspect", str(tiny("llama"))])
    assert out.exit_code == 0 and "rope" in out.output
    out = runner.invoke(main, ["inspect", str(tmp_path / "missing")])
    assert out.exit_code == 2 and "PATH" in out.output
