"""A KV cache under a length-dependent rotary schedule (Dynamic NTK, LongRoPE's switch): what a
cached decoder computes against a full recompute.

A length-dependent schedule picks its frequencies from the sequence length L. A decoder with a KV
cache rotates each key once, at the step it is computed (L = its position + 1), and keeps it; a
full recompute rotates every key again with the current L. Past the schedule's L0 the two differ:

    cached     logit(i, j) = q_i R(i theta'(i + 1)) . R(j theta'(j + 1)) k_j
    recompute  logit(i, j) = q_i R(i theta'(t + 1)) . R(j theta'(t + 1)) k_j   at step t

(theta'(L) = theta at L <= L0 for Dynamic NTK, so the two agree up to L0.)

On poslab's Transformer the cached computation is one forward with :class:`OwnStepRotary` in
place of the model's RoPE: every query and key at position p is rotated with the frequencies at
L = p + 1. Under a causal mask, row t of that forward is what a cached decoder computes at step t
(each position's hidden state depends only on positions <= it, each computed at its own step).
The recompute at step t is the model's own forward of the first t + 1 tokens. On a Hugging Face
checkpoint (:func:`hf_cached_logits`) the cache is the checkpoint's own, fed one token at a time.

Notation: b batch, t step (= position of the last token fed), m vocabulary, r rotated channels.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.positional.base import PositionalEncoding, head_axis
from poslab.positional.rope import RoPE, rotate


class OwnStepRotary(PositionalEncoding):
    """A length-dependent :class:`~poslab.positional.rope.RoPE` as a KV-cached decoder applies it:
    position p rotated with the schedule's frequencies at L = p + 1, whatever comes after."""

    kind = "rotary"
    extra_parameters = "none"
    cost = RoPE.cost
    reference = "the schedule's RoPE, each position rotated at its own step (a KV cache)"

    def __init__(self, rope: RoPE):
        if not isinstance(rope, RoPE) or not rope.length_dependent:
            raise ConfigError("encoding", type(rope).__name__, "a RoPE with a length-dependent schedule "
                                                               "(rope_type dynamic or longrope)")
        super().__init__(d_model=rope.d_model, n_heads=rope.n_heads, d_head=rope.d_head, max_len=rope.max_len)
        self.rope = rope

    def rotary_frequencies(self) -> Tensor:
        return self.rope.rotary_frequencies()

    def rotate_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return self._rotate(q, q_pos), self._rotate(k, k_pos)

    def _rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        at = head_axis(pos)  # [1, s] | [b, 1, s]
        length = (at.long() + 1).clamp(0, self.max_len)  # the step's L = p + 1
        inv_freq = self.rope.inv_freq_by_length[length]  # [1, s, r/2] | [b, 1, s, r/2]
        if self.rope.n_hat:  # LongRoPE: the first n_hat positions keep the original theta
            inv_freq = torch.where(at[..., None] < self.rope.n_hat, self.rope.inv_freq_original, inv_freq)
        return rotate(x, pos, inv_freq, self.rope.layout, self.rope.attention_factor)


def cached_model(model: nn.Module) -> nn.Module:
    """A copy of a poslab model (its ``encoding`` a length-dependent RoPE) that computes what a
    KV-cached decoder computes (:class:`OwnStepRotary`)."""
    layout = getattr(model.cfg, "layout", None)
    if layout is not None:  # its layers' own encodings would keep the recompute's rotation
        raise ConfigError("layout", layout, "None: the cached decoder replaces the model's one encoding")
    cached = copy.deepcopy(model)
    cached.encoding = OwnStepRotary(cached.encoding)  # type: ignore[arg-type]  # a RoPE: the caller's model has one
    return cached


@torch.no_grad()
def cache_gap(model: nn.Module, tokens: Tensor, steps: Sequence[int]) -> list[dict]:
    """Per step t of ``steps`` (t + 1 < tokens' length): the cached decoder's logits at t against
    the recompute's (the model's forward of tokens[:, :t + 1]). ``tokens`` [b, T]. Rows: ``step``,
    ``logit_gap`` (max |delta logit| over the batch and vocabulary), ``loss_cached`` and
    ``loss_recompute`` (mean next-token cross-entropy at t), ``argmax_agree`` (share of sequences
    whose top token agrees)."""
    cached = cached_model(model)(tokens)  # [b, T, m]: every step at once
    rows = []
    for t in steps:
        fresh = model(tokens[:, : t + 1])[:, t]  # [b, m]
        rows.append(step_row(t, cached[:, t], fresh, tokens[:, t + 1]))
    return rows


def step_row(t: int, cached: Tensor, fresh: Tensor, target: Tensor) -> dict:
    """One step's comparison of cached [b, m] and recomputed [b, m] logits against ``target`` [b]."""
    ce = nn.functional.cross_entropy
    return dict(step=int(t), logit_gap=float((cached.float() - fresh.float()).abs().max()),
                loss_cached=float(ce(cached.float(), target)), loss_recompute=float(ce(fresh.float(), target)),
                argmax_agree=float((cached.argmax(-1) == fresh.argmax(-1)).double().mean()))


# ----------------------------------------------------------------------------- a Hugging Face checkpoint

@torch.no_grad()
def hf_cached_logits(hf: nn.Module, tokens: Tensor, prefill: int, keep: Sequence[int]) -> tuple[dict, Tensor]:
    """Teacher-forced decoding of ``tokens`` [1, T] with the checkpoint's own KV cache: the first
    ``prefill`` tokens in one forward, then one token a step. Returns ({t: logits [1, m]} for t in
    ``keep``, the next-token loss at every step t >= prefill - 1, [T - prefill])."""
    T = tokens.shape[1]
    out = hf(input_ids=tokens[:, :prefill], use_cache=True, logits_to_keep=1)
    cache, logits = out.cache, out.logits[:, -1].float()
    kept, losses = {}, []
    for t in range(prefill - 1, T - 1):
        if t >= prefill:
            pos = torch.tensor([[t]], device=tokens.device)
            out = hf(input_ids=tokens[:, t:t + 1], cache=cache, position_ids=pos, use_cache=True)
            cache, logits = out.cache, out.logits[:, -1].float()
        if t in keep:
            kept[t] = logits
        losses.append(nn.functional.cross_entropy(logits, tokens[:, t + 1]))
    return kept, torch.stack(losses)


@torch.no_grad()
def hf_recompute_logits(hf: nn.Module, tokens: Tensor, t: int) -> Tensor:
    """The logits at step t [1, m] of a forward of tokens[:, :t + 1], no cache: every key rotated with
    the length of that forward."""
    return hf(input_ids=tokens[:, : t + 1], use_cache=False, logits_to_keep=1).logits[:, -1].float()
