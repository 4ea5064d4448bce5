"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018, "Self-Attention with
Relative Position Representations").

    logit_ij = q_i^T (k_j + a^K_ij) / sqrt(d),       out_i = sum_j w_ij (v_j + a^V_ij),
    a^K_ij = w^K[clip(j - i, k)],   a^V_ij = w^V[clip(j - i, k)],   clip(x, k) = max(-k, min(k, x))

``w^K`` and ``w^V`` are learned tables of 2k + 1 rows of width d (k = ``max_distance``). The
key term is added by ``score_bias`` (q_i^T a^K_ij / sqrt(d): attention adds score biases after
its own 1/sqrt(d) scaling), the value term by ``value_bias``.

Table sharing: as in the paper (its Section 3.3), one pair of tables is shared by all heads
(``share_heads=True``, the default); ``share_heads=False`` gives every head its own
[2k + 1, d] tables. Both hooks use the paper's efficient form: project onto the 2k + 1 table
rows once ([b, h, i, 2k + 1]) and gather/scatter by distance, never materializing [i, j, d].
Fractional positions are rounded to the nearest integer distance.

Notation: b batch, h head, i/j query/key position, d head dim, k max_distance,
r = clip(j - i, k) + k the table row.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.positional.base import PositionalEncoding


class Shaw(PositionalEncoding):
    kind = "relative"
    extra_parameters = "2 x (2 max_distance + 1) x d_head (x n_heads when share_heads=False)"
    cost = "O(i (2k+1) d + i j) per head for each of the key and value terms"
    reference = "Shaw, Uszkoreit & Vaswani 2018, Self-Attention with Relative Position Representations"

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, max_distance: int = 16,
                 share_heads: bool = True, init_std: float = 1.0):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        if not (isinstance(max_distance, int) and max_distance >= 1):
            raise ConfigError("max_distance", max_distance, "a positive integer")
        if not isinstance(share_heads, bool):
            raise ConfigError("share_heads", share_heads, "True, False")
        self.max_distance, self.share_heads = max_distance, share_heads
        shape = (2 * max_distance + 1, d_head) if share_heads else (n_heads, 2 * max_distance + 1, d_head)
        self.w_K = nn.Parameter(torch.randn(shape) * init_std)  # [(h,) 2k+1, d]
        self.w_V = nn.Parameter(torch.randn(shape) * init_std)  # [(h,) 2k+1, d]

    def _rows(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Table row of every (query, key) pair: clip(j - i, k) + k, [1, i, j] | [b, 1, i, j]."""
        n = k_pos[..., None, :] - q_pos[..., :, None]  # j - i
        if n.is_floating_point():
            n = n.round()
        k = self.max_distance
        return (n.long().clamp(-k, k) + k).unsqueeze(-3)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        w_K = self.w_K.to(q.dtype)
        if self.share_heads:
            q_rows = q @ w_K.transpose(-1, -2)  # q_i . w^K[r], [b, h, i, 2k+1]
        else:
            q_rows = torch.einsum("bhid,hrd->bhir", q, w_K)  # [b, h, i, 2k+1]
        rows = self._rows(q_pos, k_pos)
        rows = rows.expand(*q_rows.shape[:-1], rows.shape[-1])  # [b, h, i, j]
        return q_rows.gather(-1, rows) / math.sqrt(q.shape[-1])  # [b, h, i, j]

    def value_bias(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rows = self._rows(q_pos, k_pos).expand(weights.shape)  # [b, h, i, j]
        # weight landing on each table row: sum_j w_ij [r_ij = r]
        per_row = weights.new_zeros(*weights.shape[:-1], 2 * self.max_distance + 1)
        per_row = per_row.scatter_add(-1, rows, weights)  # [b, h, i, 2k+1]
        w_V = self.w_V.to(weights.dtype)
        if self.share_heads:
            return per_row @ w_V  # [b, h, i, d]
        return torch.einsum("bhir,hrd->bhid", per_row, w_V)  # [b, h, i, d]
