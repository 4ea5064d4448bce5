"""The four-hook protocol every positional encoding implements.

Notation: ``b`` batch, ``h`` head, ``i``/``j`` query/key index, ``s`` sequence index,
``d`` head dim, ``D`` model width.

Attention calls every hook unconditionally (see :mod:`poslab.attention`)::

    x   = enc.embed(x, pos)                          # [b, s, D]   add position to the stream
    q,k = enc.rotate_qk(q, k, q_pos, k_pos)          # [b, h, i|j, d] transform by position
    l   = q k^T / sqrt(d) + enc.score_bias(q, k, q_pos, k_pos)      # [b, h, i, j]
    o   = softmax(l / tau) v + enc.value_bias(weights, q_pos, k_pos)  # [b, h, i, d]

A hook that does not apply returns its input unchanged (``embed``, ``rotate_qk``) or ``None``
(``score_bias``, ``value_bias``), which lets attention take the fused
``scaled_dot_product_attention`` path when no per-pair tensor is needed.

Positions are explicit integer or float tensors of shape ``[s]`` (shared by the batch) or
``[b, s]``; nothing assumes ``arange``. Hooks must be pure: no buffer writes, no ``.item()``,
no Python branches on tensor values, so ``torch.func.vmap`` can map them over ensemble members.

Two encodings need more than positions in ``score_bias`` (an extension of the protocol that
leaves every other encoding as it was):

- ``reads_stream = True``: ``score_bias(q, k, q_pos, k_pos, x=x)`` also receives the attention
  layer's input at the key positions, ``x [b, j, D]`` (the normalized residual stream; the
  Forgetting Transformer's gate reads it). Attention passes ``x`` only to such an encoding, so
  the four-argument hooks of the others are called exactly as before.
- ``contextual = True``: the bias of a pair (i, j) depends on the other tokens of the sequence
  (CoPE's gated counts, the forget gate's products), so a fast path that scores every
  (token, position) pair on its own (the retrieval head's grid) must not be used for it, and
  keys must be given whole (not in chunks) in their sequence order.

``causal_only = True`` says the formula is defined for causal attention only (xPos's growing key
scale, FIRE's log of i - j, CoPE's and the forget gate's sums from j to i): a model that knows
it is bidirectional refuses such an encoding when its config is built.

Metadata is computed where it can be: ``enc.sites`` are the hooks the encoding's class
overrides (a fast path asks ``enc.uses("value_bias")``, so an override can never be skipped
for want of a declaration), ``enc.kv_cache`` is decided by the instance's options, and
``enc.rotary_frequencies()`` says whether (and with which theta) queries and keys are rotated.
Only what no code can know is written by hand, per class: ``kind``, ``extra_parameters``,
``cost`` and ``reference``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError, check_choice

SITES = ("embed", "rotate_qk", "score_bias", "value_bias")  # the four hooks
KINDS = ("none", "absolute", "relative", "rotary", "hybrid")


@dataclass(frozen=True, kw_only=True)
class Metadata:
    """What the survey's comparison table says about one built encoding."""

    sites: tuple[str, ...]  # hooks the class overrides, in SITES order (computed)
    kind: str  # one of KINDS (the class's ``kind``)
    parameters: str  # extra learned parameters, as a formula in the config's names
    cost: str  # extra cost class per attention layer
    kv_cache: bool  # cached keys stay valid as the sequence grows (computed from the options)
    reference: str  # paper the formula comes from


