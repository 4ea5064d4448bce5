import math

import torch

from poslab.tasks.base import Batch
from poslab.tasks.scoring import sequence_scores


def _batch(targets, mask):
    t = torch.tensor(targets)
    return Batch(tokens=torch.zeros_like(t), targets=t, loss_mask=torch.tensor(mask),
                 lengths=torch.full((len(t),), t.shape[1]))


def test_scores_count_only_output_positions():
    batch = _batch([[5, 1, 2, 3], [5, 1, 2, 3], [0, 0, 0, 0]],
                   [[False, True, True, True], [False, True, True, True], [False, False, False, False]])
    pred = torch.tensor([[9, 1, 2, 3], [5, 1, 0, 3], [0, 0, 0, 0]])
    acc, exact = sequence_scores(pred, batch)
    assert torch.allclose(acc[:2], torch.tensor([1.0, 2 / 3]))
    assert exact[:2].tolist() == [1.0, 0.0]
    assert math.isnan(acc[2]) and math.isnan(exact[2])


def test_copying_the_answer_scores_one():
    batch = _batch([[3, 4, 5]], [[True, False, True]])
    acc, exact = sequence_scores(batch.targets, batch)
    assert acc.item() == 1.0 and exact.item() == 1.0
