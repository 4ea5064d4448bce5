"""A pretrained causal LM as a poslab model: the checkpoint's own modules, read through hooks.

    model = load("smollm2-135m")             # fp32 on CPU (bf16 on request, on a GPU)
    model.loss(batch)                        # mean next-token cross-entropy, as poslab's models
    model.collect(batch) -> Intermediates    # per layer: attn_scores, pattern, q, k, rot_q, rot_k, v,
                                             # resid_pre, resid_post (models/intermediates.py)
    model.set_schedule({"rope_type": "yarn", "factor": 2.0})   # poslab's rotary replaces the checkpoint's
    model.rotary_frequencies()               # theta_i in use, [r/2]

Nothing is re-implemented per architecture (DESIGN.md, STYLE.md 16). ``collect`` registers, for
the one forward it runs,

- a forward pre-hook and hook on every decoder layer (``resid_pre`` / ``resid_post``), and a
  pre-hook on each layer's attention module that keeps the ``position_embeddings`` (cos, sin) it
  is handed;
- poslab's attention function under the checkpoint's own attention interface
  (``transformers``' ``AttentionInterface``, with the eager additive mask, so a sliding window
  is the checkpoint's own): it receives the rotated queries and keys, computes
  ``attn_scores = rot_q . rot_k * scaling`` (before the mask) and ``pattern`` = softmax with the
  mask, and returns the attention output exactly as eager attention does.

Queries and keys before rotation are the rotated ones rotated back: with C = A cos, S = A sin
per channel, ``rot = x C + partner(x) S`` so ``x = (rot C - partner(rot) S) / A^2`` on the r
rotated channels (exact to float rounding; tests compare it with the ``q_proj`` output of a Llama
and a GPT-J). ``partner`` is the layout's: ``rotate_half`` for the half layout, pairs (i, i + r/2)
(Llama, GPT-NeoX, ...), ``rotate_every_two`` for the interleaved layout, pairs (2i, 2i + 1)
(GPT-J); ``LAYOUTS`` says how each layout's rotary module hands (cos, sin) to the attention, and
each architecture's record (``architectures.py``) which it uses (half without a record). Keys and values of
grouped-query attention are repeated to the query heads, as the attention itself does.

Position schedules: :class:`PoslabRotary` computes (cos, sin) from
:func:`poslab.positional.rope_frequencies` (every ``ROPE_SCHEDULES`` entry, LongRoPE's per-pair
factors and ``n_hat``, length-dependent schedules with the batch's longest position like Hugging
Face) and takes the place of the checkpoint's rotary-embedding module(s). Its cos/sin are
assembled exactly as Hugging Face assembles them (float32 ``position * inv_freq``; duplicated
halves for the half layout, GPT-J's (sin, cos) of r/2 channels for the interleaved one; times the
attention factor), so given the same frequencies they are equal bit for bit;
poslab's frequencies are computed in float64 and rounded once, Hugging Face's in float32, and
the two differ by at most 2 ulp (tests/pretrained/test_rotary_parity.py).

Rope settings per layer type. A checkpoint whose config has ``layer_types`` (Gemma 2 and 3, Qwen2
with sliding layers, ...) may declare one rope setting per type (Gemma 3: ``rope_parameters``
keyed by type, sliding layers theta 10^4, full layers 10^6, a long-context scaling on the full
layers only); layer i's type is ``config.layer_types[i]`` and a model without layer types has one
type, ``full_attention``. :class:`LayerRotary` holds one :class:`PoslabRotary` per type behind the
checkpoint's own rotary interface: ``(x, position_ids, layer_type)`` where the checkpoint asks per
type (Gemma 3), ``(x, position_ids)`` where it computes one (cos, sin) for every layer (Gemma 2);
there, when the types' settings differ, a pre-hook on each layer of another type hands it its own
type's (cos, sin). ``set_schedule(scaling, layer_types=...)`` applies a schedule to the full
attention layers only by default (as the checkpoints' own long-context configs do), or to
``"all"``; ``collect`` un-rotates each layer with its own type's attention factor, and
``rotary_frequencies(layer_type)`` reads each type's. :func:`parity` (``poslab inspect DIR
--parity``) measures poslab's rotary and ``collect`` against the checkpoint's own forward, and
only the architectures whose record says so (``architectures.model_types("replace")``) take
poslab's rotary.

Notation: b batch, h query head, s/i/j position, d head dim, r rotated channels, D model width.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError, check_choice
from poslab.machine import MEMORY_FRACTION, memory_bytes
from poslab.models.intermediates import Intermediates, LayerIntermediates
from poslab.models.loss import masked_cross_entropy
from poslab.positional.rope_scaling import LENGTH_DEPENDENT, rope_frequencies, unscaled_positions
from poslab.pretrained.architectures import find, model_types
from poslab.pretrained.loading import (
    Source,
    content_hash,
    read_causal_config,
    require_transformers,
    resolve,
    shared_gguf_reader,
)
from poslab.tasks.base import Batch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FULL = "full_attention"  # the layer type of a model without layer types
SCHEDULE_LAYERS = (FULL,)  # the layer types a schedule applies to unless told ("all": every type)

DTYPES = ("float32", "bfloat16")
ATTN = "poslab"  # the name poslab's recording attention is registered under
LOSS_CHUNK = 1024  # positions per readout + loss chunk in token_losses


# ----------------------------------------------------------------------------- the rotary module

def rotate_half(x: Tensor) -> Tensor:
    """The half layout's partner, signed: pair (i, i + r/2) -> (-x_{i + r/2}, x_i)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_every_two(x: Tensor) -> Tensor:
    """The interleaved layout's partner, signed: pair (2i, 2i + 1) -> (-x_{2i+1}, x_{2i})."""
    pairs = x.unflatten(-1, (-1, 2))  # [..., r/2, 2]
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


@dataclass(frozen=True)
class Layout:
    """A rotary pair layout and the (cos, sin) interface of the checkpoints that use it."""

    # angles [b, s, r/2], A -> the rotary module's output (float32): a (cos, sin) pair, or one complex tensor
    emit: Callable[[Tensor, float], Any]
    cos_sin: Callable[[Any], tuple[Tensor, Tensor]]  # that output -> (A cos, A sin) per channel, [b, s, r]
    partner: Callable[[Tensor], Tensor]  # rotated = x (A cos) + partner(x) (A sin)


def _emit_half(angles: Tensor, factor: float) -> tuple[Tensor, Tensor]:
    emb = torch.cat((angles, angles), dim=-1)  # [b, s, r]: channels i and i + r/2 share angle i
    return emb.cos() * factor, emb.sin() * factor


