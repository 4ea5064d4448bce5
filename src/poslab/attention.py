"""One attention function for every encoding.

    logits_ij = (q_i^T k_j / sqrt(d) + bias_ij) / tau          (q, k after rotate_qk)
    weights   = softmax_j(logits + log gate_j + mask)            (softmax attention)
              = logits * gate_j * mask                            (linear: no normalization,
                                                                   the seed paper's Section 7)
    out_i     = sum_j weights_ij v_j + value_bias_i

Every hook of the encoding is called unconditionally; ``None`` from ``score_bias`` or
``value_bias`` means "nothing to add". The fused ``scaled_dot_product_attention`` computes the
attention (with the mask) when all of these hold: it is softmax attention, no value bias is
returned, no learned score bias or key gate is returned (their gradients cannot flow through the
fused kernel's mask; a fixed bias such as ALiBi's travels as a float ``attn_mask``), and the
weights are not asked for. Otherwise the explicit path below computes it.

``is_causal=True`` says the mask is exactly the square causal one (query i keeps keys j <= i) and
``mask`` is then left None: the fused kernel gets ``is_causal=True`` instead of a dense boolean
mask (it skips the masked half), and the explicit path builds the mask itself. Under ``vmap``
(the ensemble trainer) the fused kernel is used too when ``FUSED_UNDER_VMAP``, with the member
axis folded into its batch axis (:class:`_MembersInBatch`): torch has no vmap rule for it on CPU
and would otherwise call it once per member. Attention treats every (sequence, head) alone, so
members folded into the batch compute what each computes alone (tests/test_attention_fold.py).

Notation: b batch, h head, i query index, j key index, d head dim.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.errors import check_choice
from poslab.positional.base import PositionalEncoding

KINDS = ("softmax", "linear")
# Under vmap the fused kernel runs once on the members folded into its batch axis (False: the
# explicit path, which vmap batches itself; ``poslab bench lm`` times both).
FUSED_UNDER_VMAP = True
warnings.filterwarnings("ignore", message=".*batching rule for aten::_scaled_dot_product")


@dataclass
class AttentionOutput:
    out: Tensor  # [b, h, i, d]
    attn_scores: Tensor | None = None  # logits before masking, [b, h, i, j]
    pattern: Tensor | None = None  # attention weights, [b, h, i, j]
    rot_q: Tensor | None = None  # queries after rotate_qk, [b, h, i, d]
    rot_k: Tensor | None = None  # keys after rotate_qk, [b, h, j, d]


def build_mask(n_q: int, n_k: int, *, causal: bool = False, window: int | None = None,
               key_padding: Tensor | None = None, device=None, chunk: int | None = None) -> Tensor | None:
    """Boolean keep-mask broadcastable to [b, h, i, j], or None when everything is kept.

    Causal, window and chunk masks use sequence indices, aligned at the end (query i is key
    i + n_k - n_q), so a cached prefix of keys works; ``chunk``: query i keeps only keys with
    j // chunk == i // chunk. ``key_padding`` [b, j] is True where a key is real.
    """
    mask = None
    if causal or window is not None or chunk is not None:
        i = torch.arange(n_q, device=device)[:, None] + (n_k - n_q)
        j = torch.arange(n_k, device=device)[None, :]
        mask = j <= i if causal else torch.ones(n_q, n_k, dtype=torch.bool, device=device)
        if window is not None:
            mask = mask & (i - j < window)
        if chunk is not None:
            mask = mask & (i // chunk == j // chunk)
    if key_padding is not None:
        pad = key_padding[:, None, None, :]
        mask = pad if mask is None else mask & pad
    return mask


# max-args: the four hooks need q, k, v, the encoding and both positions; the rest are keyword-only options
def attention(q: Tensor, k: Tensor, v: Tensor, encoding: PositionalEncoding, q_pos: Tensor, k_pos: Tensor,  # noqa: PLR0913
              *, mask: Tensor | None = None, kind: str = "softmax", temperature: float = 1.0,
              key_gate: Tensor | None = None, need_weights: bool = False, is_causal: bool = False,
              dropout: float = 0.0, stream: Tensor | None = None) -> AttentionOutput:
    """q [b, h, i, d], k and v [b, h, j, d]; mask boolean keep-mask broadcastable to [b, h, i, j];
    key_gate positive weights on keys broadcastable to [b, h, 1, j]; ``is_causal``: the mask is
    the square causal one (``mask`` must be None); ``dropout``: on the weights (training only);
    ``stream``: the layer's input at the key positions [b, j, D], handed to ``score_bias`` as ``x=``
    for an encoding that ``reads_stream`` (the others never see it)."""
    check_choice("attention", kind, KINDS)
    if is_causal and mask is not None:
        raise ValueError("attention: give either is_causal=True or a mask, not both")
    d = q.shape[-1]
    q, k = encoding.rotate_qk(q, k, q_pos, k_pos)
    # a flag fixed by the class, not a tensor value: the other encodings keep their four-argument hook
    bias = (encoding.score_bias(q, k, q_pos, k_pos, x=stream) if encoding.reads_stream  # type: ignore[call-arg]
            else encoding.score_bias(q, k, q_pos, k_pos))
    vmapped = _is_vmapped(q)
    if _fusable(kind, need_weights, key_gate, encoding, bias, vmapped, dropout):
        return AttentionOutput(out=_fused(q, k, v, bias, mask, is_causal, temperature, dropout, vmapped))

    if is_causal:
        mask = build_mask(q.shape[-2], k.shape[-2], causal=True, device=q.device)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)  # [b, h, i, j]
    if bias is not None:
        scores = scores + bias
    scores = scores / temperature
    weights = attention_weights(scores, mask, kind, key_gate)
    if dropout > 0:
        weights = F.dropout(weights, dropout)
    out = weights @ v
    extra_v = encoding.value_bias(weights, q_pos, k_pos)
    if extra_v is not None:
        out = out + extra_v
    return AttentionOutput(out=out, attn_scores=scores, pattern=weights, rot_q=q, rot_k=k)


def _fusable(kind: str, need_weights: bool, key_gate: Tensor | None, encoding: PositionalEncoding,
             bias: Tensor | None, vmapped: bool, dropout: float) -> bool:
    """Whether the fused kernel computes this attention (see the module docstring)."""
    # Under vmap a bias's requires_grad is not visible (the batched wrapper hides it): no bias then.
    return (kind == "softmax" and not need_weights and key_gate is None and not _has_value_bias(encoding)
            and (bias is None or not (vmapped or bias.requires_grad))
            and (not vmapped or (FUSED_UNDER_VMAP and dropout == 0)))


def _fused(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None, is_causal: bool,
           temperature: float, dropout: float, vmapped: bool) -> Tensor:
    """The fused kernel's output [b, h, i, d] (members folded into its batch axis under vmap)."""
    extra, causal = mask, is_causal
    if bias is not None:  # a fixed bias (ALiBi) travels as a float mask
        extra = bias / temperature
        if is_causal:
            mask, causal = build_mask(q.shape[-2], k.shape[-2], causal=True, device=q.device), False
        if mask is not None:
            extra = extra.masked_fill(~mask, -math.inf)
    scale = 1.0 / (math.sqrt(q.shape[-1]) * temperature)
    if vmapped:  # dropout is 0 here (``_fusable``)
        return _MembersInBatch.apply(q, k, v, extra, causal, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=extra, is_causal=causal, dropout_p=dropout, scale=scale)


