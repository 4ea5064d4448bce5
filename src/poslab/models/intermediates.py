"""What a forward returns on request: everything a probe reads, named as TransformerLens names it.

    q, k          = W_Q a, W_K a                         projected, before ``rotate_qk``
    rot_q, rot_k  = rotate_qk(q, k, q_pos, k_pos)        what the logits see
    attn_scores   = (rot_q . rot_k / sqrt(d) + bias) / tau      before masking
    pattern       = softmax over the kept keys (linear attention: the masked scores)

``model.collect(batch)`` runs the forward with ``return_intermediates=True`` under
``torch.no_grad()`` and fills in ``logits``, ``lengths`` and ``prefix``; a bare forward leaves
them at their defaults (None, None, 0), so probes take what ``collect`` returns.

Sequence axis: the model's internal sequence, ``prefix`` positions (1 with a BOS vector, else 0)
followed by the tokens, so token t of a sequence sits at index ``prefix + t`` and its last real
token at ``prefix + lengths - 1``. The query axis ``i`` is either that whole sequence
(``Transformer``) or one row, the last real token's query (``RetrievalHead``).

Notation: b batch, h head, i query index, j key index, s sequence index (internal), d head dim,
D model width, m vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class LayerIntermediates:
    attn_scores: Tensor  # logits before masking, [b, h, i, j]
    pattern: Tensor  # attention weights, [b, h, i, j]
    q: Tensor  # projected queries before rotate_qk, [b, h, i, d]
    k: Tensor  # projected keys before rotate_qk, [b, h, j, d]
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
    logits: Tensor | None = None  # the model's output, [b, m] | [b, s_tokens, m] (set by collect)
    lengths: Tensor | None = None  # real tokens per sequence, [b], BOS not counted (set by collect)
    prefix: int = 0  # internal positions before the first token: 1 with BOS (set by collect)