def _emit_gptj(angles: Tensor, factor: float) -> tuple[Tensor, Tensor]:
    return angles.sin() * factor, angles.cos() * factor  # GPT-J's order; its attention repeats each per pair


def _emit_repeated(angles: Tensor, factor: float) -> tuple[Tensor, Tensor]:
    emb = torch.repeat_interleave(angles, 2, dim=-1)  # [b, s, r]: channels 2i and 2i + 1 share angle i (Cohere)
    return emb.cos() * factor, emb.sin() * factor


def _emit_complex(angles: Tensor, factor: float) -> Tensor:
    return torch.polar(torch.ones_like(angles), angles) * factor  # A e^{i angle}, [b, s, r/2] (Llama 4)


def _first_half_repeated(pe) -> tuple[Tensor, Tensor]:
    """GLM: Llama's halves, of which the attention takes the first half, each angle on its pair (2i, 2i + 1)."""
    half = pe[0].shape[-1] // 2
    return pe[0][..., :half].repeat_interleave(2, -1), pe[1][..., :half].repeat_interleave(2, -1)


LAYOUTS = {  # (pair layout, the rotary module's output) -> Layout (architectures.py: OUTPUTS)
    ("half", "halves"): Layout(emit=_emit_half, cos_sin=lambda pe: (pe[0], pe[1]), partner=rotate_half),
    ("interleaved", "gptj"): Layout(emit=_emit_gptj, partner=rotate_every_two,
                                    cos_sin=lambda pe: (pe[1].repeat_interleave(2, -1),
                                                        pe[0].repeat_interleave(2, -1))),
    ("interleaved", "repeated"): Layout(emit=_emit_repeated, cos_sin=lambda pe: (pe[0], pe[1]),
                                        partner=rotate_every_two),
    ("interleaved", "halves"): Layout(emit=_emit_half, cos_sin=_first_half_repeated, partner=rotate_every_two),
    ("interleaved", "complex"): Layout(emit=_emit_complex, partner=rotate_every_two,
                                       cos_sin=lambda pe: (pe.real.repeat_interleave(2, -1),
                                                           pe.imag.repeat_interleave(2, -1))),
}
LAYOUT_OUTPUT = {"half": "halves", "interleaved": "gptj"}  # a layout named alone: its first checkpoints' output


def _interface(layout) -> tuple[str, str]:
    """(pair layout, output) of ``layout``: the pair itself, or a layout's name (its first checkpoints' output)."""
    if isinstance(layout, tuple):
        if layout not in LAYOUTS:
            raise ConfigError("layout", list(layout), f"one of {', '.join('/'.join(k) for k in LAYOUTS)}")
        return layout
    check_choice("layout", layout, LAYOUT_OUTPUT)
    return layout, LAYOUT_OUTPUT[layout]


class PoslabRotary(nn.Module):
    """poslab's RoPE in the Hugging Face rotary-embedding interface: (x, position_ids [b, s]) ->
    the layout's pair, in x's dtype, attention factor applied: (cos, sin), each [b, s, r] with
    halves duplicated (half), or GPT-J's (sin, cos), each [b, s, r/2] (interleaved)."""

    inv_freq: Tensor  # buffers (register_buffer)
    original_inv_freq: Tensor

    def __init__(self, head_dim: int, base: float, scaling: dict | None, *, max_position_embeddings: int | None,
                 layout: str | tuple[str, str] = "half"):
        super().__init__()
        self.interface = _interface(layout)  # (pair layout, the module output the attention expects)
        self.layout = self.interface[0]
        self.head_dim, self.base, self.max_position_embeddings = head_dim, base, max_position_embeddings
        self.scaling = dict(scaling or {})
        self.rope_type = self.scaling.get("rope_type", self.scaling.get("type", "default"))
        inv_freq, factor = rope_frequencies(head_dim, base, self.scaling,
                                            max_position_embeddings=max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [r/2], at L <= L0 for dynamic/longrope
        self.attention_scaling = float(factor)
        self.n_hat = unscaled_positions(self.scaling)
        plain = {k: self.scaling[k] for k in ("rope_theta", "partial_rotary_factor") if k in self.scaling}
        self.register_buffer("original_inv_freq", rope_frequencies(head_dim, base, plain)[0], persistent=False)

    def frequencies(self, seq_len: int | None = None) -> Tensor:
        """theta'_i at sequence length ``seq_len`` (length-dependent schedules), [r/2]."""
        if self.rope_type not in LENGTH_DEPENDENT or seq_len is None:
            return self.inv_freq
        return rope_frequencies(self.head_dim, self.base, self.scaling, seq_len=seq_len,
                                max_position_embeddings=self.max_position_embeddings)[0].to(self.inv_freq.device)

    def forward(self, x: Tensor, position_ids: Tensor, layer_type=None):
        seq_len = int(position_ids.max()) + 1  # the batch's longest, as Hugging Face's dynamic update
        inv_freq = self.frequencies(seq_len)
        pos = position_ids[..., None].float()  # [b, s, 1]
        if self.n_hat:
            inv_freq = torch.where(pos < self.n_hat, self.original_inv_freq, inv_freq)  # [b, s, r/2]
        freqs = pos * inv_freq  # [b, s, r/2], float32 as in the reference
        out = LAYOUTS[self.interface].emit(freqs, self.attention_scaling)
        if isinstance(out, Tensor):  # complex (Llama 4): handed as computed, as the checkpoint's module does
            return out
        return out[0].to(x.dtype), out[1].to(x.dtype)


class LayerRotary(nn.Module):
    """One :class:`PoslabRotary` per layer type behind the checkpoint's rotary interface:
    (x, position_ids, layer_type) -> that type's pair; without a layer type (a checkpoint that
    computes one pair for every layer), the ``shared`` type's."""

    def __init__(self, rotaries: dict[str, PoslabRotary], shared: str):
        super().__init__()
        self.by_type = nn.ModuleDict(rotaries)
        self.shared = shared

    def rotary(self, layer_type: str) -> PoslabRotary:
        """The rotary of ``layer_type`` (the ModuleDict types its entries as Module)."""
        rotary = self.by_type[layer_type]
        assert isinstance(rotary, PoslabRotary)  # __init__ takes PoslabRotary modules only
        return rotary

    @property
    def attention_scaling(self) -> float:
        return self.rotary(self.shared).attention_scaling

    @property
    def inv_freq(self) -> Tensor:
        return self.rotary(self.shared).inv_freq

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None):
        return self.by_type[layer_type or self.shared](x, position_ids)


