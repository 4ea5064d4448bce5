"""KERPLE (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", arXiv 2205.09921): a conditionally positive definite kernel of |i - j| as the bias.

    logit_ij = q_i^T k_j / sqrt(d) + b_h(|i - j|)

    form="log":    b_h(n) = -r1_h log(1 + r2_h n)          r1_h, r2_h > 0
    form="power":  b_h(n) = -r1_h n^r2_h                   r1_h > 0, 0 < r2_h <= 2

r1 and r2 are learned per head. Parameterization (ours; the paper clamps the raw values):
r1_h = exp(a_h), r2_h = exp(c_h) for the log form and r2_h = 2 sigmoid(c_h) for the power form,
so the constraints hold for every parameter value. ``r1_init`` and ``r2_init`` set every head's
starting values (1 and 1). ALiBi is the power form at r2 = 1 with fixed r1.

Notation: b batch, h head, i/j query/key position, n = |i - j|.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError, check_choice
from poslab.positional.base import PositionalEncoding, relative_positions

FORMS = ("log", "power")


class Kerple(PositionalEncoding):
    kind = "relative"
    extra_parameters = "2 x n_heads (r1, r2 per head)"
    cost = "O(i j) per head (one bias per logit)"
    reference = "Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding, arXiv 2205.09921"

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, form: str = "log",
                 r1_init: float = 1.0, r2_init: float = 1.0):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        check_choice("form", form, FORMS)
        for name, value in (("r1_init", r1_init), ("r2_init", r2_init)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ConfigError(name, value, "a positive finite number")
        if form == "power" and not r2_init < 2:
            raise ConfigError("r2_init", r2_init, "a number in (0, 2) for form='power'")
        self.form = form
        self.log_r1 = nn.Parameter(torch.full((n_heads,), math.log(r1_init)))  # a_h, [h]
        c = math.log(r2_init) if form == "log" else math.log(r2_init / (2 - r2_init))  # inverse of 2 sigmoid
        self.raw_r2 = nn.Parameter(torch.full((n_heads,), c))  # c_h, [h]

    @property
    def r1(self) -> Tensor:
        return self.log_r1.exp()  # [h]

    @property
    def r2(self) -> Tensor:
        return self.raw_r2.exp() if self.form == "log" else 2 * torch.sigmoid(self.raw_r2)  # [h]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        n = relative_positions(q_pos, k_pos).to(q.dtype).abs()  # |i - j|, [1 | b, 1, i, j]
        r1, r2 = self.r1.to(q.dtype)[:, None, None], self.r2.to(q.dtype)[:, None, None]  # [h, 1, 1]
        if self.form == "log":
            return -r1 * torch.log1p(r2 * n)  # [1 | b, h, i, j]
        # n^r2 with a finite gradient in r2 at n = 0 (0^r2 = 0; d/dr2 of 1^r2 is 0)
        positive = n > 0
        power = torch.where(positive, n, torch.ones_like(n)) ** r2
        return -r1 * torch.where(positive, power, torch.zeros_like(power))
