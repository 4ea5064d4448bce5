"""Learned APE: z_t = x_t + W_pos[t], and the out-of-range policies against hand formulas."""

import pytest
import torch

from poslab.positional import build_encoding


def ape(policy, N=8):
    torch.manual_seed(0)
    return build_encoding("learned", d_model=4, n_heads=1, d_head=4, max_len=N, out_of_range=policy)


def test_in_range_adds_the_row():
    enc = ape("error")
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(enc.embed(x, torch.arange(5)), x + enc.W_pos[:5])


def test_clamp_to_last_row():
    enc = ape("clamp")
    out = enc.embed(torch.zeros(1, 12, 4), torch.arange(12))[0]
    for p in range(12):
        torch.testing.assert_close(out[p], enc.W_pos[min(p, 7)])


@pytest.mark.parametrize("policy", ["interpolate", "rescale"])
def test_index_rescaling_and_table_interpolation(policy):
    enc, L, N = ape(policy), 15, 8
    out = enc.embed(torch.zeros(1, L, 4), torch.arange(L))[0]
    W = enc.W_pos.detach()
    for p in range(L):
        u = p * (N - 1) / (L - 1)  # position p of a length-L sequence read on an N-row table
        if policy == "rescale":
            expected = W[round(u)]
        else:
            lo = int(u)
            hi = min(lo + 1, N - 1)
            expected = (1 - (u - lo)) * W[lo] + (u - lo) * W[hi]
        torch.testing.assert_close(out[p].detach(), expected, rtol=1e-5, atol=1e-6)
    # sequences that fit the table are read as they are
    short = enc.embed(torch.zeros(1, 6, 4), torch.arange(6))[0]
    torch.testing.assert_close(short.detach(), W[:6])
