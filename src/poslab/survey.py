"""The survey's comparison of positional encodings (seed ``001``), generated from code and runs.

One row per registered encoding, plugins' included, grouped by kind. Where position is injected,
the extra cost class and KV-cache compatibility are read off a built instance's metadata
(:class:`poslab.positional.Metadata`); the cost is also *measured* (:func:`measured_cost`: time and
bytes allocated per forward of a tiny Transformer at several lengths), and length extrapolation
is *measured*, from the store.

Each study that measures extrapolation declares what it measured (``Experiment.extrapolation``,
one :class:`~poslab.experiments.spec.Extrapolation`; :func:`declared` collects them): which of
its rows (a spec predicate), which column holds the number, and which survey column it fills. A
length counts as unseen when it exceeds the member's training length (``train.max_length`` of its
stored config). The reader (:func:`measurements`) knows nothing of any study's row layout beyond
these declarations. Rows of evaluate-only variants (an APE clamp, a rescaled schedule applied to
stored weights) are not the encoding as trained and are not read, unless a declaration says which
registry encoding each row measured (a context-extension study's training-free methods are the
scaled RoPE entries, ``rope_pi``, ``rope_yarn``, ..., applied at inference to the RoPE model
trained at L0). Anything not in the store reads "not measured yet".

Per-layer layouts (:mod:`poslab.models.layout`: a pattern, or a name of its ``NAMED`` hybrids
``rnope``, ``swan``, ``irope``) get the same columns (:func:`layout_rows`): their sites, parameters,
cost classes and KV cache are read off their layers' encodings, their cost is measured on the tiny
model with one layer per pattern entry, and a stored run with a layout counts for the layout (by
its name where it has one), not for its model's ``encoding``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np

from poslab.experiments.spec import Extrapolation

NOT_MEASURED = "not measured yet"


def declared() -> dict[str, Extrapolation]:
    """What each registered study measured past its training length (``Experiment.extrapolation``),
    by experiment name, in the registry's order."""
    from poslab.studies import EXPERIMENTS

    return {name: e.extrapolation for name, e in EXPERIMENTS.items() if e.extrapolation is not None}


COLUMNS = {"fixed_offset": "fixed-offset acc. beyond L_train",
           "lm": "LM loss at 2x / 4x L0 (other unseen L/L0 after ;)"}


def measurements(store_path: str | Path,
                 declarations: dict[str, Extrapolation] | None = None) -> dict[str, dict[str, str]]:
    """encoding -> {survey column: text} for what the store at ``store_path`` holds, read
    through ``declarations`` (default: every study's, :func:`declared`)."""
    from poslab.experiments.stages import is_stage
    from poslab.store import Store

    declarations = declared() if declarations is None else declarations
    path = Path(store_path)
    if not path.exists():
        return {}
    with Store(path) as store:
        runs = {r["key"]: r for r in store.runs() if r["status"] == "finished" and r["experiment"] in declarations
                and not is_stage(r["config"])}
        rows = [r for r in store.rows() if r["run_key"] in runs]
    cells: dict[tuple, list] = defaultdict(list)  # (encoding, column, experiment, summary) -> [(L, L_train, v, seed)]
    for r in rows:
        run = runs[r["run_key"]]
        dec = declarations[run["experiment"]]
        what = _measured(r, run["config"], dec)
        if what is not None:
            enc, L_train = what
            cells[(enc, dec.column, run["experiment"], dec.summary)].append((r["length"], L_train, r[dec.value],
                                                                             r.get("seed")))
    found: dict[tuple, list[str]] = defaultdict(list)
    order = list(declarations)  # texts in declaration order
    for (enc, column, experiment, summary), got in sorted(cells.items(), key=lambda kv: order.index(kv[0][2])):
        text = _summarize(got, summary, experiment)
        if text:
            found[(enc, column)].append(text)
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for (enc, column), texts in found.items():
        out[enc][column] = "; ".join(texts)
    return dict(out)


def _measured(r: dict, cfg: dict, dec: Extrapolation) -> tuple[str, int] | None:
    """(what row ``r`` of a run of config ``cfg`` measured: the declaration's encoding, the run's
    layout (its name in ``NAMED`` where it has one) or its encoding; the run's training length), or
    None where ``dec`` does not read the row (an evaluate-only variant's, unless ``dec`` names its
    encoding)."""
    from poslab.models.layout import layout_name

    model = cfg.get("model", {})
    if dec.encoding is not None:
        enc = dec.encoding(r)
    elif r.get("variant") is not None or cfg.get("variant") is not None:
        return None
    elif model.get("layout") is not None:
        enc = layout_name(model["layout"])
    else:
        enc = r.get("encoding") or model.get("encoding")
    L_train = cfg.get("train", {}).get("max_length")
    if enc is None or not L_train or not dec.where({**r, "encoding": enc}):
        return None
    return (enc, L_train) if r.get(dec.value) is not None and r.get("length") is not None else None