def _layer_rotation(rotary: LayerRotary, layer_type: str, index: int):
    """A decoder layer's pre-hook handing it its own type's (cos, sin) in place of the shared pair."""
    def hook(module, args, kwargs):
        if "position_embeddings" not in kwargs:
            raise RuntimeError(f"decoder layer {index} was not handed position_embeddings as a keyword; poslab "
                               "cannot give it its layer type's rotary")
        hidden = args[0] if args else kwargs["hidden_states"]
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(hidden.shape[1], device=hidden.device)[None].expand(hidden.shape[0], -1)
        kwargs["position_embeddings"] = rotary(hidden, pos, layer_type)
        return args, kwargs
    return hook


def require_replaceable(model_type: str, field: str = "model", value=None) -> None:
    """ConfigError unless this architecture's record says poslab's rotary replaces its own faithfully."""
    types = model_types("replace")
    if model_type not in types:
        raise ConfigError(field, value if value is not None else model_type,
                          f"a checkpoint whose rotary poslab replaces faithfully (model types "
                          f"{', '.join(types)}); this one is {model_type!r}")


def unrotate(rot: Tensor, position_embeddings, factor: float, layout: str | tuple[str, str] = "half") -> Tensor:
    """Queries or keys before the rotation: [b, h, s, d] from the rotated ones and the rotary
    module's output the attention was handed (``layout``'s interface: a pair layout, or
    (pair layout, output) as in architectures.py)."""
    spec = LAYOUTS[_interface(layout)]
    cos, sin = spec.cos_sin(position_embeddings)  # [b, s, r] each
    r = cos.shape[-1]
    c, s = cos[:, None].to(rot.dtype), sin[:, None].to(rot.dtype)  # [b, 1, s, r]
    head = (rot[..., :r] * c - spec.partner(rot[..., :r]) * s) / (factor * factor)
    return head if r == rot.shape[-1] else torch.cat((head, rot[..., r:]), dim=-1)


# ----------------------------------------------------------------------------- recording attention

