"""Tiny random checkpoints built from configs in code (no download): the quick preset's model and
the test models. Each is a real ``transformers`` model saved as config.json + safetensors, so it
goes through the same loading path as any checkpoint a researcher has.

    tiny_checkpoint("llama", path)    # rotary, grouped-query attention, theta 10^4, context 64
    tiny_checkpoint("mistral", path)  # rotary, sliding window 16
    tiny_checkpoint("gpt_neox", path) # partial rotary (fraction 0.25)
    tiny_checkpoint("gptj", path)     # rotary, interleaved pairs, rotary_dim 8 of head 16
    tiny_checkpoint("gpt2", path)     # learned absolute positions (context 64)
    tiny_checkpoint("gemma2", path)   # layer types sliding / full, one rope setting, soft caps 0.1 / 1
    tiny_checkpoint("gemma3", path)   # a rope setting per layer type: sliding theta 10^4 (window 16),
                                      # full theta 10^6; "gemma3-linear": linear x8 on the full layers

Every rotary kind here is one poslab must replace faithfully (``PARITY_KINDS``: poslab's rotary
and ``collect`` give the checkpoint's own logits, tests/pretrained/test_layer_rotary.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from poslab.errors import check_choice

VOCAB = 256  # byte-level: these checkpoints ship no tokenizer (poslab.pretrained.encode_text)
CONTEXT = 64
PAIRS = 8  # rotary pairs of the 16-channel heads below

_BODY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=CONTEXT)
_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # inside the byte vocabulary
_THETA = {"rope_type": "default", "rope_theta": 10000.0}
_GEMMA = dict(_BODY, head_dim=16, sliding_window=16, query_pre_attn_scalar=16, **_TOKENS)
_GEMMA3_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]


def _gemma3_rope(full: dict) -> dict:
    return {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_theta": 1e6, **full}}


CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {  # kind -> (transformers config class, its options)
    "llama": ("LlamaConfig", dict(_BODY, rope_parameters=_THETA)),
    "llama-linear": ("LlamaConfig", dict(_BODY, rope_parameters={**_THETA, "rope_type": "linear", "factor": 4.0})),
    "llama-dynamic": ("LlamaConfig", dict(_BODY, rope_parameters={**_THETA, "rope_type": "dynamic",
                                                                  "factor": 2.0})),
    "llama-yarn": ("LlamaConfig", dict(_BODY, rope_parameters={**_THETA, "rope_type": "yarn", "factor": 2.0,
                                                               "original_max_position_embeddings": 32})),
    "llama-llama3": ("LlamaConfig", dict(_BODY, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "qwen2": ("Qwen2Config", dict(_BODY, rope_parameters=_THETA)),
    "qwen3": ("Qwen3Config", dict(_BODY, head_dim=16, rope_parameters=_THETA)),
    "mistral": ("MistralConfig", dict(_BODY, sliding_window=16, rope_parameters=_THETA)),
    "phi3": ("Phi3Config", dict(_BODY, original_max_position_embeddings=CONTEXT, rope_parameters=_THETA, **_TOKENS)),
    "phi3-longrope": ("Phi3Config", dict(_BODY, original_max_position_embeddings=32, **_TOKENS, rope_parameters={
        **_THETA, "rope_type": "longrope", "original_max_position_embeddings": 32,
        "short_factor": [1.0 + 0.05 * i for i in range(PAIRS)],
        "long_factor": [1.5 + 0.25 * i for i in range(PAIRS)]})),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, max_position_embeddings=CONTEXT,
                                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.25})),
    "olmo2": ("Olmo2Config", dict(_BODY, rope_parameters=_THETA, **_TOKENS)),
    # soft caps small enough to bite on a random model's scores (~0.14) and logits (~0.6)
    "gemma2": ("Gemma2Config", dict(_GEMMA, rope_parameters=_THETA, attn_logit_softcapping=0.1,
                                    final_logit_softcapping=1.0)),
    "gemma3": ("Gemma3TextConfig", dict(_GEMMA, num_hidden_layers=3, layer_types=_GEMMA3_TYPES,
                                        rope_parameters=_gemma3_rope({"rope_type": "default"}))),
    "gemma3-linear": ("Gemma3TextConfig", dict(_GEMMA, num_hidden_layers=3, layer_types=_GEMMA3_TYPES,
                                               rope_parameters=_gemma3_rope({"rope_type": "linear", "factor": 8.0}))),
    "gptj": ("GPTJConfig", dict(n_embd=64, n_inner=128, n_layer=2, n_head=4, rotary_dim=8, n_positions=CONTEXT)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT)),
}
PARITY_KINDS = tuple(k for k in CONFIGS if k != "gpt2")  # every rotary checkpoint above


def tiny_checkpoint(kind: str, path: str | Path, *, seed: int = 0, rope_parameters: dict | None = None) -> Path:
    """Write a tiny random ``kind`` checkpoint to ``path`` (weights fixed by ``seed``); returns path."""
    check_choice("kind", kind, CONFIGS)
    import transformers

    name, options = CONFIGS[kind]
    options = dict(options, vocab_size=VOCAB, tie_word_embeddings=False)
    if rope_parameters is not None:
        options["rope_parameters"] = rope_parameters
    config = getattr(transformers, name)(**options)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = Path(path)
    model.save_pretrained(path)
    return path
