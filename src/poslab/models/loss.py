"""The one training objective every model shares: cross-entropy over the batch's loss mask."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from poslab.tasks.base import Batch

IGNORE = -100  # the target index cross_entropy skips


def masked_cross_entropy(logits: Tensor, batch: Batch) -> Tensor:
    """Mean cross-entropy over ``batch.loss_mask``: one target per sequence or one per position.

    logits [b, m] with targets [b], or [b, s, m] with targets [b, s]; full-sequence logits with
    one target per sequence are read at each sequence's last position, L - 1. Masked targets
    become ``ignore_index``, which gives bit for bit the plain mean when nothing is masked.
    With ``batch.loss_weight`` w: sum(w ce) / sum(w) over the mask (a weighted mean).
    """
    targets = batch.targets.masked_fill(~batch.loss_mask, IGNORE)
    logits = aligned_logits(logits, batch)
    if batch.loss_weight is None:
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE)
    ce = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE, reduction="none")
    weight = batch.loss_weight.flatten() * batch.loss_mask.flatten()
    return (ce * weight).sum() / weight.sum()


def aligned_logits(logits: Tensor, batch: Batch) -> Tensor:
    """Logits shaped like the targets: full-sequence logits [b, s, m] are read at L - 1 when the
    task has one target per sequence (targets [b]); otherwise returned as they are."""
    if logits.dim() == 3 and batch.targets.dim() == 1:
        last = (batch.lengths - 1)[:, None, None].expand(-1, 1, logits.shape[-1])
        return logits.gather(1, last)[:, 0]  # [b, m]
    return logits
