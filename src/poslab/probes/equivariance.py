"""Offset equivariance and kernel uniqueness, as pure functions of mean-attention rows and profiles.

Lemma 1 (equivariance): a rotary logit depends on positions only through delta = t - n, so a
head's attention-by-offset profile, restricted to the offsets present at every length and
renormalized over them, is the same at every length:

    p_L(delta) = a_L(delta) / sum_{delta' in W} a_L(delta'),   W = {-(w - 1), ..., 0}

(the softmax's normaliser cancels in the ratio; the mean over sequences makes it approximate).
Lemma 2 (uniqueness) is a separate question: whether the kernel phi(delta) over the whole range
[-(L - 1), 0] has its single maximum at -K, or a secondary peak (a rotary kernel with few
frequencies realigns: d_head = 16 has peaks near 19-21 and 38-40 steps from its main one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from poslab.probes.attention import as_row


def window_profile(mean_attn_row: np.ndarray, L: int, width: int) -> np.ndarray:
    """The last query's mean attention at offsets -(width - 1) .. 0, renormalized to sum 1, [width].

    ``mean_attn_row`` [L] holds key positions 0 .. L - 1 (the query sits at L - 1)."""
    if not 1 <= width <= L:
        raise ValueError(f"width must be in [1, L={L}], got {width}")
    window = as_row(mean_attn_row, L)[L - width:].astype(np.float64)
    return window / window.sum()


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """0.5 sum |p - q| of two distributions of one shape (0 equal, 1 disjoint)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"shapes differ: {p.shape} and {q.shape}")
    return float(0.5 * np.abs(p - q).sum())


def secondary_peak(values: Sequence[float] | np.ndarray, offsets: Sequence[int] | np.ndarray) -> dict:
    """The global maximum of a profile over integer offsets and its highest other local maximum.

    Returns ``argmax`` (offset of the maximum), ``second`` (offset of the highest strict local
    maximum other than the global one; None if there is none), ``ratio`` (its value over the
    maximum's; NaN if none), ``unique`` (the maximum is attained once)."""
    v = np.asarray(values, dtype=np.float64)
    o = np.asarray(offsets)
    if v.ndim != 1 or v.shape != o.shape or len(v) == 0:
        raise ValueError("values and offsets must be equal-length 1-d sequences")
    top = int(v.argmax())
    left = np.r_[-np.inf, v[:-1]]
    right = np.r_[v[1:], -np.inf]
    local = np.flatnonzero((v > left) & (v > right))
    local = local[local != top]
    unique = int((v == v[top]).sum()) == 1
    if len(local) == 0:
        return dict(argmax=int(o[top]), second=None, ratio=float("nan"), unique=unique)
    s = int(local[v[local].argmax()])
    return dict(argmax=int(o[top]), second=int(o[s]), ratio=float(v[s] / v[top]), unique=unique)


__all__ = ["secondary_peak", "total_variation", "window_profile"]