def _summarize(cells: list[tuple], summary: str, experiment: str) -> str:
    seeds = len({c[3] for c in cells})
    if summary == "mean":
        unseen = [c for c in cells if c[0] > c[1]]
        if not unseen:
            return ""
        lengths = [c[0] for c in unseen]
        return (f"{np.mean([c[2] for c in unseen]):.3f} (L {min(lengths)}-{max(lengths)}, {seeds} seeds, "
                f"{experiment})")
    by: dict[float, list] = defaultdict(list)
    for L, L_train, v, _ in cells:
        by[L / L_train].append(v)
    if not any(ratio > 1 for ratio in by):
        return ""
    at = lambda ratio: f"{np.mean(by[ratio]):.3f}" if ratio in by else "-"  # noqa: E731
    others = ", ".join(f"{ratio:g}x {np.mean(v):.3f}" for ratio, v in sorted(by.items()) if ratio > 1
                       and ratio not in (2, 4))
    L0 = "/".join(str(v) for v in sorted({c[1] for c in cells}))
    return f"{at(2)} / {at(4)} (1x: {at(1)}; L0 {L0}, {seeds} seeds, {experiment}{'; ' + others if others else ''})"


# ----------------------------------------------------------------------------- measured cost

COST_LENGTHS = (64, 256, 1024)


