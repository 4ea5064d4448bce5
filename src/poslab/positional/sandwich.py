"""Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis", arXiv 2212.10356): the inner product of two sinusoidal position
vectors as a parameter-free relative bias.

With p_t the sinusoidal vector of position t in d' dimensions (Vaswani et al. 2017, base 10000),

    p_i . p_j = sum_{k=0}^{d'/2 - 1} cos((i - j) w_k),    w_k = 10000^(-2k/d')

which is d'/2 at i = j and decays, roughly logarithmically, with |i - j| (the "sandwich" of the
query's and key's position vectors, the cross terms of (x + p)^T (x + p) dropped). The form
implemented here, per head h = 1 .. H:

    logit_ij = q_i^T k_j / sqrt(d) + (p_i . p_j - d'/2) / r_h,      r_h = 8 h / H

Subtracting d'/2 makes the bias 0 at i = j and negative elsewhere; dividing by r_h is our reading
of the paper's per-head compression, which borrows ALiBi's head ratios (h 8/H) so that heads see
the same pattern at different strengths. ``d_sandwich`` is d' (128 by default, an even number);
``compress=False`` gives every head the plain p_i . p_j - d'/2.

Notation: b batch, h head, i/j query/key position, d' sandwich dimension.
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.positional.base import PositionalEncoding, relative_positions


class Sandwich(PositionalEncoding):
    kind = "relative"
    extra_parameters = "none"
    cost = "O(i j d') per head (a cosine sum per logit)"
    reference = ("Chi et al. 2023, Dissecting Transformer Length Extrapolation via the Lens of Receptive "
                 "Field Analysis (Sandwich), arXiv 2212.10356")

    omega: Tensor
    ratio: Tensor

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, d_sandwich: int = 128,
                 compress: bool = True):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        if isinstance(d_sandwich, bool) or not isinstance(d_sandwich, int) or d_sandwich < 2 or d_sandwich % 2:
            raise ConfigError("d_sandwich", d_sandwich, "an even integer >= 2 (d')")
        if not isinstance(compress, bool):
            raise ConfigError("compress", compress, "True, False")
        self.d_sandwich, self.compress = d_sandwich, compress
        omega = 10000.0 ** (-torch.arange(0, d_sandwich, 2, dtype=torch.float64) / d_sandwich)
        self.register_buffer("omega", omega.float(), persistent=False)  # w_k, [d'/2]
        ratio = 8.0 * torch.arange(1, n_heads + 1) / n_heads if compress else torch.ones(n_heads)
        self.register_buffer("ratio", ratio.float(), persistent=False)  # r_h, [h]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = relative_positions(q_pos, k_pos).to(torch.float32)  # i - j, [1 | b, 1, i, j]
        inner = torch.cos(rel[..., None] * self.omega).sum(-1)  # p_i . p_j, [1 | b, 1, i, j]
        bias = (inner - self.d_sandwich / 2) / self.ratio[:, None, None]  # [1 | b, h, i, j]
        return bias.to(q.dtype)
