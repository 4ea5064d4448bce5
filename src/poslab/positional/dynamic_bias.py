"""Dynamic position bias: a small MLP maps the relative position to one bias per head.

    logit_ij = q_i^T k_j / sqrt(d) + f_theta(u(i - j))_h

    u(n) = n                              (default)
    u(n) = sign(n) log(|n| + 1)           (``log_distance=True``)

f_theta: R -> R^H is ``depth`` linear layers with SiLU between them (hidden width ``mlp_width``),
as in the dynamic position bias of lucidrains/x-transformers (``DynamicPositionBias``), which
follows the continuous relative-position bias of SwinV2 (Liu et al. 2022, "Swin Transformer V2",
arXiv 2111.09883) in one dimension. The signed log compresses long distances so an unseen one
stays near the inputs the MLP was trained on. Unlike a T5 table the bias is defined at every
distance, seen or not.

Notation: b batch, h head, i/j query/key position, H heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError, require_int, require_positive_int
from poslab.positional.base import PositionalEncoding, heads_first, relative_positions


class DynamicPositionBias(PositionalEncoding):
    kind = "relative"
    extra_parameters = "mlp_width x (n_heads + 2) + (depth - 2) x mlp_width x (mlp_width + 1) + n_heads"
    cost = "O(i j mlp_width^2) per layer (the MLP on every (i, j))"
    reference = ("lucidrains/x-transformers DynamicPositionBias; Liu et al. 2022, Swin Transformer V2, "
                 "arXiv 2111.09883")

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, mlp_width: int = 32,
                 depth: int = 2, log_distance: bool = False):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_positive_int("mlp_width", mlp_width)
        require_int("depth", depth, 2, "an integer >= 2 (linear layers)")
        if not isinstance(log_distance, bool):
            raise ConfigError("log_distance", log_distance, "True, False")
        self.log_distance = log_distance
        layers: list[nn.Module] = [nn.Linear(1, mlp_width), nn.SiLU()]
        for _ in range(depth - 2):
            layers += [nn.Linear(mlp_width, mlp_width), nn.SiLU()]
        layers.append(nn.Linear(mlp_width, n_heads))
        self.mlp = nn.Sequential(*layers)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = relative_positions(q_pos, k_pos).to(q.dtype)  # i - j, [1 | b, 1, i, j]
        u = torch.sign(rel) * torch.log1p(rel.abs()) if self.log_distance else rel
        return heads_first(self.mlp(u[..., None]))  # [1 | b, h, i, j]
