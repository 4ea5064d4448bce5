"""Sinusoidal absolute position embedding (Vaswani et al. 2017, "Attention Is All You Need").

    z_t = x_t + PE[t],   PE[t, 2i] = sin(t / base^(2i/D)),   PE[t, 2i+1] = cos(t / base^(2i/D))

No parameters; the table is a function of the position, so any real position (past the
training length, rescaled, fractional) has an embedding.

Notation: b batch, s position index, t a position, D model width, i frequency index.
"""

from __future__ import annotations

from torch import Tensor

from poslab.positional.base import PositionalEncoding, require_even, require_positive, sinusoid_table


class Sinusoidal(PositionalEncoding):
    kind = "absolute"
    extra_parameters = "none"
    cost = "O(s D) once, at the input"
    reference = "Vaswani et al. 2017, Attention Is All You Need"

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, base: float = 10000.0):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_even("d_model", d_model)
        require_positive("base", base)
        self.base = base

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + sinusoid_table(pos, self.d_model, self.base).to(x.dtype)  # [s|b, s, D]
