"""Positional encodings: one module per family, a plain-dict registry, the public formulas.

``ENCODINGS`` maps the names used on the command line and in the papers' tables to factories;
per-entry defaults are bound with ``functools.partial``. Build one with :func:`build_encoding`.
"""

from __future__ import annotations

import inspect
from functools import partial

from poslab.errors import ConfigError
from poslab.positional.base import SITES, Metadata, PositionalEncoding
from poslab.positional.learned import LearnedAPE
from poslab.positional.rope import RoPE
from poslab.positional.rope_scaling import rope_frequencies

ENCODINGS: dict[str, type[PositionalEncoding] | partial] = {
    "learned": LearnedAPE,
    "rope": RoPE,
}

GEOMETRY = ("d_model", "n_heads", "d_head", "max_len")


def encoding_class(name: str) -> type[PositionalEncoding]:
    factory = ENCODINGS.get(name)
    if factory is None:
        raise ConfigError("encoding", name, sorted(ENCODINGS))
    return factory.func if isinstance(factory, partial) else factory


def encoding_options(name: str) -> dict[str, object]:
    """The options an encoding takes beyond the geometry, with their defaults."""
    factory = ENCODINGS[name]
    params = inspect.signature(encoding_class(name).__init__).parameters
    bound = factory.keywords if isinstance(factory, partial) else {}
    return {k: bound.get(k, p.default) for k, p in params.items()
            if k not in GEOMETRY and k != "self" and p.kind is p.KEYWORD_ONLY}


def check_encoding(name: str, options: dict | None = None) -> None:
    """Validate a name and its options without building anything."""
    allowed = encoding_options(name) if name in ENCODINGS else encoding_class(name)
    for key in options or {}:
        if key not in allowed:
            raise ConfigError(f"encoding.{key}", key, sorted(allowed) or "no options")


def build_encoding(name: str, *, d_model: int, n_heads: int, d_head: int, max_len: int,
                   **options) -> PositionalEncoding:
    check_encoding(name, options)
    return ENCODINGS[name](d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len, **options)


__all__ = ["ENCODINGS", "SITES", "Metadata", "PositionalEncoding", "build_encoding", "check_encoding",
           "encoding_class", "encoding_options", "rope_frequencies"]
