"""The shared encoder presentation (poslab.tasks.chomsky.format) against its worked example and a
naive per-row construction."""

from __future__ import annotations

import pytest
import torch

from poslab.tasks.chomsky.format import EMPTY, PAD, encoder_batch, encoder_inputs, encoder_lists, encoder_vocab_size

F, T = False, True


def test_worked_example():
    batch = encoder_lists([[1, 1, 1], [0, 2]], [[1], [2, 0, 0]], scored=[1, 1])
    assert batch.tokens.tolist() == [[3, 3, 3, 1, 0], [2, 4, 1, 1, 1]]
    assert batch.lengths.tolist() == [4, 5]
    assert batch.targets.tolist() == [[0, 0, 0, 1, 0], [0, 0, 2, 0, 0]]
    assert batch.loss_mask.tolist() == [[F, F, F, T, F], [F, F, T, F, F]]
    assert batch.tokens.dtype == torch.long and batch.targets.dtype == torch.long
    assert batch.loss_mask.dtype == torch.bool


@pytest.mark.parametrize("scored", [None, [0, 2, 1]])
def test_lists_match_naive(scored):
    inputs = [[0, 4, 3, 1], [2], [1, 1]]
    outputs = [[3], [0, 1, 4, 2], [1, 0]]
    batch = encoder_lists(inputs, outputs, scored)
    width = max(len(x) + len(y) for x, y in zip(inputs, outputs, strict=True))
    assert batch.tokens.shape == (3, width)
    for i, (x, y) in enumerate(zip(inputs, outputs, strict=True)):
        seq = [v + 2 for v in x] + [EMPTY] * len(y)
        L, k = len(seq), len(y) if scored is None else scored[i]
        assert int(batch.lengths[i]) == L
        assert batch.tokens[i].tolist() == seq + [PAD] * (width - L)
        assert batch.targets[i].tolist() == [0] * len(x) + y + [0] * (width - L)
        assert batch.loss_mask[i].tolist() == [F] * len(x) + [T] * k + [F] * (width - len(x) - k)


def test_inputs_round_trip_and_width():
    inputs = [[0, 4, 3, 1], [2], [1, 0]]
    batch = encoder_lists(inputs, [[3], [0, 1, 4, 2], [1, 0]])
    x, n = encoder_inputs(batch.tokens)
    assert n.tolist() == [4, 1, 2]
    assert [x[i, :len(r)].tolist() for i, r in enumerate(inputs)] == inputs
    wide = encoder_batch(x, n, batch.targets[:, -4:] * 0, torch.tensor([1, 4, 2]), width=9)
    assert wide.tokens.shape == (3, 9) and torch.equal(wide.tokens[:, :5], batch.tokens)
    assert not wide.tokens[:, 5:].any() and not wide.loss_mask[:, 5:].any()
    with pytest.raises(ValueError):
        encoder_batch(x, n, x, torch.tensor([1, 4, 2]), width=4)
    with pytest.raises(ValueError):
        encoder_batch(x, n, x, torch.tensor([1, 4, 2]), torch.tensor([2, 0, 0]))


def test_vocab_size():
    assert encoder_vocab_size(2, 2) == 4  # PAD, EMPTY, two symbols
    assert encoder_vocab_size(3, 5) == 5  # cycle_navigation: 5 classes outnumber the 3 + 2 ids
