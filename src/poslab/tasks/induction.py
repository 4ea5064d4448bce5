"""Induction: a random prefix, then the same tokens again; predict what followed the earlier copy.

The task of a two-layer induction circuit (Olsson et al. 2022, "In-context learning and induction
heads"; the seed paper's next step: "a content match rather than a query token sets the
offset"). A length-L sequence is a prefix of P = ceil(L / 2) distinct tokens drawn uniformly
without replacement from a vocabulary of m, followed by its first L - P tokens again::

    s_t = prefix_t          for 0 <= t < P
    s_t = prefix_{t - P}    for P <= t < L

At every position t of the second copy the current token s_t occurred once before, at j = t - P,
and the target is the token after that occurrence:

    y_t = s_{j + 1} = s_{t - P + 1}

so the offset to the answer, -(P - 1), is set by where the content matches, not by a fixed
distance. Positions of the first copy have no target (its tokens are unpredictable).
:meth:`Induction.label` applies the rule by content alone (the most recent earlier occurrence of
the current token, then the token after it), so it says the same on any tokens.

Tokens are 0 .. m - 1; 0 also pads past each sequence's length, which is masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.tasks.base import Batch, Length, check_vocab, length_range

MIN_LENGTH = 3  # a prefix of two and one repeated token


@dataclass(frozen=True, kw_only=True)
class Induction:
    """Repeated random sequence: y_t = the token after the earlier occurrence of s_t.

    Worked examples (m = 8; ``.`` = no target)::

        L = 8, P = 4   tokens   5  2  7  0  5  2  7  0
                       targets  .  .  .  .  2  7  0  5     t = 7: 0 occurred at 3, then came s_4 = 5
        L = 7, P = 4   tokens   3  6  1  4  3  6  1
                       targets  .  .  .  .  6  1  4
        L = 5, P = 3   tokens   1  0  6  1  0  0  0  0     padded to 8 (pad token 0, masked)
                       targets  .  .  .  0  6  .  .  .

    Chance accuracy is 1/m (a guess that knows only the vocabulary).
    """

    name: ClassVar[str] = "induction"
    target_kind: ClassVar[str] = "sequence"

    m: int = 64  # vocabulary size; a prefix holds distinct tokens, so ceil(L / 2) <= m

    def __post_init__(self):
        check_vocab(self.m, least=2)

    @property
    def vocab_size(self) -> int:
        return self.m

    @property
    def chance(self) -> float:
        return 1.0 / self.m

    def validate(self, min_length: int) -> None:
        """A length must hold a prefix of two and one repeated token, and its prefix of distinct tokens
        must fit the vocabulary (called with every training bound and evaluation length)."""
        top = 2 * self.m
        if not isinstance(min_length, int) or not MIN_LENGTH <= min_length <= top:
            raise ConfigError("length", min_length, f"an integer in [{MIN_LENGTH}, {top}] (2 m: a prefix of "
                                                    f"ceil(L / 2) distinct tokens out of m = {self.m})")

    @staticmethod
    def prefix_length(lengths: Tensor) -> Tensor:
        """P = ceil(L / 2) per sequence, [b]."""
        return (lengths + 1) // 2

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [b, s], lengths [b] -> targets [b, s] and loss mask [b, s], by content: for each real
        t, the most recent j < t with s_j = s_t; the target is s_{j+1}; no such j, no target."""
        b, s = tokens.shape
        t = torch.arange(s, device=tokens.device)
        earlier = (tokens[:, :, None] == tokens[:, None, :]) & (t[None, :] < t[:, None])  # [b, t, j]
        j = torch.where(earlier, t, -1).amax(-1)  # the most recent earlier occurrence, -1 if none, [b, s]
        loss_mask = (j >= 0) & (t < lengths[:, None])  # [b, s]
        after = (j + 1).clamp(min=0, max=s - 1)  # j + 1 <= t < s where masked in
        targets = tokens.gather(1, after).masked_fill(~loss_mask, 0)
        return targets, loss_mask

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch:
        lo, hi = length_range(length)
        self.validate(lo)
        self.validate(hi)
        device = generator.device
        keys = torch.rand(batch_size, self.m, generator=generator, device=device)
        prefix = keys.argsort(-1)[:, : (hi + 1) // 2]  # distinct tokens, uniform without replacement, [b, P_max]
        if lo == hi:
            lengths = torch.full((batch_size,), hi, dtype=torch.long, device=device)
        else:
            lengths = torch.randint(lo, hi + 1, (batch_size,), generator=generator, device=device)
        P = self.prefix_length(lengths)[:, None]  # [b, 1]
        t = torch.arange(hi, device=device)
        source = torch.where(t < P, t, t - P).clamp(max=prefix.shape[1] - 1)  # prefix index of s_t, [b, s]
        tokens = prefix.gather(1, source).masked_fill(t >= lengths[:, None], 0)
        targets, loss_mask = self.label(tokens, lengths)
        return Batch(tokens=tokens, targets=targets, loss_mask=loss_mask, lengths=lengths)
