"""The survey's table of position encodings in representative LLMs, with columns poslab computes.

    entries()                 the published values in data/llm_positions.json (one dict per model)
    entry_from_config(cfg)    the same fields read off any Hugging Face config dict (or a GGUF header)
    describe(entry) -> row    the computed columns:

wavelengths   lambda_i = 2 pi / theta'_i of the schedule in use (every pair; theta' from
              poslab.positional.rope_frequencies at the extended length), shortest .. longest
critical dim  d_extra = 2 ceil((r/2) log_base(L0 / 2 pi)) of the rotated width r at the original
              context L0 (Liu et al. 2023; poslab.positional.scaling_laws)
bound         T_extra = 2 pi base^(d_extra / r): how far the unscaled model's critical pair reaches
effective     the context the schedule targets: factor x L0 for a scaling dict with a factor, else
              the config's maximum; a sliding window caps what one layer sees (shown beside it)
KV cache      yes unless the schedule depends on the sequence length (dynamic NTK, LongRoPE switch
              the frequencies of every cached key when the sequence grows)
poslab can    what the architecture's record (architectures.py) allows: record its attention,
              replace its rotary (every schedule); "no record" for a model type poslab has none of
layers        the layer-type pattern of a config with ``layer_types`` ("5 sliding : 1 full (x3)"), and of
              layers without rope, from the architecture's record ("3 chunked : 1 full (no rope)");
              a model with a rope setting or window per type (Gemma 2, 3) gets one row per type,
              named "model: type xN", each with that type's theta, scaling, window and columns
"""

from __future__ import annotations

import json
import math
from importlib import resources
from itertools import groupby
from typing import Any

from poslab.errors import ConfigError
from poslab.positional.rope_scaling import LENGTH_DEPENDENT, rope_frequencies
from poslab.positional.scaling_laws import critical_dimension, extrapolation_bound
from poslab.pretrained.architectures import find

HEADER = {"name": "model", "layers": "layers", "encoding": "encoding", "rope_type": "rope type", "theta": "theta",
          "context": "context L0 -> max", "head": "head dim (rotated)", "window": "window",
          "wavelengths": "wavelengths", "critical": "critical dim", "bound": "bound (unscaled)",
          "effective": "effective context", "kv_cache": "KV cache", "poslab": "poslab can"}


def entries() -> list[dict]:
    """The survey's entries; one that carries its published ``config`` (the fields of its config.json
    that position depends on) is read as :func:`entry_from_config` reads any config, so its per-layer
    pattern comes from its architecture's record (which layers rotate, windows, chunks), as ``inspect``
    shows it."""
    text = resources.files("poslab").joinpath("data/llm_positions.json").read_text()
    return [_from_published(item) if "config" in item else item for item in json.loads(text)["models"]]


def _from_published(item: dict) -> dict:
    entry = entry_from_config(item["config"], name=item["name"])
    entry.update({k: v for k, v in item.items() if k not in ("config", "name")})
    return entry


