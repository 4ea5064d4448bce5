"""What a forward returns on request: everything a probe reads, named as TransformerLens names it.

Notation: b batch, h head, i query index, j key index, s position, d head dim, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class LayerIntermediates:
    attn_scores: Tensor  # logits before masking, [b, h, i, j]
    pattern: Tensor  # attention weights, [b, h, i, j]
    rot_q: Tensor  # queries after rotate_qk, [b, h, i, d]
    rot_k: Tensor  # keys after rotate_qk, [b, h, j, d]
    v: Tensor  # values, [b, h, j, d]
    resid_pre: Tensor  # residual stream entering the layer, [b, s, D]
    resid_post: Tensor  # residual stream leaving the layer, [b, s, D] (RetrievalHead: [b, 1, D])


@dataclass
class Intermediates:
    embed: Tensor  # token embedding after the embed hook, [b, s, D]
    positions: Tensor  # the positions used, [s] | [b, s]
    layers: list[LayerIntermediates] = field(default_factory=list)
