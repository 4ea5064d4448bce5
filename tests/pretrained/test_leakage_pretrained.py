"""The leakage probe on a pretrained checkpoint's intermediates (through its own collect): per
layer and head, at early queries, with the checkpoint's own sliding window."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from poslab.errors import ConfigError
from poslab.pretrained import load
from poslab.probes import leakage as lk
from poslab.tasks.base import Batch


def batch_of(b: int, L: int) -> Batch:
    tokens = torch.randint(0, 256, (b, L), generator=torch.Generator().manual_seed(0))
    return Batch(tokens=tokens, targets=tokens, lengths=torch.full((b,), L),
                 loss_mask=torch.ones_like(tokens, dtype=torch.bool))


def test_leakage_reads_a_pretrained_llama_per_layer_head_and_early_query(tiny):
    model = load(str(tiny("llama")))
    batch = batch_of(10, 12)
    out = lk.leakage(model, batch, early=4, chunk=4)
    assert out["component_b"].shape == (2, 4) and out["early_component_a"].shape == (2, 4)
    assert (out["component_a"] > 0).all()  # causal mask: the normaliser depends on the query position
    one = lk.leakage(model, batch, early=4, layers=[1])
    np.testing.assert_allclose(one["component_b"], out["component_b"][1:], atol=1e-9)


def test_a_sliding_window_checkpoint_uses_its_own_window(tiny):
    model = load(str(tiny("mistral")))
    assert model.cfg.window == 16
    batch = batch_of(6, 24)
    out = lk.leakage(model, batch)  # the softmax check passes only with the window of 16
    assert out["component_a"].shape == (2, 4)
    with pytest.raises(ConfigError, match="model"):  # the same intermediates read as full causal attention
        lk.leakage_of([model.collect(batch)], window=None)