class PositionalEncoding(nn.Module):
    """Base class: every hook is the identity. Subclasses override the hooks they use.

    Every encoding is built with the same geometry keywords, ``d_model``, ``n_heads``,
    ``d_head`` and ``max_len`` (the longest position a table must hold), plus its own options.
    A subclass writes the four survey fields below; everything else about it is derived.
    """

    kind: ClassVar[str]  # one of KINDS; readable from the class: encoding_class(name).kind
    extra_parameters: ClassVar[str]  # extra learned parameters, as a formula in the config's names
    cost: ClassVar[str]  # extra cost class per attention layer
    reference: ClassVar[str]  # paper the formula comes from
    # rotate_qk maps each position's vector by that position alone, so a [..., h, g, 1, d] input
    # broadcasts against positions [s] to [..., h, g, s, d] (a fast path hands it one vector per
    # token instead of a copy per position); False unless a class says so
    broadcasts_positions: ClassVar[bool] = False
    reads_stream: ClassVar[bool] = False  # score_bias also takes x= the layer's input [b, j, D] (module docstring)
    contextual: ClassVar[bool] = False  # a pair's bias depends on other tokens: no per-pair fast path
    causal_only: ClassVar[bool] = False  # defined for causal attention only: a bidirectional model refuses it
    # positions must come from the task (Batch.positions: digit significance for position coupling and Abacus);
    # a model refuses to fall back on its own 0 .. s - 1
    task_positions: ClassVar[bool] = False

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int):
        super().__init__()
        self.d_model, self.n_heads, self.d_head, self.max_len = d_model, n_heads, d_head, max_len

    # -- derived metadata

    @property
    def sites(self) -> tuple[str, ...]:
        """The hooks this encoding's class overrides, in SITES order."""
        return overridden_hooks(type(self))  # type: ignore[arg-type]  # a class is hashable; mypy misreads its __hash__

    def uses(self, hook: str) -> bool:
        """Whether the class overrides ``hook`` (one of SITES): a fast path may skip only hooks it does not."""
        check_choice("hook", hook, SITES)
        return hook in self.sites

    @property
    def kv_cache(self) -> bool:
        """Whether cached keys stay valid as the sequence grows.

        True unless a hook reads the sequence's longest position (a length-dependent rotary
        schedule, a rescaled table); encodings with such options override this.
        """
        return True

    def rotary_frequencies(self) -> Tensor | None:
        """theta [d/2] by which ``rotate_qk`` rotates the pairs of q and k, or None.

        A rotary encoding also has ``layout`` ("interleaved" | "half"), so
        ``poslab.positional.rope.rotate(x, delta, enc.rotary_frequencies(), enc.layout)``
        rotates ``x`` by the offsets ``delta`` as the encoding does (RoPE's attention factor aside).
        """
        return None

    @property
    def is_rotary(self) -> bool:
        return self.rotary_frequencies() is not None

    @property
    def meta(self) -> Metadata:
        """This encoding's row of the survey's comparison table."""
        return Metadata(sites=self.sites, kind=self.kind, parameters=self.extra_parameters, cost=self.cost,
                        kv_cache=self.kv_cache, reference=self.reference)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        """x [b, s, D], pos [s] | [b, s] -> [b, s, D]."""
        return x

    def rotate_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """q [b, h, i, d], k [b, h, j, d] -> the same shapes."""
        return q, k

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Added to the scaled logits: broadcastable to [b, h, i, j], or None."""
        return None

    def value_bias(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """weights [b, h, i, j] -> added to the attention output [b, h, i, d], or None."""
        return None

    def check_positions(self, max_position: int) -> None:
        """Raise ConfigError if positions up to ``max_position`` cannot be encoded."""

    def penalty(self) -> Tensor | None:
        """A term the model adds to its training loss (MoPE's admissibility penalty), or None."""
        return None


# ----------------------------------------------------------------------------- helpers

_HOOKS_OF: dict[type, tuple[str, ...]] = {}  # a plain dict, not functools.cache: torch.compile traces it silently


def overridden_hooks(cls: type[PositionalEncoding]) -> tuple[str, ...]:
    """The hooks (of SITES) that ``cls`` defines differently from :class:`PositionalEncoding`."""
    hooks = _HOOKS_OF.get(cls)
    if hooks is None:
        base = PositionalEncoding
        hooks = _HOOKS_OF[cls] = tuple(hook for hook in SITES if getattr(cls, hook) is not getattr(base, hook))
    return hooks


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Query minus key position with a head axis: [s]|[b, s] -> [1, i, j] | [b, 1, i, j]."""
    rel = q_pos[..., :, None] - k_pos[..., None, :]
    return rel.unsqueeze(-3)


def heads_first(per_pair: Tensor) -> Tensor:
    """A function of :func:`relative_positions` with one output per head, [1 | b, 1, i, j, h], as a
    score bias [1 | b, h, i, j] (the head axis moved before i, j; the relative grid's own head axis
    dropped for batched positions)."""
    bias = per_pair.movedim(-1, -3)  # [1, h, i, j] | [b, 1, h, i, j]
    return bias.squeeze(1) if bias.dim() == 5 else bias


def head_axis(pos: Tensor) -> Tensor:
    """[s] -> [1, s]; [b, s] -> [b, 1, s]: positions that broadcast against [b, h, s, ...]."""
    return pos.unsqueeze(-2)


def require_even(field: str, value: int) -> None:
    if value % 2:
        raise ConfigError(field, value, "an even number (rotary pairs channels)")


def require_positive(field: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(field, value, "a positive number")


def sinusoid_table(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(...).

    positions [...] -> [..., dim]. ``dim`` must be even.
    """
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [..., dim/2]
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # [..., dim]
