"""What every task shares: the batch it returns, length handling, and fixed evaluation sets.

A task is a frozen dataclass (its config) with a pure sampler::

    batch = task.sample(generator, batch_size, length)   # length: L, or (L_min, L_max) inclusive
    targets, loss_mask = task.label(tokens, lengths)     # the rule alone, on any given tokens

Every random number comes from the ``torch.Generator`` passed in, so the same generator state
gives the same batch, whether one seed trains alone or inside an ensemble. Sampling is two
``randint`` calls (tokens first, then lengths) plus indexing; no Python loop over the batch.

Sequences are right-padded to the longest length with token 0; ``lengths`` says where each one
ends, and ``loss_mask`` is False wherever a target is undefined. Because tokens are drawn before
lengths, ``length=L`` and ``length=(L, L)`` give the same tokens from the same generator state.

Notation: b batch, s sequence index (padded length), L a sequence's real length.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import Tensor

from poslab.errors import ConfigError

Length = int | tuple[int, int]


@dataclass
class Batch:
    tokens: Tensor  # [b, s] int64 in [0, vocab_size); positions >= lengths are padding (value 0)
    targets: Tensor  # [b] for last-position tasks, [b, s] for full-sequence tasks, int64
    loss_mask: Tensor  # bool, same shape as targets
    lengths: Tensor  # [b] int64, real length of each sequence
    # Optional hint of where the queries of last-position tasks sit, for a model's fast path
    # (RetrievalHead's grid): every L - 1 lies in first_query .. first_query + n_queries - 1.
    first_query: Tensor | None = None  # [] int64
    n_queries: int | None = None
    # Optional per-target weights in the training loss (float, shape of targets): the loss is then
    # sum(w ce) / sum(w) over the loss mask. None: every target counts once (the plain mean).
    loss_weight: Tensor | None = None
    # Optional per-token position ids from the task's structure, [b, s] int64 (digit significance for
    # position coupling and Abacus, :mod:`poslab.tasks.digit_addition`); the model reads them instead of
    # its own 0 .. s - 1. None: the model's own positions.
    positions: Tensor | None = None

    TENSORS = ("tokens", "targets", "loss_mask", "lengths", "first_query", "loss_weight", "positions")

    def to(self, device: torch.device | str) -> Batch:
        return self.map(lambda x: x.to(device))

    def map(self, fn) -> Batch:
        """A batch with ``fn`` applied to every tensor field (the hint ``n_queries`` is kept)."""
        fields: dict[str, Any] = {k: None if getattr(self, k) is None else fn(getattr(self, k))
                                  for k in self.TENSORS}
        return Batch(**fields, n_queries=self.n_queries)

    def __getitem__(self, index) -> Batch:
        """Sequences ``index`` (a slice or index tensor over the batch axis), hint kept."""
        return Batch(tokens=self.tokens[index], targets=self.targets[index], loss_mask=self.loss_mask[index],
                     lengths=self.lengths[index], first_query=self.first_query, n_queries=self.n_queries,
                     loss_weight=None if self.loss_weight is None else self.loss_weight[index],
                     positions=None if self.positions is None else self.positions[index])

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


class Task(Protocol):
    """What the trainer and the probes rely on; the concrete tasks are plain frozen dataclasses."""

    @property
    def name(self) -> str: ...  # the registry name (a class variable of each task)

    @property
    def vocab_size(self) -> int: ...

    @property
    def chance(self) -> float: ...

    @property
    def target_kind(self) -> str: ...  # "last": one target at L - 1, [b]; "sequence": [b, s]

    def validate(self, min_length: int) -> None: ...

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]: ...  # targets, loss_mask

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch: ...


PER = ("batch", "sequence")


def sample_steps(task: Task, generator: torch.Generator, steps: int, batch_size: int, length: tuple[int, int],
                 per: str = "batch") -> Batch:
    """``steps`` training batches at once, stacked: every tensor gets a leading [n] axis.

    ``per="batch"``: one length per step, uniform in [lo, hi]; ``per="sequence"``: one per
    sequence. Sequences are right-padded to hi. A task may provide its own ``sample_steps``
    (the uniform-token tasks draw all tokens in one call); otherwise each step is one
    ``task.sample`` call. Every batch carries the query hint (``first_query``, ``n_queries``).
    A task whose length is not its token count (the benchmark tasks: ``max_tokens(L)``, the most
    tokens a sequence of task length L takes) is padded to ``max_tokens(hi)`` tokens instead of hi.
    """
    lo, hi = length_range(length)
    own = getattr(task, "sample_steps", None)
    if own is not None:
        return own(generator, steps, batch_size, (lo, hi), per)
    max_tokens = getattr(task, "max_tokens", None)
    width = hi if max_tokens is None else int(max_tokens(hi))
    parts = []
    for _ in range(steps):
        if per == "batch":
            L = int(torch.randint(lo, hi + 1, (1,), generator=generator, device=generator.device))
            batch = task.sample(generator, batch_size, L)
            first, n = L - 1, 1
        else:
            batch, first, n = task.sample(generator, batch_size, (lo, hi)), lo - 1, hi - lo + 1
        batch = _pad(batch, width)
        batch.first_query, batch.n_queries = torch.tensor(first), n
        parts.append(batch)
    fields: dict[str, Any] = {k: None if getattr(parts[0], k) is None else torch.stack([getattr(p, k) for p in parts])
                              for k in Batch.TENSORS}
    return Batch(**fields, n_queries=max(cast(int, p.n_queries) for p in parts))  # each set just above


def _pad(batch: Batch, width: int) -> Batch:
    """Right-pad tokens (and per-position targets / mask) of ``batch`` to ``width`` positions."""
    extra = width - batch.tokens.shape[1]
    if extra == 0:
        return batch
    pad = lambda x, v: torch.nn.functional.pad(x, (0, extra), value=v)  # noqa: E731
    per_position = batch.targets.ndim == 2
    weight = batch.loss_weight
    return Batch(tokens=pad(batch.tokens, 0), lengths=batch.lengths,
                 targets=pad(batch.targets, 0) if per_position else batch.targets,
                 loss_mask=pad(batch.loss_mask, False) if per_position else batch.loss_mask,
                 loss_weight=pad(weight, 0.0) if per_position and weight is not None else weight,
                 positions=None if batch.positions is None else pad(batch.positions, 0))


class UniformTokens:
    """What the tasks over i.i.d. uniform tokens share; each is a frozen dataclass with a field
    ``m`` (vocabulary size) that adds its own ``validate`` and ``label``."""

    m: int

    if TYPE_CHECKING:  # each subclass defines these (see Task)
        def validate(self, min_length: int) -> None: ...

        def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]: ...

    @property
    def vocab_size(self) -> int:
        return self.m

    @property
    def chance(self) -> float:
        return 1.0 / self.m

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch:
        self.validate(length_range(length)[0])
        tokens, lengths = uniform_sequences(generator, batch_size, length, self.m)
        targets, loss_mask = self.label(tokens, lengths)
        return Batch(tokens=tokens, targets=targets, loss_mask=loss_mask, lengths=lengths)

    def sample_steps(self, generator: torch.Generator, steps: int, batch_size: int, length: tuple[int, int],
                     per: str = "batch") -> Batch:
        """Every step's tokens in one draw, then the lengths: [n, b, hi] (see :func:`sample_steps`)."""
        (lo, hi), n, b = length, steps, batch_size
        self.validate(lo)
        device = generator.device
        tokens = torch.randint(0, self.m, (n * b, hi), generator=generator, device=device)
        if per == "batch":
            first = torch.randint(lo, hi + 1, (n,), generator=generator, device=device) - 1  # L - 1 per step
            lengths, n_queries = (first + 1).repeat_interleave(b), 1
        else:
            lengths = torch.randint(lo, hi + 1, (n * b,), generator=generator, device=device)
            first, n_queries = torch.full((n,), lo - 1, device=device), hi - lo + 1
        tokens = tokens.masked_fill(torch.arange(hi, device=device) >= lengths[:, None], 0)
        targets, loss_mask = self.label(tokens, lengths)
        return Batch(tokens=tokens.view(n, b, hi), targets=targets.view(n, b, *targets.shape[1:]),
                     loss_mask=loss_mask.view(n, b, *loss_mask.shape[1:]), lengths=lengths.view(n, b),
                     first_query=first, n_queries=n_queries)


