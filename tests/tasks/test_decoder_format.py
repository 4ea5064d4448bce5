"""The shared decoder presentation (poslab.tasks.decoder_format) against its worked example."""

from __future__ import annotations

import pytest
import torch

from poslab.tasks.decoder_format import decoder_batch, decoder_label, decoder_lists

F, T = False, True


def test_worked_example():
    batch = decoder_batch(torch.tensor([[5, 6, 7], [5, 0, 0]]), torch.tensor([3, 1]),
                          torch.tensor([[7, 6, 5], [5, 0, 0]]), torch.tensor([3, 1]), sep=1, eos=2)
    assert batch.tokens.tolist() == [[5, 6, 7, 1, 7, 6, 5, 2], [5, 1, 5, 2, 0, 0, 0, 0]]
    assert batch.lengths.tolist() == [8, 4]
    assert batch.targets.tolist() == [[6, 7, 1, 7, 6, 5, 2, 0], [1, 5, 2, 0, 0, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[F, F, F, T, T, T, T, F], [F, T, T, F, F, F, F, F]]
    assert batch.targets.dtype == torch.long and batch.loss_mask.dtype == torch.bool


@pytest.mark.parametrize("sep,eos", [(1, 2), (None, 2), (1, None), (None, None)])
def test_lists_match_naive_and_label(sep, eos):
    inputs = [[9, 3, 4, 8], [9, 5], [9]]
    outputs = [[6], [7, 7, 7, 7, 7], []]
    batch = decoder_lists(inputs, outputs, sep=sep, eos=eos)
    for i, (x, y) in enumerate(zip(inputs, outputs, strict=True)):
        seq = x + ([sep] if sep is not None else []) + y + ([eos] if eos is not None else [])
        L = len(seq)
        assert int(batch.lengths[i]) == L
        assert batch.tokens[i, :L].tolist() == seq and not batch.tokens[i, L:].any()
        scored = [p for p in range(batch.tokens.shape[1]) if batch.loss_mask[i, p]]
        first = len(x) + (sep is not None) - 1
        assert scored == list(range(first, L - 1))
        assert [int(batch.targets[i, p]) for p in scored] == seq[first + 1:]
    if sep is not None:
        targets, mask = decoder_label(batch.tokens, batch.lengths, sep)
        assert torch.equal(targets, batch.targets) and torch.equal(mask, batch.loss_mask)


def test_label_needs_boundary():
    with pytest.raises(ValueError):
        decoder_label(torch.tensor([[3, 4, 5]]), torch.tensor([3]), 1)
