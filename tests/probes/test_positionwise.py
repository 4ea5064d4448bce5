"""The LM studies' loss by position: one window at a time by hand against position_losses."""

import torch
import torch.nn.functional as F

from poslab.models.transformer import Transformer, TransformerConfig
from poslab.probes.positionwise import bucket_rows, position_losses
from poslab.tasks.base import Batch


def test_position_losses_and_buckets_equal_a_naive_loop():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, max_len=12,
                                          encoding="rope")).eval()
    tokens = torch.randint(0, 11, (5, 10), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 11, (5, 10), generator=torch.Generator().manual_seed(2))
    def batch(i):
        t = tokens[i:i + 2]
        return Batch(tokens=t, targets=targets[i:i + 2], loss_mask=torch.ones(len(t), 10, dtype=torch.bool),
                     lengths=torch.full((len(t),), 10))

    batches = [batch(i) for i in range(0, 5, 2)]  # chunks of 2, 2, 1 windows
    got = position_losses(model, batches, "cpu")
    with torch.no_grad():
        per_window = [F.cross_entropy(model(tokens[w:w + 1])[0], targets[w], reduction="none") for w in range(5)]
        hits = sum(int((model(tokens[w:w + 1])[0].argmax(-1) == targets[w]).sum()) for w in range(5))
    naive = torch.stack(per_window).double().mean(0)
    torch.testing.assert_close(got.per_position, naive, rtol=1e-6, atol=1e-6)
    assert got.windows == 5 and got.hits == hits and got.accuracy == hits / 50
    rows = bucket_rows(got, 4, length=10)
    assert [(r["bucket_start"], r["bucket_end"]) for r in rows] == [(0, 3), (4, 7), (8, 9)]
    assert rows[2]["loss"] == float(got.per_position[8:].mean()) and rows[1]["position"] == 5.5
    assert abs(rows[0]["loss"] - float(naive[:4].mean())) < 1e-6
