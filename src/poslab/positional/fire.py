"""FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
Transformers", arXiv 2310.04418): a learned function of the normalized relative distance.

    logit_ij = q_i^T k_j / sqrt(d) + b_h(i, j)

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),     psi(x) = log(c x + 1)

f_theta: R -> R^H is an MLP (one hidden layer of ``mlp_width`` = 32 ReLU units, as in the paper),
one output per head; c > 0 and the threshold L > 0 are learned (c = exp(a), L = exp(l) here, so
they stay positive; initial values ``c_init`` = 1 and ``L_init`` = max_len, our choice). Dividing
by psi(max(L, i)) maps every distance a query can see into [0, 1] once i > L (progressive
interpolation), so the MLP is never asked about an input it was not trained on.

FIRE is causal: i - j >= 0 for every key a query attends to. Keys after the query (masked anyway)
are read at distance 0, which keeps the log finite; ``causal_only`` makes a bidirectional model
refuse it.

Notation: b batch, h head, i/j query/key position, H heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.errors import ConfigError, require_positive_int
from poslab.positional.base import PositionalEncoding, heads_first, relative_positions


class FIRE(PositionalEncoding):
    kind = "relative"
    extra_parameters = "mlp_width x (n_heads + 2) + n_heads + 2 (MLP, c, L)"
    cost = "O(i j mlp_width) per layer (the MLP on every (i, j))"
    reference = ("Li et al. 2023, Functional Interpolation for Relative Positions Improves Long Context "
                 "Transformers (FIRE), arXiv 2310.04418")
    causal_only = True

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, mlp_width: int = 32,
                 c_init: float = 1.0, L_init: float | None = None):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_positive_int("mlp_width", mlp_width)
        L_init = float(max_len) if L_init is None else L_init
        for name, value in (("c_init", c_init), ("L_init", L_init)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ConfigError(name, value, "a positive finite number")
        self.hidden = nn.Linear(1, mlp_width)
        self.out = nn.Linear(mlp_width, n_heads)
        self.log_c = nn.Parameter(torch.tensor(math.log(c_init)))  # c = exp(a)
        self.log_L = nn.Parameter(torch.tensor(math.log(L_init)))  # L = exp(l)

    def psi(self, x: Tensor) -> Tensor:
        return torch.log1p(self.log_c.exp() * x)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = relative_positions(q_pos, k_pos).to(q.dtype).clamp(min=0)  # i - j (>= 0), [1 | b, 1, i, j]
        i = q_pos.to(q.dtype)[..., None, :, None]  # [1, i, 1] | [b, 1, i, 1]
        norm = self.psi(torch.maximum(self.log_L.exp(), i))  # psi(max(L, i))
        x = (self.psi(rel) / norm)[..., None]  # [1 | b, 1, i, j, 1]
        return heads_first(self.out(F.relu(self.hidden(x))))  # [1 | b, h, i, j]
