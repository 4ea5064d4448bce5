"""Per-head summaries of a multi-head retrieval model (the head-count study).

Attention peaks per query class, for content-conditioned retrieval (the target offset depends
on the query token: K1 for tokens < m/2, K2 for the others): averaging attention over both
classes first puts the K1 and K2 peaks at different keys and halves the height, so
:func:`class_peaks` takes each class's own mean attention. :func:`head_summaries`: each head's
carrier energies and top singular-value energy of W.
"""

from __future__ import annotations

import numpy as np
import torch

from poslab.probes.carriers import accuracy_and_attention, carrier, rank_concentrations


def class_peaks(model, batch, m: int, chunk: int) -> np.ndarray:
    """Per query class (token < m/2, token >= m/2) and head, the maximum over key positions of the
    class's mean attention, [2, h] (NaN for a class with no query)."""
    query = batch.tokens[torch.arange(len(batch.lengths)), batch.lengths - 1]  # [b]
    out = np.full((2, model.cfg.n_heads), np.nan)
    for c, members in enumerate((query < m // 2, query >= m // 2)):
        if members.any():
            _, attn = accuracy_and_attention(model, batch[members.nonzero()[:, 0]], chunk=chunk)  # [h, L]
            out[c] = attn.max(-1)
    return out


def peak_heights(model, batch, m: int, chunk: int, attn: np.ndarray) -> dict:
    """Peak attention of the batch's mean attention ``attn`` [h, L] and of each query class's
    (:func:`class_peaks`): ``peak_height`` per class, highest head, mean over the classes (NaN
    classes skipped); ``peak_height_mean`` the same over heads instead of the highest; the two
    classes' own highest (``peak_class0``, ``peak_class1``); pooled over both classes first
    (``peak_pooled``, highest head; ``peak_pooled_mean``, mean head)."""
    pooled, per_class = attn.max(-1), class_peaks(model, batch, m, chunk)
    return dict(peak_height=float(np.nanmean(per_class.max(-1))),
                peak_height_mean=float(np.nanmean(per_class.mean(-1))),
                peak_class0=float(per_class[0].max()), peak_class1=float(per_class[1].max()),
                peak_pooled=float(pooled.max()), peak_pooled_mean=float(pooled.mean()))


def head_summaries(model, batch) -> list[dict]:
    """Per head h (in order): its carrier energies ``carrier_q``, ``carrier_k`` on the batch and the
    top singular-value energy of its W = W_Q^T W_K (``rank_concentration``)."""
    c = carrier(model, batch, head=None)
    rank = rank_concentrations(model.W_Q, model.W_K, model.cfg.n_heads)
    return [dict(carrier_q=float(c["carrier_q_heads"][h]), carrier_k=float(c["carrier_k_heads"][h]),
                 rank_concentration=float(rank[h])) for h in range(model.cfg.n_heads)]
