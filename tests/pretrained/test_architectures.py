"""The architecture records (issue 54, item 1): what poslab can do with each checkpoint family is read
from one record, and adding an architecture is one record and nothing else."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
from click.testing import CliRunner

from poslab.cli import main
from poslab.errors import ConfigError
from poslab.pretrained import architectures as archs
from poslab.pretrained import load
from poslab.pretrained.checks import preflight, require_capable
from poslab.pretrained.table import capabilities, entry_from_config, table_rows
from poslab.pretrained.tiny import PARITY_KINDS, tiny_checkpoint


def test_the_records_agree_with_what_reads_them(tiny):
    assert PARITY_KINDS == archs.parity_kinds() and "gpt2" not in PARITY_KINDS and "gptj" in PARITY_KINDS
    assert archs.find("gemma3") is archs.ARCHITECTURES["gemma3_text"]  # the GGUF's name of Gemma 3
    assert archs.find("olmo") is None
    for arch in archs.ARCHITECTURES.values():
        assert arch.layout in ("half", "interleaved") and arch.encoding in ("rope", "learned", "alibi")
        if arch.replace:  # a rotary poslab replaces is one it records, with a tiny parity kind
            assert arch.record and arch.encoding == "rope" and arch.tiny
    assert load(str(tiny("gptj"))).layout == "interleaved" and load(str(tiny("llama"))).layout == "half"
    assert entry_from_config(dict(model_type="bloom"))["encoding"] == "alibi"
    assert entry_from_config(dict(model_type="opt", max_position_embeddings=2048))["encoding"] == "learned"
    rows = {r["name"]: r for r in table_rows()}  # poslab models: the published model types' records
    assert rows["Llama 2 7B"]["poslab"] == "record, replace" and rows["GPT-2"]["poslab"] == "record"
    assert rows["BLOOM"]["poslab"] == "none" and rows["DeepSeek-V2"]["poslab"] == "none"


def test_adding_an_architecture_is_one_record(tmp_path, monkeypatch):
    """OLMo (1) has no record: inspect says so and a study that records its attention refuses it.
    One record (with its tiny config) later, the tiny checkpoint builds, the study's checks pass and
    inspect --parity passes, with nothing else changed."""
    config = dict(model_type="olmo")
    assert entry_from_config(config)["model_type"] == "olmo" and capabilities("olmo") == "no record"
    with pytest.raises(ConfigError, match="cannot record the attention of this 'olmo' model"):
        require_capable(config, ("record",))
    with pytest.raises(ConfigError, match="kind"):
        tiny_checkpoint("olmo", tmp_path / "none")
    body = dict(archs._BODY, rope_parameters=archs._THETA, **archs._TOKENS)
    monkeypatch.setitem(archs.ARCHITECTURES, "olmo", archs.Architecture(
        model_type="olmo", record=True, replace=True, tiny={"olmo": ("OlmoConfig", body)}))
    path = tiny_checkpoint("olmo", tmp_path / "olmo")
    require_capable(config, ("record", "schedule"))
    preflight(load(str(path)), ("record", "schedule"))
    out = CliRunner().invoke(main, ["inspect", str(path), "--parity"])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[2].rstrip().endswith("record, replace")  # the "poslab can" column
    assert out.output.rstrip().endswith("parity: pass")


def test_a_llama4_config_json_without_layer_types_shows_its_chunks():
    """A Llama 4 config.json as published names no layer_types (its config class builds them from
    no_rope_layers and attention_chunk_size): the record builds the same ones, so the chunk shows."""
    from transformers import Llama4TextConfig

    published = dict(num_hidden_layers=8, num_attention_heads=4, hidden_size=64, head_dim=16,
                     max_position_embeddings=1024, rope_theta=5e5, attention_chunk_size=128,
                     no_rope_layers=[1, 1, 1, 0, 1, 1, 0, 1])
    built = Llama4TextConfig(**published, intermediate_size_mlp=128, num_local_experts=2)
    arch = archs.find("llama4_text")
    assert arch.layer_types(dict(published)) == list(built.layer_types)
    assert arch.layer_chunks(dict(published)) == [128 if t == archs.CHUNKED else None for t in built.layer_types]
    layers = entry_from_config(dict(published, model_type="llama4_text"))["layers"]
    assert layers["types"]["chunked_attention"] == {"count": 6, "rope_theta": 5e5, "chunk": 128}
    assert layers["types"]["full_attention (no rope)"]["count"] == 2
