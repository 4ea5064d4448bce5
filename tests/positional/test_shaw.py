"""Shaw et al.: logits and outputs against the paper's equations written as loops."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.attention import attention, build_mask
from poslab.errors import ConfigError
from poslab.positional import build_encoding


@pytest.mark.parametrize("share_heads", [True, False])
def test_logits_and_output_against_loops(share_heads):
    torch.manual_seed(0)
    h, d, k_max, n = 2, 4, 3, 7
    enc = build_encoding("shaw", d_model=8, n_heads=h, d_head=d, max_len=16, max_distance=k_max,
                         share_heads=share_heads)
    q, k, v = torch.randn(2, h, n, d), torch.randn(2, h, n, d), torch.randn(2, h, n, d)
    pos = torch.tensor([0, 1, 2, 3, 4, 8, 9])
    res = attention(q, k, v, enc, pos, pos, mask=build_mask(n, n, causal=True), need_weights=True)

    w_K, w_V = enc.w_K.detach(), enc.w_V.detach()
    table_K = (lambda head, r: w_K[r]) if share_heads else (lambda head, r: w_K[head, r])
    table_V = (lambda head, r: w_V[r]) if share_heads else (lambda head, r: w_V[head, r])
    logits = torch.empty(2, h, n, n)
    out = torch.zeros(2, h, n, d)
    for b in range(2):
        for head in range(h):
            for i in range(n):
                for j in range(n):
                    r = max(-k_max, min(k_max, int(pos[j] - pos[i]))) + k_max
                    logits[b, head, i, j] = q[b, head, i] @ (k[b, head, j] + table_K(head, r)) / math.sqrt(d)
                weights = logits[b, head, i, : i + 1].softmax(-1)  # causal
                for j in range(i + 1):
                    r = max(-k_max, min(k_max, int(pos[j] - pos[i]))) + k_max
                    out[b, head, i] += weights[j] * (v[b, head, j] + table_V(head, r))
    torch.testing.assert_close(res.attn_scores, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res.out, out, atol=1e-5, rtol=1e-5)


def test_bad_max_distance():
    with pytest.raises(ConfigError) as err:
        build_encoding("shaw", d_model=8, n_heads=2, d_head=4, max_len=8, max_distance=0)
    assert err.value.field == "max_distance"
