"""Attention patterns, model-independent: mean attention per layer and head, peak, pinning.

    a_{b,h}(j)        = pattern_{b,h}[last(b), j]           the last query's weights over keys j
    mean attention    = mean_b a_{b,h}(j)                    [h, L]   (one length L per batch)
    mean pattern      = mean_{b : i real} pattern_{b,h}[i, j]   [h, s, s]
    (ii) peak         t* = argmax_j mean_b a(j),  peak offset = t* - (L - 1)   (-K for the target)
         a*           = mean attention at offset -K
    pinning           the peak's absolute key position across (unseen) lengths (Proposition 2)

The pure functions read :class:`~poslab.models.intermediates.Intermediates` and return sums over
the chunk's sequences, so chunked results add up; the ``model, batch`` functions drive them
over :func:`~poslab.probes.common.over_chunks`. Row functions (:func:`peak`,
:func:`attention_at_offset`, :func:`pinned_position`) take one head's mean row ``[L]``.

Key positions are indices on the intermediates' sequence axis: token positions 0 .. L - 1, or
with BOS the BOS at 0 and tokens at 1 .. L (pass ``L + 1`` to :func:`peak`; offsets are then
still key minus query). For linear attention the weights are the unnormalised ones the model uses.

Notation: b batch, h head, i query index, j key index, s sequence index, L length, K offset.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.models.intermediates import Intermediates
from poslab.probes.common import CHUNK, Collects, at_last_query, one_length, over_chunks, real_keys
from poslab.tasks.base import Batch

# ----------------------------------------------------------------------------- pure: sums over a chunk

def last_query_attention(inter: Intermediates, layer: int = 0) -> Tensor:
    """Each sequence's last-query attention weights over keys, [b, h, s]."""
    return at_last_query(inter.layers[layer].pattern, inter)


def attention_sum(inter: Intermediates, layer: int = 0, L: int | None = None) -> Tensor:
    """Sum over sequences of the last query's weights on keys 0 .. L - 1, [h, L] float64.

    Summed in the pattern's own dtype, then widened (the order the probes have always used).
    """
    rows = last_query_attention(inter, layer)  # [b, h, s]
    if L is not None:
        rows = rows[..., :L]
    return rows.sum(0).double().cpu()


def pattern_sum(inter: Intermediates, layer: int = 0) -> tuple[Tensor, Tensor]:
    """Sum over sequences of the full pattern where query i is real, [h, i, j] float64, and how
    many sequences have query i real, [i] (one-row patterns count every sequence)."""
    pattern = inter.layers[layer].pattern.double()  # [b, h, i, j]
    if pattern.shape[2] == 1:
        live = torch.ones(pattern.shape[0], 1, dtype=torch.bool, device=pattern.device)  # [b, 1]
    else:
        live = real_keys(inter)  # a query is real where it is a real key, [b, i]
    total = (pattern * live[:, None, :, None]).sum(0)  # [h, i, j]
    return total.cpu(), live.sum(0).cpu()


# ----------------------------------------------------------------------------- model drivers

def mean_attention(model: Collects, batch: Batch, *, chunk: int = CHUNK) -> np.ndarray:
    """Mean over sequences of the last query's attention weights over key positions, ``[h, L]``
    (layer 0; with BOS ``[h, L + 1]``, BOS first).

    Every sequence of ``batch`` must have the same length L. For linear attention these are
    the unnormalised weights the model uses.
    """
    L = one_length(batch)
    total: Tensor | None = None
    for _, inter in over_chunks(model, batch, chunk):
        part = attention_sum(inter, 0, L + inter.prefix)
        total = part if total is None else total + part
    assert total is not None  # one chunk at least
    return (total / batch.tokens.shape[0]).numpy()


def mean_attention_by_layer(model: Collects, batch: Batch, *, chunk: int = CHUNK) -> np.ndarray:
    """:func:`mean_attention` for every layer at once, ``[layers, h, L]`` (with BOS ``L + 1``)."""
    L = one_length(batch)
    total: Tensor | None = None
    for _, inter in over_chunks(model, batch, chunk):
        part = torch.stack([attention_sum(inter, n, L + inter.prefix) for n in range(len(inter.layers))])
        total = part if total is None else total + part
    assert total is not None  # one chunk at least
    return (total / batch.tokens.shape[0]).numpy()


