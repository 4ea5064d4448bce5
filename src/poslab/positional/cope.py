"""Contextual position encoding (CoPE; Golovneva et al. 2024, "Contextual Position Encoding:
Learning to Count What's Important", arXiv 2405.18719).

Positions are counted by the content: each key between j and the query i counts by a gate.

    g_ij  = sigmoid(q_i . k_j)                                        gate, in (0, 1)
    p_ij  = sum_{t = j .. i} g_it                                     contextual position (a float)
    e(p)  = (p - floor p) e[ceil p] + (ceil p - p) e[floor p]        + e[p] at whole p
    logit_ij = q_i^T k_j / sqrt(d) + q_i . e(p_ij)

with learned position embeddings e[0 .. npos_max - 1] in R^d (shared by the heads, as in the
paper's code; each head still counts with its own gates), p clamped to npos_max - 1. The gate is
the paper's Eq. 3 as written, sigmoid of the unscaled q_i . k_j; the added term q_i . e is not
divided by sqrt(d) either (it is added to the logit as the paper adds it).

"Keys between j and i" is read off the positions: t runs over the keys with
k_pos[j] <= k_pos[t] <= q_pos[i]; keys must come in increasing position order and whole (the
sum runs over all of them), which is why CoPE is ``contextual``: the retrieval head's per-pair
grid does not apply, and a streamed evaluator must hand it all keys at once. Keys after the
query count nothing and are masked anyway (CoPE is ``causal_only``).

Notation: b batch, h head, i/j/t query/key/key position index, d head dim, P npos_max.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from poslab.errors import require_positive_int
from poslab.positional.base import PositionalEncoding


class CoPE(PositionalEncoding):
    kind = "relative"
    extra_parameters = "npos_max x d_head"
    cost = "O(i j d) per head (gates, a cumulative sum, and q . e for every count)"
    reference = "Golovneva et al. 2024, Contextual Position Encoding (CoPE), arXiv 2405.18719"
    contextual = True
    causal_only = True

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, npos_max: int = 64,
                 init_std: float = 0.02):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_positive_int("npos_max", npos_max)
        self.npos_max = npos_max
        self.pos_emb = nn.Parameter(torch.randn(npos_max, d_head) * init_std)  # e[p], [P, d]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        gates = torch.sigmoid(q @ k.transpose(-1, -2))  # g_it, [b, h, i, t]
        before = k_pos[..., None, :] <= q_pos[..., :, None]  # key t at or before query i, [i, t] | [b, i, t]
        gates = gates * before.unsqueeze(-3).to(gates.dtype)
        p = gates.flip(-1).cumsum(-1).flip(-1)  # p_ij = sum_{t >= j} g_it, [b, h, i, j]
        p = p.clamp(max=self.npos_max - 1)
        lo = p.floor()
        w = p - lo  # weight of e[ceil p]
        logits_e = q @ self.pos_emb.to(q.dtype).T  # q_i . e[p] for every whole p, [b, h, i, P]
        at_lo = logits_e.gather(-1, lo.long())  # [b, h, i, j]
        at_hi = logits_e.gather(-1, p.ceil().long())
        return at_hi * w + at_lo * (1 - w)
