"""Rotary frequency schedules for context extension, as pure functions.

Entry point::

    rope_frequencies(head_dim, base=10000.0, scaling=None, *, max_position_embeddings=None,
                     seq_len=None) -> (inv_freq, attention_factor)

``scaling`` takes the keys and meanings of a Hugging Face ``rope_parameters`` /
``rope_scaling`` dict, so a config copied from a model card gives the model's own frequencies.
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.errors import check_choice

ROPE_TYPES = ("default",)


def rope_frequencies(head_dim: int, base: float = 10000.0, scaling: dict | None = None, *,
                     max_position_embeddings: int | None = None,
                     seq_len: int | None = None) -> tuple[Tensor, float]:
    scaling = dict(scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    check_choice("rope_type", rope_type, ROPE_TYPES)
    dim = int(head_dim * scaling.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return inv_freq.to(torch.float32), 1.0
