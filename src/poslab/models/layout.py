"""Per-layer layouts of a Transformer: one pattern string, each layer's encoding, mask and temperature.

    layout  = entry ("," entry)*                  repeated cyclically over n_layers (its length divides it)
    entry   = NAME (":" KEY "=" VALUE)*           NAME a registry encoding that acts inside attention
    layer l = entry[l mod len(layout)]

    "rope,rope,rope,nope"                                   RNoPE (Yang et al. 2025), SmolLM3
    "rope:window=64,rope:window=64,rope:window=64,nope"     SWAN-GPT, Command A
    "rope:chunk=64,rope:chunk=64,rope:chunk=64,nope"        Llama 4's chunked rope layers (iRoPE)
    "rope:chunk=64,rope:chunk=64,rope:chunk=64,nope:attn_scale=0.1:floor_scale=8192"
                                                            ... with its no-rope layers' temperature tuning
    "rope:base=10000,rope:base=1000000"                     Gemma's local / global theta

Reserved keys set the layer's attention, every other key is an option of the encoding (checked
as ``encoding_options`` are): ``window`` (sliding window: query i keeps keys with i - j < window),
``chunk`` (chunked attention: key j is visible to query i iff j <= i and j // chunk == i // chunk)
and ``temperature`` (the layer's logits are divided by it), and Llama 4's position-dependent
temperature ("attn_temperature_tuning", in transformers' Llama 4 on its no-rope layers): ``attn_scale``
turns it on and the query at position p is scaled before the logits::

    q_p <- q_p * (log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1)

(``floor_scale`` default 8192 and Llama 4's own ``attn_scale`` 0.1: the scale is 1 up to position
floor_scale - 2 and grows like log p past it; p is the query's position, its internal index unless
positions are given). A layer without ``window`` or ``temperature`` keeps the model's; ``chunk`` and
``attn_scale`` have no model-wide default. An entry naming the
model's ``encoding`` starts from its ``encoding_options`` (the entry's own options override them).
VALUEs read as int, then float, then ``true``/``false``, else as a string.

The field's hybrid layouts are named once (:data:`NAMED`: ``rnope``, ``swan``, ``irope``); a
model's ``layout`` may be one of these names, which stands for its pattern (the config keeps the
pattern, so a run's key names what ran).

An encoding that adds position to the stream (``embed``: learned, sinusoidal, MoPE's additive
form) is refused inside a layout: its embed would never be called there, only the model's
``encoding`` embeds. Every refusal is one ConfigError naming ``layout``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.positional import ENCODINGS, build_encoding, encoding_class, encoding_options
from poslab.positional.base import overridden_hooks

RESERVED = ("window", "chunk", "temperature", "attn_scale", "floor_scale")  # the layer's attention, not the encoding
# the field's hybrid layouts by name (windows and chunks at poslab's scale, 64 tokens); a config keeps the pattern
NAMED = {
    "rnope": "rope,rope,rope,nope",  # Yang et al. 2025 (RNoPE), SmolLM3: no rope on every fourth layer
    "swan": "rope:window=64,rope:window=64,rope:window=64,nope",  # SWAN-GPT, Command A: local rope, global nope
    # Llama 4's iRoPE: chunked rope layers, a global no-rope layer with its temperature tuning (Llama 4 also
    # sets qk_norm=True, a model field)
    "irope": "rope:chunk=64,rope:chunk=64,rope:chunk=64,nope:attn_scale=0.1",
}
FLOOR_SCALE = 8192  # Llama 4's default floor_scale (transformers' Llama4TextConfig)
_INT = re.compile(r"[+-]?\d+")
_PROBE_LEN = 1024  # tables built to check an entry's options (as check_streamable builds them)


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """One layer of a layout: its encoding (registry name and options) and its attention."""

    encoding: str  # registry name
    options: tuple[tuple[str, object], ...] = ()  # the encoding's options, sorted by key
    window: int | None = None  # sliding window (None: the model's ``window``)
    chunk: int | None = None  # chunked attention (None: none)
    temperature: float | None = None  # the layer's temperature (None: the model's)
    attn_scale: float | None = None  # Llama 4's temperature tuning of the queries (None: none)
    floor_scale: int = FLOOR_SCALE  # positions per step of that tuning's floor

    def query_scale(self, pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor | None:
        """The factor of the queries at positions pos [...]: log(floor((pos + 1) / floor_scale) + 1)
        * attn_scale + 1, same shape, in ``dtype``; None without tuning."""
        if self.attn_scale is None:
            return None
        return torch.log1p(torch.floor((pos.to(dtype) + 1.0) / self.floor_scale)) * self.attn_scale + 1.0

    @property
    def encoding_options(self) -> dict:
        return dict(self.options)


def layer_encodings() -> list[str]:
    """The registry names a layout may use: every encoding whose class leaves ``embed`` alone."""
    # a class is hashable; mypy misreads its __hash__ (as in positional/base.py)
    return [name for name in ENCODINGS if "embed" not in overridden_hooks(encoding_class(name))]  # type: ignore[arg-type]


def pattern(layout: str) -> str:
    """A layout name's pattern (:data:`NAMED`), or ``layout`` itself."""
    return NAMED.get(layout.strip(), layout) if isinstance(layout, str) else layout


