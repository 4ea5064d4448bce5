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
    tiny_checkpoint("cohere2", path)  # interleaved pairs; 3 sliding rope layers : 1 full layer without rope
    tiny_checkpoint("llama4", path)   # iRoPE: chunk 8 on 3 rope layers, 1 global layer without rope
    ...                               # phi, stablelm, cohere, starcoder2, mixtral, qwen2_moe, qwen3_moe,
                                      # granite, glm, glm4, smollm3, falcon, falcon-mq (architectures.py)

The configs are the architecture records' (``architectures.py``: each record's ``tiny``). Every
rotary kind here is one poslab must replace faithfully (``PARITY_KINDS``: poslab's rotary and
``collect`` give the checkpoint's own logits, tests/pretrained/test_layer_rotary.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from poslab.errors import check_choice
from poslab.pretrained.architectures import VOCAB, parity_kinds, tiny_configs

CONFIGS = tiny_configs()  # kind -> (transformers config class, its options), from the architecture records
PARITY_KINDS = parity_kinds()  # every rotary kind above (their records say poslab replaces the rotary)


def tiny_checkpoint(kind: str, path: str | Path, *, seed: int = 0, rope_parameters: dict | None = None) -> Path:
    """Write a tiny random ``kind`` checkpoint to ``path`` (weights fixed by ``seed``); returns path."""
    configs = tiny_configs()  # read now: a record added at run time is one kind more
    check_choice("kind", kind, configs)
    import transformers

    name, options = configs[kind]
    options = dict(options, vocab_size=VOCAB, tie_word_embeddings=False)
    if rope_parameters is not None:
        options["rope_parameters"] = rope_parameters
    config = getattr(transformers, name)(**options)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = Path(path)
    model.save_pretrained(path)
    return path
