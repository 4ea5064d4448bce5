"""A Gaussian distance bias: logit_ij = q_i^T k_j / sqrt(d) - (i - j)^2 / (2 sigma_h^2).

sigma_h = exp(s_h) is learned per head, initialised at ``sigma_init`` (4 positions).

Notation: b batch, h head, i/j query/key position.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.positional.base import PositionalEncoding, relative_positions


class GaussianBias(PositionalEncoding):
    kind = "relative"
    extra_parameters = "n_heads (log sigma per head)"
    cost = "O(i j) per head (one bias per logit)"
    reference = "poslab-plugin-example (a worked example of a plugin encoding)"

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, sigma_init: float = 4.0):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        if isinstance(sigma_init, bool) or not isinstance(sigma_init, (int, float)) or not sigma_init > 0:
            raise ConfigError("sigma_init", sigma_init, "a positive number")
        self.log_sigma = nn.Parameter(torch.full((n_heads,), math.log(sigma_init)))  # s_h, [h]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = relative_positions(q_pos, k_pos).to(q.dtype)  # i - j, [1 | b, 1, i, j]
        var = (2 * self.log_sigma).exp().to(q.dtype)[:, None, None]  # sigma_h^2, [h, 1, 1]
        return -rel.square() / (2 * var)  # [1 | b, h, i, j]
