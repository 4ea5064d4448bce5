"""What every probe shares: chunked collection, where each sequence's query sits, accuracy.

    last(b)      = prefix + L_b - 1                       internal index of sequence b's last token
    real(b, j)   = j < prefix + L_b                       key j is BOS or a real token
    accuracy     = sum_{b(,s)} mask [argmax_y logits = target] / sum mask

Probes are pure functions of :class:`~poslab.models.intermediates.Intermediates` (what
``model.collect(batch)`` returns) or of sums accumulated from them over chunks;
:func:`over_chunks` is the one place that runs a model, in chunks of ``chunk`` sequences on the
model's device under ``torch.no_grad()``, so any probe runs in bounded memory.

Query rows: a ``Transformer`` returns every query (``i`` = the whole sequence), the
``RetrievalHead`` one row, the last token's. :func:`at_last_query` reads either: with one row
that row is the last query (for a one-position sequence both rules agree).

Notation: b batch, h head, i query index, j key index, s sequence index, d head dim, m vocab.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.models.intermediates import Intermediates
from poslab.positional.base import PositionalEncoding
from poslab.tasks.base import Batch

CHUNK = 1024  # sequences per forward


# ----------------------------------------------------------------------------- what the drivers read of a model

class HasParameters(Protocol):
    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...


class Collects(HasParameters, Protocol):
    """A model the drivers can run: ``Transformer``, ``RetrievalHead``, ``pretrained.PretrainedLM``."""

    def collect(self, batch: Batch) -> Intermediates: ...


class HeadsConfig(Protocol):
    @property
    def n_heads(self) -> int: ...

    @property
    def encoding(self) -> str: ...


class PoslabModel(Collects, Protocol):
    """``Transformer`` or ``RetrievalHead``: a config with ``n_heads`` and the built ``encoding``."""

    @property
    def cfg(self) -> HeadsConfig: ...

    @property
    def encoding(self) -> PositionalEncoding: ...

    def layer_encoding(self, layer: int) -> PositionalEncoding: ...  # the encoding layer ``layer`` attends with


# ----------------------------------------------------------------------------- chunks

def split_batch(batch: Batch, chunk: int = CHUNK, device: torch.device | str | None = None) -> Iterator[Batch]:
    """Consecutive slices of ``batch`` of at most ``chunk`` sequences, moved to ``device``."""
    if not isinstance(chunk, int) or chunk < 1:
        raise ConfigError("chunk", chunk, "a positive integer")
    for i in range(0, batch.tokens.shape[0], chunk):
        part = batch[i:i + chunk]
        yield part if device is None else part.to(device)


def model_device(model: HasParameters) -> torch.device:
    return next(model.parameters()).device


def over_chunks(model: Collects, batch: Batch, chunk: int = CHUNK) -> Iterator[tuple[Batch, Intermediates]]:
    """``(part, model.collect(part))`` for consecutive slices of at most ``chunk`` sequences.

    ``part`` is the slice on the model's device. Sum what a probe needs from each chunk's
    intermediates before asking for the next: then at most two chunks' intermediates are alive.
    """
    for part in split_batch(batch, chunk, model_device(model)):
        yield part, model.collect(part)


def one_length(batch: Batch) -> int:
    """The common length L of an evaluation batch; refuses mixed lengths (offsets would not align)."""
    lengths = batch.lengths
    L = int(lengths[0])
    if bool((lengths != L).any()):
        raise ConfigError("lengths", sorted(set(lengths.tolist())),
                          "one length per evaluation batch (use eval_batch(task, L, n, seed))")
    return L


# ----------------------------------------------------------------------------- heads

def check_head(n_heads: int, head: int | None) -> None:
    if head is not None and not 0 <= head < n_heads:
        raise ConfigError("head", head, f"an index in [0, {n_heads - 1}] or None (mean over heads)")


def pick_head(values: np.ndarray, head: int | None) -> float:
    """values [h] -> values[head], or their mean for head=None."""
    check_head(len(values), head)
    return float(values.mean() if head is None else values[head])


# ----------------------------------------------------------------------------- where the queries are

def sequence_length(inter: Intermediates) -> int:
    """Length of the internal sequence axis (BOS included)."""
    return inter.embed.shape[1]


def real_lengths(inter: Intermediates) -> Tensor:
    """Real internal positions per sequence, prefix + L_b, [b] (full sequences without ``lengths``)."""
    if inter.lengths is None:
        b, s = inter.embed.shape[:2]
        return torch.full((b,), s, dtype=torch.long, device=inter.embed.device)
    return inter.lengths + inter.prefix


def last_index(inter: Intermediates) -> Tensor:
    """Internal index of each sequence's last real token, prefix + L_b - 1, [b]."""
    return real_lengths(inter) - 1


def real_keys(inter: Intermediates) -> Tensor:
    """Key j is BOS or a real token of sequence b, [b, s] bool."""
    s = sequence_length(inter)
    return torch.arange(s, device=inter.embed.device) < real_lengths(inter)[:, None]


def at_last_query(x: Tensor, inter: Intermediates) -> Tensor:
    """x [b, h, i, ...] -> [b, h, ...]: each sequence's row at its last real query.

    One query row (``RetrievalHead``) is that row; otherwise the row ``prefix + L_b - 1``.
    """
    if x.shape[2] == 1:
        return x[:, :, 0]
    b, h = x.shape[:2]
    index = last_index(inter).view(b, 1, 1, *([1] * (x.ndim - 3))).expand(b, h, 1, *x.shape[3:])
    return x.gather(2, index)[:, :, 0]


# ----------------------------------------------------------------------------- (i) accuracy

def correct(logits: Tensor, targets: Tensor, loss_mask: Tensor) -> tuple[int, int]:
    """(hits, counted): sum mask [argmax logits = target] and sum mask.

    One target per sequence (logits [b, m], targets and mask [b]) or per position (logits
    [b, s, m], targets and mask [b, s]).
    """
    if logits.shape[:-1] != targets.shape or targets.shape != loss_mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be targets {tuple(targets.shape)} plus a vocabulary "
                         f"axis, and loss_mask {tuple(loss_mask.shape)} the shape of targets")
    hit = (logits.argmax(-1) == targets) & loss_mask
    return int(hit.sum()), int(loss_mask.sum())


def accuracy_of(logits: Tensor, targets: Tensor, loss_mask: Tensor) -> float:
    """Fraction of masked targets whose argmax logit is right (NaN when the mask is empty)."""
    hits, total = correct(logits, targets, loss_mask)
    return hits / total if total else math.nan


def accuracy(model: torch.nn.Module, batch: Batch, *, chunk: int = CHUNK) -> float:
    """Fraction of targets (where ``loss_mask``) whose argmax logit is right, per sequence or per position.

    Only the logits are needed, so each chunk runs the plain forward (``model(tokens,
    lengths=...)``, the fused attention kernel where it applies) rather than :meth:`collect`:
    cheaper, and the same numbers the probes have always reported.
    """
    hits = total = 0
    with torch.no_grad():
        for part in split_batch(batch, chunk, model_device(model)):
            h, t = correct(model(part.tokens, lengths=part.lengths), part.targets, part.loss_mask)
            hits, total = hits + h, total + t
    return hits / total if total else math.nan
