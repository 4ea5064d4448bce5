"""Scores of sequence-output tasks: per-token accuracy and whole-sequence exact match.

The length-generalization benchmarks (Ruoss et al. 2023; Kazemnejad et al. 2023) score a model
on its output tokens only: the positions where ``batch.loss_mask`` is True. Per sequence::

    token_accuracy = (# output positions predicted right) / (# output positions)
    exact_match    = 1 if every output position is predicted right, else 0

A sequence with no output position scores NaN for both (it has nothing to score).
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.tasks.base import Batch


def sequence_scores(predictions: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
    """(token accuracy [b], exact match [b]) of ``predictions`` (int [b, s], one token per position,
    the argmax of the logits) against ``batch.targets`` over ``batch.loss_mask``."""
    if batch.targets.ndim != 2:
        raise ValueError("sequence_scores needs per-position targets [b, s]")
    mask = batch.loss_mask
    right = (predictions == batch.targets) & mask
    count = mask.sum(-1)
    accuracy = right.sum(-1) / count
    exact = (right.sum(-1) == count).to(accuracy.dtype)
    nan = torch.full_like(accuracy, float("nan"))
    return torch.where(count > 0, accuracy, nan), torch.where(count > 0, exact, nan)
