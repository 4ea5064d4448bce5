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
``MODEL_LAYOUTS`` which checkpoints use which (the default is half). Keys and values of
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

Notation: b batch, h query head, s/i/j position, d head dim, r rotated channels, D model width.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError, check_choice
from poslab.experiments.executors import MEMORY_FRACTION, memory_bytes
from poslab.models.intermediates import Intermediates, LayerIntermediates
from poslab.models.loss import masked_cross_entropy
from poslab.positional.rope_scaling import LENGTH_DEPENDENT, rope_frequencies, unscaled_positions
from poslab.pretrained.loading import Source, content_hash, read_config, require_causal, require_transformers, resolve
from poslab.tasks.base import Batch

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

    emit: Callable[[Tensor, float], tuple[Tensor, Tensor]]  # angles [b, s, r/2], A -> the rotary module's output
    cos_sin: Callable[[tuple], tuple[Tensor, Tensor]]  # that output -> (A cos, A sin) per channel, [b, s, r]
    partner: Callable[[Tensor], Tensor]  # rotated = x (A cos) + partner(x) (A sin)


def _emit_half(angles: Tensor, factor: float) -> tuple[Tensor, Tensor]:
    emb = torch.cat((angles, angles), dim=-1)  # [b, s, r]: channels i and i + r/2 share angle i
    return emb.cos() * factor, emb.sin() * factor


def _emit_gptj(angles: Tensor, factor: float) -> tuple[Tensor, Tensor]:
    return angles.sin() * factor, angles.cos() * factor  # GPT-J's order; its attention repeats each per pair


LAYOUTS = {
    "half": Layout(emit=_emit_half, cos_sin=lambda pe: (pe[0], pe[1]), partner=rotate_half),
    "interleaved": Layout(emit=_emit_gptj, partner=rotate_every_two,
                          cos_sin=lambda pe: (pe[1].repeat_interleave(2, -1), pe[0].repeat_interleave(2, -1))),
}
MODEL_LAYOUTS = {"gptj": "interleaved"}  # model_type -> layout; every other rotary checkpoint: half


class PoslabRotary(nn.Module):
    """poslab's RoPE in the Hugging Face rotary-embedding interface: (x, position_ids [b, s]) ->
    the layout's pair, in x's dtype, attention factor applied: (cos, sin), each [b, s, r] with
    halves duplicated (half), or GPT-J's (sin, cos), each [b, s, r/2] (interleaved)."""

    def __init__(self, head_dim: int, base: float, scaling: dict | None, *, max_position_embeddings: int,
                 layout: str = "half"):
        super().__init__()
        check_choice("layout", layout, LAYOUTS)
        self.layout = layout
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
        a, b = LAYOUTS[self.layout].emit(freqs, self.attention_scaling)
        return a.to(x.dtype), b.to(x.dtype)


def unrotate(rot: Tensor, position_embeddings: tuple, factor: float, layout: str = "half") -> Tensor:
    """Queries or keys before the rotation: [b, h, s, d] from the rotated ones and the rotary
    module's output the attention was handed (``layout``'s interface)."""
    spec = LAYOUTS[layout]
    cos, sin = spec.cos_sin(position_embeddings)  # [b, s, r] each
    r = cos.shape[-1]
    c, s = cos[:, None].to(rot.dtype), sin[:, None].to(rot.dtype)  # [b, 1, s, r]
    head = (rot[..., :r] * c - spec.partner(rot[..., :r]) * s) / (factor * factor)
    return head if r == rot.shape[-1] else torch.cat((head, rot[..., r:]), dim=-1)


# ----------------------------------------------------------------------------- recording attention