def entry_from_config(cfg: dict, name: str = "config") -> dict:
    """One table entry from a Hugging Face config dict (or poslab's reading of a GGUF header)."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    model_type = cfg.get("model_type", "")
    mla = cfg.get("qk_rope_head_dim") and cfg.get("qk_nope_head_dim") is not None  # DeepSeek's MLA
    head_dim = _head_dim(cfg, mla)
    entry = {"name": cfg.get("name") or name, "context": _context(cfg), "head_dim": head_dim, "model_type": model_type}
    arch = find(model_type)  # its record, where the config alone does not say (GPT-2's table, BLOOM's ALiBi)
    entry["encoding"] = _encoding(cfg, arch)
    if entry["encoding"] == "rope":
        entry.update(_rope_fields(cfg, params, head_dim, mla))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if window:
        entry["sliding_window"] = window
    layers = _layers(cfg, arch, entry, params, window)
    if layers is not None:
        entry["layers"] = layers
    return entry


def _head_dim(cfg: dict, mla) -> int | None:
    """The size of a head's query and key."""
    heads = cfg.get("num_attention_heads") or cfg.get("n_head") or cfg.get("n_heads")
    width = cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("d_model")
    head_dim = cfg.get("head_dim") or cfg.get("d_kv") or (width // heads if width and heads else None)
    if mla:  # each of num_attention_heads heads: qk_nope_head_dim + qk_rope_head_dim, the latter rotated
        head_dim = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    return head_dim


def _context(cfg: dict):
    """The config's maximum context, under whichever of its families' names it has (None: none)."""
    return (cfg.get("max_position_embeddings") or cfg.get("n_positions") or cfg.get("max_seq_len")
            or cfg.get("seq_length") or cfg.get("n_ctx"))


def _encoding(cfg: dict, arch) -> str:
    """alibi, t5_bias, learned or rope: what the config says, else what its architecture's record says."""
    alibi = cfg.get("alibi") or (cfg.get("attn_config") or {}).get("alibi") or \
        (arch is not None and arch.encoding == "alibi")
    if alibi:
        return "alibi"
    if "relative_attention_num_buckets" in cfg:
        return "t5_bias"
    if (arch is not None and arch.encoding == "learned") or cfg.get("position_embedding_type") == "absolute":
        return "learned"
    return "rope"


def _rope_fields(cfg: dict, params: dict, head_dim: int | None, mla) -> dict:
    """A rope entry's rope_theta, and its partial_rotary_factor and rope_scaling where they are not the default."""
    fields: dict[str, Any] = {"rope_theta": float(params.get("rope_theta") or cfg.get("rope_theta") or
                                                  cfg.get("rotary_emb_base") or 10000.0)}
    partial = _rotary_fraction(cfg, params, head_dim, mla)
    if partial and partial != 1.0:
        fields["partial_rotary_factor"] = float(partial)
    scaling = _scaling(params)
    if scaling is not None:
        fields["rope_scaling"] = scaling
    return fields


def _rotary_fraction(cfg: dict, params: dict, head_dim: int | None, mla):
    """The fraction of a head's channels that rotate, as the config states it or as its rotated width implies."""
    partial = params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or cfg.get("rotary_pct")
    if not partial and cfg.get("rotary_dim") and head_dim:  # GPT-J: the rotated channels, absolute
        partial = cfg["rotary_dim"] / head_dim
    if mla and head_dim:
        partial = cfg["qk_rope_head_dim"] / head_dim
    return partial


def _scaling(params: dict) -> dict | None:
    """The rope scaling in ``params`` (theta and the rotated fraction aside); None for the default schedule."""
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return scaling if scaling.get("rope_type", scaling.get("type", "default")) != "default" else None


def _layers(cfg: dict, arch, entry: dict, params: dict, window) -> dict | None:
    """A rope entry's per-layer pattern (:func:`_layer_entries`, with its record's notes); None where every
    layer is alike or the entry has no rope."""
    types = arch.layer_types(cfg) if arch is not None else cfg.get("layer_types")  # read for every encoding
    if entry["encoding"] != "rope":
        return None
    n = cfg.get("num_hidden_layers")
    types = list(types) if types and len(types) == (n or len(types)) else None
    rope = arch.rope_layers(cfg) if arch is not None and n and (types or arch.rope_types is None) else None
    chunks = arch.layer_chunks(cfg) if arch is not None and types else None
    if not (types or (rope and not all(rope))):
        return None
    layers = _layer_entries(cfg, entry, types or [FULL] * len(rope or []), params, window, rope, chunks)
    if arch is not None and arch.notes:
        layers["notes"] = arch.notes
    return layers


FULL = "full_attention"
NO_ROPE = " (no rope)"  # the suffix of a layer kind without rope ("full_attention (no rope)")


def _layer_entries(cfg: dict, entry: dict, types: list[str], params: dict, window, rope: list[bool] | None = None,
                   chunks: list | None = None) -> dict:
    """The pattern and, per layer kind (its type, and whether it rotates q and k: its record's
    per-layer pattern), its count, rope setting and window or chunk (a sliding window holds on the
    layers that are not full attention, as transformers' masks apply it; a chunk on the chunked ones)."""
    per_type = params if params and set(params) <= set(types) and all(isinstance(v, dict) for v in params.values()) \
        else None
    rope = rope or [True] * len(types)
    chunks = chunks or [None] * len(types)
    kinds = [t if r else t + NO_ROPE for t, r in zip(types, rope, strict=True)]
    out: dict[str, Any] = {"pattern": layer_pattern(kinds), "types": {}}
    for kind in dict.fromkeys(kinds):
        i = kinds.index(kind)
        own = None if kind.endswith(NO_ROPE) else dict(per_type[types[i]]) if per_type else dict(params)
        out["types"][kind] = _kind_entry(kinds.count(kind), types[i], own, entry, window, chunks[i])
    if per_type and FULL in per_type and FULL in out["types"]:
        _take_full_attention(entry, out["types"][FULL])
    return out


def _kind_entry(count: int, layer_type: str, own: dict | None, entry: dict, window, chunk) -> dict:
    """One layer kind's count, rope setting (from ``own``, its rope parameters; None: it does not rotate)
    and window or chunk."""
    sub: dict[str, Any] = {"count": count}
    if own is None:
        sub["encoding"] = "none"
    else:
        sub["rope_theta"] = float(own.get("rope_theta") or entry["rope_theta"])
        scaling = _scaling(own)
        if scaling is not None:
            sub["rope_scaling"] = scaling
    if chunk:
        sub["chunk"] = chunk
    elif window and layer_type != FULL:
        sub["sliding_window"] = window
    return sub


def _take_full_attention(entry: dict, full: dict) -> None:
    """The entry's own columns become the global (full-attention) layers' rope setting."""
    entry["rope_theta"] = full["rope_theta"]
    entry.pop("rope_scaling", None)
    if "rope_scaling" in full:
        entry["rope_scaling"] = full["rope_scaling"]


def layer_pattern(types: list[str]) -> str:
    """The shortest repeating unit of the layer types as runs: "5 sliding : 1 full (x3)"."""
    short = [str(t).replace("_attention", "") for t in types]
    if len(set(short)) == 1:
        return f"{len(short)} {short[0]}"
    n = len(short)
    period = next(p for p in range(1, n + 1) if n % p == 0 and short == short[:p] * (n // p))
    runs = " : ".join(f"{len(list(group))} {kind}" for kind, group in groupby(short[:period]))
    return runs + (f" (x{n // period})" if n // period > 1 else "")


def describe_rows(entry: dict) -> list[dict]:
    """:func:`describe` of an entry; an entry whose layer types differ in rope setting or window
    gives one row per type (the full-attention layers' first), named "model: type xN"."""
    layers = entry.get("layers")
    if not layers:
        return [describe(entry)]
    types = layers["types"]
    if len({json.dumps({k: v for k, v in sub.items() if k != "count"}, sort_keys=True)
            for sub in types.values()}) == 1:
        return [dict(describe(entry), **({"notes": layers["notes"]} if layers.get("notes") else {}))]
    rows = []
    for t in sorted(types, key=lambda t: (t != FULL, t.endswith(NO_ROPE))):
        sub = {k: v for k, v in entry.items() if k not in ("rope_scaling", "sliding_window", "layers")}
        sub.update({k: v for k, v in types[t].items() if k != "count"})
        sub["name"] = f"{entry['name']}: {t.replace('_attention', '')} x{types[t]['count']}"
        row = describe(sub)
        row["layers"] = layers["pattern"]
        rows.append(row)
    if layers.get("notes"):
        rows[0]["notes"] = layers["notes"]
    return rows


def describe(entry: dict) -> dict:
    """The table row of one entry: its published values and the computed columns (strings)."""
    row = {k: "-" for k in HEADER}
    row.update(name=entry["name"], encoding=entry["encoding"], poslab=capabilities(entry.get("model_type")))
    if entry.get("layers"):
        row["layers"] = entry["layers"]["pattern"]
    context: Any = entry.get("context")  # an int; None where a config names none (a rope row then needs the
    # scaling's original_max_position_embeddings, as int() in _rope_columns takes it)
    head: int | None = entry.get("head_dim")
    row["window"] = str(entry.get("sliding_window") or (f"chunk {entry['chunk']}" if entry.get("chunk") else "-"))
    row["head"] = str(head or "?")
    row["kv_cache"] = "yes"
    if entry["encoding"] != "rope":
        row["context"] = str(context or "?")
        row["effective"] = row["context"] + (" (learned table)" if entry["encoding"] == "learned" else "")
        return row
    row.update(_rope_columns(entry, context, head))
    return row


def _rope_columns(entry: dict, context: Any, head: int | None) -> dict[str, str]:
    """A rope entry's columns: its schedule, rotated width, context, reach, wavelengths and KV cache."""
    scaling = dict(entry.get("rope_scaling") or {})
    legacy_type: str = scaling.get("type", "default")  # typed here: get(key, <Any>) types as Optional
    rope_type = scaling.get("rope_type", legacy_type)
    base = float(entry.get("rope_theta", 10000.0))
    frac = float(entry.get("partial_rotary_factor", 1.0))
    r = round(head * frac) if head else None
    orig = int(scaling.get("original_max_position_embeddings") or context)
    cols = {"rope_type": rope_type, "theta": f"{base:g}", "head": f"{head} ({r})" if r != head else str(head),
            "context": f"{orig} -> {context}" if orig != context else str(context)}
    if r and head:  # r is set only with a head size
        cols["critical"] = str(critical_dimension(base, orig, r))
        bound = extrapolation_bound(base, orig, r)
        cols["bound"] = "unlimited" if math.isinf(bound) else f"{bound:,.0f}"
        cols["wavelengths"] = _wavelengths(head, base, frac, scaling, rope_type, context)
    cols["effective"] = _effective(entry, scaling, rope_type, context, orig)
    if rope_type in LENGTH_DEPENDENT:
        cols["kv_cache"] = "no (frequencies change with length)"
    return cols


def _wavelengths(head: int, base: float, frac: float, scaling: dict, rope_type: str, context: Any) -> str:
    """The shortest .. longest wavelength of the schedule at the extended length ("n.a." where poslab's
    rope_frequencies has no such schedule)."""
    try:
        cfg = {**scaling, "rope_theta": base}
        if frac != 1.0:
            cfg["partial_rotary_factor"] = frac
        inv_freq, _ = rope_frequencies(head, base, cfg if rope_type != "default" else
                                       ({"partial_rotary_factor": frac} if frac != 1.0 else None),
                                       max_position_embeddings=context, seq_len=context)
        wave = 2 * math.pi / inv_freq.double()
        return f"{float(wave.min()):.1f} .. {float(wave.max()):,.0f}"
    except ConfigError as e:
        return f"n.a. ({e.field.rsplit('.', 1)[-1]} not in the table)"


def _effective(entry: dict, scaling: dict, rope_type: str, context: Any, orig: int) -> str:
    """The context the schedule targets, and the model card's own scaling beside it where it names one."""
    factor = scaling.get("factor") or (context / orig if rope_type == "longrope" and orig else None)
    effective = f"{int(factor * orig):,}" if factor and rope_type != "default" else f"{context:,}"
    if entry.get("card_rope_scaling"):
        card = entry["card_rope_scaling"]
        effective += f" ({card['rope_type']} x{card['factor']:g}: {int(card['factor'] * orig):,})"
    return effective


def table_rows(items: list[dict] | None = None) -> list[dict]:
    return [row for e in (entries() if items is None else items) for row in describe_rows(e)]


def inspect_rows(path: str) -> list[dict]:
    """The table rows of any config.json, model directory, GGUF file or built-in model name (no
    weights read): one, or one per layer type (:func:`describe_rows`)."""
    from poslab.pretrained.loading import read_config, resolve

    source = resolve(path, field="PATH")
    if source.kind == "hub":
        raise ConfigError("PATH", path, "a local config.json, model directory or GGUF file (inspect reads no network)")
    return describe_rows(entry_from_config(read_config(source, "PATH"), name=str(path)))


def capabilities(model_type: str | None) -> str:
    """The "poslab can" column: what its architecture's record allows ("record, replace": record its
    attention, replace its rotary with every schedule), "none", or "no record" ("-": no model type)."""
    if not model_type:
        return "-"
    arch = find(model_type)
    if arch is None:
        return "no record"
    return ", ".join(c for c in ("record", "replace") if arch.can(c)) or "none"


def inspect_path(path: str) -> dict:
    """The first of :func:`inspect_rows` (the full-attention layers' for a model with a row per type)."""
    return inspect_rows(path)[0]
