"""One record per checkpoint architecture: what poslab can do with it, and the tiny config its tests build.

    ARCHITECTURES["llama"] -> Architecture    keyed by transformers' model_type
    find(model_type) -> Architecture | None    by model_type or one of its aliases (a GGUF's name)
    model_types(capability) -> (type, ...)     the types (aliases included) that can "record" | "replace"

A record holds

- ``encoding``: rope | learned | alibi, where a config alone does not say (GPT-2's table, BLOOM's
  ALiBi); a config's own fields still decide for the others (``table.entry_from_config``);
- ``record``: poslab records its attention (poslab's attention function under transformers'
  attention interface, ``attention``): ``collect`` gives the checkpoint's logits
  (tests/pretrained/test_adapter.py, test_layer_rotary.py);
- ``replace``: poslab's rotary replaces the checkpoint's, with every schedule (a schedule is
  applied by replacing the rotary): ``set_schedule(None)`` and ``collect`` under it give the
  checkpoint's logits (``parity``; tests/pretrained/test_layer_rotary.py over ``tiny_kinds``);
- ``layout``: the rotary pair layout, half (i, i + r/2) or interleaved (2i, 2i + 1); ``collect``
  un-rotates queries and keys with it;
- ``output``: how the checkpoint's rotary module hands its angles to the attention (``OUTPUTS``):
  ``halves`` (cos, sin) [b, s, r], angle i at channels i and i + r/2 (Llama; GLM too, whose attention
  takes the first half and repeats each angle onto its interleaved pair), ``gptj`` (sin, cos) of r/2
  channels, ``repeated`` (cos, sin) [b, s, r], angle i at channels 2i and 2i + 1 (Cohere),
  ``complex`` A e^{i angle} [b, s, r/2] (Llama 4); poslab's rotary hands the same;
- the per-layer pattern (``layer_pattern``): which layers rotate at all (``rope_flags``: a config
  field listing 1 for a rope layer and 0 for a layer without, SmolLM3 and Llama 4, with the
  interval of no-rope layers when the list is absent; ``rope_types``: the layer types that rotate,
  Cohere2's sliding layers), chunked attention (``chunk``: the config field of the chunk on the
  ``chunked_attention`` layers, Llama 4), the sliding window and theta per layer type (the config's
  ``layer_types`` and ``rope_parameters``), and what else the layers do to q and k (``notes``);
- ``aliases``: the architecture's other model_type names (Gemma 3's GGUF says "gemma3");
- ``tiny``: kind -> (transformers config class, options): the tiny random checkpoints
  ``tiny.tiny_checkpoint`` builds, whose parity tests every kind of a ``replace`` record.

Adding an architecture is one record here and nothing else (tests/pretrained/test_architectures.py
adds one at run time and runs ``inspect --parity`` on it). A model type with no record is refused
by name wherever a study needs to record its attention or replace its rotary
(``checks.require_capable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VOCAB = 256  # byte-level: the tiny checkpoints ship no tokenizer (poslab.pretrained.encode_text)
CONTEXT = 64
PAIRS = 8  # rotary pairs of the 16-channel heads below
CAPABILITIES = ("record", "replace")
LAYOUTS = ("half", "interleaved")
OUTPUTS = ("halves", "gptj", "repeated", "complex")
CHUNKED = "chunked_attention"  # the layer type of chunked attention (Llama 4's rope layers)

_BODY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=CONTEXT)
_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # inside the byte vocabulary
_THETA = {"rope_type": "default", "rope_theta": 10000.0}
_GEMMA = dict(_BODY, head_dim=16, sliding_window=16, query_pre_attn_scalar=16, **_TOKENS)
_GEMMA3_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]


def _gemma3_rope(full: dict) -> dict:
    return {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_theta": 1e6, **full}}


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """What poslab knows of one checkpoint architecture (module docstring)."""

    model_type: str  # transformers' model_type
    encoding: str = "rope"  # rope | learned | alibi
    record: bool = False  # poslab records its attention (collect tested)
    replace: bool = False  # poslab's rotary replaces its own, every schedule (parity tested)
    layout: str = "half"  # rotary pair layout: half (i, i + r/2) | interleaved (2i, 2i + 1)
    output: str = "halves"  # what its rotary module hands the attention (OUTPUTS; module docstring)
    rope_flags: tuple[str, str, int] | None = None  # (per-layer 1/0 field, interval field, its default)
    rope_types: tuple[str, ...] | None = None  # the layer types that rotate (None: every type)
    chunk: str | None = None  # config field of the chunk of the chunked_attention layers
    # where a config.json has no layer_types: (the field of the period, its default), the last layer of each
    # period full attention, the others sliding (Cohere2's sliding_window_pattern, as its config class builds it)
    type_period: tuple[str, int] | None = None
    notes: str = ""  # what else the layers do to q and k (shown by inspect)
    attention: str = "transformers attention interface"  # the path poslab records through
    why_not: str = ""  # for a record that can do nothing: why (said when a study refuses it)
    aliases: tuple[str, ...] = ()  # other model_type names of the same architecture (a GGUF's)
    tiny: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # kind -> (config class, options)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.model_type, *self.aliases)

    def can(self, capability: str) -> bool:
        return bool(getattr(self, capability))

    def rope_layers(self, config) -> list[bool]:
        """Per layer, whether it rotates q and k, read off ``config`` (a dict or a config object)."""
        flags = self._flags(config)
        types = self.layer_types(config)
        if self.rope_types is not None and types:
            flags = [f and t in self.rope_types for f, t in zip(flags, types, strict=True)]
        return flags

    def layer_types(self, config) -> list[str] | None:
        """The config's ``layer_types``, or those its period field implies (``type_period``); None without."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        types = get("layer_types")
        if types:
            return [str(t) for t in types]
        n = int(get("num_hidden_layers") or 0)
        if self.chunk is not None and get(self.chunk) and n:  # as Llama 4's config class builds them
            return [CHUNKED if rope else "full_attention" for rope in self._flags(config)]
        if self.type_period is None or not n:
            return None
        period = int(get(self.type_period[0]) or self.type_period[1])
        return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n)]

    def _flags(self, config) -> list[bool]:
        """Per layer, whether its rope flags (``rope_flags``) let it rotate (every layer without them)."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        n = int(get("num_hidden_layers") or get("n_layer") or 0)
        if self.rope_flags is None:
            return [True] * n
        listed, interval_field, default = self.rope_flags
        given = get(listed)
        if given:
            return [bool(f) for f in given]
        interval = int(get(interval_field) or default)
        return [(i + 1) % interval != 0 for i in range(n)]

    def layer_chunks(self, config) -> list[int | None]:
        """Per layer, the chunk of its chunked attention (None: not chunked)."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        types = self.layer_types(config) or []
        chunk = get(self.chunk) if self.chunk else None
        return [int(chunk) if chunk and t == CHUNKED else None for t in types] if types else \
            [None] * int(get("num_hidden_layers") or 0)


