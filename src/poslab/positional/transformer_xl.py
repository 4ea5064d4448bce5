"""Transformer-XL relative attention (Dai et al. 2019, "Transformer-XL: Attentive Language
Models Beyond a Fixed-Length Context"), its Eq. (3) without the memory:

    logit_ij = [ q_i^T k_j  +  q_i^T W_R R_{i-j}  +  u^T k_j  +  v^T W_R R_{i-j} ] / sqrt(d)
                  (a)              (b)                (c)          (d)

R_t is the sinusoid of the relative distance t = i - j (``base.sinusoid_table``, width
``d_rel`` = d_model by default; no parameters), W_R [h, d, d_rel] a learned projection per head,
u and v [h, d] the learned global content and position biases. Attention computes (a); this
encoding's ``score_bias`` returns ((b) + (c) + (d)) / sqrt(d).

(b) + (d) = (q_i + v)^T W_R R_{i-j} is computed without building R for every (i, j) pair: with
x = W_R^T (q_i + v) split into the coefficients (x_s, x_c) of each frequency's (sin, cos) and
A = omega p_i, B = omega p_j, the angle-difference identities give
x_s sin(A - B) + x_c cos(A - B) = (x_s sin A + x_c cos A) cos B + (x_c sin A - x_s cos A) sin B,
one matmul against the keys' (cos B, sin B).

Notation: b batch, h head, i/j query/key position (p_i, p_j their values), d head dim,
d_rel sinusoid width, f frequency index, omega_f = base^(-2f/d_rel).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from poslab.positional.base import PositionalEncoding, head_axis, require_even, require_positive


class TransformerXL(PositionalEncoding):
    kind = "relative"
    extra_parameters = "n_heads x d_head x (d_rel + 2)  (W_R, u, v)"
    cost = "O(i j d_rel) per head"
    reference = "Dai et al. 2019, Transformer-XL"

    omega: Tensor  # buffer

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, d_rel: int | None = None,
                 base: float = 10000.0, init_std: float = 0.02):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        self.d_rel = d_model if d_rel is None else d_rel
        require_even("d_rel", self.d_rel)
        require_positive("base", base)
        self.base = base
        self.W_R = nn.Parameter(torch.randn(n_heads, d_head, self.d_rel) / math.sqrt(self.d_rel))  # [h, d, d_rel]
        self.u = nn.Parameter(torch.randn(n_heads, d_head) * init_std)  # content bias, [h, d]
        self.v = nn.Parameter(torch.randn(n_heads, d_head) * init_std)  # position bias, [h, d]
        omega = base ** (-torch.arange(0, self.d_rel, 2, dtype=torch.float32) / self.d_rel)
        self.register_buffer("omega", omega, persistent=False)  # [d_rel/2]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        d = q.shape[-1]
        content = torch.einsum("hd,bhjd->bhj", self.u.to(q.dtype), k)[..., None, :]  # (c), [b, h, 1, j]

        x = torch.einsum("bhid,hdr->bhir", q + self.v.to(q.dtype)[:, None, :], self.W_R.to(q.dtype))
        x_s, x_c = x[..., 0::2], x[..., 1::2]  # sin / cos coefficients, [b, h, i, d_rel/2]
        a = head_axis(q_pos).to(q.dtype)[..., None] * self.omega.to(q.dtype)  # A, [1|b, 1, i, d_rel/2]
        b = head_axis(k_pos).to(q.dtype)[..., None] * self.omega.to(q.dtype)  # B, [1|b, 1, j, d_rel/2]
        coef_cos = x_s * a.sin() + x_c * a.cos()  # [b, h, i, d_rel/2]
        coef_sin = x_c * a.sin() - x_s * a.cos()
        position = coef_cos @ b.cos().transpose(-1, -2) + coef_sin @ b.sin().transpose(-1, -2)  # (b)+(d), [b, h, i, j]
        return (position + content) / math.sqrt(d)
