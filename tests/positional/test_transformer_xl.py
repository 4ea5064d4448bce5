"""Transformer-XL: the four-term logit of Dai et al. (2019), Eq. (3), as loops."""

from __future__ import annotations

import math

import torch

from poslab.attention import attention
from poslab.positional import build_encoding


def test_logits_against_the_four_terms():
    torch.manual_seed(0)
    h, d, d_model = 2, 4, 6
    enc = build_encoding("transformer_xl", d_model=d_model, n_heads=h, d_head=d, max_len=64)
    with torch.no_grad():  # make the biases matter
        enc.u.normal_()
        enc.v.normal_()
    q, k = torch.randn(2, h, 5, d), torch.randn(2, h, 6, d)
    q_pos = torch.tensor([[5, 6, 7, 8, 9], [20, 21, 22, 23, 24.5]])
    k_pos = torch.tensor([[4, 5, 6, 7, 8, 9], [0, 3, 6, 9, 12, 15]])
    scores = attention(q, k, k, enc, q_pos, k_pos, need_weights=True).attn_scores.detach()
    W_R, u, v = enc.W_R.detach().double(), enc.u.detach().double(), enc.v.detach().double()
    for b in range(2):
        for head in range(h):
            for i in range(5):
                for j in range(6):
                    t = float(q_pos[b, i] - k_pos[b, j])  # i - j
                    R = torch.tensor([f(t / 10000 ** (2 * f_i / d_model))
                                      for f_i in range(d_model // 2) for f in (math.sin, math.cos)],
                                     dtype=torch.float64)
                    qi, kj = q[b, head, i].double(), k[b, head, j].double()
                    a = qi @ kj
                    b_term = qi @ (W_R[head] @ R)
                    c = u[head] @ kj
                    d_term = v[head] @ (W_R[head] @ R)
                    expected = (a + b_term + c + d_term) / math.sqrt(d)
                    assert abs(float(scores[b, head, i, j]) - float(expected)) < 1e-4
