"""Chunking, query indexing and accuracy: on hand-built intermediates with known answers, and on a
full-sequence Transformer (one target per position, over the loss mask)."""

from __future__ import annotations

import math

import pytest
import torch

from poslab import probes
from poslab.errors import ConfigError
from poslab.models.intermediates import Intermediates, LayerIntermediates
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.tasks import build_task, eval_batch


def hand_built(x: torch.Tensor, lengths: torch.Tensor | None, prefix: int = 0) -> Intermediates:
    """Intermediates whose every per-layer tensor is ``x`` [b, h, i, j] (shapes only matter here)."""
    b, _, _, s = x.shape
    layer = LayerIntermediates(attn_scores=x, pattern=x, q=x, k=x, rot_q=x, rot_k=x, v=x,
                               resid_pre=torch.zeros(b, s, 1), resid_post=torch.zeros(b, s, 1))
    return Intermediates(embed=torch.zeros(b, s, 1), positions=torch.arange(s), layers=[layer], lengths=lengths,
                         prefix=prefix)


def test_correct_and_accuracy_of_per_sequence_and_per_position():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]])  # argmax 1, 0, 2
    targets = torch.tensor([1, 1, 2])
    assert probes.correct(logits, targets, torch.ones(3, dtype=torch.bool)) == (2, 3)
    assert probes.accuracy_of(logits, targets, torch.tensor([True, False, True])) == 1.0
    assert math.isnan(probes.accuracy_of(logits, targets, torch.zeros(3, dtype=torch.bool)))
    per_position = logits[None].expand(2, 3, 3)  # [b=2, s=3, m=3]
    targets2 = torch.tensor([[1, 0, 0], [0, 0, 1]])
    mask2 = torch.tensor([[True, True, False], [False, True, True]])
    assert probes.correct(per_position, targets2, mask2) == (3, 4)  # right at (0,0), (0,1), (1,1); wrong at (1,2)
    assert probes.accuracy_of(per_position, targets2, mask2) == 0.75
    with pytest.raises(ValueError):
        probes.correct(logits, targets2, mask2)


def test_last_query_indexing_with_and_without_bos():
    b, h, s = 3, 2, 5
    x = torch.arange(b * h * s * s, dtype=torch.float64).view(b, h, s, s)
    lengths = torch.tensor([4, 2, 3])
    inter = hand_built(x, lengths, prefix=1)
    assert probes.last_index(inter).tolist() == [4, 2, 3]
    assert probes.real_keys(inter).tolist() == [[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False]]
    rows = probes.at_last_query(x, inter)  # [b, h, s]
    for i, last in enumerate([4, 2, 3]):
        torch.testing.assert_close(rows[i], x[i, :, last])
    full = hand_built(x, None)
    assert probes.last_index(full).tolist() == [4, 4, 4]
    one_row = x[:, :, :1]  # a RetrievalHead's single query row is the last query
    torch.testing.assert_close(probes.at_last_query(one_row, inter), x[:, :, 0])


def test_split_batch_refuses_a_bad_chunk_and_keeps_order():
    batch = eval_batch(build_task("fixed_offset", m=5, K=2), 8, 10, seed=0)
    parts = list(probes.split_batch(batch, 3))
    assert [p.tokens.shape[0] for p in parts] == [3, 3, 3, 1]
    assert torch.equal(torch.cat([p.targets for p in parts]), batch.targets)
    for chunk in (0, -1, 2.5):
        with pytest.raises(ConfigError) as err:
            list(probes.split_batch(batch, chunk))
        assert err.value.field == "chunk"


@pytest.mark.parametrize("bos", [False, True])
def test_accuracy_of_a_full_sequence_model_counts_the_loss_mask(bos):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=5, d_model=16, n_layers=2, n_heads=4, max_len=24, bos=bos))
    batch = eval_batch(build_task("shift", m=5, K=2), (4, 12), 50, seed=0)
    hits = total = 0
    for i in range(50):  # one sequence at a time, unpadded
        L = int(batch.lengths[i])
        pred = model(batch.tokens[i:i + 1, :L])[0].argmax(-1)  # [L]
        keep = batch.loss_mask[i, :L]
        hits += int(((pred == batch.targets[i, :L]) & keep).sum())
        total += int(keep.sum())
    assert total == int(batch.loss_mask.sum())
    assert probes.accuracy(model, batch, chunk=7) == pytest.approx(hits / total)
    # from collected logits, chunk by chunk
    counts = [probes.correct(inter.logits, part.targets, part.loss_mask)
              for part, inter in probes.over_chunks(model, batch, chunk=16)]
    assert sum(c[0] for c in counts) / sum(c[1] for c in counts) == pytest.approx(hits / total)
