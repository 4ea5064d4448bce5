"""A GGUF header is parsed once per load and per ``inspect --parity`` (issue 54, item 6: Gemma 3's
parity in time). gguf's reader builds numpy views of every header field, 14.6 s for Gemma 3 270M's
vocabulary here; before ``shared_gguf_reader`` a load built it 4 times and ``inspect
--parity`` 6 times (docs/pretrained.md, "Gemma 3's parity in time"). A tiny llama GGUF written here
stands in for it: the count of readers is the same whatever the vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
pytest.importorskip("gguf", reason="the pretrained extra (gguf) is not installed")
import gguf
import numpy as np
import torch
from click.testing import CliRunner

from poslab.cli import main
from poslab.pretrained.loading import gguf_metadata, shared_gguf_reader
from poslab.pretrained.model import load

VOCAB, WIDTH, FFN = 256, 64, 128


def _tiny_llama_gguf(path: Path, seed: int = 0) -> np.ndarray:
    """A whole one-block llama GGUF (float32, no tokenizer) at ``path``; its token embedding."""
    rng = np.random.default_rng(seed)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(WIDTH)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(WIDTH // 4)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(VOCAB)
    embedding = weight(VOCAB, WIDTH)
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, np.float32))
    writer.add_tensor("output.weight", weight(VOCAB, WIDTH))
    for name, shape in [("attn_q", (WIDTH, WIDTH)), ("attn_k", (WIDTH, WIDTH)), ("attn_v", (WIDTH, WIDTH)),
                        ("attn_output", (WIDTH, WIDTH)), ("ffn_gate", (FFN, WIDTH)), ("ffn_up", (FFN, WIDTH)),
                        ("ffn_down", (WIDTH, FFN))]:
        writer.add_tensor(f"blk.0.{name}.weight", weight(*shape))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(WIDTH, np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(WIDTH, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return embedding


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """The paths of every gguf.GGUFReader built from here on (poslab's and transformers' alike)."""
    paths: list[str] = []
    original = gguf.GGUFReader

    class Counting(original):  # type: ignore[misc, valid-type]
        def __init__(self, path, *args, **kwargs):
            paths.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    return paths


def test_load_parses_the_gguf_header_once_and_reads_its_weights(tmp_path, built):
    path = tmp_path / "tiny.gguf"
    embedding = _tiny_llama_gguf(path)
    counting = gguf.GGUFReader
    model = load(str(path), quiet=True)
    assert built == [str(path)]  # config, transformers' config, weights (and tokenizer try): one reader
    assert gguf.GGUFReader is counting  # the reader class is back after the load
    assert torch.equal(model.hf.get_input_embeddings().weight, torch.from_numpy(embedding))
    assert torch.isfinite(model(torch.arange(8)[None])).all()


def test_inspect_parity_parses_the_gguf_header_once(tmp_path, built):
    path = tmp_path / "tiny.gguf"
    _tiny_llama_gguf(path)
    result = CliRunner().invoke(main, ["inspect", str(path), "--parity"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.output.rstrip().endswith("parity: pass")
    assert built == [str(path)]  # refusal checks, load, the table's rows: one reader


def test_one_reader_per_file_and_version_within_the_block_only(tmp_path, built):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _tiny_llama_gguf(a)
    _tiny_llama_gguf(b, seed=1)
    with shared_gguf_reader():
        first = gguf.GGUFReader(str(a))
        assert gguf.GGUFReader(str(a)) is first
        with shared_gguf_reader():  # nested: the same sharing
            assert gguf.GGUFReader(str(a)) is first
        assert gguf.GGUFReader(str(b)) is not first
        assert gguf_metadata(str(a))["general.architecture"] == "llama"
        assert built == [str(a), str(b)]
        with open(a, "ab") as f:  # the file changes: its reader is built again
            f.write(b"\0" * 64)
        assert gguf.GGUFReader(str(a)) is not first
        assert len(built) == 3
    gguf_metadata(str(b))  # outside the block every read builds its own
    assert len(built) == 4