# ----------------------------------------------------------------------------- helpers

def length_range(length: Length) -> tuple[int, int]:
    """``L`` -> (L, L); ``(lo, hi)`` -> (lo, hi), checked: 1 <= lo <= hi."""
    if isinstance(length, (tuple, list)):
        if len(length) != 2:
            raise ConfigError("length", length, "an integer L or a pair (L_min, L_max)")
        lo, hi = length
    else:
        lo = hi = length
    if not (_is_int(lo) and _is_int(hi) and 1 <= lo <= hi):
        raise ConfigError("length", length, "a positive integer L or a pair (L_min, L_max) with 1 <= L_min <= L_max")
    return int(lo), int(hi)


def uniform_sequences(generator: torch.Generator, batch_size: int, length: Length,
                      vocab_size: int) -> tuple[Tensor, Tensor]:
    """I.i.d. uniform tokens, right-padded with 0 past each sequence's length.

    Returns tokens [b, hi] and lengths [b], lengths uniform in [lo, hi] (drawn only when lo < hi).
    """
    lo, hi = length_range(length)
    device = generator.device
    tokens = torch.randint(0, vocab_size, (batch_size, hi), generator=generator, device=device)
    if lo == hi:
        return tokens, torch.full((batch_size,), hi, dtype=torch.long, device=device)
    lengths = torch.randint(lo, hi + 1, (batch_size,), generator=generator, device=device)
    pad = torch.arange(hi, device=device) >= lengths[:, None]  # [b, s]
    return tokens.masked_fill(pad, 0), lengths


def check_offset(field: str, K: int, min_length: int | None = None) -> None:
    """An offset must be a positive integer, and smaller than the shortest length it is posed at."""
    if not _is_int(K) or K < 1:
        raise ConfigError(field, K, "a positive integer")
    if min_length is not None and K >= min_length:
        raise ConfigError(field, K, f"an integer in [1, {min_length - 1}] for a shortest training length "
                                    f"of {min_length}")


def check_vocab(m: int, least: int = 1) -> None:
    if not _is_int(m) or m < least:
        raise ConfigError("m", m, f"an integer >= {least}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# ----------------------------------------------------------------------------- evaluation sets

def eval_seed(seed: int, length: Length) -> int:
    """A 63-bit generator seed fixed by (evaluation seed, length), the same in every process."""
    lo, hi = length_range(length)
    digest = hashlib.sha256(f"poslab-eval:{seed}:{lo}:{hi}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def eval_batch(task: Task, length: Length, n: int, seed: int, *, device: torch.device | str = "cpu") -> Batch:
    """The evaluation set of ``n`` sequences fixed by (task, length, evaluation seed).

    Drawn on the CPU from a fresh generator, then moved, so it is the same on every device.
    Different lengths get unrelated sets; the same (seed, length) gives the same tokens for
    every task with the same vocabulary.
    """
    generator = torch.Generator(device="cpu").manual_seed(eval_seed(seed, length))
    return task.sample(generator, n, length).to(device)