def _recording_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention that keeps scores and pattern on ``module._poslab_record`` (set by collect)."""
    h = query.shape[1]
    key = key.repeat_interleave(h // key.shape[1], dim=1)  # [b, h, j, d]
    value = value.repeat_interleave(h // value.shape[1], dim=1)
    scaling = module.scaling if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [b, h, i, j], before the mask
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

    def __init__(self, hf: nn.Module, *, source: Source | None = None, tokenizer=None, key: str | None = None):
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
        self.window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
        self.own_window = self.window
        self.inference_window: int | None = None  # a sliding window applied in collect (set_window)
        self.layers = _decoder_layers(hf, self.n_layers)
        self.layout = MODEL_LAYOUTS.get(getattr(config, "model_type", ""), "half")  # rotary pair layout
        self._rotary_slots = [(parent, name) for parent, name, _ in _rotary_modules(hf)]
        self.own_rotary = [getattr(p, n) for p, n in self._rotary_slots]
        self.schedule: dict | None = None  # the poslab schedule in use (None: the checkpoint's own modules)
        # what the probes written for poslab's Transformer read (probes/leakage.py)
        self.cfg = SimpleNamespace(bos=False, attention="softmax", energy_gate=False, causal=True,
                                   window=self.window, n_layers=self.n_layers, n_heads=self.n_heads)

    # --- the encoding

    @property
    def encoding(self) -> str:
        """rotary | learned | alibi | none, read off the checkpoint's modules and config."""
        if self._rotary_slots:
            return "rotary"
        if getattr(self.config, "alibi", False) or getattr(self.config, "model_type", "") in ("bloom", "mpt"):
            return "alibi"
        if any(n.endswith(("wpe", "embed_positions")) for n, _ in self.hf.named_modules()):
            return "learned"
        return "none"

    def own_scaling(self) -> dict:
        """The checkpoint's own rotary config as a poslab scaling dict (rope_theta included)."""
        params = dict(getattr(self.config, "rope_parameters", None) or {})
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

    def set_schedule(self, scaling: dict | None) -> None:
        """Replace the checkpoint's rotary embedding by poslab's under ``scaling`` (a Hugging Face
        rope dict; None or {}: the checkpoint's own schedule, computed by poslab). ``restore()``
        puts the checkpoint's modules back."""
        if not self._rotary_slots:
            raise ConfigError("schedule", (scaling or {}).get("rope_type", "default"),
                              f"a model with rotary position embedding (this {self.config.model_type} "
                              f"model's encoding is {self.encoding})")
        own = self.own_scaling()
        cfg = dict(scaling) if scaling else dict(own)
        cfg.setdefault("rope_theta", own["rope_theta"])
        if "partial_rotary_factor" in own:
            cfg.setdefault("partial_rotary_factor", own["partial_rotary_factor"])
        if cfg.get("rope_type", cfg.get("type", "default")) not in LENGTH_DEPENDENT + ("default",):
            cfg.setdefault("original_max_position_embeddings", self.context)
        device = next(self.hf.parameters()).device
        rotary = PoslabRotary(self.d_head, own["rope_theta"], cfg, max_position_embeddings=self.context,
                              layout=self.layout).to(device)
        for parent, name in self._rotary_slots:
            setattr(parent, name, rotary)
        self.schedule = cfg

    def restore(self) -> None:
        for (parent, name), module in zip(self._rotary_slots, self.own_rotary, strict=True):
            setattr(parent, name, module)
        self.schedule = None

    def set_window(self, window: int | None) -> None:
        """Mask keys ``window`` or more positions back in :meth:`collect` (an inference-time sliding
        window over weights trained without one); None: the checkpoint's own mask again."""
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ConfigError("window", window, "a positive integer (keys kept per query) or None")
        self.inference_window = window
        self.window = self.own_window if window is None else window
        self.cfg.window = self.window

    def rotary_frequencies(self) -> Tensor:
        """theta_i of the rotary in use (at L <= L0 for a length-dependent schedule), [r/2]."""
        if not self._rotary_slots:
            raise ConfigError("encoding", self.encoding, "a rotary model (rotary_frequencies)")
        parent, name = self._rotary_slots[0]
        inv_freq = getattr(getattr(parent, name), "inv_freq", None)
        if inv_freq is None:  # a checkpoint module holding a sin/cos table (GPT-J): its own schedule, by poslab
            own = self.own_scaling()
            inv_freq = rope_frequencies(self.d_head, own["rope_theta"], own)[0]
        return inv_freq

    @property
    def kv_cache(self) -> bool:
        rope_type = (self.schedule or self.own_scaling()).get("rope_type", "default")
        return rope_type not in LENGTH_DEPENDENT

    # --- checks

    def own_table_length(self) -> int | None:
        """Positions the checkpoint's own rotary module holds a sin/cos table for (GPT-J's stops at
        n_positions); None when it computes angles at any position."""
        table = getattr(self.own_rotary[0], "embed_positions", None) if self.own_rotary else None
        return None if table is None else int(table.shape[0])

    def check_length(self, L: int, *, intermediates: bool = False) -> None:
        """ConfigError if one sequence of L tokens cannot run here: a learned table too short, or
        attention that would not fit in memory (the estimate is in the message)."""
        if not isinstance(L, int) or isinstance(L, bool) or L < 2:
            raise ConfigError("length", L, "an integer >= 2")
        if self.encoding == "learned" and self.context and L > self.context:
            raise ConfigError("length", L, f"at most {self.context} (the checkpoint's learned position table)")
        table = self.own_table_length()
        if self.schedule is None and table is not None and L > table:
            raise ConfigError("length", L, f"at most {table} with the checkpoint's own sin/cos table "
                                           "(set_schedule(None) computes the same angles at any length)")
        require_attention_fits("length", L, L, self.n_heads, self.n_layers if intermediates else 0,
                               what="scores and patterns (collect)" if intermediates else "mask")

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
                 or any(getattr(self.config, k, None) for k in ("final_logit_softcapping", "logit_scale")))
        if plain:
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
        records = [dict() for _ in self.layers]
        handles, attn_modules = [], []
        if intervention is not None:
            handles.append(self.hf.get_input_embeddings().register_forward_hook(
                _replace_position0(self._check_intervention(intervention, batch.tokens.shape[0]))))
        for i, layer in enumerate(self.layers):
            handles.append(layer.register_forward_pre_hook(_keep_input(records[i]), with_kwargs=True))
            handles.append(layer.register_forward_hook(_keep_output(records[i])))
            attention = next(m for m in layer.modules() if m.__class__.__name__.endswith("Attention"))
            attention._poslab_record = records[i]
            attention._poslab_window = self.inference_window
            attn_modules.append(attention)
            handles.append(attention.register_forward_pre_hook(_keep_rotation(records[i]), with_kwargs=True))
        previous = self.config._attn_implementation
        try:
            self.hf.set_attn_implementation(ATTN)
            with torch.no_grad():
                logits = self(batch.tokens)
        finally:
            self.hf.set_attn_implementation(previous)
            for handle in handles:
                handle.remove()
            for module in attn_modules:
                del module._poslab_record, module._poslab_window
        s = batch.tokens.shape[1]
        inter = Intermediates(embed=records[0]["resid_pre"], positions=torch.arange(s))
        for rec in records:
            cos_sin = rec.get("position_embeddings")
            if cos_sin is None:  # no rotation: what the logits see is the projection itself
                q, k = rec["rot_q"], rec["rot_k"]
            else:
                factor = self._factor()
                q = unrotate(rec["rot_q"], cos_sin, factor, self.layout)
                k = unrotate(rec["rot_k"], cos_sin, factor, self.layout)
            inter.layers.append(LayerIntermediates(
                attn_scores=rec["attn_scores"], pattern=rec["pattern"], q=q, k=k, rot_q=rec["rot_q"],
                rot_k=rec["rot_k"], v=rec["v"], resid_pre=rec["resid_pre"], resid_post=rec["resid_post"]))
        inter.logits, inter.lengths, inter.prefix = logits, batch.lengths, 0
        return inter

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

    def _factor(self) -> float:
        parent, name = self._rotary_slots[0]
        return float(getattr(getattr(parent, name), "attention_scaling", 1.0))


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
        if pe is None and len(args) > 1 and isinstance(args[1], tuple):
            pe = args[1]
        if pe is not None:
            record["position_embeddings"] = pe
    return hook


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