def attention_weights(scores: Tensor, mask: Tensor | None, kind: str, key_gate: Tensor | None = None) -> Tensor:
    """Scaled logits [..., j] -> weights over keys: softmax(l + log gate) or, for linear
    attention, l * gate; masked keys get weight 0."""
    if kind == "softmax":
        logits = scores if key_gate is None else scores + key_gate.log()
        if mask is not None:
            logits = logits.masked_fill(~mask, -math.inf)
        return logits.softmax(dim=-1)
    weights = scores if key_gate is None else scores * key_gate
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


class _MembersInBatch(torch.autograd.Function):
    """The fused kernel under ``vmap``, the member axis e folded into its batch axis b.

    torch's CPU ``scaled_dot_product_attention`` has no vmap batching rule, so vmap would call it
    once per member (its "performance drop" fallback). The ``vmap`` rule here moves the member
    axis of q, k, v [e, b, h, i | j, d] and of the mask to the front and runs the kernel once on
    [e b, h, i | j, d]; a mask without a member axis is broadcast over it. The ops inside run
    below vmap, where autograd records them as it records any other, so the kernel's own backward
    serves; ``forward`` (called only outside vmap, where :func:`attention` calls the kernel
    directly) is the kernel itself and has no backward of its own."""

    @staticmethod
    def forward(q, k, v, mask, is_causal, scale):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("attention: _MembersInBatch is for vmap only; call the kernel directly outside it")

    @staticmethod
    def vmap(info, in_dims, q, k, v, mask, is_causal, scale):
        e = info.batch_size

        def lead(x: Tensor, dim: int | None) -> Tensor:  # the member axis first: [e, ...]
            return x.expand(e, *x.shape) if dim is None else x.movedim(dim, 0)

        q, k, v = (lead(x, dim) for x, dim in zip((q, k, v), in_dims[:3], strict=True))
        b = q.shape[1]
        if mask is not None:
            mask = lead(mask, in_dims[3])  # [e, up to 4 dims broadcastable to b, h, i, j]
            mask = mask.reshape(e, *[1] * (q.dim() - mask.dim()), *mask.shape[1:])  # [e, b | 1, h | 1, i | 1, j]
            mask = mask.expand(e, b, *mask.shape[2:]).flatten(0, 1)  # [e b, h | 1, i | 1, j]
        out = F.scaled_dot_product_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), attn_mask=mask,
                                             is_causal=is_causal, scale=scale)  # [e b, h, i, d]
        return out.view(e, b, *out.shape[1:]), 0


def _is_vmapped(x: Tensor) -> bool:
    # The fused kernel has no vmap batching rule on CPU (torch loops it over members). torch has
    # no public "is this tensor batched by vmap" query (torch.func exposes none), hence the
    # private one; tests/models check both paths give the same numbers.
    return torch._C._functorch.is_batchedtensor(x)


def _has_value_bias(encoding: PositionalEncoding) -> bool:
    # The value hook needs the weights, so whether the class overrides it is asked, not probed.
    return encoding.uses("value_bias")