_RECORDS = [
    Architecture(model_type="llama", record=True, replace=True, tiny={
        "llama": ("LlamaConfig", dict(_BODY, rope_parameters=_THETA)),
        "llama-linear": ("LlamaConfig", dict(_BODY, rope_parameters={**_THETA, "rope_type": "linear",
                                                                     "factor": 4.0})),
        "llama-dynamic": ("LlamaConfig", dict(_BODY, rope_parameters={**_THETA, "rope_type": "dynamic",
                                                                      "factor": 2.0})),
        "llama-yarn": ("LlamaConfig", dict(_BODY, rope_parameters={**_THETA, "rope_type": "yarn", "factor": 2.0,
                                                                   "original_max_position_embeddings": 32})),
        "llama-llama3": ("LlamaConfig", dict(_BODY, rope_parameters={
            "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}))}),
    Architecture(model_type="qwen2", record=True, replace=True,
                 tiny={"qwen2": ("Qwen2Config", dict(_BODY, rope_parameters=_THETA))}),
    Architecture(model_type="qwen3", record=True, replace=True,
                 tiny={"qwen3": ("Qwen3Config", dict(_BODY, head_dim=16, rope_parameters=_THETA))}),
    Architecture(model_type="mistral", record=True, replace=True,
                 tiny={"mistral": ("MistralConfig", dict(_BODY, sliding_window=16, rope_parameters=_THETA))}),
    Architecture(model_type="phi3", record=True, replace=True, tiny={
        "phi3": ("Phi3Config", dict(_BODY, original_max_position_embeddings=CONTEXT, rope_parameters=_THETA,
                                    **_TOKENS)),
        "phi3-longrope": ("Phi3Config", dict(_BODY, original_max_position_embeddings=32, **_TOKENS, rope_parameters={
            **_THETA, "rope_type": "longrope", "original_max_position_embeddings": 32,
            "short_factor": [1.0 + 0.05 * i for i in range(PAIRS)],
            "long_factor": [1.5 + 0.25 * i for i in range(PAIRS)]}))}),
    Architecture(model_type="gpt_neox", record=True, replace=True, tiny={
        "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                           num_attention_heads=4, max_position_embeddings=CONTEXT,
                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                            "partial_rotary_factor": 0.25}))}),
    Architecture(model_type="olmo2", record=True, replace=True,
                 tiny={"olmo2": ("Olmo2Config", dict(_BODY, rope_parameters=_THETA, **_TOKENS))}),
    # soft caps small enough to bite on a random model's scores (~0.14) and logits (~0.6)
    Architecture(model_type="gemma2", record=True, replace=True, tiny={
        "gemma2": ("Gemma2Config", dict(_GEMMA, rope_parameters=_THETA, attn_logit_softcapping=0.1,
                                        final_logit_softcapping=1.0))}),
    Architecture(model_type="gemma3_text", aliases=("gemma3",), record=True, replace=True, tiny={
        "gemma3": ("Gemma3TextConfig", dict(_GEMMA, num_hidden_layers=3, layer_types=_GEMMA3_TYPES,
                                            rope_parameters=_gemma3_rope({"rope_type": "default"}))),
        "gemma3-linear": ("Gemma3TextConfig", dict(_GEMMA, num_hidden_layers=3, layer_types=_GEMMA3_TYPES,
                                                   rope_parameters=_gemma3_rope({"rope_type": "linear",
                                                                                 "factor": 8.0})))}),
    Architecture(model_type="gptj", layout="interleaved", output="gptj", record=True, replace=True, tiny={
        "gptj": ("GPTJConfig", dict(n_embd=64, n_inner=128, n_layer=2, n_head=4, rotary_dim=8, n_positions=CONTEXT))}),
    Architecture(model_type="phi", record=True, replace=True, tiny={  # partial rotary 0.5, dense + parallel
        "phi": ("PhiConfig", dict(_BODY, rope_parameters=dict(_THETA, partial_rotary_factor=0.5), **_TOKENS))}),
    Architecture(model_type="stablelm", record=True, replace=True, tiny={
        "stablelm": ("StableLmConfig", dict(_BODY, rope_parameters=dict(_THETA, partial_rotary_factor=0.25),
                                            **_TOKENS))}),
    Architecture(model_type="cohere", layout="interleaved", output="repeated", record=True, replace=True, tiny={
        "cohere": ("CohereConfig", dict(_BODY, rope_parameters=_THETA, logit_scale=0.5, **_TOKENS))}),
    # Command A / R7B: three sliding rope layers, then one global layer without rope
    Architecture(model_type="cohere2", layout="interleaved", output="repeated", rope_types=("sliding_attention",),
                 type_period=("sliding_window_pattern", 4),
                 record=True, replace=True, tiny={
                     "cohere2": ("Cohere2Config", dict(_BODY, num_hidden_layers=4, sliding_window=16,
                                                       rope_parameters=_THETA, logit_scale=0.5, **_TOKENS))}),
    Architecture(model_type="starcoder2", record=True, replace=True, tiny={
        "starcoder2": ("Starcoder2Config", dict(_BODY, sliding_window=16, rope_parameters=_THETA, **_TOKENS))}),
    Architecture(model_type="mixtral", record=True, replace=True, tiny={
        "mixtral": ("MixtralConfig", dict(_BODY, num_local_experts=4, num_experts_per_tok=2, rope_parameters=_THETA,
                                          **_TOKENS))}),
    Architecture(model_type="qwen2_moe", aliases=("qwen2moe",), record=True, replace=True, tiny={
        "qwen2_moe": ("Qwen2MoeConfig", dict(_BODY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                             shared_expert_intermediate_size=32, rope_parameters=_THETA,
                                             **_TOKENS))}),
    Architecture(model_type="qwen3_moe", aliases=("qwen3moe",), record=True, replace=True, tiny={
        "qwen3_moe": ("Qwen3MoeConfig", dict(_BODY, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=32, rope_parameters=_THETA, **_TOKENS))}),
    Architecture(model_type="granite", record=True, replace=True, tiny={  # its multipliers away from 1
        "granite": ("GraniteConfig", dict(_BODY, rope_parameters=_THETA, embedding_multiplier=2.0,
                                          attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=4.0,
                                          **_TOKENS))}),
    # GLM's rotary module hands Llama's halves; its attention rotates interleaved pairs of the first half
    Architecture(model_type="glm", layout="interleaved", record=True, replace=True, tiny={
        "glm": ("GlmConfig", dict(_BODY, head_dim=16, rope_parameters=dict(_THETA, partial_rotary_factor=0.5),
                                  **_TOKENS))}),
    Architecture(model_type="glm4", layout="interleaved", record=True, replace=True, tiny={
        "glm4": ("Glm4Config", dict(_BODY, head_dim=16, rope_parameters=dict(_THETA, partial_rotary_factor=0.5),
                                    **_TOKENS))}),
    Architecture(model_type="smollm3", rope_flags=("no_rope_layers", "no_rope_layer_interval", 4),
                 record=True, replace=True, tiny={
                     "smollm3": ("SmolLM3Config", dict(_BODY, num_hidden_layers=4, rope_parameters=_THETA,
                                                       **_TOKENS))}),
    # iRoPE: chunked attention with rope on three layers of four, global attention without rope on the fourth
    Architecture(model_type="llama4_text", layout="interleaved", output="complex",
                 rope_flags=("no_rope_layers", "no_rope_layer_interval", 4), chunk="attention_chunk_size",
                 notes="QK L2 norm after the rotation (use_qk_norm); no-rope layers scale q by "
                       "1 + attn_scale log(1 + floor((p + 1) / floor_scale)) (attn_temperature_tuning)",
                 record=True, replace=True, tiny={  # chunk 8 and floor_scale 4: both bite within 16 tokens
                     "llama4": ("Llama4TextConfig", dict(_BODY, num_hidden_layers=4, head_dim=16,
                                                         intermediate_size_mlp=128, num_local_experts=2,
                                                         attention_chunk_size=8, floor_scale=4,
                                                         rope_parameters=_THETA, **_TOKENS))}),
    # Falcon calls transformers' attention interface in the installed transformers (5.25); the recording check
    # (checks.preflight) refuses a version that does not. ALiBi Falcon (alibi=True) is recorded, not rescheduled.
    Architecture(model_type="falcon", record=True, replace=True, tiny={
        "falcon": ("FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
                                        new_decoder_architecture=True, max_position_embeddings=CONTEXT,
                                        rope_parameters=_THETA, **_TOKENS)),
        "falcon-mq": ("FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           multi_query=True, new_decoder_architecture=False, parallel_attn=True,
                                           max_position_embeddings=CONTEXT, rope_parameters=_THETA, **_TOKENS))}),
    # refused by name: what poslab cannot do with them, and why
    Architecture(model_type="deepseek_v2", aliases=("deepseek_v3",),
                 why_not="multi-head latent attention (MLA): rope on a decoupled qk_rope_head_dim part of each "
                         "head, outside poslab's rotary replacement and un-rotation"),
    Architecture(model_type="gpt2", encoding="learned", record=True,
                 tiny={"gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT))}),
    Architecture(model_type="gpt_neo", encoding="learned"),  # known to the table; not tested here
    Architecture(model_type="opt", encoding="learned"),
    Architecture(model_type="bloom", encoding="alibi"),
    Architecture(model_type="mpt", encoding="alibi"),
]
ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in _RECORDS}


def find(model_type: str | None) -> Architecture | None:
    """The record of ``model_type`` (its own name or an alias); None for an architecture poslab has no
    record of."""
    for arch in ARCHITECTURES.values():
        if model_type in arch.names:
            return arch
    return None


def model_types(capability: str) -> tuple[str, ...]:
    """Every model_type name (aliases included) whose record has ``capability`` ("record" | "replace")."""
    if capability not in CAPABILITIES:
        raise ValueError(f"capability: got {capability!r}; allowed: {', '.join(CAPABILITIES)}")
    return tuple(name for arch in ARCHITECTURES.values() if arch.can(capability) for name in arch.names)


def tiny_configs() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every record's tiny configs: kind -> (config class, options)."""
    return {kind: cfg for arch in ARCHITECTURES.values() for kind, cfg in arch.tiny.items()}


def parity_kinds() -> tuple[str, ...]:
    """The tiny kinds whose parity the tests check: every kind of a record poslab's rotary replaces."""
    return tuple(kind for arch in ARCHITECTURES.values() if arch.replace for kind in arch.tiny)