def load(spec, *, dtype: str = "float32", device: str = "cpu", threads: int | None = None) -> PretrainedLM:
    """A checkpoint as a :class:`PretrainedLM`: ``smollm2-135m`` (the built-in GGUF), a directory
    with config.json and safetensors, a .gguf file, or a hub id (needs a network)."""
    check_choice("dtype", dtype, DTYPES)
    if dtype == "bfloat16" and device == "cpu":
        raise ConfigError("dtype", dtype, "float32 on cpu (bfloat16 is offered on a GPU)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "cpu (no CUDA device is available here)")
    source = resolve(spec)
    if source.kind == "config":
        raise ConfigError("--model", source.name, "a checkpoint with weights (a directory with config.json and "
                                                  "weights, or a GGUF file); a config alone can only be inspected")
    require_transformers()
    config = read_config(source)  # a GGUF of an unsupported architecture stops here
    if "rope_parameters" not in config and "rope_scaling" not in config and config.get("model_type") is None:
        raise ConfigError("--model", source.name, "a causal language model config")
    require_causal(config, source.name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    kwargs = dict(dtype=torch_dtype)
    if source.kind == "gguf":
        folder, filename = os.path.split(source.path)
        kwargs["gguf_file"] = filename
        where = folder
    else:
        where = source.path
    try:
        hf = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    except (ValueError, OSError, KeyError) as e:
        raise ConfigError("--model", source.name, f"a checkpoint transformers can load ({str(e).splitlines()[0]})") \
            from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **({"gguf_file": kwargs["gguf_file"]}
                                                           if "gguf_file" in kwargs else {}))
    except (ValueError, OSError, KeyError, TypeError):
        tokenizer = None  # a model without a tokenizer reads bytes (see encode_text)
    if tokenizer is not None and is_empty_tokenizer(tokenizer):
        tokenizer = None  # transformers builds an empty one from a folder with no tokenizer files
    return PretrainedLM(hf.to(device), source=source, tokenizer=tokenizer, key=content_hash(source))


def is_empty_tokenizer(tokenizer) -> bool:
    """A tokenizer with no real vocabulary: no more entries than its special tokens (and at most 8).
    transformers 5 builds one (1-5 entries) for a folder without tokenizer files."""
    try:
        size = len(tokenizer)
    except TypeError:
        return False
    return size <= max(8, len(getattr(tokenizer, "all_special_tokens", ()) or ()))


def encode_text(model: PretrainedLM, text: str) -> Tensor:
    """Token ids of ``text``: the checkpoint's tokenizer without special tokens (no BOS), or its
    UTF-8 bytes for a checkpoint that ships no tokenizer (vocabulary >= 256), [n] int64."""
    if model.tokenizer is not None:
        return torch.tensor(model.tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.long)
    vocab = model.config.vocab_size
    if vocab < 256:
        raise ConfigError("tokenizer", None, f"a checkpoint with a tokenizer or a vocabulary >= 256 (has {vocab})")
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode_tokens(model: PretrainedLM, ids) -> str:
    ids = [int(i) for i in ids]
    if model.tokenizer is not None:
        return model.tokenizer.decode(ids, skip_special_tokens=True)
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
