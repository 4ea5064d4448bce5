"""Tiny random checkpoints built from configs in code (no download): the quick preset's model and
the test models. Each is a real ``transformers`` model saved as config.json + safetensors, so it
goes through the same loading path as any checkpoint a researcher has.

    tiny_checkpoint("llama", path)    # rotary, grouped-query attention, theta 10^4, context 64
    tiny_checkpoint("mistral", path)  # rotary, sliding window 16
    tiny_checkpoint("gpt_neox", path) # partial rotary (fraction 0.25)
    tiny_checkpoint("gptj", path)     # rotary, interleaved pairs, rotary_dim 8 of head 16
    tiny_checkpoint("gpt2", path)     # learned absolute positions (context 64)
"""

from __future__ import annotations

from pathlib import Path

import torch

from poslab.errors import check_choice

VOCAB = 256  # byte-level: these checkpoints ship no tokenizer (poslab.pretrained.encode_text)
CONTEXT = 64

CONFIGS = {
    "llama": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=CONTEXT,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "mistral": ("MistralConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                                      sliding_window=16, rope_parameters={"rope_type": "default",
                                                                          "rope_theta": 10000.0})),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, max_position_embeddings=CONTEXT,
                                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.25})),
    "gptj": ("GPTJConfig", dict(n_embd=64, n_inner=128, n_layer=2, n_head=4, rotary_dim=8, n_positions=CONTEXT)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT)),
}


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
