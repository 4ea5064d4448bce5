"""A small pre-LN transformer with full-sequence outputs (the seed paper's Section 5.2 model).

    x      = embed(W_E[s_t], t)                      position enters the stream (APE, sinusoidal)
    for each layer:
        a      = LN_attn(x)
        q,k,v  = W_Q a, W_K a, W_V a                  split into h heads of width d
        o      = attention(q, k, v, encoding, t, t)   rotate_qk, score_bias, value_bias inside
        x      = x + W_O o
        x      = x + MLP(LN_mlp(x))
    logits = U LN_final(x)

Used for the shift task, the character-level language model, and studies of context extension
and of positional leakage. The mask is causal and/or a sliding window (and, per layer, chunked),
plus key padding when ``lengths`` is given.

One positional-encoding module serves the whole model: ``embed`` is called once at the input,
``rotate_qk``, ``score_bias`` and ``value_bias`` in every layer, all with the same parameters.
Sharing is what T5 does with its relative bias, keeps RoPE-family tables in one place, and leaves
no dead parameters (a per-layer copy of an embed-site encoding would never be called past layer
0).

A per-layer layout (``layout``, :mod:`poslab.models.layout`) gives layers their own encoding,
mask and temperature, as the field's hybrid models do::

    layout = "rope,rope,rope,nope"                     RNoPE / SmolLM3: every fourth layer without rope
    layout = "rope:window=64,rope:window=64,rope:window=64,nope"         SWAN-GPT, Command A
    layout = "rope:chunk=64,rope:chunk=64,rope:chunk=64,nope"            Llama 4 (with qk_norm=True)
    layout = "rope:base=10000,rope:base=1000000"       Gemma's local / global theta

The pattern repeats over ``n_layers``. ``encoding`` stays the input-site encoding (its ``embed``)
and the default: layers whose entry is the model's encoding with its options use that module,
and layers with the same entry share one other module (``layer_encodings``), so a layout of
``encoding`` alone is the plain model, parameter for parameter. A layer with a window or chunk
gets its own mask; plain causal layers keep the fused kernel. ``model.layer_encoding(l)`` is
layer l's encoding; every caller of a Block's parts (:func:`~poslab.models.intervention.forward_with`,
the streamed evaluator) asks it, never ``model.encoding``, for a layer.

``qk_norm=True`` L2-normalizes each head's q and k (rows of unit norm) before ``rotate_qk`` on
the layers whose encoding rotates (``is_rotary``), as Llama 4 does on its rope layers; RoPE's
rotation is orthogonal, so normalizing before it equals normalizing after. With unit rows the
logits are cosines / (sqrt(d) tau); Llama 4's norm is an RMS norm (rows of norm sqrt(d)), whose
logits ours equal at temperature 1/d. Llama 4's position-dependent temperature on its no-rope
layers is a layout option (``nope:attn_scale=0.1:floor_scale=8192``, :mod:`poslab.models.layout`):
that layer's queries are scaled by log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1 at position p.

With ``bos`` a learned vector ``W_bos`` is prepended at position 0 and the real tokens sit at
positions 1 .. s (explicit ``positions`` are those of the real tokens; BOS keeps 0). Logits are
returned for the real tokens only; intermediates cover the whole internal sequence, BOS at index
0, so sink-reading probes can see it.

Two extensions, each its own config in its own module, held by one optional field each:
``energy_gate`` (:class:`~poslab.models.energy_gate.EnergyGate`, MoPE's energy-gated attention:
each layer gates its keys by their energy relative to the past) and ``random_positions``
(:class:`~poslab.models.random_positions.RandomPositions`, Ruoss et al.'s randomized positions at
the embedding). ``None`` is off; ``True`` and an integer N are shorthands for the defaults. A run's
config records the model as :meth:`TransformerConfig.record` writes it (the extensions under their
earlier flat names), so every stored run key still names its run.

The forward is pure — no ``.item()``, no branches on tensor values, no buffer writes — so an
ensemble is ``torch.func.functional_call`` + ``vmap`` over stacked parameters.

Notation: b batch, s tokens, n internal sequence (s, or s + 1 with BOS), h head, d head dim,
D d_model, F MLP width, m vocab.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, replace
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.attention import KINDS, attention, build_mask
from poslab.errors import ConfigError, check_choice, require_positive_int
from poslab.models import energy_gate as gate_ext
from poslab.models import random_positions as positions_ext
from poslab.models.energy_gate import EnergyGate
from poslab.models.intermediates import Intermediates, LayerIntermediates
from poslab.models.intervention import Intervention, forward_with
from poslab.models.layout import LayerSpec, check_layout, parse_layout, pattern
from poslab.models.loss import masked_cross_entropy
from poslab.models.random_positions import RandomPositions
from poslab.positional import PositionalEncoding, build_encoding, check_encoding, encoding_class
from poslab.tasks.base import Batch

# the fields the extensions replaced, as a run's config records them -> where they went
RENAMED = dict(gate_projection="energy_gate.projection", gate_energy="energy_gate.energy",
               gate_temperature="energy_gate.temperature", gate_tau_init="energy_gate.tau_init",
               gate_renormalize="energy_gate.renormalize", random_positions_eval="random_positions.at_eval",
               random_positions_draw="random_positions.draw")


INITS = ("torch", "normal")  # TransformerConfig.init
NORMAL_STD = 0.02  # init="normal": nanoGPT's and GPT-2's standard deviation


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    vocab_size: int  # m
    d_model: int = 64  # D
    n_layers: int = 2
    n_heads: int = 4  # h; each head has d_head = d_model // n_heads channels
    d_mlp: int | None = None  # MLP hidden width F; None -> 4 * d_model
    encoding: str = "rope"  # key of poslab.positional.ENCODINGS
    encoding_options: dict = field(default_factory=dict)  # the encoding's own options
    max_len: int = 64  # longest position any table must hold, BOS included
    causal: bool = True  # query i sees keys j <= i
    window: int | None = None  # sliding window: query i sees keys with i - j < window
    bos: bool = False  # prepend a learned BOS vector at position 0
    attention: str = "softmax"  # "softmax" | "linear" (no normalization; seed paper §7)
    temperature: float = 1.0  # logits are divided by it before the softmax
    layer_norm: bool = True  # pre-LN before attention, MLP and readout; False: identity
    bias: bool = True  # biases in the MLP and LayerNorms (False: none, as nanoGPT's bias=False)
    dropout: float = 0.0  # training-only dropout on embeddings, attention weights and residual branches
    # per-layer pattern, e.g. "rope,rope,rope,nope" or "rope:window=64,nope", repeated over n_layers, or
    # a name of layout.NAMED ("rnope", "swan", "irope": kept as its pattern) (poslab.models.layout);
    # None: ``encoding`` with ``window`` and ``temperature`` in every layer
    layout: str | None = None
    qk_norm: bool = False  # L2-normalize each head's q and k on the layers that rotate (Llama 4)
    energy_gate: EnergyGate | None = None  # energy-gated attention (models/energy_gate.py); True: the defaults
    random_positions: RandomPositions | None = None  # randomized positions (models/random_positions.py); N: N
    # "torch": W_E and BOS ~ N(0, 1), every matrix U(+-1/sqrt(fan_in)) as nn.Linear; "normal": nanoGPT's
    # (GPT-2's) N(0, 0.02^2) for every matrix, the residual projections 0.02 / sqrt(2 n_layers), biases 0
    init: str = "torch"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
            require_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", self.n_heads, f"a divisor of d_model={self.d_model}")
        if self.d_mlp is not None:
            require_positive_int("d_mlp", self.d_mlp)
        if self.window is not None:
            require_positive_int("window", self.window)
        check_choice("attention", self.attention, KINDS)
        if not self.temperature > 0:
            raise ConfigError("temperature", self.temperature, "a positive number")
        if not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
            raise ConfigError("dropout", self.dropout, "a number in [0, 1)")
        check_encoding(self.encoding, self.encoding_options)
        if not self.causal and encoding_class(self.encoding).causal_only:
            raise ConfigError("causal", self.causal, f"True: encoding {self.encoding!r} is defined for causal "
                                                     "attention only")
        object.__setattr__(self, "layout", pattern(self.layout))  # a named layout (layout.NAMED) -> its pattern
        object.__setattr__(self, "energy_gate", EnergyGate.setting(self.energy_gate))  # shorthands resolved
        object.__setattr__(self, "random_positions", RandomPositions.setting(self.random_positions))
        check_choice("init", self.init, INITS)
        if not isinstance(self.qk_norm, bool):
            raise ConfigError("qk_norm", self.qk_norm, "True, False")
        if self.layout is not None:
            check_layout(self.layout, n_layers=self.n_layers, encoding=self.encoding, options=self.encoding_options,
                         causal=self.causal, d_model=self.d_model, n_heads=self.n_heads, max_len=self.max_len)

    def record(self) -> dict:
        """This config as a run's config records it: every field, the extensions under the flat
        names they had before they were extensions (so every stored run key still names its run)."""
        fields = dataclasses.asdict(self)
        del fields["energy_gate"], fields["random_positions"]
        return fields | gate_ext.recorded(self.energy_gate) | positions_ext.recorded(self.random_positions)

    @classmethod
    def from_record(cls, fields: dict) -> TransformerConfig:
        """The config a run's recorded model config (:meth:`record`) stands for."""
        core = {k: v for k, v in fields.items()
                if k in cls.__dataclass_fields__ and k not in ("energy_gate", "random_positions")}
        return cls(**core, energy_gate=gate_ext.from_recorded(fields),
                   random_positions=positions_ext.from_recorded(fields))

    def layer_specs(self) -> tuple[LayerSpec, ...]:
        """Each layer's encoding, window, chunk and temperature (the model's where the layout is silent)."""
        if self.layout is None:
            own = LayerSpec(encoding=self.encoding, options=tuple(sorted(self.encoding_options.items())))
            specs: tuple[LayerSpec, ...] = (own,) * self.n_layers
        else:
            specs = parse_layout(self.layout, self.n_layers, self.encoding, self.encoding_options, self.causal)
        return tuple(replace(s, window=self.window if s.window is None else s.window,
                             temperature=self.temperature if s.temperature is None else s.temperature)
                     for s in specs)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def mlp_width(self) -> int:
        return self.d_mlp or 4 * self.d_model


