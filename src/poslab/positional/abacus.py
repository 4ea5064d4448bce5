"""Abacus embeddings (McLeish et al. 2024, arXiv 2405.17399): a learned embedding per digit, indexed by
the digit's place in its number, with a random offset during training.

    z_t = x_t + [p_t > 0] W_pos[p_t + k]     k ~ U{0, .., K} per sequence (training), k = 0 (evaluation)

The task hands ``p_t`` (``Batch.positions``, :mod:`poslab.tasks.digit_addition` with ``positions="abacus"``):
1, 2, 3, .. along each number from its least significant digit (the paper writes every number least
significant digit first, so this is "the position relative to the start of the number"), 0 for every
token that is not a digit, which gets no embedding. Digits of the same significance in the two operands
and in the sum share an id. The offset k (the paper's K = 100, training on 20-digit numbers) lets ids
past the trained digit counts be trained; where the table is too short for the drawn k, k is capped at
the room left (``max_position`` minus the row's largest id), so with a table of at least K + the trained
digits + 1 rows the draw is exactly U{0, .., K}. Rows are initialised N(0, init_std^2). The model refuses
to run it without task positions (``task_positions``). The paper combines it with NoPE or FIRE; alone
here, it is Abacus with NoPE.

Notation: b batch, s token index, D model width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.errors import ConfigError, require_int
from poslab.positional.base import PositionalEncoding


class Abacus(PositionalEncoding):
    kind = "absolute"
    extra_parameters = "(max_position + 1) x d_model"
    cost = "O(s D) once, at the input"
    reference = "McLeish et al. 2024 (arXiv 2405.17399)"
    task_positions = True

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, max_offset: int = 100,
                 max_position: int = 256, init_std: float = 0.02):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_int("max_offset", max_offset, 0, "an integer >= 0 (K; 0: no random offset)")
        require_int("max_position", max_position, 1, "a positive integer (the largest digit id)")
        self.max_offset, self.max_position = max_offset, max_position
        self.W_pos = nn.Parameter(torch.randn(max_position + 1, d_model) * init_std)  # row 0 is never read

    def check_positions(self, max_position: int) -> None:
        if max_position > self.max_position:
            raise ConfigError("max_position", self.max_position,
                              f"an integer >= {max_position} (the largest digit id the task hands at evaluation)")

    def shifted(self, pos: Tensor) -> Tensor:
        """The ids the table is read at: digit ids (> 0) of each sequence moved by k in training."""
        if not self.training or self.max_offset == 0:
            return pos
        room = (self.max_position - pos.amax(dim=-1, keepdim=True)).clamp(min=0, max=self.max_offset)  # [b, 1]
        k = (torch.rand(room.shape, device=pos.device) * (room + 1)).floor().long().clamp(max=room)
        return torch.where(pos > 0, pos + k, pos)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        p = self.shifted(pos.long())
        return x + F.embedding(p, self.W_pos) * (p > 0)[..., None].to(x.dtype)  # [b, s, D]; non-digits: none
