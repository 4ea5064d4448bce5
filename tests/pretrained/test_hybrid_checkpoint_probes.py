"""Issue 57 item 3: the per-layer-type probes on hybrid checkpoints (tiny random Llama 4, SmolLM3,
Cohere2 from their architecture records): each layer's kind is the checkpoint's own pattern, every
layer gets its attention targets, and seed 001's (b) runs with each layer's window, chunked layers out."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
import torch  # noqa: E402

from poslab.pretrained import load  # noqa: E402
from poslab.probes import layer_types as lt  # noqa: E402
from poslab.tasks.base import Batch  # noqa: E402

S = 24  # past Llama 4's chunk of 8, past Cohere2's window of 16


def batch_of(n=4, s=S):
    x = torch.randint(0, 256, (n, s), generator=torch.Generator().manual_seed(3))
    return Batch(tokens=x, targets=x, loss_mask=torch.ones_like(x, dtype=torch.bool), lengths=torch.full((n,), s))


@pytest.mark.parametrize("kind, types", [
    ("llama4", ["rope+chunk 8"] * 3 + ["nope"]),
    ("smollm3", ["rope"] * 3 + ["nope"]),
    ("cohere2", ["rope+window 16"] * 3 + ["nope"]),
])
def test_per_layer_type_probes_on_a_hybrid_checkpoint(tiny, kind, types):
    model = load(tiny(kind))
    kinds = lt.layer_kinds(model)
    assert [k.type for k in kinds] == types
    b = batch_of()
    rows = lt.target_rows(model, b, chunk=2)
    assert len(rows) == model.n_layers * model.n_heads
    for r in rows:
        assert 0 <= r["key0"] <= 1 and 0 <= r["recent"] <= 1 + 1e-6 and r["distance"] >= 0
        if r["chunk"] is not None:  # only queries 1 .. chunk - 1 see key 0
            assert r["key0"] <= (r["chunk"] - 1) / (S - 1) + 1e-6
        if r["window"] is not None:  # a window of w keys: no key farther than w - 1
            assert r["distance"] <= r["window"] - 1
    leak = lt.leakage_rows(model, b, chunk=2)
    assert len(leak) == model.n_layers * model.n_heads
    for r in leak:
        if r["chunk"] is None:  # the leakage probes' softmax check passed with this layer's window
            assert math.isfinite(r["component_b"]) and math.isfinite(r["component_a"])
        else:
            assert r["component_b"] is None and r["na"] == lt.CHUNKED_WHY