class Block(nn.Module):
    """One pre-LN layer: x + W_O attn(LN_attn x), then x + MLP(LN_mlp x).

    ``spec`` is the layer's window, chunk and temperature (default: the model's, no chunk);
    ``qk_norm``: its q and k rows are L2-normalized before rotation."""

    def __init__(self, cfg: TransformerConfig, spec: LayerSpec | None = None, qk_norm: bool = False):
        super().__init__()
        self.cfg = cfg
        spec = spec or LayerSpec(encoding=cfg.encoding, window=cfg.window, temperature=cfg.temperature)
        self.window, self.chunk, self.qk_norm, self.spec = spec.window, spec.chunk, qk_norm, spec
        self.temperature = cfg.temperature if spec.temperature is None else spec.temperature
        D, hd = cfg.d_model, cfg.n_heads * cfg.d_head
        self.ln_attn = nn.LayerNorm(D, bias=cfg.bias) if cfg.layer_norm else nn.Identity()
        # Projections act as y = W x (the paper's convention): [out, in]; head r owns rows r d .. (r+1) d.
        self.W_Q = nn.Parameter(_uniform(hd, D))
        self.W_K = nn.Parameter(_uniform(hd, D))
        self.W_V = nn.Parameter(_uniform(hd, D))
        self.W_O = nn.Parameter(_uniform(D, hd))
        if cfg.energy_gate is not None:  # the extension's parameters (models/energy_gate.py)
            self.W_gate = nn.Parameter(_uniform(cfg.energy_gate.rows(cfg.n_heads), D))  # energy projection, [h | 1, D]
            self.gate_tau = nn.Parameter(torch.full((cfg.n_heads,), cfg.energy_gate.tau_init))  # tau_h, [h]
        self.ln_mlp = nn.LayerNorm(D, bias=cfg.bias) if cfg.layer_norm else nn.Identity()
        self.MLP = nn.Sequential(nn.Linear(D, cfg.mlp_width, bias=cfg.bias), nn.GELU(),
                                 nn.Linear(cfg.mlp_width, D, bias=cfg.bias))

    def forward(self, x: Tensor, encoding: PositionalEncoding, pos: Tensor, mask: Tensor | None,
                need_weights: bool, is_causal: bool = False) -> tuple[Tensor, LayerIntermediates | None]:
        """x [b, n, D], pos [n] | [b, n] -> x [b, n, D] and, on request, what the layer computed.
        ``is_causal``: the mask is the plain causal one (``mask`` is None), see ``attention``."""
        p = self.cfg.dropout if self.training else 0.0
        a = self.ln_attn(x)
        q, k, v = self.project(a, pos)  # [b, h, n, d]
        v, gate = self.gated(a, v)
        att = attention(q, k, v, encoding, pos, pos, mask=mask, kind=self.cfg.attention,
                        temperature=self.temperature, key_gate=gate, need_weights=need_weights,
                        is_causal=is_causal, dropout=p, stream=a)
        out = self.mix(x, att.out, p)
        if not need_weights:
            return out, None
        # need_weights: attention took the explicit path, which returns all four
        assert att.attn_scores is not None and att.pattern is not None
        assert att.rot_q is not None and att.rot_k is not None
        return out, LayerIntermediates(attn_scores=att.attn_scores, pattern=att.pattern, q=q, k=k,
                                       rot_q=att.rot_q, rot_k=att.rot_k, v=v, resid_pre=x, resid_post=out)

    # The layer's parts, in order; the streamed evaluator (probes/lm_streaming.py) calls them chunk
    # by chunk instead of writing the layer again.

    def project(self, a: Tensor, pos: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Normalized input a [b, n, D] at positions pos [n] | [b, n] -> q, k, v, each [b, h, n, d]
        (before any rotation)."""
        return (self.queries(a, pos), *self.keys_values(a))

    def queries(self, a: Tensor, pos: Tensor | None = None) -> Tensor:
        """[b, h, n, d]; a layer with temperature tuning (``attn_scale``) scales them by position,
        so it needs ``pos`` [n] | [b, n]."""
        q = self._qk_norm(self._heads(a, self.W_Q))
        if self.spec.attn_scale is None:
            return q
        if pos is None:
            raise ConfigError("layout", self.cfg.layout, "positions for the queries of a layer with attn_scale "
                                                         "(Block.queries(a, pos))")
        scale = self.spec.query_scale(pos, q.dtype)  # [n] | [b, n]
        assert scale is not None
        return q * scale[..., None, :, None]  # [1 | b, 1, n, 1]

    def keys_values(self, a: Tensor) -> tuple[Tensor, Tensor]:
        return self._qk_norm(self._heads(a, self.W_K)), self._heads(a, self.W_V)  # [b, h, n, d] each

    def _qk_norm(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1) if self.qk_norm else x  # unit rows, before rotate_qk

    def gate(self, a: Tensor, start: int = 0, carry: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Energy gate of the keys a [b, n, D] at internal indices start .. start + n - 1 -> E, g
        [b, h, n] and the running sum of e^2 that continues it (:func:`poslab.models.energy_gate.energy`)."""
        assert self.cfg.energy_gate is not None
        return gate_ext.energy(self.cfg.energy_gate, a, self.W_gate, self.gate_tau, self.cfg.n_heads, start, carry)

    def gated(self, a: Tensor, v: Tensor) -> tuple[Tensor, Tensor | None]:
        """The values v [b, h, n, d] and the key gate attention applies, under this layer's energy
        gate, if any (:func:`poslab.models.energy_gate.apply`)."""
        if self.cfg.energy_gate is None:
            return v, None
        return gate_ext.apply(self.cfg.energy_gate, self.gate(a)[1], v)

    def energy_gate(self, a: Tensor) -> tuple[Tensor, Tensor]:
        """Normalized input a [b, n, D] -> relative energy E and gate g, each [b, h, n] (causal)."""
        E, g, _ = self.gate(a)
        return E, g

    def mix(self, x: Tensor, o: Tensor, p: float = 0.0) -> Tensor:
        """The residual stream x [b, n, D] after this layer, given the heads' attention output
        o [b, h, n, d]: x + W_O o, then + MLP(LN_mlp(.)) (dropout p on both branches)."""
        b, h, n, d = o.shape
        o = o.transpose(1, 2).reshape(b, n, h * d)  # heads concatenated, [b, n, h d]
        resid_mid = x + _dropout(o @ self.W_O.T, p)
        return resid_mid + _dropout(self.MLP(self.ln_mlp(resid_mid)), p)

    def _heads(self, x: Tensor, W: Tensor) -> Tensor:
        """[b, n, D] -> [b, h, n, d]."""
        b, n, _ = x.shape
        return (x @ W.T).view(b, n, self.cfg.n_heads, self.cfg.d_head).transpose(1, 2)


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        D, m = cfg.d_model, cfg.vocab_size
        self.encoding = build_encoding(cfg.encoding, d_model=D, n_heads=cfg.n_heads, d_head=cfg.d_head,
                                       max_len=cfg.max_len, d_head_from="d_model", **cfg.encoding_options)
        self.W_E = nn.Parameter(torch.randn(m, D))  # token embedding, [m, D]
        if cfg.bos:
            self.W_bos = nn.Parameter(torch.randn(D))  # the BOS vector, embedded like a token
        # layer l's encoding: ``encoding`` where its entry is the model's, else a shared entry of
        # ``layer_encodings`` (built after W_E and W_bos, so a plain model's RNG stream is unchanged
        # by the layout machinery)
        specs = cfg.layer_specs()
        own = (cfg.encoding, tuple(sorted(cfg.encoding_options.items())))
        distinct: list[tuple[str, tuple]] = []
        for spec in specs:
            if (spec.encoding, spec.options) != own and (spec.encoding, spec.options) not in distinct:
                distinct.append((spec.encoding, spec.options))
        self.layer_encodings = nn.ModuleList(
            build_encoding(name, d_model=D, n_heads=cfg.n_heads, d_head=cfg.d_head, max_len=cfg.max_len,
                           d_head_from="d_model", **dict(options)) for name, options in distinct)
        self._encoding_index = tuple(-1 if (s.encoding, s.options) == own else distinct.index((s.encoding, s.options))
                                     for s in specs)  # -1: ``encoding``
        self.layers = nn.ModuleList(
            Block(cfg, spec, qk_norm=cfg.qk_norm and self.layer_encoding(i).is_rotary) for i, spec in enumerate(specs))
        self.ln_final = nn.LayerNorm(D, bias=cfg.bias) if cfg.layer_norm else nn.Identity()
        self.U = nn.Parameter(_uniform(m, D))  # readout, [m, D]
        if cfg.init == "normal":  # drawn over the "torch" values, so that init's stream is unchanged
            self._normal_init()

    @torch.no_grad()
    def _normal_init(self, std: float = NORMAL_STD) -> None:
        """nanoGPT's initialisation (``GPT._init_weights``; GPT-2's): every weight matrix of the model's
        own N(0, std^2), the two projections into the residual stream (W_O, the MLP's second layer)
        N(0, (std / sqrt(2 n_layers))^2), the MLP's biases 0. The LayerNorms keep (1, 0), and each
        encoding keeps its own initialisation (its options say it: learned APE's ``init_std``). The
        readout stays untied from W_E (nanoGPT ties them)."""
        residual = std / math.sqrt(2 * self.cfg.n_layers)
        matrices: list[Tensor] = [self.W_E, self.U, *([self.W_bos] if self.cfg.bos else [])]
        for layer in range(self.cfg.n_layers):
            block = self.block(layer)
            first, second = cast(nn.Linear, block.MLP[0]), cast(nn.Linear, block.MLP[2])
            matrices += [block.W_Q, block.W_K, block.W_V, first.weight]
            matrices += [block.W_gate] if block.cfg.energy_gate is not None else []
            block.W_O.normal_(0.0, residual)
            second.weight.normal_(0.0, residual)
            for linear in (first, second):
                if linear.bias is not None:
                    linear.bias.zero_()
        for w in matrices:
            w.normal_(0.0, std)

    def block(self, layer: int) -> Block:
        return cast(Block, self.layers[layer])

    def layer_encoding(self, layer: int) -> PositionalEncoding:
        """The encoding whose attention hooks layer ``layer`` calls."""
        index = self._encoding_index[layer]
        return self.encoding if index < 0 else self.layer_encodings[index]  # type: ignore[return-value]

    def encodings(self) -> list[PositionalEncoding]:
        """Every distinct encoding module of the model: ``encoding``, then ``layer_encodings``."""
        return [self.encoding, *self.layer_encodings]  # type: ignore[list-item]

    def check_length(self, L: int) -> None:
        """Raise ConfigError before any work if sequences of L tokens cannot be encoded.

        Only the encoding knows its limit (RoPE has none; a learned table has max_len rows), so
        this asks it about the largest default position, L - 1 (L with BOS).
        """
        require_positive_int("length", L)
        N = None if self.cfg.random_positions is None else self.cfg.random_positions.N
        if N is not None and not N > L:
            raise ConfigError("random_positions", N, f"an integer > {L} (more positions to sample from than the "
                                                     "longest training or evaluation length)")
        for enc in self.encodings():
            enc.check_positions((L if N is None else N) - 1 + int(self.cfg.bos))

    @property
    def padding_inert(self) -> bool:
        """Whether the loss of a batch is unchanged (to float rounding) when the positions past every
        sequence's length are cut off: they are masked keys (or, causal, later than every real query)
        and hold no target. Not so with randomized positions drawn for the padded width (``draw="length"``
        draws each sequence's for its own length), dropout (its draws follow the tensor's shape) or an
        encoding that reads the longest position (one that breaks a KV cache, ``kv_cache`` False). The
        trainer's ``crop_padding`` asks it."""
        cfg = self.cfg
        sampled = cfg.random_positions
        return (sampled is None or sampled.draw == "length") and cfg.dropout == 0 and self.encoding.kv_cache

    def loss(self, batch: Batch) -> Tensor:
        """Mean cross-entropy over the batch's loss mask (one target per position or per sequence).

        A causal model needs no key padding: every key past a sequence's end is also after each
        of its real queries, so the mask is the plain causal one and the fused kernel applies.
        """
        positions = batch.positions
        if positions is None:  # randomized positions, drawn here where each sequence's length is known
            positions = self.drawn_positions(batch.tokens, batch.lengths)
        logits = self(batch.tokens, positions, lengths=None if self.cfg.causal else batch.lengths)
        loss = masked_cross_entropy(logits, batch)
        for enc in self.encodings():
            penalty = enc.penalty()  # a training-only term (MoPE's admissibility penalty)
            if penalty is not None:
                loss = loss + penalty
        return loss

    def forward(self, tokens: Tensor, positions: Tensor | None = None, lengths: Tensor | None = None,
                return_intermediates: bool = False):
        """tokens [b, s] -> logits [b, s, m], or (logits, Intermediates) on request.

        positions [s] | [b, s] of the tokens (default 0 .. s-1, or 1 .. s with BOS); lengths [b]
        marks right padding: keys past a sequence's length are masked. A leakage study's
        interventions run the same parts through :func:`poslab.models.intervention.forward_with`.
        """
        x, pos = self.embed(tokens, positions)
        masks = self.layer_masks(x.shape[1], lengths, tokens.device)
        inter = Intermediates(embed=x, positions=pos) if return_intermediates else None
        for i, (block, (mask, plain_causal)) in enumerate(zip(self.layers, masks, strict=True)):
            x, layer = block(x, self.layer_encoding(i), pos, mask, need_weights=return_intermediates,
                             is_causal=plain_causal)
            if inter is not None:
                inter.layers.append(layer)
        logits = self.readout(x)
        return (logits, inter) if return_intermediates else logits

    # The forward's parts, in order.

    def drawn_positions(self, tokens: Tensor, lengths: Tensor | None = None) -> Tensor | None:
        """Randomized positions [b, s] of ``tokens`` [b, s] (1 .. with BOS), where the model draws them now
        (``random_positions`` on; training, or evaluation with ``at_eval``); else None. ``lengths`` [b]: each
        sequence's own tokens, which a per-length draw reads (``draw="length"``; the width draw ignores them).
        None too for an encoding whose positions come from the task (``embed`` asks the task for them)."""
        sampled = self.cfg.random_positions
        if sampled is None or self.encoding.task_positions or not (self.training or sampled.at_eval):
            return None
        b, s = tokens.shape
        return sampled.sample(b, s, tokens.device, lengths) + int(self.cfg.bos)

    def embed(self, tokens: Tensor, positions: Tensor | None = None,
              bos: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tokens [b, s] -> the residual stream entering layer 0, x [b, n, D] (n = s, + 1 with BOS
        at index 0: ``bos`` [b, 1, D], default W_bos), and every index's position pos [n] | [b, n]."""
        cfg = self.cfg
        b, s = tokens.shape
        if positions is None and self.encoding.task_positions:  # position coupling, Abacus: ids from the task
            raise ConfigError("positions", None, f"per-token positions [b, s] from the task for encoding "
                                                 f"{cfg.encoding!r} (a task that hands Batch.positions)")
        if positions is None:
            positions = self.drawn_positions(tokens)
        if positions is None:
            positions = torch.arange(int(cfg.bos), s + int(cfg.bos), device=tokens.device)
        x = F.embedding(tokens, self.W_E)  # [b, s, D]
        pos = positions
        if cfg.bos:
            x = torch.cat((self.W_bos.expand(b, 1, cfg.d_model) if bos is None else bos, x), dim=1)  # [b, n, D]
            pos = torch.cat((torch.zeros_like(positions[..., :1]), positions), dim=-1)  # BOS at 0, [n] | [b, n]
        return _dropout(self.encoding.embed(x, pos), cfg.dropout if self.training else 0.0), pos

    def attention_mask(self, n: int, lengths: Tensor | None, device, *, explicit: bool = False,
                       layer: int | None = None) -> tuple[Tensor | None, bool]:
        """(keep-mask broadcastable to [b, h, n, n], plain_causal) of layer ``layer`` (None: the
        model's window, no chunk): a plain causal mask is None with plain_causal True (attention's
        fused kernel skips the masked half) unless ``explicit``."""
        cfg = self.cfg
        window, chunk = (cfg.window, None) if layer is None else (self.block(layer).window, self.block(layer).chunk)
        plain_causal = cfg.causal and window is None and chunk is None and lengths is None and not explicit
        if plain_causal:
            return None, True
        key_padding = None
        if lengths is not None:
            key_padding = torch.arange(n, device=device) < (lengths + int(cfg.bos))[:, None]  # [b, n]
        mask = build_mask(n, n, causal=cfg.causal, window=window, chunk=chunk, key_padding=key_padding,
                          device=device)
        if lengths is not None:
            # A padded query keeps itself so no softmax row is empty (its output is never read);
            # real queries are unaffected, their own key is always kept.
            assert mask is not None  # key_padding was given
            mask = mask | torch.eye(n, dtype=torch.bool, device=device)
        return mask, False

    def layer_masks(self, n: int, lengths: Tensor | None, device, *,
                    explicit: bool = False) -> list[tuple[Tensor | None, bool]]:
        """:meth:`attention_mask` of every layer, each distinct (window, chunk) built once."""
        built: dict[tuple[int | None, int | None], tuple[Tensor | None, bool]] = {}
        out = []
        for i in range(len(self.layers)):
            key = (self.block(i).window, self.block(i).chunk)
            if key not in built:
                built[key] = self.attention_mask(n, lengths, device, explicit=explicit, layer=i)
            out.append(built[key])
        return out

    def readout(self, x: Tensor) -> Tensor:
        """The last residual stream x [b, n, D] -> logits of the real tokens [b, s, m] (BOS dropped)."""
        return self.ln_final(x[:, int(self.cfg.bos):]) @ self.U.T

    def collect(self, batch: Batch, intervention: Intervention | None = None) -> Intermediates:
        """What the probes read about ``batch``: the forward's intermediates under no_grad (key
        padding from ``batch.lengths``), with its ``logits`` [b, s, m], the batch's ``lengths``
        and ``prefix`` = 1 with BOS (token t sits at internal index prefix + t); with an
        ``intervention``, those of :func:`~poslab.models.intervention.forward_with`."""
        with torch.no_grad():
            if intervention is None:
                logits, inter = self.forward(batch.tokens, batch.positions, lengths=batch.lengths,
                                             return_intermediates=True)
            else:
                logits, inter = forward_with(self, batch.tokens, intervention, lengths=batch.lengths)
        inter.logits, inter.lengths, inter.prefix = logits, batch.lengths, int(self.cfg.bos)
        return inter

def _dropout(x: Tensor, p: float) -> Tensor:
    return F.dropout(x, p) if p > 0 else x


def _uniform(n_out: int, n_in: int) -> Tensor:
    """U(-1/sqrt(n_in), 1/sqrt(n_in)), nn.Linear's scale, as a raw [n_out, n_in] matrix."""
    bound = 1.0 / math.sqrt(n_in)
    return torch.empty(n_out, n_in).uniform_(-bound, bound)
