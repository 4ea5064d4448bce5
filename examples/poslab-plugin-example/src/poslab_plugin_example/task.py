"""First-token retrieval: the target is the first token of the sequence, whatever its length.

Worked examples (m = 20)::

    tokens  3 17  5  9          L = 4    target s_0 = 3
    tokens  8  1  0  0          L = 2    target s_0 = 8   (two pad slots)

Chance accuracy is 1/m. An absolute position (0) rather than an offset from the query: a
relative encoding must find the start of the sequence by its distance L - 1, which changes with L.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.tasks.base import UniformTokens


@dataclass(frozen=True, kw_only=True)
class FirstToken(UniformTokens):
    name: ClassVar[str] = "first_token"
    target_kind: ClassVar[str] = "last"
    m: int = 20  # vocabulary size

    def __post_init__(self):
        if isinstance(self.m, bool) or not isinstance(self.m, int) or self.m < 2:
            raise ConfigError("task.m", self.m, "an integer >= 2")

    def validate(self, min_length: int) -> None:
        if min_length < 2:
            raise ConfigError("train.min_length", min_length, "at least 2 (a first token before the query)")

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [b, s], lengths [b] -> targets [b] and loss mask [b]."""
        targets = tokens[:, 0]
        return targets, torch.ones_like(targets, dtype=torch.bool)
