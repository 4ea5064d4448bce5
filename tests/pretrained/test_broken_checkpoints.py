"""Checkpoints as they come broken, and checkpoints poslab cannot serve (issue 54, items 2 and 5):
each is one line on stderr naming the field, exit 2, through the real command line in the default
executor, and the folder holding the store (which already records a study's output folder) is
byte-for-byte unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
import torch
import transformers
from click.testing import CliRunner

from poslab.cli import main
from poslab.errors import ConfigError
from poslab.store import Store
from poslab.studies import EXPERIMENTS
from poslab.studies.implementation import CHAR

STUDIES = ("pretrained-leakage", "pretrained-extension")
WITHOUT_BOS = ["--set", 'grid.model.bos=["without BOS"]']


@pytest.fixture
def world(tmp_path) -> Path:
    """A folder with a store that holds one run and the output folder pointer of a study."""
    with Store(tmp_path / "s.sqlite") as db:
        db.record("abc123", experiment="pretrained-leakage", config={"x": 1}, rows=[{"a": 0.5}])
        db.record_outputs("pretrained-leakage", tmp_path / "earlier")
    return tmp_path


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(world: Path, args: list[str], *words: str) -> str:
    """Run ``poslab ARGS`` (a run gets the world's store and a new --out); assert one line on stderr
    naming ``words``, exit 2, nothing on stdout and no file changed; return the line."""
    if args[0] == "run":
        args = [*args, "--store", str(world / "s.sqlite"), "--out", str(world / "out"), "--no-progress"]
    before = _snapshot(world)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poslab: error: ") and "allowed" in lines[0], result.stderr
    assert result.stdout == ""
    for word in words:
        assert word in lines[0], lines[0]
    assert _snapshot(world) == before and not (world / "out").exists()
    return lines[0]


def _copy(tiny, kind: str, dest: Path) -> Path:
    shutil.copytree(tiny(kind), dest)
    return dest


def _cut(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


# ----------------------------------------------------------------------------- item 5: broken checkpoints

@pytest.mark.parametrize("cut", ["data", "header"])
def test_a_truncated_safetensors_file_is_one_line_in_run_and_inspect_parity(tiny, tmp_path, world, cut):
    ckpt = _copy(tiny, "llama", tmp_path / "cut")
    weights = ckpt / "model.safetensors"
    _cut(weights, weights.stat().st_size // 2 if cut == "data" else 20)
    for study in STUDIES:
        refused(world, ["run", study, "--preset", "quick", "--model", str(ckpt)], "--model", "model.safetensors",
                "cut short")
    refused(world, ["inspect", str(ckpt), "--parity"], "PATH", "cut short")


def _tiny_gguf(path: Path) -> Path:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_rope_freq_base(10000.0)
    writer.add_tensor("token_embd.weight", np.zeros((256, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("keep", [100, 2000, 50_000])  # inside the header, the tensor table, the tensor data
def test_a_truncated_gguf_is_one_line_in_inspect_and_run(tmp_path, world, keep):
    whole = _tiny_gguf(tmp_path / "tiny.gguf")
    assert CliRunner().invoke(main, ["inspect", str(whole)]).exit_code == 0  # the whole file reads
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:keep])
    refused(world, ["inspect", str(cut)], "PATH", "cut.gguf is cut short")
    refused(world, ["run", "pretrained-leakage", "--preset", "quick", "--model", str(cut)], "--model", "cut short")


def _with_tokenizer(ckpt: Path, n_tokens: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, n_tokens)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(ckpt)


@pytest.mark.parametrize("study", STUDIES)
def test_a_vocabulary_smaller_than_the_tokenizers_is_one_line(tiny, tmp_path, world, study):
    ckpt = _copy(tiny, "llama", tmp_path / "bigtok")  # 256 embedding rows
    _with_tokenizer(ckpt, 300)
    refused(world, ["run", study, "--preset", "quick", "--model", str(ckpt)], "--model", "300 tokens", "256 rows")
    fits = _copy(tiny, "llama", tmp_path / "fits")
    _with_tokenizer(fits, 200)
    from poslab.pretrained import load

    assert len(load(str(fits)).tokenizer) == 200  # a tokenizer within the embedding loads


def _partial_llama(tiny, dest: Path) -> Path:
    """A Llama config with partial_rotary_factor: transformers loads it and its own rotary ignores the
    factor, poslab's reads it, so with poslab's rotary in its place the forward fails."""
    ckpt = _copy(tiny, "llama", dest)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(dict(cfg, partial_rotary_factor=0.5)))
    return ckpt


@pytest.mark.parametrize("study", STUDIES)
def test_a_config_transformers_loads_but_cannot_run_is_one_line(tiny, tmp_path, world, study):
    ckpt = _partial_llama(tiny, tmp_path / "partial")
    refused(world, ["run", study, "--preset", "quick", "--model", str(ckpt)], "--model", "'llama'", "RuntimeError")
    refused(world, ["inspect", str(ckpt), "--parity"], "--parity", "RuntimeError")


@pytest.mark.parametrize("seeds", ["0", "-1"])
@pytest.mark.parametrize("study", list(EXPERIMENTS))
def test_seeds_below_one_are_refused_in_every_study(world, study, seeds):
    from poslab.studies import get_experiment

    preset = "quick" if "quick" in get_experiment(study).presets else next(iter(get_experiment(study).presets))
    refused(world, ["run", study, "--preset", preset, "--seeds", seeds], "seeds", "a positive integer")


# ----------------------------------------------------------------------------- item 2: refusal before any work

def _tiny_from_config(config, path: Path) -> Path:
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def test_a_model_type_whose_attention_poslab_does_not_record_is_refused_by_name(tmp_path, world):
    # OLMo (1) has no record (Falcon, the example, has one since its attention is recorded)
    olmo = _tiny_from_config(transformers.OlmoConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        vocab_size=256, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2), tmp_path / "olmo")
    line = refused(world, ["run", "pretrained-leakage", "--preset", "quick", "--model", str(olmo), *WITHOUT_BOS],
                   "--model", "'olmo'", "cannot record the attention")
    assert "llama" in line  # the types it can


def test_a_rotary_poslab_does_not_replace_is_refused_by_name_in_every_study_that_needs_it(tmp_path, world):
    gemma = _tiny_from_config(transformers.GemmaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=256, max_position_embeddings=64), tmp_path / "gemma")
    for study in ("pretrained-leakage", "pretrained-extension"):
        refused(world, ["run", study, "--preset", "quick", "--model", str(gemma)], "'gemma'")
    refused(world, ["run", "implementation", "--preset", "quick", "--set",
                    f"grid.model.checkpoint={json.dumps([CHAR, str(gemma)])}"], "'gemma'")


def test_attention_that_bypasses_the_recording_is_refused_never_stored_as_zeros(tiny, world, monkeypatch):
    """A Llama whose attention does not call transformers' attention interface (as Falcon's did in the
    issue): its type passes the record, the recording check's forward refuses it."""
    from transformers.models.llama import modeling_llama

    class Direct:  # every attention call goes to eager attention, whatever poslab registers
        @staticmethod
        def get_interface(name, default):
            return modeling_llama.eager_attention_forward

    monkeypatch.setattr(modeling_llama, "ALL_ATTENTION_FUNCTIONS", Direct())
    refused(world, ["run", "pretrained-leakage", "--preset", "quick", "--model", str(tiny("llama")), *WITHOUT_BOS],
            "did not pass through poslab's recording attention at layers 0, 1 of 2")


