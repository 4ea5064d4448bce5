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
        cfg, dec = run["config"], declarations[run["experiment"]]
        if dec.encoding is not None:
            enc = dec.encoding(r)
        elif r.get("variant") is not None or cfg.get("variant") is not None:
            continue
        else:
            enc = r.get("encoding") or cfg.get("model", {}).get("encoding")
        L_train = cfg.get("train", {}).get("max_length")
        row = {**r, "encoding": enc}
        if enc is None or not L_train or not dec.where(row) or r.get(dec.value) is None or r.get("length") is None:
            continue
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


def tiny_model(name: str, max_len: int):
    """A one-layer causal Transformer (d_model 32, 2 heads) with encoding ``name``, eval mode."""
    import torch

    from poslab.models.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    return Transformer(TransformerConfig(**TINY, encoding=name, max_len=max_len)).eval()


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


def measured_cost(name: str, lengths: Sequence[int] = COST_LENGTHS, repeats: int = 3) -> dict[int, tuple[float, int]]:
    """{L: (median seconds per forward, bytes allocated per forward)} of the tiny model with
    encoding ``name`` on one sequence of each length (one thread; wall time, so a busy machine
    inflates the times, not the bytes)."""
    import torch

    model = tiny_model(name, max(lengths))
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
