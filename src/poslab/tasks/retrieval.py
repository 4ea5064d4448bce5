"""Retrieval tasks: copy the token a fixed (or query-chosen) offset before the query.

The seed paper's Section 2: a length-L sequence s_0 .. s_{L-1} of i.i.d. uniform tokens from a
vocabulary of m; the query is the last position n = L - 1 and the target is

    y = s_{L-1-K}

so the task is a purely positional selection problem with a single optimal token. The
content-conditioned variant lets the query token pick the offset, so one head must implement
two offsets at once (the paper's multi-head study).

Tokens here are 0 .. m-1 (the paper writes 1 .. m); 0 also pads, which is harmless because
padding sits past each sequence's length and is masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.tasks.base import UniformTokens, check_offset, check_vocab


@dataclass(frozen=True, kw_only=True)
class FixedOffset(UniformTokens):
    """Fixed-offset retrieval: the target is the token K positions before the last one.

    Worked examples (m = 20)::

        K = 1   tokens  3 17  5  9          L = 4, query s_3 = 9    target s_2 = 5
        K = 2   tokens  3 17  5  9          L = 4                   target s_1 = 17
        K = 1   tokens  4 11  2  0  0       L = 3 (two pad slots)   target s_1 = 11

    Chance accuracy is 1/m: the target is independent of everything at or after it.
    """

    name: ClassVar[str] = "fixed_offset"
    target_kind: ClassVar[str] = "last"

    m: int = 20  # vocabulary size
    K: int = 1  # offset of the target before the query

    def __post_init__(self):
        check_vocab(self.m)
        check_offset("K", self.K)

    def validate(self, min_length: int) -> None:
        check_offset("K", self.K, min_length)

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [b, s], lengths [b] -> targets [b] and loss mask [b]."""
        targets = _at(tokens, lengths - 1 - self.K)
        return targets, torch.ones_like(targets, dtype=torch.bool)


@dataclass(frozen=True, kw_only=True)
class ContentConditioned(UniformTokens):
    """Content-conditioned retrieval: the query token's class picks the offset.

    Rule: a query token q < m // 2 (the lower half of the vocabulary) uses K1, any other uses
    K2; the target is y = s_{L-1-K(q)} with q = s_{L-1}. With m even, half the queries use each
    offset.

    Worked examples (m = 20, so the split is at 10; K1 = 2, K2 = 3)::

        tokens  7 12  3 18  4      query 4  < 10 -> K1 = 2    target s_2 = 3
        tokens  7 12  3 18 15      query 15 >= 10 -> K2 = 3   target s_1 = 12
        tokens  9  1  6 10  0      L = 4, query 10 -> K2 = 3  target s_0 = 9

    Chance accuracy is 1/m.
    """

    name: ClassVar[str] = "content_conditioned"
    target_kind: ClassVar[str] = "last"

    m: int = 20  # vocabulary size; tokens < m // 2 form the K1 class
    K1: int = 2  # offset for query tokens in [0, m // 2)
    K2: int = 3  # offset for query tokens in [m // 2, m)

    def __post_init__(self):
        check_vocab(self.m, least=2)
        check_offset("K1", self.K1)
        check_offset("K2", self.K2)

    def offset(self, query: Tensor) -> Tensor:
        """The offset each query token selects: [...] int -> [...] int."""
        return torch.where(query < self.m // 2, self.K1, self.K2)

    def validate(self, min_length: int) -> None:
        check_offset("K1", self.K1, min_length)
        check_offset("K2", self.K2, min_length)

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [b, s], lengths [b] -> targets [b] and loss mask [b]."""
        query = _at(tokens, lengths - 1)  # [b]
        targets = _at(tokens, lengths - 1 - self.offset(query))
        return targets, torch.ones_like(targets, dtype=torch.bool)


def _at(tokens: Tensor, index: Tensor) -> Tensor:
    """tokens [b, s], index [b] -> tokens[r, index[r]] for each row r, [b]."""
    return tokens.gather(1, index[:, None]).squeeze(1)