def mean_pattern(model: Collects, batch: Batch, *, chunk: int = CHUNK) -> np.ndarray:
    """Mean attention pattern per layer and head, ``[layers, h, i, j]``: each query row averaged
    over the sequences in which that query is real (NaN where none is). Lengths may differ."""
    total: Tensor | None = None
    count: Tensor | None = None
    for _, inter in over_chunks(model, batch, chunk):
        sums = [pattern_sum(inter, n) for n in range(len(inter.layers))]
        part, live = torch.stack([s for s, _ in sums]), sums[0][1]
        total, count = (part, live) if total is None or count is None else (total + part, count + live)
    assert total is not None and count is not None  # one chunk at least
    return (total / count[:, None]).numpy()


# ----------------------------------------------------------------------------- rows: peak and pinning

def as_row(row: np.ndarray | Tensor, L: int | None = None) -> np.ndarray:
    """One head's mean attention as a 1-D float64 array ([1, L] is squeezed)."""
    arr = np.asarray(row.detach().cpu() if isinstance(row, Tensor) else row, dtype=np.float64)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1:
        raise ValueError(f"expected one head's row [L], got shape {arr.shape}: index mean_attention(...)[h]")
    if L is not None:
        if arr.shape[0] < L:
            raise ValueError(f"row has {arr.shape[0]} positions, fewer than L={L}")
        arr = arr[:L]
    return arr


def peak(mean_attn_row: np.ndarray, L: int) -> dict:
    """The selected position of one head's mean attention row [L].

    ``peak_offset`` = key - query position (-K for the target), ``peak_position`` = absolute key
    position, ``peak_height`` = the maximum of the mean attention.
    """
    row = as_row(mean_attn_row, L)
    t = int(row.argmax())
    return dict(peak_offset=t - (L - 1), peak_position=t, peak_height=float(row[t]))


SLOPE_MAX = 0.1  # |peak_slope| below this: the peak does not move with L (Proposition 2's pinning, Table 1)


def peak_slope(lengths, positions) -> float:
    """Least-squares slope of a head's peak position against L (0: absolute, pinned; 1: relative,
    it moves with the query); NaN below two lengths."""
    L = np.asarray(lengths, dtype=float)
    return float(np.polyfit(L, np.asarray(positions, dtype=float), 1)[0]) if len(L) >= 2 else float("nan")


def attention_at_offset(mean_attn_row: np.ndarray, L: int, offset: int) -> float:
    """Mean attention at key position ``L - 1 + offset``; with ``offset = -K`` this is a*."""
    row = as_row(mean_attn_row, L)
    t = L - 1 + offset
    if not 0 <= t < L:
        raise ConfigError("offset", offset, f"an integer in [{-(L - 1)}, 0] at L={L}")
    return float(row[t])


def pinned_position(mean_attn_rows_by_length: Mapping[int, np.ndarray], *, tolerance: int = 0,
                    train_max_len: int | None = None) -> dict:
    """Proposition 2's test: does the peak sit at one absolute position across lengths?

    Pass one head's mean attention rows at the (unseen) lengths to compare. Returns

    - ``positions``, ``offsets``, ``heights``: {L: peak key position / peak offset / peak height};
    - ``spread``: max - min of the peak positions; ``pinned``: spread <= ``tolerance``;
    - ``position``: the most common peak position (ties: the smallest);
    - ``relative``: one peak offset at every length; ``offset``: the most common offset;
    - ``in_range``: every peak position < ``train_max_len`` (None when it is not given).

    A RoPE head is relative and not pinned; the paper's APE head selects a position inside the
    training range at every unseen length (``in_range``; exactly one position: ``pinned``).
    """
    if not mean_attn_rows_by_length:
        raise ValueError("pinned_position needs at least one length")
    peaks = {int(L): peak(row, int(L)) for L, row in sorted(mean_attn_rows_by_length.items())}
    positions = {L: p["peak_position"] for L, p in peaks.items()}
    offsets = {L: p["peak_offset"] for L, p in peaks.items()}
    spread = max(positions.values()) - min(positions.values())
    in_range = None if train_max_len is None else all(t < train_max_len for t in positions.values())
    return dict(positions=positions, offsets=offsets, heights={L: p["peak_height"] for L, p in peaks.items()},
                spread=spread, pinned=spread <= tolerance, position=_mode(positions.values()),
                relative=len(set(offsets.values())) == 1, offset=_mode(offsets.values()), in_range=in_range)


def _mode(values) -> int:
    values = sorted(values)
    return max(values, key=values.count)  # first (smallest) of the most common


__all__ = ["as_row", "attention_at_offset", "attention_sum", "last_query_attention", "mean_attention",
           "mean_attention_by_layer", "mean_pattern", "pattern_sum", "peak", "peak_slope", "pinned_position"]
