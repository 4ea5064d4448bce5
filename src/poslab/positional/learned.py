"""Learned absolute position embedding (APE; Gehring et al. 2017, Devlin et al. 2019).

    z_t = x_t + W_pos[t]

``W_pos`` has one learned row per position 0 .. max_position - 1. A position past the table is
handled by the declared out-of-range policy (the seed paper's inference-time fixes):

- ``error``: such positions are refused before any work (``check_positions``);
- ``clamp``: clamp-to-last, p -> min(p, N - 1);
- ``interpolate``: table interpolation, p -> p (N - 1) / (L - 1) with linear interpolation
  between rows, L - 1 the largest position of the sequence;
- ``rescale``: index rescaling, the same map rounded to the nearest row.

Rows are initialised N(0, init_std^2); ``init_std`` defaults to 0.02 (GPT-2's). Rows past the
training lengths never get a gradient, so this value decides what an unseen position carries
(the seed paper's Table 1 control compares it with N(0, 1)).

Notation: b batch, s position index, D model width, N table rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.errors import ConfigError, check_choice
from poslab.positional.base import PositionalEncoding

POLICIES = ("error", "clamp", "interpolate", "rescale")
LENGTH_DEPENDENT = ("interpolate", "rescale")  # map every position through the longest one


class LearnedAPE(PositionalEncoding):
    kind = "absolute"
    extra_parameters = "max_position x d_model"
    cost = "O(s D) once, at the input"
    reference = "Gehring et al. 2017; Devlin et al. 2019"

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int,
                 max_position: int | None = None, out_of_range: str = "error", init_std: float = 0.02):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        check_choice("out_of_range", out_of_range, POLICIES)
        self.max_position = int(max_position or max_len)
        if self.max_position < 1:
            raise ConfigError("max_position", max_position, "a positive integer")
        self.out_of_range = out_of_range
        self.W_pos = nn.Parameter(torch.randn(self.max_position, d_model) * init_std)

    @property
    def kv_cache(self) -> bool:
        # an earlier token's embedding moves when a longer sequence moves the longest position
        return self.out_of_range not in LENGTH_DEPENDENT

    def check_positions(self, max_position: int) -> None:
        if self.out_of_range == "error" and max_position >= self.max_position:
            raise ConfigError(
                "length", max_position + 1,
                f"at most {self.max_position} for a learned table of {self.max_position} rows "
                f"with out_of_range='error' (or declare out_of_range as one of {', '.join(POLICIES[1:])})")

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        last = self.max_position - 1
        if self.out_of_range in LENGTH_DEPENDENT:
            longest = pos.amax(dim=-1, keepdim=True).clamp(min=last)  # L - 1, never shrinks
            p = pos.to(torch.float32) * (last / longest)
            if self.out_of_range == "rescale":
                return x + F.embedding(p.round().long(), self.W_pos)
            lo = p.floor().long().clamp(max=last)
            hi = (lo + 1).clamp(max=last)
            w = (p - lo)[..., None]
            return x + (1 - w) * F.embedding(lo, self.W_pos) + w * F.embedding(hi, self.W_pos)
        return x + F.embedding(pos.long().clamp(max=last), self.W_pos)
