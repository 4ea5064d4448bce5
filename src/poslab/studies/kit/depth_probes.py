"""Probes of a multi-layer causal transformer the next-step studies share (issue 39, item 3).

    last-query attention   a_{layer,h}(j) = mean_b pattern_{layer,h}[L_b - 1, j]      [layers, h, L]
    peak offset            argmax_j a(j) - (L - 1)                                   per layer and head
    offset share           mean over real queries i >= -delta of pattern[i, i + delta]   (delta = -1: previous token)

A study of a last-position task (``fixed_offset``) reads :func:`last_query_rows`; a study of a
full-sequence task reads :func:`offset_share` from the mean pattern (:func:`poslab.probes.mean_pattern`).

Notation: b batch, h head, i query index, j key index, L length.
"""

from __future__ import annotations

import numpy as np
import torch

from poslab import probes
from poslab.models.loss import aligned_logits
from poslab.probes.attention import attention_sum
from poslab.probes.common import correct, one_length, over_chunks


def last_query(model, batch, chunk: int) -> tuple[float, np.ndarray]:
    """(accuracy of a last-position task, the last query's mean attention ``[layers, h, L]``) in one pass."""
    L = one_length(batch)
    hits = total = 0
    attn: torch.Tensor | None = None
    for part, inter in over_chunks(model, batch, chunk):
        assert inter.logits is not None  # collect sets them
        h, t = correct(aligned_logits(inter.logits, part), part.targets, part.loss_mask)
        hits, total = hits + h, total + t
        sums = torch.stack([attention_sum(inter, n, L + inter.prefix) for n in range(len(inter.layers))])
        attn = sums if attn is None else attn + sums
    assert attn is not None  # one chunk at least
    return hits / total, (attn / batch.tokens.shape[0]).numpy()


def last_query_rows(attn: np.ndarray, L: int, K: int, **extra) -> list[dict]:
    """One ``probe="head"`` row per (layer, head) of the last query's mean attention ``[layers, h, L]``:
    its peak offset, position and height, and a* (the weight at -K)."""
    return [dict(probe="head", length=L, layer=layer, head=h, **extra, **probes.peak(attn[layer, h], L),
                 a_star=float(attn[layer, h, L - 1 - K]))
            for layer in range(attn.shape[0]) for h in range(attn.shape[1])]


def offset_share(pattern: np.ndarray, delta: int, queries: np.ndarray | None = None) -> np.ndarray:
    """Mean over queries i (``queries``: a boolean mask over i; default every i with a key at
    i + delta) of the mean pattern's weight at key i + delta, ``[layers, h]``; NaN where no query counts.

    ``pattern``: :func:`poslab.probes.mean_pattern`'s ``[layers, h, i, j]`` (NaN rows: no sequence had query i)."""
    n = pattern.shape[-1]
    i = np.arange(n)
    ok = (i + delta >= 0) & (i + delta < n)
    if queries is not None:
        ok &= queries
    if not ok.any():
        return np.full(pattern.shape[:2], np.nan)
    w = pattern[:, :, i[ok], i[ok] + delta]  # [layers, h, queries]
    return np.nanmean(w, axis=-1)


def argmax_share(pattern: np.ndarray, key_of: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Share of the ``queries`` (a boolean mask over i) whose mean-pattern argmax key is ``key_of[i]``,
    ``[layers, h]``."""
    if not queries.any():
        return np.full(pattern.shape[:2], np.nan)
    filled = np.where(np.isnan(pattern), -np.inf, pattern)
    hit = filled.argmax(-1)[:, :, queries] == key_of[queries]  # [layers, h, queries]
    return hit.mean(-1)


__all__ = ["argmax_share", "last_query", "last_query_rows", "offset_share"]
