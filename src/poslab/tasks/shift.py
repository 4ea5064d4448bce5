"""Full-sequence shift: every position predicts the token K places before it.

The seed paper's Section 5.2 task for the two-layer transformer: i.i.d. uniform tokens from a
vocabulary of m, and at every position t >= K the target is

    y_t = s_{t-K}

so a causal model must retrieve at a fixed relative offset from every query position at once —
the fixed-offset task posed L - K times per sequence. Positions t < K have no target and
positions past the sequence's length are padding; ``loss_mask`` is False at both, and their
``targets`` are 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.tasks.base import UniformTokens, check_offset, check_vocab


@dataclass(frozen=True, kw_only=True)
class Shift(UniformTokens):
    """Shift by K: targets[t] = tokens[t - K] for K <= t < L.

    Worked examples (m = 20)::

        K = 2   tokens   5  1  8  8  3      L = 5
                targets  .  .  5  1  8      (. = masked)
        K = 1   tokens   5  1  8  8  3      L = 5
                targets  .  5  1  8  8
        K = 2   tokens   6  2  9  0  0      L = 3 (two pad slots)
                targets  .  .  6  .  .

    Chance accuracy is 1/m per position.
    """

    name: ClassVar[str] = "shift"
    target_kind: ClassVar[str] = "sequence"

    m: int = 20  # vocabulary size
    K: int = 2  # offset; 2 by default, the smallest offset that needs a pre-rotated carrier (paper §3)

    def __post_init__(self):
        check_vocab(self.m)
        check_offset("K", self.K)

    def validate(self, min_length: int) -> None:
        check_offset("K", self.K, min_length)

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [b, s], lengths [b] -> targets [b, s] and loss mask [b, s]."""
        s = tokens.shape[1]
        t = torch.arange(s, device=tokens.device)
        loss_mask = (t >= self.K) & (t < lengths[:, None])  # [b, s]
        targets = F.pad(tokens[:, : s - self.K], (self.K, 0)).masked_fill(~loss_mask, 0)  # [b, s]
        return targets, loss_mask