@pytest.mark.parametrize("spoil", [
    lambda p: torch.roll(p, 1, dims=-1),  # each row's weights moved one key later: onto a key it may not see
    lambda p: 2 * p,  # rows summing to 2
    lambda p: torch.zeros_like(p),  # the zeros the issue stored
])
def test_the_recording_check_wants_each_row_to_sum_to_1_over_the_keys_it_may_see(tiny, monkeypatch, spoil):
    from poslab.pretrained import load
    from poslab.pretrained.checks import preflight

    model = load(str(tiny("llama")))
    preflight(model, ("record", "schedule"))  # the real recording passes
    real = model.stream

    def leaky(batch, on_layer, intervention=None):
        def spoilt(i, scores, pattern):
            on_layer(i, scores, spoil(pattern))
        real(batch, spoilt, intervention)

    monkeypatch.setattr(model, "stream", leaky)
    with pytest.raises(ConfigError, match="recorded pattern at layer 0 is not"):
        preflight(model, ("record",))


def test_leakage_asks_for_a_schedule_only_where_its_modes_apply_one(tmp_path, world, monkeypatch):
    """A rotary type whose attention poslab records but whose rotary it does not replace: refused
    with BOS among the modes (the NTK variants set a schedule), accepted without BOS alone."""
    from poslab.experiments import validate
    from poslab.experiments.runner import prepare
    from poslab.pretrained import architectures as archs
    from poslab.studies import get_experiment

    gemma = _tiny_from_config(transformers.GemmaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=256, max_position_embeddings=64), tmp_path / "gemma")
    monkeypatch.setitem(archs.ARCHITECTURES, "gemma", archs.Architecture(model_type="gemma", record=True))
    refused(world, ["run", "pretrained-leakage", "--preset", "quick", "--model", str(gemma)],
            "cannot replace the rotary (to apply a schedule) of this 'gemma' model")
    exp = get_experiment("pretrained-leakage")
    validate(prepare(exp, "quick", checkpoint=str(gemma), overrides=WITHOUT_BOS[1:]), "cpu", exp)
