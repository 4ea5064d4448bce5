"""Positional encodings: one module per family, a plain-dict registry, the public formulas.

``ENCODINGS`` maps the names used on the command line and in the papers' tables to factories;
per-entry defaults are bound with ``functools.partial``. Build one with :func:`build_encoding`.

The scaled RoPE entries are RoPE with another frequency schedule (:mod:`rope_scaling`). Their
defaults suit the small models of the seed experiments: a model trained on sequences of
``original_max_position_embeddings = 16`` positions, extended by ``factor = 4`` (to 64).
``rope_longrope`` uses one factor for every pair (short 1, long 4), the degenerate LongRoPE
without a searched per-pair table; pass ``scaling=`` with a model card's lists to get the real one.

The field's other encodings (docs/encodings.md): xPos, KERPLE (log and power forms), Sandwich,
FIRE, CoPE, the dynamic position bias, the Forgetting Transformer's forget gate (``fox``), and the
RoPE variants p-RoPE, Resonance RoPE (alone and with YaRN) and partial rotary in both frequency
conventions. Installed packages add entries through the ``poslab.encodings`` entry points
(:mod:`poslab.plugins`), loaded when this module is imported.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any, cast

import torch

from poslab import plugins
from poslab.errors import ConfigError
from poslab.positional.abacus import Abacus
from poslab.positional.alibi import ALiBi, alibi_slopes
from poslab.positional.base import KINDS, SITES, Metadata, PositionalEncoding, overridden_hooks
from poslab.positional.cope import CoPE
from poslab.positional.coupling import PositionCoupling
from poslab.positional.dynamic_bias import DynamicPositionBias
from poslab.positional.fire import FIRE
from poslab.positional.fox import ForgetGate
from poslab.positional.kerple import Kerple
from poslab.positional.learned import LearnedAPE
from poslab.positional.mope import MoPEAdditive, MoPERelative
from poslab.positional.nope import NoPE
from poslab.positional.rope import RoPE
from poslab.positional.rope_scaling import ROPE_SCHEDULES, rope_frequencies
from poslab.positional.sandwich import Sandwich
from poslab.positional.shaw import Shaw
from poslab.positional.sinusoidal import Sinusoidal
from poslab.positional.t5 import T5Bias, t5_relative_bucket
from poslab.positional.transformer_xl import TransformerXL
from poslab.positional.xpos import XPos

_SMALL = {"factor": 4.0, "original_max_position_embeddings": 16}  # trained on 16 positions, x4

ENCODINGS: dict[str, type[PositionalEncoding] | partial] = {
    "nope": NoPE,
    "sinusoidal": Sinusoidal,
    "learned": LearnedAPE,
    "shaw": Shaw,
    "transformer_xl": TransformerXL,
    "t5": T5Bias,
    "alibi": ALiBi,
    "rope": RoPE,
    "rope_pi": partial(RoPE, scaling={"rope_type": "linear", "factor": 4.0}),
    "rope_ntk": partial(RoPE, scaling={"rope_type": "ntk", "factor": 4.0}),
    "rope_dynamic": partial(RoPE, scaling={"rope_type": "dynamic", **_SMALL}),
    "rope_ntk_by_parts": partial(RoPE, scaling={"rope_type": "ntk_by_parts", **_SMALL}),
    "rope_yarn": partial(RoPE, scaling={"rope_type": "yarn", **_SMALL}),
    "rope_llama3": partial(RoPE, scaling={"rope_type": "llama3", "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, **_SMALL}),
    "rope_longrope": partial(RoPE, scaling={"rope_type": "longrope", "short_factor": 1.0,
                                            "long_factor": 4.0, **_SMALL}),
    "mope": MoPERelative,
    "mope_additive": MoPEAdditive,
    "xpos": XPos,
    "kerple_log": partial(Kerple, form="log"),
    "kerple_power": partial(Kerple, form="power"),
    "sandwich": Sandwich,
    "fire": FIRE,
    "cope": CoPE,
    "dynamic_position_bias": DynamicPositionBias,
    "fox": ForgetGate,  # data-dependent ALiBi: the Forgetting Transformer's forget gate
    # p-RoPE (Barbero et al. 2025): the lowest (1 - p) share of frequencies not rotated, p = rotary_fraction
    "p_rope": partial(RoPE, rotary_fraction=0.75, scaling={"rope_type": "proportional"}),
    "rope_resonance": partial(RoPE, scaling={"resonance": True}),  # Wang et al. 2024
    "rope_resonance_yarn": partial(RoPE, scaling={"rope_type": "yarn", **_SMALL, "resonance": True}),
    # partial rotary, a quarter of the channels (GPT-NeoX / Pythia's rotary_pct): frequencies over the
    # rotated width (GPT-NeoX, Phi-2, GLM / ChatGLM) and over the full head width (transformers' proportional)
    "rope_partial": partial(RoPE, rotary_fraction=0.25),
    "rope_partial_full": partial(RoPE, rotary_fraction=0.25, scaling={"rope_type": "proportional"}),
    # positions from the task's structure (Batch.positions: digit significance), arithmetic length generalization
    "position_coupling": PositionCoupling,  # Cho et al. 2024
    "abacus": Abacus,  # McLeish et al. 2024
}



def _is_encoding(obj: object) -> bool:
    cls = obj.func if isinstance(obj, partial) else obj
    return isinstance(cls, type) and issubclass(cls, PositionalEncoding)


# plugins (poslab.plugins): installed packages' encodings and rope schedules join the registries on import
ENCODINGS.update(plugins.load("encodings", ENCODINGS, _is_encoding,
                              "a PositionalEncoding subclass or a functools.partial of one"))
ROPE_SCHEDULES.update(plugins.load("schedules", ROPE_SCHEDULES, callable,
                                   "a schedule function (dim, base, cfg, *, max_position_embeddings, seq_len)"))

GEOMETRY = ("d_model", "n_heads", "d_head", "max_len")
# enough to build any entry and ask it
SMALL_GEOMETRY: dict[str, Any] = dict(d_model=64, n_heads=1, d_head=64, max_len=64)


def encoding_class(name: str) -> type[PositionalEncoding]:
    factory = ENCODINGS.get(name)
    if factory is None:
        raise ConfigError("encoding", name, sorted(ENCODINGS))
    return cast(type[PositionalEncoding], factory.func) if isinstance(factory, partial) else factory


def encoding_options(name: str) -> dict[str, object]:
    """The options an encoding takes beyond the geometry, with their defaults."""
    factory = ENCODINGS[name]
    params = inspect.signature(encoding_class(name).__init__).parameters
    bound = factory.keywords if isinstance(factory, partial) else {}
    return {k: bound.get(k, p.default) for k, p in params.items()
            if k not in GEOMETRY and k != "self" and p.kind is p.KEYWORD_ONLY}


def check_encoding(name: str, options: dict | None = None) -> None:
    """Validate a name and its options without building anything."""
    if name not in ENCODINGS:
        encoding_class(name)  # raises ConfigError naming the registry
    allowed = encoding_options(name)
    for key in options or {}:
        if key not in allowed:
            raise ConfigError(f"encoding.{key}", key, sorted(allowed) or "no options")


def build_encoding(name: str, *, d_model: int, n_heads: int, d_head: int, max_len: int,
                   d_head_from: str = "d_head", **options) -> PositionalEncoding:
    """Build registry entry ``name``. ``d_head_from`` names the field the caller's head width comes
    from (``d_model`` when it is d_model / n_heads), so a width the encoding refuses is reported as
    the field the user set."""
    check_encoding(name, options)
    try:
        return ENCODINGS[name](d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len, **options)
    except ConfigError as e:
        if d_head_from == "d_head" or e.field != "d_head":
            raise
        raise ConfigError(d_head_from, d_model, f"a width whose head dimension d_model / n_heads = {d_head} "
                                                f"suits {name!r}: {e.allowed}") from None


def small_encoding(name: str, **options) -> PositionalEncoding:
    """An entry built at SMALL_GEOMETRY, to ask about its metadata; the global RNG is left as it was
    (initializing parameters draws from it, and a caller may be about to seed a model)."""
    with torch.random.fork_rng(devices=[]):
        return build_encoding(name, **SMALL_GEOMETRY, **options)


def registered(kind: str | tuple[str, ...] | None = None, causal: bool | None = None,
               task_positions: bool = False) -> tuple[str, ...]:
    """Names of every registered encoding, plugins' included, in registry order, optionally filtered.

    ``kind`` keeps the entries whose class ``kind`` is that one (or one of those, given a tuple) of
    ``KINDS``; ``causal`` is the attention of the model that will use them: ``False`` (bidirectional)
    drops the ``causal_only`` entries, ``True`` (causal) and ``None`` keep every entry. The entries that
    read their positions from the task (``task_positions``: position coupling, Abacus) run only on a task
    that hands them, so they are left out unless ``task_positions=True``. Read from the classes, nothing
    is built. A study that takes encodings by kind calls this, so an encoding added to ``ENCODINGS`` or by
    an installed plugin joins it without a line changed in the study::

        >>> registered("none")
        ('nope',)
        >>> "xpos" in registered("rotary") and "xpos" not in registered("rotary", causal=False)
        True
        >>> "abacus" in registered(task_positions=True) and "abacus" not in registered()
        True
    """
    kinds = (kind,) if isinstance(kind, str) else kind
    for k in kinds or ():
        if k not in KINDS:
            raise ConfigError("kind", k, KINDS)
    return tuple(name for name in ENCODINGS
                 if (kinds is None or encoding_class(name).kind in kinds)
                 and (causal is not False or not encoding_class(name).causal_only)
                 and (task_positions or not encoding_class(name).task_positions))


def rotary_encodings() -> list[str]:
    """Names of the registry entries that rotate queries and keys (``is_rotary``), in registry order."""
    return [name for name in ENCODINGS if small_encoding(name).is_rotary]


__all__ = ["ENCODINGS", "ROPE_SCHEDULES", "SITES", "SMALL_GEOMETRY", "Metadata", "PositionalEncoding",
           "alibi_slopes", "build_encoding", "check_encoding", "encoding_class", "encoding_options",
           "overridden_hooks", "registered", "rope_frequencies", "rotary_encodings", "small_encoding",
           "t5_relative_bucket"]
