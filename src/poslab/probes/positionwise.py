"""Next-token loss at each position of a window, averaged over a text's windows.

    loss_t = mean_w CE(logits_{w,t}, c_{w,t+1}),    t = 0 .. L - 1

One forward per chunk of windows (the model's own, so anything longer than memory allows goes
through :func:`poslab.probes.lm_streaming.positionwise_loss` instead). The LM studies read the
same three things from it: the overall loss, the greedy next-token accuracy and the loss in
equal-width position buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.tasks.base import Batch


@dataclass(frozen=True)
class PositionLosses:
    per_position: Tensor  # [L] float64: mean cross-entropy at each position over the windows
    windows: int
    hits: int  # greedy next-token hits over every position of every window

    @property
    def loss(self) -> float:
        return float(self.per_position.mean())

    @property
    def accuracy(self) -> float:
        return self.hits / (self.windows * len(self.per_position))


def position_losses(model: nn.Module, batches: Iterable[Batch], device) -> PositionLosses:
    """Mean cross-entropy per position of ``model`` over every window of ``batches`` (one length)."""
    total: Tensor | None = None
    windows = hits = 0
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(device)
            logits = model(batch.tokens)  # [b, L, m]
            ce = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none").double().sum(0).cpu()
            total = ce if total is None else total + ce
            hits += int((logits.argmax(-1) == batch.targets).sum())
            windows += batch.size
    if total is None:
        raise ValueError("position_losses: no windows")
    return PositionLosses(total / windows, windows, hits)


def bucket_rows(losses: PositionLosses, width: int, **fields) -> list[dict]:
    """One ``positionwise`` row per run of ``width`` positions: its first and last position, its
    midpoint and the mean loss over it."""
    per, L = losses.per_position, len(losses.per_position)
    return [dict(probe="positionwise", **fields, bucket_start=lo, bucket_end=min(lo + width, L) - 1,
                 position=(lo + min(lo + width, L) - 1) / 2, loss=float(per[lo:lo + width].mean()),
                 windows=losses.windows) for lo in range(0, L, width)]


def loss_rows(model_at: Callable[[int], nn.Module], text, lengths: Sequence[int], width: int, *, n: int,
              chunk: int, device) -> list[dict]:
    """Per length L: a ``loss`` row (mean over all positions) and :func:`bucket_rows`, over at most
    ``n`` non-overlapping windows of ``text`` (a text task with ``windows``), ``model_at(L)`` the
    model evaluated at that length (a length-dependent schedule gives one per length)."""
    rows = []
    for L in lengths:
        got = position_losses(model_at(L), text.windows(L, batch_size=chunk, limit=n), device)
        rows.append(dict(probe="loss", length=L, loss=got.loss, windows=got.windows))
        rows += bucket_rows(got, width, length=L)
    return rows
