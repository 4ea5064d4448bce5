"""Pretrained language models as poslab models.

    loading.py   where a checkpoint comes from (built-in name, directory, GGUF, hub id), its config,
                 its content hash; bad input stops here, before any weights are read
    model.py     PretrainedLM: the checkpoint's own modules behind loss / collect / rotary_frequencies,
                 PoslabRotary (one per layer type, in LayerRotary), poslab's schedules in place of the
                 checkpoint's rotary embedding, and parity against the checkpoint's own forward
    architectures.py  one record per checkpoint architecture: what poslab can do with it (record its
                 attention, replace its rotary), its pair layout and encoding, its tiny test configs
    checks.py    what a study asks of a checkpoint (its attention recorded, its rotary replaced), checked
                 by model type and with one short forward before any work; parity's tolerance and verdict
    table.py     the survey's table of LLM position encodings (data/llm_positions.json) and
                 ``poslab inspect`` of any config.json or GGUF file
    tiny.py      tiny random checkpoints from configs in code (tests, the quick preset)

``transformers`` (and ``gguf``, ``accelerate`` for GGUF files) come with the ``pretrained`` extra;
without them every entry point stops with one ConfigError naming the extra.
"""

from poslab.pretrained.loading import BUILTIN, Source, content_hash, read_config, resolve
from poslab.pretrained.model import (
    SCHEDULE_LAYERS,
    LayerRotary,
    PoslabRotary,
    PretrainedLM,
    decode_tokens,
    encode_text,
    load,
    parity,
)

__all__ = ["BUILTIN", "SCHEDULE_LAYERS", "LayerRotary", "PoslabRotary", "PretrainedLM", "Source", "content_hash",
           "decode_tokens", "encode_text", "load", "parity", "read_config", "resolve"]