class TinyShape(TypedDict):
    """The tiny model every entry is timed on: its TransformerConfig shape fields."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int


TINY: TinyShape = {"vocab_size": 16, "d_model": 32, "n_layers": 1, "n_heads": 2}


def tiny_model(name: str, max_len: int, layout: str | None = None):
    """A one-layer causal Transformer (d_model 32, 2 heads) with encoding ``name``, eval mode; with
    a ``layout`` (a pattern or a name of ``layout.NAMED``), one layer per entry of its pattern."""
    import torch

    from poslab.models.layout import pattern
    from poslab.models.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    shape = TINY if layout is None else TINY | {"n_layers": len(pattern(layout).split(","))}
    return Transformer(TransformerConfig(**shape, encoding=name, max_len=max_len, layout=layout)).eval()


def allocated_bytes(fn) -> int:
    """Bytes of every tensor the ops inside ``fn()`` create (views and in-place results not
    counted): the allocation volume of one forward, not its peak."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not any(r.alias_info is not None for r in func._schema.returns):
                Count.total += sum(t.nbytes for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            return out

    with Count():
        fn()
    return Count.total


def measured_cost(name: str, lengths: Sequence[int] = COST_LENGTHS, repeats: int = 3,
                  layout: str | None = None) -> dict[int, tuple[float, int]]:
    """{L: (median seconds per forward, bytes allocated per forward)} of the tiny model with
    encoding ``name`` (and ``layout``, see :func:`tiny_model`) on one sequence of each length (one
    thread; wall time, so a busy machine inflates the times, not the bytes)."""
    import torch

    model = tiny_model(name, max(lengths), layout)
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for L in lengths:
                x = torch.randint(0, TINY["vocab_size"], (1, L), generator=torch.Generator().manual_seed(L))
                model(x)  # warm-up: lazily built tables
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    model(x)
                    times.append(time.perf_counter() - t0)
                out[L] = (float(np.median(times)), allocated_bytes(lambda x=x: model(x)))
    finally:
        torch.set_num_threads(threads)
    return out


def cost_text(cost: dict[int, tuple[float, int]]) -> str:
    return ", ".join(f"{L}: {1e3 * s:.2f} ms {b / 2**20:.1f} MiB" for L, (s, b) in sorted(cost.items()))


# ----------------------------------------------------------------------------- the table

def comparison_rows(store_path: str | Path, cost_lengths: Sequence[int] | None = COST_LENGTHS) -> list[dict]:
    """One dict per registered encoding, plugins' included (:func:`poslab.positional.registered`),
    grouped by kind in ``KINDS`` order and in registry order within a kind: metadata columns, the
    package it came from, measured cost (unless ``cost_lengths`` is empty or None) and measured
    extrapolation."""
    from poslab import plugins
    from poslab.positional import registered, small_encoding
    from poslab.positional.base import KINDS

    measured = measurements(store_path)
    rows = []
    for name in (name for k in KINDS for name in registered(k)):
        m = small_encoding(name).meta
        got = measured.get(name, {})
        rows.append(dict(encoding=name, kind=m.kind, origin=plugins.origin("encodings", name),
                         sites=", ".join(m.sites) or "-", parameters=m.parameters,
                         cost=m.cost, measured_cost=cost_text(measured_cost(name, cost_lengths)) if cost_lengths
                         else "not measured", kv_cache=kv_cache_cell(name),
                         fixed_offset=got.get("fixed_offset", NOT_MEASURED), lm=got.get("lm", NOT_MEASURED)))
    return rows


def check_layouts(layouts: Sequence[str]) -> None:
    """One ConfigError naming ``--layout`` for a layout the tiny model cannot take, before any work."""
    from poslab.errors import ConfigError
    from poslab.models.layout import NAMED, pattern
    from poslab.models.transformer import TransformerConfig

    for layout in layouts:
        try:
            TransformerConfig(**TINY | {"n_layers": len(pattern(layout).split(","))}, encoding="nope", layout=layout)
        except ConfigError as e:
            raise ConfigError("--layout", layout, f"a name of {sorted(NAMED)} or a pattern ({e.allowed})") from None


def layout_rows(store_path: str | Path, layouts: Sequence[str],
                cost_lengths: Sequence[int] | None = COST_LENGTHS) -> list[dict]:
    """One dict per layout (a pattern or a name of ``layout.NAMED``) with :func:`comparison_rows`'
    columns: kind "layout"; sites, parameters, cost classes and KV cache from its layers'
    encodings (each distinct entry once, "name: ..." where they differ); cost measured on the tiny
    model with one layer per entry; extrapolation from the store's runs with that layout."""
    from poslab.models.layout import layout_name, parse_layout, pattern
    from poslab.positional import small_encoding

    measured = measurements(store_path)
    rows = []
    for layout in layouts:
        full = pattern(layout)
        name = layout_name(full)
        specs = parse_layout(full, len(full.split(",")), encoding="nope")
        metas = {(s.encoding, s.options): small_encoding(s.encoding, **s.encoding_options).meta for s in specs}
        sites = [site for m in metas.values() for site in m.sites]

        def each(field: str, metas=metas) -> str:  # one value, or "name: value" per distinct entry
            values = {enc: getattr(m, field) for (enc, _), m in metas.items()}
            return next(iter(values.values())) if len(set(values.values())) == 1 else "; ".join(
                f"{enc}: {v}" for enc, v in values.items())

        cost = measured_cost("nope", cost_lengths, layout=full) if cost_lengths else None
        got = measured.get(name, {})
        rows.append(dict(encoding=name, kind="layout", origin="poslab", sites=", ".join(dict.fromkeys(sites)) or "-",
                         parameters=each("parameters"), cost=each("cost"),
                         measured_cost=f"{cost_text(cost)} ({len(specs)} layers)" if cost else "not measured",
                         kv_cache="yes" if all(m.kv_cache for m in metas.values()) else "no",
                         fixed_offset=got.get("fixed_offset", NOT_MEASURED), lm=got.get("lm", NOT_MEASURED)))
    return rows


def kv_cache_cell(name: str) -> str:
    """The KV-cache column: "yes" where cached keys stay valid (the class's options say so, and the
    prefix test in tests/test_survey.py checks it for every entry); for a length-dependent rotary
    schedule, "no" with the logit gap it measures here: the tiny random model of the cost column at
    4 L0 (its schedule's original_max_position_embeddings), decoded with a KV cache (each key rotated
    at its own step) against a full recompute (:func:`poslab.probes.kv_cache.cache_gap`; a
    study measures the same on trained models and checkpoints)."""
    from poslab.positional import small_encoding
    from poslab.positional.rope import RoPE

    enc = small_encoding(name)
    if enc.kv_cache:
        return "yes"
    if not (isinstance(enc, RoPE) and enc.length_dependent):
        return "no"
    import torch

    from poslab.probes.kv_cache import cache_gap

    L0 = int(enc.scaling.get("original_max_position_embeddings") or 16)
    L = 4 * L0
    model = tiny_model(name, L)
    x = torch.randint(0, TINY["vocab_size"], (2, L), generator=torch.Generator().manual_seed(0))
    gap = max(r["logit_gap"] for r in cache_gap(model, x, range(L0, L - 1)))
    return f"no (logit gap {gap:.2g} at L = {L} = 4 L0, tiny random model)"


HEADER = dict(encoding="encoding", kind="kind", origin="from", sites="where position enters",
              parameters="extra parameters", cost="cost",
              measured_cost="measured per forward (L: time, bytes allocated; tiny model)",
              kv_cache="KV cache", fixed_offset=COLUMNS["fixed_offset"], lm=COLUMNS["lm"])
