"""Attention with linear biases (ALiBi; Press, Smith & Lewis 2022, "Train Short, Test Long").

    logit_ij = q_i^T k_j / sqrt(d) - m_h (i - j)        (causal form; ``symmetric``: - m_h |i - j|)

Head h gets a fixed slope m_h. For n heads, n a power of two, the slopes are the geometric
sequence m_h = 2^(-8h/n), h = 1 .. n (8 heads: 1/2, 1/4, ..., 1/256). Otherwise, with
c = 2^floor(log2 n), the first c slopes are those for c heads and the remaining n - c are every
other slope (the 1st, 3rd, ...) of the sequence for 2c heads, as in the reference code.
In the causal form the bias is positive for keys after the query; the causal mask removes those.

Notation: b batch, h head, i/j query/key position, d head dim, m slope.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.positional.base import PositionalEncoding, relative_positions


def alibi_slopes(n_heads: int) -> Tensor:
    """The ALiBi slopes m_1 .. m_n for ``n_heads`` heads, float32 [n_heads]."""
    if n_heads < 1:
        raise ConfigError("n_heads", n_heads, "a positive integer")
    return torch.tensor(_slopes(n_heads), dtype=torch.float32)


def _slopes(n: int) -> list[float]:
    def geometric(count: int) -> list[float]:
        return [2.0 ** (-8.0 * h / count) for h in range(1, count + 1)]

    c = 2 ** math.floor(math.log2(n))
    if c == n:
        return geometric(n)
    return geometric(c) + geometric(2 * c)[0::2][: n - c]


class ALiBi(PositionalEncoding):
    kind = "relative"
    extra_parameters = "none"
    cost = "O(i j) per head (one bias per logit)"
    reference = "Press, Smith & Lewis 2022, Train Short, Test Long"

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, symmetric: bool = False):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        if not isinstance(symmetric, bool):
            raise ConfigError("symmetric", symmetric, "True, False")
        self.symmetric = symmetric
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # m_h, [h]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = relative_positions(q_pos, k_pos).to(q.dtype)  # i - j, [1, i, j] | [b, 1, i, j]
        if self.symmetric:
            rel = rel.abs()
        return -self.slopes.to(q.dtype)[:, None, None] * rel  # [1|b, h, i, j]
