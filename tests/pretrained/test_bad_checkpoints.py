"""Checkpoints as researchers bring them (issue 36, item 5): a config under any name can be
inspected, an encoder is refused by name, an empty tokenizer counts as none, and a ConfigError
survives the trip back from a worker process."""

from __future__ import annotations

import json
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")

from poslab.errors import ConfigError
from poslab.pretrained import load, resolve
from poslab.pretrained.loading import require_causal
from poslab.pretrained.model import is_empty_tokenizer
from poslab.pretrained.table import inspect_path


def _raise_config_error(field: str) -> None:
    raise ConfigError(field, 3, ["a", "b"])


def test_config_error_survives_pickling_and_a_worker_process():
    e = pickle.loads(pickle.dumps(ConfigError("model.window", 7, "none, or an int")))
    assert (e.field, e.value, e.allowed) == ("model.window", 7, "none, or an int")
    assert str(e) == "model.window: got 7; allowed: none, or an int"
    with ProcessPoolExecutor(1) as pool, pytest.raises(ConfigError, match="^x.y: got 3; allowed: a, b$"):
        pool.submit(_raise_config_error, "x.y").result()


def test_inspect_reads_a_config_under_any_name(tiny, tmp_path):
    cfg = json.loads((tiny("llama") / "config.json").read_text())
    f = tmp_path / "llama31_8b_config.json"
    f.write_text(json.dumps(cfg))
    assert resolve(str(f)).kind == "config"
    assert inspect_path(str(f))["encoding"] == "rope"
    with pytest.raises(ConfigError, match="a config alone can only be inspected"):
        load(str(f))
    other = tmp_path / "data.json"
    other.write_text(json.dumps({"rows": [1, 2]}))
    with pytest.raises(ConfigError, match="this file is neither"):
        resolve(str(other))


@pytest.mark.parametrize("config, why", [
    (dict(model_type="bert", architectures=["BertModel"]), "this is a bert BertModel, not causal"),
    (dict(model_type="bert", architectures=["BertForMaskedLM"]), "not causal"),
    (dict(model_type="newarch", architectures=["NewArchForSequenceClassification"]), "this one declares"),
])
def test_an_encoder_or_non_causal_checkpoint_is_refused_by_name(config, why):
    with pytest.raises(ConfigError, match=why):
        require_causal(config, "all-MiniLM-L6-v2")


def test_causal_checkpoints_pass():
    require_causal(dict(model_type="llama", architectures=["LlamaForCausalLM"]), "x")
    require_causal(dict(model_type="gpt2", architectures=["GPT2LMHeadModel"]), "x")
    require_causal(dict(model_type="bert", is_decoder=True, architectures=["BertLMHeadModel"]), "x")


def test_an_encoder_directory_is_refused_before_loading(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(model_type="bert", architectures=["BertModel"],
                                                          hidden_size=32)))
    with pytest.raises(ConfigError, match="--model.*causal"):
        load(str(tmp_path))


class _Tok:
    def __init__(self, n, special=()):
        self.n, self.all_special_tokens = n, list(special)

    def __len__(self):
        return self.n


def test_an_empty_tokenizer_counts_as_none(tiny):
    assert is_empty_tokenizer(_Tok(3)) and is_empty_tokenizer(_Tok(5, ["<unk>"]))
    assert not is_empty_tokenizer(_Tok(300)) and not is_empty_tokenizer(_Tok(49152, ["<s>"]))
    model = load(str(tiny("llama")))  # a folder with no tokenizer files: bytes, never an empty tokenizer
    assert model.tokenizer is None


@pytest.mark.parametrize("study", ["pretrained-extension", "pretrained-leakage"])
def test_run_refuses_an_encoder_in_one_line_in_the_default_executor(study, tmp_path):
    from click.testing import CliRunner

    from poslab.cli import main

    enc = tmp_path / "minilm"
    enc.mkdir()
    (enc / "config.json").write_text(json.dumps(dict(model_type="bert", architectures=["BertModel"])))
    out = CliRunner().invoke(main, ["run", study, "--preset", "quick", "--model", str(enc), "--out",
                                    str(tmp_path / "out"), "--store", str(tmp_path / "s.sqlite"), "--no-progress"])
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "not causal" in out.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "s.sqlite").exists()
