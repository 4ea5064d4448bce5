"""Attention with linear biases (ALiBi; Press, Smith & Lewis 2022, "Train Short, Test Long").

    logit_ij = q_i^T k_j / sqrt(d) - m_h (i - j)        (causal form; ``symmetric``: - m_h |i - j|)

Head h gets a fixed slope m_h. For n heads, n a power of two, the slopes are the geometric
sequence m_h = 2^(-8h/n), h = 1 .. n (8 heads: 1/2, 1/4, ..., 1/256). Otherwise, with
c = 2^floor(log2 n), the first c slopes are those for c heads and the remaining n - c are every
other slope (the 1st, 3rd, ...) of the sequence for 2c heads, as in the reference code.
In the causal form the bias is positive for keys after the query; the causal mask removes those.

Options beyond the paper: ``slope`` gives every head one fixed slope instead of the geometric
sequence (one head's published slope, 2^-8, is nearly flat over a few dozen positions), and
``learned_slope`` makes the slopes parameters, m_h = exp(r_h) so they stay positive, initialised
at the fixed ones (log-parameterised as in the learned-slope ALiBi variants of the field).

Notation: b batch, h head, i/j query/key position, d head dim, m slope, r log-slope.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

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
    extra_parameters = "none (n_heads log-slopes with learned_slope=True)"
    cost = "O(i j) per head (one bias per logit)"
    reference = "Press, Smith & Lewis 2022, Train Short, Test Long"

    fixed_slopes: Tensor  # buffer, registered only when learned_slope is False

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, symmetric: bool = False,
                 slope: float | None = None, learned_slope: bool = False):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        if not isinstance(symmetric, bool):
            raise ConfigError("symmetric", symmetric, "True, False")
        if slope is not None and (isinstance(slope, bool) or not isinstance(slope, (int, float))
                                  or not math.isfinite(slope) or slope <= 0):
            raise ConfigError("slope", slope, "a positive finite number, or None (the published slopes)")
        if not isinstance(learned_slope, bool):
            raise ConfigError("learned_slope", learned_slope, "True, False")
        self.symmetric, self.learned_slope = symmetric, learned_slope
        init = alibi_slopes(n_heads) if slope is None else torch.full((n_heads,), float(slope))  # m_h, [h]
        if learned_slope:
            self.log_slopes = nn.Parameter(init.log())  # r_h, [h]; m_h = exp(r_h) > 0
        else:
            self.register_buffer("fixed_slopes", init, persistent=False)  # m_h, [h]

    @property
    def slopes(self) -> Tensor:
        """m_h [h]: the fixed slopes, or exp of the learned log-slopes."""
        return self.log_slopes.exp() if self.learned_slope else self.fixed_slopes

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = relative_positions(q_pos, k_pos).to(q.dtype)  # i - j, [1, i, j] | [b, 1, i, j]
        if self.symmetric:
            rel = rel.abs()
        return -self.slopes.to(q.dtype)[:, None, None] * rel  # [1|b, h, i, j]