def layout_name(layout: str) -> str:
    """The name of a pattern in :data:`NAMED`, or the pattern itself."""
    return next((name for name, p in NAMED.items() if p == layout), layout)


def parse_layout(layout: str, n_layers: int, encoding: str = "rope", options: dict | None = None,
                 causal: bool = True) -> tuple[LayerSpec, ...]:
    """``layout`` -> one LayerSpec per layer (the pattern repeated over ``n_layers``); ``encoding``
    and ``options`` are the model's (an entry naming it starts from its options). Checks names,
    keys and the pattern's length without building anything; :func:`check_layout` also builds."""
    if not isinstance(layout, str) or not layout.strip():
        raise ConfigError("layout", layout, "None or a comma-separated pattern such as 'rope,rope,rope,nope'")
    entries = [e.strip() for e in layout.split(",")]
    if n_layers % len(entries):
        raise ConfigError("layout", layout, f"a pattern whose length ({len(entries)} entries) divides "
                                            f"n_layers={n_layers}")
    specs = [_entry(e, layout, encoding, options or {}, causal) for e in entries]
    return tuple(specs[i % len(specs)] for i in range(n_layers))


def check_layout(layout: str, *, n_layers: int, encoding: str, options: dict | None, causal: bool,
                 d_model: int, n_heads: int, max_len: int) -> None:
    """:func:`parse_layout`, then every distinct entry built once at the model's head width (the
    global RNG left as it was), so an option of the wrong type or value is refused before any work."""
    specs = parse_layout(layout, n_layers, encoding, options, causal)
    distinct: list[LayerSpec] = []
    for spec in specs:
        if all((spec.encoding, spec.options) != (d.encoding, d.options) for d in distinct):
            distinct.append(spec)
    for spec in distinct:
        name, opts = spec.encoding, spec.options
        try:
            with torch.random.fork_rng(devices=[]):
                build_encoding(name, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads,
                               max_len=min(max_len, _PROBE_LEN), d_head_from="d_model", **dict(opts))
        except (ConfigError, TypeError, ValueError) as e:
            raise ConfigError("layout", layout, f"options of {name!r} that build it ({e})") from None


def _entry(text: str, layout: str, encoding: str, model_options: dict, causal: bool) -> LayerSpec:
    name, *pairs = text.split(":")
    name = name.strip()
    allowed_names = layer_encodings()
    if name not in allowed_names:
        embed = name in ENCODINGS  # a registry entry, but one that embeds
        raise ConfigError("layout", layout, f"entries named one of {', '.join(allowed_names)}"
                                            + (f" ({name!r} adds position to the stream: only the model's "
                                               "`encoding` embeds)" if embed else ""))
    if not causal and encoding_class(name).causal_only:
        raise ConfigError("layout", layout, f"entries defined for bidirectional attention ({name!r} is causal only)")
    own = encoding_options(name)
    attention: dict[str, object] = {}
    options = dict(model_options) if name == encoding else {}
    seen: set[str] = set()
    for pair in pairs:
        key, sep, raw = (p.strip() for p in pair.partition("="))
        if not sep or not key or key in seen:
            raise ConfigError("layout", layout, f"entries NAME:key=value:... with each key once ({text!r})")
        seen.add(key)
        if key not in RESERVED and key not in own:
            raise ConfigError("layout", layout, f"keys of {name!r}: {', '.join([*RESERVED, *sorted(own)])}")
        value = _value(raw)
        if key in RESERVED:
            attention[key] = _attention_value(key, value, layout)
        else:
            options[key] = value
    if "floor_scale" in attention and "attn_scale" not in attention:
        raise ConfigError("layout", layout, f"floor_scale with attn_scale, which turns the tuning on ({text!r})")
    return LayerSpec(encoding=name, options=tuple(sorted(options.items())), **attention)  # type: ignore[arg-type]


def _value(raw: str) -> object:
    if _INT.fullmatch(raw):
        return int(raw)
    try:
        return float(raw)
    except ValueError:
        pass
    return {"true": True, "false": False}.get(raw.lower(), raw)


def _attention_value(key: str, value: object, layout: str) -> int | float:
    if key in ("temperature", "attn_scale"):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
        raise ConfigError("layout", layout, f"{key}=a positive number (got {value!r})")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigError("layout", layout, f"{key}=a positive integer (got {value!r})")
