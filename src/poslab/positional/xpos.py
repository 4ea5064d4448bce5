"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv 2212.10554).

RoPE with a per-pair exponential decay: the query at position n is rotated and scaled by
zeta_i^(n / gamma), the key at position m by zeta_i^(-m / gamma), so

    q_n . k_m = sum_i zeta_i^((n - m) / gamma) Re[(q_n)_i conj((k_m)_i) e^{i (n - m) theta_i}]

depends on positions only through n - m and decays with the distance (zeta_i < 1), fastest for the
high frequencies:

    zeta_i  = (2i/d + zeta_0) / (1 + zeta_0),   zeta_0 = 0.4,   i = 0 .. d/2 - 1
    theta_i = base^(-2i/d)
    gamma   = scale_base (512)

The key scale grows as zeta^(-m/gamma), so the decay only makes sense for keys before the query:
xPos is defined for causal attention (``causal_only``; a bidirectional Transformer refuses it).
Positions are used as given (the paper's blockwise-causal variant is not implemented). In float32
the key scale zeta_0^(-m/gamma), zeta_0 = 0.4/1.4, overflows past m = 88.7 gamma / ln 3.5, about
36,000 positions at gamma = 512: give a larger ``scale_base`` for longer sequences.

Notation: b batch, h head, s position index, d head dim, n/m query/key position.
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.errors import ConfigError, check_choice
from poslab.positional.base import PositionalEncoding, head_axis, require_even, require_positive
from poslab.positional.rope import LAYOUTS, rotate
from poslab.positional.rope_scaling import rope_frequencies

ZETA_0 = 0.4


def xpos_zeta(d_head: int) -> Tensor:
    """zeta_i = (2i/d + 0.4) / 1.4, float32 [d/2]."""
    return ((torch.arange(0, d_head, 2, dtype=torch.float64) / d_head + ZETA_0) / (1 + ZETA_0)).float()


class XPos(PositionalEncoding):
    kind = "rotary"
    extra_parameters = "none"
    cost = "O(s d) per layer (rotation and scale of q and k)"
    reference = "Sun et al. 2022, A Length-Extrapolatable Transformer (xPos), arXiv 2212.10554"
    broadcasts_positions = True  # one rotor and scale per position
    causal_only = True

    inv_freq: Tensor
    zeta: Tensor

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, base: float = 10000.0,
                 scale_base: float = 512.0, layout: str = "interleaved"):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_even("d_head", d_head)
        check_choice("layout", layout, LAYOUTS)
        if isinstance(scale_base, bool) or not isinstance(scale_base, (int, float)):
            raise ConfigError("scale_base", scale_base, "a positive number (gamma, 512 in the paper)")
        require_positive("scale_base", scale_base)
        self.layout, self.scale_base = layout, float(scale_base)
        inv_freq, _ = rope_frequencies(d_head, base)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # theta_i, [d/2]
        self.register_buffer("zeta", xpos_zeta(d_head), persistent=False)  # zeta_i, [d/2]

    def rotary_frequencies(self) -> Tensor:
        return self.inv_freq  # the rotation; xPos's decay is a scale, not a rotation

    def scale(self, pos: Tensor, sign: float) -> Tensor:
        """zeta_i^(sign * pos / gamma): [s] | [b, s] -> [1, s, d/2] | [b, 1, s, d/2]."""
        exponent = head_axis(pos).to(torch.float32)[..., None] * (sign / self.scale_base)
        return self.zeta ** exponent

    def rotate_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return (rotate(q, q_pos, self.inv_freq, self.layout, self.scale(q_pos, 1.0)),
                rotate(k, k_pos, self.inv_freq, self.layout, self.scale(k_pos, -1.0)))
