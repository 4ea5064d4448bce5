"""Next-token loss at each position of a window, averaged over a text's windows.

    loss_t = mean_w CE(logits_{w,t}, c_{w,t+1}),    t = 0 .. L - 1

One forward per chunk of windows (the model's own, so anything longer than memory allows goes
through :func:`poslab.probes.lm_streaming.positionwise_loss` instead). The LM studies read the
same three things from it: the overall loss, the greedy next-token accuracy and the loss in
equal-width position buckets. :func:`bend_rows` reads the buckets against a predicted bound
(where the loss should start to rise, e.g. the RoPE scaling law's T_extra).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
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


def bend_rows(rows: list[dict], L0: int, delta: float, sharp: float) -> list[dict]:
    """Per method with a predicted bound (a ``scaling_law`` row: method, seed,
    ``extrapolation_bound``) and seed, on its ``positionwise`` rows of the longest windows
    (``longest``): the reference loss (buckets in [L0/2, L0)), the mean rise over buckets in
    [L0, bound) and past the bound, and the first bucket from L0 on whose loss exceeds the
    reference by ``delta`` (None if none does), and the same for a rise above ``sharp`` (a
    control) with its start over the bound."""
    out = []
    for law in (r for r in rows if r.get("probe") == "scaling_law"):
        m, seed, bound = law["method"], law["seed"], law["extrapolation_bound"]
        pos = _longest_buckets(rows, m, seed)
        in_range = [r["loss"] for r in pos if L0 // 2 <= r["bucket_start"] and r["bucket_end"] < L0]
        if in_range:
            out.append(dict(probe="bend", method=m, seed=seed, bound=bound,
                            **_bend(pos, float(np.mean(in_range)), L0, bound, delta, sharp)))
    return out


def _longest_buckets(rows: list[dict], method, seed) -> list[dict]:
    """The ``positionwise`` rows of one method and seed on its longest windows, by bucket start."""
    return sorted((r for r in rows if r.get("probe") == "positionwise" and r.get("longest") and r["method"] == method
                   and r["seed"] == seed), key=lambda r: r["bucket_start"])


def _bend(pos: list[dict], ref: float, L0: int, bound, delta: float, sharp: float) -> dict:
    """:func:`bend_rows`'s columns of one method and seed, from its buckets ``pos`` and reference loss ``ref``."""
    flat = [r["loss"] - ref for r in pos if r["bucket_start"] >= L0 and r["bucket_end"] < bound]
    past = [r["loss"] - ref for r in pos if r["bucket_start"] >= bound]
    rising = [r["bucket_start"] for r in pos if r["bucket_start"] >= L0 and r["loss"] - ref > delta]
    steep = [r["bucket_start"] for r in pos if r["bucket_start"] >= L0 and r["loss"] - ref > sharp]
    return dict(ref=ref, flat_rise=float(np.mean(flat)) if flat else None,
                past_rise=float(np.mean(past)) if past else None,
                bend=rising[0] if rising else None, sharp_bend=steep[0] if steep else None,
                sharp_over_bound=steep[0] / bound if steep else None)
