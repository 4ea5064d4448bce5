"""attention(): the fused kernel under vmap runs once, on the members folded into its batch axis,
and computes bit for bit what each member's own call computes."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from poslab import attention as attention_module
from poslab.attention import attention, build_mask
from poslab.positional import build_encoding

E, B, H, S, D = 3, 4, 2, 7, 8  # members, batch, heads, positions, head dim
NOPE = build_encoding("nope", d_model=H * D, n_heads=H, d_head=D, max_len=S)


def qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(E, B, H, S, D, generator=g, requires_grad=True) for _ in range(3)]


LENGTHS = torch.tensor([[7, 5, 3, 1], [6, 7, 2, 4], [1, 1, 7, 7]])  # [e, b]


def masks():
    """(name, the mask each member's call gets (a function of the member), whether it is mapped)."""
    pad = torch.arange(S) < LENGTHS[..., None]  # [e, b, j]
    return {
        "causal": (lambda e: None, None, True),
        "key padding, per member": (lambda e: build_mask(S, S, key_padding=pad[e]), build_mask(
            S, S, key_padding=pad.flatten(0, 1)).view(E, B, 1, 1, S), False),
        "square, shared": (lambda e: build_mask(S, S, causal=True, window=3), build_mask(S, S, causal=True, window=3),
                           False),
        "key padding, shared": (lambda e: build_mask(S, S, key_padding=pad[0]), build_mask(S, S, key_padding=pad[0]),
                                False),
    }


@pytest.mark.parametrize("case", list(masks()))
def test_fused_attention_under_vmap_equals_each_members_own_call_bit_for_bit(case, monkeypatch):
    own, mapped_mask, causal = masks()[case]
    seen = []
    kernel = F.scaled_dot_product_attention

    def recording(q, *args, **kw):
        seen.append(tuple(q.shape))
        return kernel(q, *args, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    q, k, v = qkv()
    pos = torch.arange(S)
    mask_dim = None if mapped_mask is None or case.endswith("shared") else 0

    def call(q, k, v, mask):
        return attention(q, k, v, NOPE, pos, pos, mask=mask, is_causal=causal).out

    out = vmap(call, in_dims=(0, 0, 0, mask_dim))(q, k, v, mapped_mask)  # [e, b, h, i, d]
    assert seen == [(E * B, H, S, D)]  # one call, the members folded into the batch
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    for e in range(E):
        qe, ke, ve = (x[e].detach().requires_grad_(True) for x in (q, k, v))
        alone = kernel(qe, ke, ve, attn_mask=own(e), is_causal=causal, scale=1 / math.sqrt(D))
        assert torch.equal(out[e], alone)
        for g, g_alone in zip(grads, torch.autograd.grad(alone.square().sum(), (qe, ke, ve)), strict=True):
            assert torch.equal(g[e], g_alone)
    assert out.abs().sum() > 0 and all(g.abs().sum() > 0 for g in grads)


def test_without_the_fold_vmap_takes_the_explicit_path_and_agrees(monkeypatch):
    q, k, v = qkv(1)
    pos = torch.arange(S)

    def call(q, k, v):
        return attention(q, k, v, NOPE, pos, pos, is_causal=True).out

    folded = vmap(call)(q, k, v)
    monkeypatch.setattr(attention_module, "FUSED_UNDER_VMAP", False)
    explicit = vmap(call)(q, k, v)
    torch.testing.assert_close(folded, explicit, rtol=1e-5, atol=1e-6)
