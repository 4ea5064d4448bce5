"""Full-sequence shift: targets and masks checked position by position."""

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import Shift


def test_docstring_examples():
    tokens = torch.tensor([[5, 1, 8, 8, 3], [6, 2, 9, 0, 0]])
    lengths = torch.tensor([5, 3])
    targets, mask = Shift(K=2).label(tokens, lengths)
    assert mask.tolist() == [[False, False, True, True, True], [False, False, True, False, False]]
    assert targets[mask].tolist() == [5, 1, 8, 6]
    targets, mask = Shift(K=1).label(tokens[:1], lengths[:1])
    assert targets[0, 1:].tolist() == [5, 1, 8, 8] and not mask[0, 0]


@pytest.mark.parametrize("K", [1, 3])
def test_sample_matches_hand_indexing(K):
    batch = Shift(m=7, K=K).sample(torch.Generator().manual_seed(3), 16, (4, 9))
    assert batch.targets.shape == batch.loss_mask.shape == batch.tokens.shape == (16, 9)
    for row, y, keep, L in zip(batch.tokens.tolist(), batch.targets.tolist(), batch.loss_mask.tolist(),
                               batch.lengths.tolist(), strict=False):
        for t in range(9):
            assert keep[t] == (K <= t < L)
            assert y[t] == (row[t - K] if keep[t] else 0)


def test_chance_and_kind():
    assert Shift(m=20).chance == pytest.approx(0.05)
    assert Shift().target_kind == "sequence"


def test_offset_must_fit():
    with pytest.raises(ConfigError) as err:
        Shift(K=4).validate(4)
    assert err.value.field == "K" and "[1, 3]" in str(err.value)