def _recording_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                         **kwargs):
    """Eager attention that keeps scores and pattern on ``module._poslab_record`` (set by collect).
    A ``softcap`` the checkpoint's attention passes (Gemma 2's ``attn_logit_softcapping``) caps the
    scores as eager attention does, tanh(s / c) c; ``attn_scores`` are the capped ones, which the
    softmax sees."""
    h = query.shape[1]
    key = key.repeat_interleave(h // key.shape[1], dim=1)  # [b, h, j, d]
    value = value.repeat_interleave(h // value.shape[1], dim=1)
    scaling = module.scaling if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [b, h, i, j], before the mask
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    masked = scores if attention_mask is None else scores + attention_mask[..., : key.shape[-2]]
    window = getattr(module, "_poslab_window", None)  # an inference-time sliding window (set_window)
    if window is not None:
        n_q, n_k = scores.shape[-2:]
        i = torch.arange(n_q, device=scores.device)[:, None] + (n_k - n_q)  # queries aligned at the end
        masked = masked.masked_fill(i - torch.arange(n_k, device=scores.device)[None] >= window, float("-inf"))
    pattern = torch.softmax(masked, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(pattern, value).transpose(1, 2).contiguous()  # [b, i, h, d]
    record = getattr(module, "_poslab_record", None)
    if record is not None:
        record.update(attn_scores=scores, pattern=pattern, rot_q=query, rot_k=key, v=value)
    return out, pattern


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(ATTN, _recording_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN, eager_mask)


# ----------------------------------------------------------------------------- the adapter

class PretrainedLM(nn.Module):
    """A Hugging Face causal LM behind poslab's model interface (see the module docstring)."""

    def __init__(self, hf: PreTrainedModel, *, source: Source | None = None, tokenizer=None,
                 key: str | None = None):
        super().__init__()
        self.hf = hf.eval()
        self.source, self.tokenizer = source, tokenizer
        self.key = key  # content hash of the weights (None: built in memory)
        config = hf.config
        self.config = config
        self.n_layers = config.num_hidden_layers
        self.n_heads = config.num_attention_heads
        self.d_model = config.hidden_size
        self.d_head = getattr(config, "head_dim", None) or self.d_model // self.n_heads
        self.context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.layer_types = _layer_types(config, self.n_layers)  # layer i's type ([FULL] * n without layer types)
        self.rope_types = tuple(dict.fromkeys(self.layer_types))  # the distinct types, in layer order
        window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
        # a window every layer keeps (Mistral), or None where some layers attend in full (Gemma: layer_windows)
        self.layer_windows = [window if (t != FULL or not _has_layer_types(config)) else None
                              for t in self.layer_types]
        self.window = window if all(w is not None for w in self.layer_windows) else None
        self.own_window = self.window
        self.inference_window: int | None = None  # a sliding window applied in collect (set_window)
        self.layers = _decoder_layers(hf, self.n_layers)
        arch = find(getattr(config, "model_type", None))
        self.layout = arch.layout if arch is not None else "half"  # rotary pair layout (its record's)
        # (pair layout, what the checkpoint's rotary module hands its attention): poslab's rotary hands the same
        self.interface = (self.layout, arch.output) if arch is not None else ("half", "halves")
        # the per-layer pattern of its record: which layers rotate, which attend in chunks
        self.layer_rope = arch.rope_layers(config) if arch is not None else [True] * self.n_layers
        self.layer_chunks = arch.layer_chunks(config) if arch is not None else [None] * self.n_layers
        self.notes = arch.notes if arch is not None else ""
        self._rotary_slots = [(parent, name) for parent, name, _ in _rotary_modules(hf)]
        self.own_rotary = [getattr(p, n) for p, n in self._rotary_slots]
        self.schedule: dict | None = None  # the poslab schedule in use (None: the checkpoint's own modules)
        self.schedules: dict[str, dict] | None = None  # the same per layer type
        self.schedule_targets: tuple[str, ...] = ()  # the layer types the schedule in use was put on
        self._hooks: list = []  # per-layer rotation hooks of a schedule (restore removes them)
        # what the probes written for poslab's Transformer read (probes/leakage.py)
        self.cfg = SimpleNamespace(bos=False, attention="softmax", energy_gate=False, causal=True,
                                   window=self.window, n_layers=self.n_layers, n_heads=self.n_heads)

    # --- the encoding

    @property
    def encoding(self) -> str:
        """rotary | learned | alibi | none, read off the checkpoint's config and modules (ALiBi first: an
        ALiBi Falcon builds a rotary module it never calls)."""
        arch = find(getattr(self.config, "model_type", None))
        if getattr(self.config, "alibi", False) or (arch is not None and arch.encoding == "alibi"):
            return "alibi"
        if self._rotary_slots:
            return "rotary"
        if any(n.endswith(("wpe", "embed_positions")) for n, _ in self.hf.named_modules()):
            return "learned"
        return "none"

    @property
    def per_type_rope(self) -> bool:
        """The checkpoint declares a rope setting per layer type (its rotary module is asked per type)."""
        return _per_type_parameters(self.config) is not None

    @property
    def default_type(self) -> str:
        """The layer type ``own_scaling()`` and ``rotary_frequencies()`` read without one: full attention's
        (the global layers, where a schedule goes by default) where those rotate, else the first rope
        layer's (Llama 4, Cohere2: their full-attention layers have no rope)."""
        types = self.rotary_types or self.rope_types
        return FULL if FULL in types else types[0]

    def own_scaling(self, layer_type: str | None = None) -> dict:
        """The checkpoint's own rotary config (of ``layer_type``, default :attr:`default_type`) as a
        poslab scaling dict (rope_theta included)."""
        layer_type = self._layer_type(layer_type)
        per_type = _per_type_parameters(self.config)
        params = dict((per_type[layer_type] if per_type else getattr(self.config, "rope_parameters", None)) or {})
        from poslab.positional.rope_scaling import KEYS

        out = {k: v for k, v in params.items() if k in KEYS and v is not None}
        partial = params.get("partial_rotary_factor", getattr(self.config, "partial_rotary_factor", None))
        rotary_dim = getattr(self.config, "rotary_dim", None)  # GPT-J: rotated channels, absolute
        if partial is None and rotary_dim:
            partial = rotary_dim / self.d_head
        if partial not in (None, 1.0):
            out["partial_rotary_factor"] = float(partial)
        out.setdefault("rope_theta", float(getattr(self.config, "rope_theta", 10000.0)))
        return out

    def own_scalings(self) -> dict[str, dict]:
        """:meth:`own_scaling` of every layer type."""
        return {t: self.own_scaling(t) for t in self.rope_types}

    def set_schedule(self, scaling: dict | None, layer_types: tuple[str, ...] | str = SCHEDULE_LAYERS) -> None:
        """Replace the checkpoint's rotary embedding by poslab's: ``scaling`` (a Hugging Face rope
        dict) on the layers of ``layer_types`` (default: full attention, the global layers; "all":
        every layer), each other layer type keeps its own setting, computed by poslab. None or {}:
        every type's own schedule, computed by poslab. ``restore()`` puts the checkpoint's modules back."""
        if self.encoding != "rotary":
            raise ConfigError("schedule", (scaling or {}).get("rope_type", "default"),
                              f"a model with rotary position embedding (this {self.config.model_type} "
                              f"model's encoding is {self.encoding})")
        require_replaceable(getattr(self.config, "model_type", ""), "schedule", (scaling or {}).get("rope_type",
                                                                                                  "default"))
        targets = self._schedule_targets(layer_types)
        settings = {t: self._setting(scaling if t in targets else None, t) for t in self.rope_types}
        device = next(self.hf.parameters()).device
        rotary = LayerRotary({t: PoslabRotary(self.d_head, cfg["rope_theta"], cfg, layout=self.interface,
                                              max_position_embeddings=self.context)
                              for t, cfg in settings.items()}, shared=self.default_type).to(device)
        self.restore()
        self.schedule_targets = targets
        for parent, name in self._rotary_slots:
            setattr(parent, name, rotary)
        if not self.per_type_rope:  # one pair for every layer: layers of another setting get theirs by a hook
            shared = settings[self.default_type]
            self._hooks = [layer.register_forward_pre_hook(_layer_rotation(rotary, t, i), with_kwargs=True)
                           for i, (layer, t) in enumerate(zip(self.layers, self.layer_types, strict=True))
                           if settings[t] != shared and self.layer_rope[i]]
        self.schedules = settings
        self.schedule = settings[self.default_type]

    @property
    def rotary_types(self) -> tuple[str, ...]:
        """The layer types with at least one layer that rotates q and k (a schedule goes on these only)."""
        return tuple(t for t in self.rope_types
                     if any(r for r, u in zip(self.layer_rope, self.layer_types, strict=True) if u == t))

    def schedule_summary(self) -> str:
        """Where the schedule in use acts: its rope type and the layers it is on, "the rope layers only"
        where some layers have no rope (they are left as they are)."""
        if self.schedules is None:
            return "the checkpoint's own rotary"
        targets = self.schedule_targets
        on = [i for i, (t, r) in enumerate(zip(self.layer_types, self.layer_rope, strict=True)) if r and t in targets]
        cfg = self.schedules[targets[0]]
        name = cfg.get("rope_type", cfg.get("type", "default"))
        name += f" x{cfg['factor']:g}" if cfg.get("factor") else ""
        where = f"on {len(on)} of {self.n_layers} layers ({', '.join(targets)})"
        nope = [i for i, r in enumerate(self.layer_rope) if not r]
        if nope:
            many = len(nope) > 1
            where += (f", the rope layers only: layer{'s' if many else ''} {', '.join(map(str, nope))} "
                      f"{'have' if many else 'has'} no rope and keep{'' if many else 's'} no position encoding")
        return f"{name} {where}"

    def _setting(self, scaling: dict | None, layer_type: str) -> dict:
        own = self.own_scaling(layer_type)
        cfg = dict(scaling) if scaling else dict(own)
        cfg.setdefault("rope_theta", own["rope_theta"])
        if "partial_rotary_factor" in own:
            cfg.setdefault("partial_rotary_factor", own["partial_rotary_factor"])
        if cfg.get("rope_type", cfg.get("type", "default")) not in LENGTH_DEPENDENT + ("default",):
            cfg.setdefault("original_max_position_embeddings", self.context)
        return cfg

    def _schedule_targets(self, layer_types) -> tuple[str, ...]:
        """The layer types a schedule goes on: of ``layer_types``, those with rope layers. The default
        (full attention) on a model whose full-attention layers have no rope (Llama 4, Cohere2) is every
        rope layer type."""
        rotary = self.rotary_types
        if layer_types == "all":
            return rotary
        if isinstance(layer_types, str) or not layer_types or not all(isinstance(t, str) for t in layer_types):
            raise ConfigError("schedule_layers", layer_types, f'"all" or a tuple of layer types of '
                                                              f'{", ".join(rotary)}')
        present = tuple(t for t in layer_types if t in rotary)
        if not present and tuple(layer_types) == SCHEDULE_LAYERS:
            return rotary
        if not present:
            raise ConfigError("schedule_layers", list(layer_types), f'"all" or layer types of this model with rope '
                                                                    f'layers: {", ".join(rotary)}')
        return present

    def _layer_type(self, layer_type: str | None) -> str:
        if layer_type is None:
            return self.default_type
        if layer_type not in self.rope_types:
            raise ConfigError("layer_type", layer_type, f"one of this model's: {', '.join(self.rope_types)}")
        return layer_type

    def restore(self) -> None:
        for (parent, name), module in zip(self._rotary_slots, self.own_rotary, strict=True):
            setattr(parent, name, module)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self.schedule = self.schedules = None

    def set_window(self, window: int | None) -> None:
        """Mask keys ``window`` or more positions back in :meth:`collect` (an inference-time sliding
        window over weights trained without one); None: the checkpoint's own mask again."""
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ConfigError("window", window, "a positive integer (keys kept per query) or None")
        self.inference_window = window
        self.window = self.own_window if window is None else window
        self.cfg.window = self.window

    def rotary_frequencies(self, layer_type: str | None = None) -> Tensor:
        """theta_i of the rotary in use on the layers of ``layer_type`` (default :attr:`default_type`;
        at L <= L0 for a length-dependent schedule), [r/2]."""
        if self.encoding != "rotary":
            raise ConfigError("encoding", self.encoding, "a rotary model (rotary_frequencies)")
        layer_type = self._layer_type(layer_type)
        module = self._rotary_module()
        if isinstance(module, LayerRotary):
            return module.rotary(layer_type).inv_freq
        inv_freq = getattr(module, f"{layer_type}_inv_freq" if self.per_type_rope else "inv_freq", None)
        if inv_freq is None:  # a checkpoint module holding a sin/cos table (GPT-J): its own schedule, by poslab
            own = self.own_scaling(layer_type)
            inv_freq = rope_frequencies(self.d_head, own["rope_theta"], own)[0]
        return inv_freq

    def rotary_frequencies_by_type(self) -> dict[str, Tensor]:
        return {t: self.rotary_frequencies(t) for t in self.rope_types}

    @property
    def kv_cache(self) -> bool:
        settings = self.schedules or self.own_scalings()
        return all(cfg.get("rope_type", "default") not in LENGTH_DEPENDENT for cfg in settings.values())

    # --- checks

    def own_table_length(self) -> int | None:
        """Positions the checkpoint's own rotary module holds a sin/cos table for (GPT-J's stops at
        n_positions); None when it computes angles at any position."""
        table = getattr(self.own_rotary[0], "embed_positions", None) if self.own_rotary else None
        return None if table is None else int(table.shape[0])

    def check_length(self, L: int, *, intermediates: bool = False, new_tokens: int = 0) -> None:
        """ConfigError if one sequence of L tokens, then ``new_tokens`` decoded after it, cannot run
        here: a learned table too short, or attention that would not fit in memory (the estimate is
        in the message). A decoder feeds back every decoded token but the last, so the positions
        used are L + new_tokens - 1 (:meth:`greedy`)."""
        if not isinstance(L, int) or isinstance(L, bool) or L < 2:
            raise ConfigError("length", L, "an integer >= 2")
        if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 0:
            raise ConfigError("new_tokens", new_tokens, "an integer >= 0 (tokens decoded after the prompt)")
        n = L + max(new_tokens - 1, 0)  # positions the forward passes see
        field, value = ("length", L) if n == L else ("new_tokens", new_tokens)
        what = "" if n == L else f" ({L} prompt tokens + {new_tokens} decoded use {n} positions)"
        if self.encoding == "learned" and self.context and n > self.context:
            raise ConfigError(field, value, f"at most {self.context} positions (the checkpoint's learned "
                                            f"position table){what}")
        table = self.own_table_length()
        if self.schedule is None and table is not None and n > table:
            raise ConfigError(field, value, f"at most {table} positions with the checkpoint's own sin/cos table"
                                            f"{what} (set_schedule(None) computes the same angles at any length)")
        require_attention_fits(field, value, n, self.n_heads, self.n_layers if intermediates else 0,
                               what="scores and patterns (collect)" if intermediates else "mask")

    def greedy(self, prompt: Tensor, n_new: int, *, cached: bool = True, prefill: int | None = None) -> list[int]:
        """Greedy decoding of ``n_new`` tokens after ``prompt`` [1, s] (:meth:`check_length` counts the
        positions first; :func:`greedy` decodes)."""
        self.check_length(int(prompt.shape[1]), new_tokens=n_new)
        return greedy(self.hf, prompt, n_new, cached=cached, prefill=prefill)

    @property
    def prepends_bos(self) -> bool:
        """The checkpoint's tokenizer puts its BOS first when asked for special tokens (Gemma 3 does,
        SmolLM2 does not); such a model's loss is measured after a BOS (``encode_text(..., bos=True)``)."""
        tok = self.tokenizer
        if tok is None or getattr(tok, "bos_token_id", None) is None:
            return False
        return tok("a", add_special_tokens=True).input_ids[:1] == [tok.bos_token_id]

    # --- the interface every poslab model has

    def forward(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """tokens [b, s] -> logits [b, s, m] (positions: [s] | [b, s], default 0 .. s-1)."""
        if positions is not None and positions.dim() == 1:
            positions = positions[None].expand(tokens.shape[0], -1)
        return self.hf(input_ids=tokens, position_ids=positions, use_cache=False).logits.float()

    def loss(self, batch: Batch) -> Tensor:
        return masked_cross_entropy(self(batch.tokens), batch)

    @torch.no_grad()
    def token_losses(self, tokens: Tensor, chunk: int = LOSS_CHUNK) -> Tensor:
        """Next-token loss at every position, [b, s - 1] (entry t predicts token t + 1).

        The checkpoint's body runs once; its readout and the loss run ``chunk`` positions at a time,
        so the [b, s, vocabulary] logits are never held (49,152 x 8192 x 4 bytes = 1.5 GiB for
        SmolLM2 at its context). Checkpoints whose logits are not the readout of the last hidden
        state alone (a soft cap, a logit scale) take the plain forward."""
        head, body = self.hf.get_output_embeddings(), getattr(self.hf, "base_model", None)
        plain = (head is None or body is None or body is self.hf
                 or any(getattr(self.config, k, None) for k in ("final_logit_softcapping", "logit_scale",
                                                                "logits_scaling")))
        if plain or body is None:  # (plain covers body None; repeated for the type checker)
            logits = self(tokens)
            return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(),
                                               reduction="none").view(tokens.shape[0], -1)
        hidden = body(input_ids=tokens, use_cache=False).last_hidden_state  # [b, s, D]
        b, s = tokens.shape
        out = []
        for lo in range(0, s - 1, chunk):
            hi = min(lo + chunk, s - 1)
            logits = head(hidden[:, lo:hi]).float()  # [b, c, m]
            out.append(nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, lo + 1:hi + 1].flatten(),
                                                   reduction="none").view(b, hi - lo))
        return torch.cat(out, 1)

    def collect(self, batch: Batch, intervention=None) -> Intermediates:
        """The forward's intermediates under no_grad, through hooks on the checkpoint's modules
        (and under :meth:`set_window`'s window). An ``intervention`` may set ``bos_embedding`` only:
        the input embedding at position 0 is replaced ([D] | [b, D]), whatever token sits there."""
        require_transformers()
        _register_attention()
        records: list[dict] = [{} for _ in self.layers]
        handles, attn_modules = [], []
        if intervention is not None:
            handles.append(self.hf.get_input_embeddings().register_forward_hook(
                _replace_position0(self._check_intervention(intervention, batch.tokens.shape[0]))))
        for i, layer in enumerate(self.layers):
            handles.append(layer.register_forward_pre_hook(_keep_input(records[i]), with_kwargs=True))
            handles.append(layer.register_forward_hook(_keep_output(records[i])))
            attention = next(m for m in layer.modules() if m.__class__.__name__.endswith("Attention"))
            # nn.Module.__setattr__ is typed for Tensor | Module values; these are plain attributes
            attention._poslab_record = records[i]  # type: ignore[assignment]
            attention._poslab_window = self.inference_window  # type: ignore[assignment]
            attn_modules.append(attention)
            handles.append(attention.register_forward_pre_hook(_keep_rotation(records[i]), with_kwargs=True))
        with self._recording(handles, attn_modules):
            logits = self(batch.tokens)
        s = batch.tokens.shape[1]
        inter = Intermediates(embed=records[0]["resid_pre"], positions=torch.arange(s))
        rotary = self.encoding == "rotary"  # an ALiBi Falcon hands its attention (cos, sin) it does not use
        for i, rec in enumerate(records):
            cos_sin = rec.get("position_embeddings")
            if cos_sin is None or not self.layer_rope[i] or not rotary:  # no rotation: q, k as projected
                q, k = rec["rot_q"], rec["rot_k"]
            else:
                factor = self._factor(i)
                q = unrotate(rec["rot_q"], cos_sin, factor, self.interface)
                k = unrotate(rec["rot_k"], cos_sin, factor, self.interface)
            inter.layers.append(LayerIntermediates(
                attn_scores=rec["attn_scores"], pattern=rec["pattern"], q=q, k=k, rot_q=rec["rot_q"],
                rot_k=rec["rot_k"], v=rec["v"], resid_pre=rec["resid_pre"], resid_post=rec["resid_post"]))
        inter.logits, inter.lengths, inter.prefix = logits, batch.lengths, 0
        return inter

    def stream(self, batch: Batch, on_layer: Callable[[int, Tensor, Tensor], None], intervention=None) -> None:
        """Run the checkpoint's body (no readout) and hand layer i's ``attn_scores`` and ``pattern``
        [b, h, s, s] to ``on_layer(i, attn_scores, pattern)`` as the forward passes it. Nothing is
        kept: memory holds one layer's attention, not every layer's (:meth:`collect`), and never the
        [b, s, vocabulary] logits (0.5 GiB a sequence for Gemma 3 at 512 tokens). Same mask, window
        and ``intervention`` (``bos_embedding`` only) as :meth:`collect`."""
        require_transformers()
        _register_attention()
        handles, attn_modules = [], []
        if intervention is not None:
            handles.append(self.hf.get_input_embeddings().register_forward_hook(
                _replace_position0(self._check_intervention(intervention, batch.tokens.shape[0]))))
        for i, layer in enumerate(self.layers):
            attention = next(m for m in layer.modules() if m.__class__.__name__.endswith("Attention"))
            # nn.Module.__setattr__ is typed for Tensor | Module values; these are plain attributes
            attention._poslab_record = _HandOn(i, on_layer)  # type: ignore[assignment]
            attention._poslab_window = self.inference_window  # type: ignore[assignment]
            attn_modules.append(attention)
        body = getattr(self.hf, "base_model", None) or self.hf
        with self._recording(handles, attn_modules):
            body(input_ids=batch.tokens, use_cache=False)

    @contextlib.contextmanager
    def _recording(self, handles: list, attn_modules: list):
        """poslab's recording attention for one no-grad forward; the checkpoint's own attention, the
        hooks' removal and the modules' recording slots restored after it, whatever happens."""
        previous = self.config._attn_implementation
        try:
            self.hf.set_attn_implementation(ATTN)
            with torch.no_grad():
                yield
        finally:
            self.hf.set_attn_implementation(previous)
            for handle in handles:
                handle.remove()
            for module in attn_modules:
                del module._poslab_record, module._poslab_window

    @property
    def attended_windows(self) -> list[int | None]:
        """Per layer, the keys a query attends back (None: all): the layer's own window
        (:attr:`layer_windows`) or :meth:`set_window`'s, whichever is shorter."""
        extra = self.inference_window
        return [extra if w is None else (w if extra is None else min(w, extra)) for w in self.layer_windows]

    def _check_intervention(self, intervention, b: int) -> Tensor:
        """The position-0 embedding [b, D] of an intervention that sets bos_embedding and nothing else."""
        others = [f for f in ("resid0", "drop_key0") if getattr(intervention, f, None) is not None]
        if others:
            raise ConfigError(f"intervention.{others[0]}", "set", "None (a pretrained model takes bos_embedding only)")
        x0 = getattr(intervention, "bos_embedding", None)
        D = self.d_model
        if not isinstance(x0, Tensor) or tuple(x0.shape) not in ((D,), (b, D)):
            raise ConfigError("intervention.bos_embedding", list(x0.shape) if isinstance(x0, Tensor) else x0,
                              f"a tensor of shape [{D}] or [{b}, {D}]")
        return x0.expand(b, D)

    def _rotary_module(self) -> nn.Module:
        parent, name = self._rotary_slots[0]
        return getattr(parent, name)

    def _factor(self, layer: int) -> float:
        """The attention factor A of the rotary layer ``layer`` was handed."""
        module, layer_type = self._rotary_module(), self.layer_types[layer]
        if isinstance(module, LayerRotary):
            handed = layer_type if (self.per_type_rope or self._hooks) else module.shared
            return float(module.rotary(handed).attention_scaling)
        name = f"{layer_type}_attention_scaling" if self.per_type_rope else "attention_scaling"
        return float(getattr(module, name, 1.0))


# ----------------------------------------------------------------------------- parity

PARITY_SHORT, PARITY_LONG = 16, 48  # the default lengths (bounded by the context; past a sliding window)


@torch.no_grad()
def greedy(hf: nn.Module, prompt: Tensor, n_new: int, *, cached: bool = True, prefill: int | None = None) -> list[int]:
    """The one greedy decoder: ``n_new`` tokens after ``prompt`` [1, s] from a Hugging Face causal LM.

    ``cached`` (the default): with the checkpoint's own KV cache, positions continuing from the
    prompt; the first ``prefill`` tokens (default: all of them) in one forward, then the rest of the
    prompt one token a step, as a decoder fed token by token keeps its cache (every key rotated at
    the step it was computed: what a length-dependent schedule does with a cache). Not ``cached``:
    the whole sequence recomputed at every step, every key rotated with the current length. Each
    forward reads out the last position only (no [s, vocabulary] logits)."""
    if not cached:
        seq, out = prompt, []
        for _ in range(n_new):
            logits = hf(input_ids=seq, use_cache=False, logits_to_keep=1).logits[:, -1].float()
            nxt = logits.argmax(-1, keepdim=True)
            out.append(int(nxt))
            seq = torch.cat((seq, nxt), 1)
        return out
    s = int(prompt.shape[1])
    first = s if prefill is None else prefill
    res = hf(input_ids=prompt[:, :first], use_cache=True, logits_to_keep=1)
    cache, logits = res.cache, res.logits[:, -1]
    for t in range(first, s):  # the rest of the prompt, one token a step
        pos = torch.tensor([[t]], device=prompt.device)
        res = hf(input_ids=prompt[:, t:t + 1], cache=cache, position_ids=pos, use_cache=True)
        cache, logits = res.cache, res.logits[:, -1]
    out = []
    for step in range(n_new):
        nxt = logits.argmax(-1, keepdim=True)
        out.append(int(nxt))
        if step == n_new - 1:
            break
        pos = torch.tensor([[s + step]], device=prompt.device)
        res = hf(input_ids=nxt, cache=cache, position_ids=pos, use_cache=True)
        cache, logits = res.cache, res.logits[:, -1]
    return out


def parity_lengths(model: PretrainedLM) -> tuple[int, int]:
    """Two lengths for :func:`parity`: 16 tokens, and 48 or, for a model with a sliding window,
    one eighth past the window, so the window's mask is crossed; both within 3/4 of the context."""
    cap = max(2, (model.context or 4 * PARITY_LONG) * 3 // 4)
    window = max((w for w in model.layer_windows if w), default=0)
    long = max(PARITY_LONG, window + window // 8)
    return min(PARITY_SHORT, cap), min(long, cap)


@torch.no_grad()
def parity(model: PretrainedLM, lengths: tuple[int, ...] | None = None, *, seed: int = 0,
           tokens: Tensor | None = None) -> list[dict]:
    """max |delta logit| against the checkpoint's own forward of random tokens (or the first L of
    ``tokens`` [n]: random ids drive a real model's logits far past text's, and the float32
    rounding with them), per length: of the
    forward under poslab's rotary (``set_schedule(None)``: every layer type's own schedule, computed
    by poslab) and of ``collect`` under it (poslab's recording attention). The checkpoint's own
    modules are back afterwards. ConfigError for an architecture poslab does not replace."""
    if model.encoding != "rotary":
        raise ConfigError("--parity", model.encoding, "a model with rotary position embedding")
    require_replaceable(getattr(model.config, "model_type", ""), "--parity")
    lengths = tuple(lengths or parity_lengths(model))
    for L in lengths:
        model.check_length(L, intermediates=True)
    device = next(model.hf.parameters()).device
    g = torch.Generator().manual_seed(seed)
    rows = []
    for L in lengths:
        if tokens is not None and tokens.numel() < L:
            raise ConfigError("tokens", int(tokens.numel()), f"at least {L} tokens (the longest parity length)")
    for L in lengths:
        x = (torch.randint(0, model.config.vocab_size, (1, L), generator=g) if tokens is None
             else tokens[:L][None]).to(device)
        batch = Batch(tokens=x, targets=x, loss_mask=torch.ones_like(x, dtype=torch.bool),
                      lengths=torch.tensor([L], device=device))
        model.restore()
        own = model(x)
        model.set_schedule(None)
        try:  # each [L, vocabulary] logits compared in place and dropped: own and one other held at a time
            forward = float(model(x).sub_(own).abs_().max())
            logits = model.collect(batch).logits
            assert logits is not None  # collect always returns the logits
            collect = float(logits.sub_(own).abs_().max())
        finally:
            model.restore()
        rows.append(dict(length=L, forward=forward, collect=collect, logit_scale=float(own.abs().max())))
    return rows


class _HandOn(dict):
    """A recording-attention record (:func:`_recording_attention`) that hands a layer's scores and
    pattern to a callback and keeps nothing (:meth:`PretrainedLM.stream`)."""

    def __init__(self, layer: int, on_layer: Callable[[int, Tensor, Tensor], None]):
        super().__init__()
        self.layer, self.on_layer = layer, on_layer

    def update(self, *args, **kwargs) -> None:  # type: ignore[override]
        self.on_layer(self.layer, kwargs["attn_scores"], kwargs["pattern"])


def _replace_position0(x0: Tensor):
    def hook(module, args, output):
        return torch.cat((x0.to(output.dtype)[:, None], output[:, 1:]), dim=1)
    return hook


def _keep_input(record: dict):
    def hook(module, args, kwargs):
        record["resid_pre"] = args[0] if args else kwargs["hidden_states"]
    return hook


def _keep_output(record: dict):
    def hook(module, args, output):
        record["resid_post"] = output[0] if isinstance(output, tuple) else output
    return hook


def _keep_rotation(record: dict):
    def hook(module, args, kwargs):
        pe = kwargs.get("position_embeddings")
        if pe is None and len(args) > 1 and isinstance(args[1], (tuple, Tensor)):
            pe = args[1]
        if pe is not None:
            record["position_embeddings"] = pe
    return hook


def _has_layer_types(config) -> bool:
    types = getattr(config, "layer_types", None)
    return isinstance(types, (list, tuple)) and len(types) == config.num_hidden_layers and len(types) > 0


def _layer_types(config, n_layers: int) -> list[str]:
    """Layer i's type: ``config.layer_types[i]``, or full attention for a model without layer types."""
    return [str(t) for t in config.layer_types] if _has_layer_types(config) else [FULL] * n_layers


def _per_type_parameters(config) -> dict | None:
    """``rope_parameters`` keyed by layer type (Gemma 3), or None for one setting of every layer."""
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or not params or not _has_layer_types(config):
        return None
    if set(params) <= set(config.layer_types) and all(isinstance(v, dict) for v in params.values()):
        return params
    return None


def _decoder_layers(hf: nn.Module, n_layers: int) -> list[nn.Module]:
    for _, module in hf.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return list(module)
    raise ConfigError("model", type(hf).__name__, f"a causal LM with a list of {n_layers} decoder layers")


def _rotary_modules(hf: nn.Module):
    """(parent, attribute name, module) of every rotary-embedding module of the checkpoint."""
    out = []
    for _, parent in hf.named_modules():
        for name, child in parent.named_children():
            if child.__class__.__name__.endswith("RotaryEmbedding"):
                out.append((parent, name, child))
    return out


def attention_bytes(L: int, n_heads: int, layers_kept: int = 0, batch: int = 1) -> int:
    """Bytes the attention of one forward over L tokens holds at its peak.

    A plain forward (``layers_kept`` = 0) runs the checkpoint's fused attention (SDPA), which never
    holds an L x L score matrix (measured: a forward of 8192 tokens of a 4-head model added 30-40 MB
    of peak RSS, against 1 GiB for one layer's float32 scores); the worst it keeps is a boolean
    mask, L^2 bytes (a sliding window). ``collect`` keeps scores and pattern in float32 for every
    layer: 2 x 4 b h L^2 bytes per layer.
    """
    if layers_kept <= 0:
        return batch * L * L
    return 2 * 4 * batch * n_heads * L * L * layers_kept


def require_attention_fits(field: str, value, L: int, n_heads: int, layers_kept: int = 0, batch: int = 1,
                           what: str = "") -> None:
    """ConfigError naming ``field`` when :func:`attention_bytes` exceeds MEMORY_FRACTION of
    the machine's memory; the estimate and what it counts (``what``) are in the message."""
    need, have = attention_bytes(L, n_heads, layers_kept, batch), memory_bytes() * MEMORY_FRACTION
    if need > have:
        raise ConfigError(field, value, f"a length whose attention fits in memory: L={L} needs about "
                                        f"{need / 2**30:.1f} GiB of attention{' ' + what if what else ''}, "
                                        f"{have / 2**30:.1f} GiB available")


# ----------------------------------------------------------------------------- loading

def load(spec, *, dtype: str = "float32", device: str = "cpu", threads: int | None = None,
         quiet: bool = False) -> PretrainedLM:
    """A checkpoint as a :class:`PretrainedLM`: ``smollm2-135m`` (the built-in GGUF), a directory
    with config.json and safetensors, a .gguf file, or a hub id (needs a network). ``quiet``: without
    transformers' "Loading weights" bar (a check whose refusal is one line)."""
    if quiet:
        from transformers.utils import logging

        shown = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()
        try:
            return load(spec, dtype=dtype, device=device, threads=threads)
        finally:
            if shown:
                logging.enable_progress_bar()
    with shared_gguf_reader():  # a GGUF's header is parsed once, not once per reader of it (loading.py)
        return _load(spec, dtype=dtype, device=device)


def _load(spec, *, dtype: str, device: str) -> PretrainedLM:
    check_choice("dtype", dtype, DTYPES)
    if dtype == "bfloat16" and device == "cpu":
        raise ConfigError("dtype", dtype, "float32 on cpu (bfloat16 is offered on a GPU)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "cpu (no CUDA device is available here)")
    source = resolve(spec)
    config = read_causal_config(source)  # a config alone, an encoder, an unsupported GGUF stop here
    require_transformers()
    if "rope_parameters" not in config and "rope_scaling" not in config and config.get("model_type") is None:
        raise ConfigError("--model", source.name, "a causal language model config")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    kwargs = dict(dtype=torch_dtype)
    if source.kind == "gguf":
        folder, filename = os.path.split(source.path)
        kwargs["gguf_file"] = filename
        where = folder
    else:
        where = source.path
    from safetensors import SafetensorError

    try:  # read_causal_config checked the files' headers; a tensor damaged inside them fails here
        hf = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    except (ValueError, OSError, KeyError, SafetensorError, RuntimeError) as e:
        raise ConfigError("--model", source.name, f"a checkpoint transformers can load ({str(e).splitlines()[0]})") \
            from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **({"gguf_file": kwargs["gguf_file"]}
                                                           if "gguf_file" in kwargs else {}))
    except (ValueError, OSError, KeyError, TypeError):
        tokenizer = None  # a model without a tokenizer reads bytes (see encode_text)
    if tokenizer is not None and is_empty_tokenizer(tokenizer):
        tokenizer = None  # transformers builds an empty one from a folder with no tokenizer files
    # a tokenizer whose ids run past the embedding table would index out of it
    weight = hf.get_input_embeddings().weight
    rows = int(weight.shape[0]) if isinstance(weight, Tensor) else None
    if tokenizer is not None and rows is not None and len(tokenizer) > rows:
        raise ConfigError("--model", source.name, f"a checkpoint whose embedding covers its tokenizer's vocabulary "
                                                  f"(the tokenizer has {len(tokenizer)} tokens, the embedding "
                                                  f"{rows} rows)")
    # transformers decorates PreTrainedModel.to with functools.wraps(nn.Module.to), whose type takes self as an argument
    return PretrainedLM(hf.to(device), source=source, tokenizer=tokenizer,  # type: ignore[arg-type]
                        key=content_hash(source))


def is_empty_tokenizer(tokenizer) -> bool:
    """A tokenizer with no real vocabulary: no more entries than its special tokens (and at most 8).
    transformers 5 builds one (1-5 entries) for a folder without tokenizer files."""
    try:
        size = len(tokenizer)
    except TypeError:
        return False
    return size <= max(8, len(getattr(tokenizer, "all_special_tokens", ()) or ()))


def encode_text(model: PretrainedLM, text: str, *, bos: bool = False) -> Tensor:
    """Token ids of ``text``: the checkpoint's tokenizer without special tokens (no BOS unless ``bos``:
    its BOS id first, as :attr:`PretrainedLM.prepends_bos` models are trained), or its UTF-8 bytes for
    a checkpoint that ships no tokenizer (vocabulary >= 256), [n] int64."""
    if model.tokenizer is not None:
        ids = model.tokenizer(text, add_special_tokens=False).input_ids
        bos_id = getattr(model.tokenizer, "bos_token_id", None)
        if bos and bos_id is None:
            raise ConfigError("bos", True, "False (this checkpoint's tokenizer has no BOS token)")
        return torch.tensor(([bos_id] if bos else []) + list(ids), dtype=torch.long)
    if bos:
        raise ConfigError("bos", True, "False (this checkpoint ships no tokenizer)")
    vocab = model.config.vocab_size
    if vocab < 256:
        raise ConfigError("tokenizer", None, f"a checkpoint with a tokenizer or a vocabulary >= 256 (has {vocab})")
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode_tokens(model: PretrainedLM, ids) -> str:
    ids = [int(i) for i in ids]
    if model.tokenizer is not None:
        return model.tokenizer.decode(ids, skip_special_tokens=True)
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
