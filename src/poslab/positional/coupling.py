"""Position coupling (Cho et al. 2024, arXiv 2405.20671): a learned absolute table read at position ids
that the task couples by its structure, with a random starting id during training.

    z_t = x_t + W_pos[p_t + u]          u ~ U{0, .., max_pos - max_t p_t} per sequence (training), u = 0 (evaluation)

For addition the task hands ``p_t`` (``Batch.positions``, :mod:`poslab.tasks.digit_addition` with
``positions="coupled"``): with the operands zero-padded to n digits and the sum to n + 1, a digit of
significance i, in either operand or in the sum, has id n + 1 - i, and every other token ('+', '=',
the end token) has id n + 2 ("digits of the same significance are in the same position"). These are the
paper's ids with starting id 1; the paper draws the starting id s uniformly from 1 .. max_pos - n - 1
during training, so every id 1 .. max_pos is trained and the ids of an n' = max_pos - 2 digit addition
at evaluation (start 1) were all seen. Here that draw is ``u = s - 1``, taken per sequence from the
longest id of the row, so the task stays a pure sampler and evaluation is deterministic.

The paper's defaults: max_pos = 202 for training on 1-30 digits and testing to 200 (its scripts; the
encoding needs max_pos >= longest tested n + 2). Ids past the table are refused by ``check_positions``.
Rows are initialised N(0, init_std^2). There is no other positional signal (the paper's model is
otherwise NoPE). The model refuses to run it without task positions (``task_positions``).

Notation: b batch, s token index, D model width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.errors import ConfigError, require_int
from poslab.positional.base import PositionalEncoding


class PositionCoupling(PositionalEncoding):
    kind = "absolute"
    extra_parameters = "(max_pos + 1) x d_model"
    cost = "O(s D) once, at the input"
    reference = "Cho et al. 2024 (arXiv 2405.20671)"
    task_positions = True

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, max_pos: int = 202,
                 random_start: bool = True, init_std: float = 0.02):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_int("max_pos", max_pos, 3, "an integer >= 3 (the largest position id; >= digits + 2)")
        if not isinstance(random_start, bool):
            raise ConfigError("random_start", random_start, "True, False")
        self.max_pos, self.random_start = max_pos, random_start
        self.W_pos = nn.Parameter(torch.randn(max_pos + 1, d_model) * init_std)  # row 0: padding

    def check_positions(self, max_position: int) -> None:
        if max_position > self.max_pos:
            raise ConfigError("max_pos", self.max_pos, f"an integer >= {max_position} (the largest position id "
                                                       "the task hands at evaluation)")

    def shifted(self, pos: Tensor) -> Tensor:
        """The ids the table is read at: ``pos`` [s] | [b, s] moved by a random start per sequence in
        training (real ids only: padding keeps 0), as they are otherwise."""
        if not (self.training and self.random_start):
            return pos
        room = (self.max_pos - pos.amax(dim=-1, keepdim=True)).clamp(min=0)  # [b, 1]: the largest u
        u = (torch.rand(room.shape, device=pos.device) * (room + 1)).floor().long().clamp(max=room)
        return torch.where(pos > 0, pos + u, pos)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + F.embedding(self.shifted(pos.long()), self.W_pos)  # [b, s, D]
