"""The survey's comparison of positional encodings (seed ``001``), generated from code and runs.

One row per registry encoding. Where position is injected, the extra cost and KV-cache
compatibility are read off a built instance's metadata (:class:`poslab.positional.Metadata`);
length extrapolation is *measured*, from what a store holds:

- fixed-offset retrieval accuracy beyond the training length: every stored row with
  ``probe == "length"``, ``in_range`` False and an ``accuracy`` (the Table 1 protocol of the
  ``phenomenon`` experiment and any experiment that reuses it), of runs whose task is
  ``fixed_offset``, trained members only (no evaluate-only variant such as an APE clamp), averaged
  over seeds, offsets and unseen lengths;
- the language model's loss at 2x and 4x its training length L0 beside the loss at L0: stored
  rows with ``probe == "loss"``, a ``length`` and a ``loss``, from trained members (no
  evaluate-only variant, no extension method other than the encoding itself), as the
  ``context-extension`` experiment writes them.

Anything not in the store reads "not measured yet".
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

NOT_MEASURED = "not measured yet"


def measurements(store_path: str | Path) -> dict[str, dict[str, str]]:
    """encoding -> {"fixed_offset": text, "lm": text} for what the store at ``store_path`` holds."""
    from poslab.store import Store

    path = Path(store_path)
    if not path.exists():
        return {}
    with Store(path) as store:
        runs = {r["key"]: r for r in store.runs() if r["status"] == "finished"}
        rows = [r for r in store.rows() if r["run_key"] in runs]
    fixed: dict[str, list] = defaultdict(list)
    lm: dict[tuple, list] = defaultdict(list)
    for r in rows:
        run = runs[r["run_key"]]
        cfg = run["config"]
        enc = r.get("encoding") or cfg.get("model", {}).get("encoding")
        if enc is None:
            continue
        if (r.get("probe") == "length" and r.get("in_range") is False and r.get("accuracy") is not None
                and cfg.get("task_type") == "fixed_offset" and r.get("variant") is None
                and cfg.get("model", {}).get("attention", "softmax") == "softmax"):  # not the linear control
            fixed[enc].append((r["accuracy"], r["length"], r.get("seed"), run["experiment"]))
        if (r.get("probe") == "loss" and r.get("length") and r.get("loss") is not None and r.get("variant") is None
                and r.get("method") in (None, enc)):
            L0 = cfg.get("train", {}).get("max_length")
            if L0 and r["length"] % L0 == 0:
                lm[(enc, run["experiment"], L0)].append((r["length"] // L0, r["loss"], r.get("seed")))
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for enc, cells in fixed.items():
        acc = np.mean([c[0] for c in cells])
        lengths = [c[1] for c in cells]
        out[enc]["fixed_offset"] = (f"{acc:.3f} (L {min(lengths)}-{max(lengths)}, {len({c[2] for c in cells})} seeds, "
                                    f"{', '.join(sorted({c[3] for c in cells}))})")
    for (enc, experiment, L0), cells in lm.items():
        by = defaultdict(list)
        for mult, loss, _ in cells:
            by[mult].append(loss)
        if 2 not in by and 4 not in by:
            continue
        part = " / ".join(f"{np.mean(by[m]):.3f}" if m in by else "-" for m in (2, 4))
        base = f"{np.mean(by[1]):.3f}" if 1 in by else "-"
        out[enc]["lm"] = (f"{part} (1x: {base}; L0 {L0}, {len({c[2] for c in cells})} seeds, {experiment})")
    return dict(out)


def comparison_rows(store_path: str | Path) -> list[dict]:
    """One dict per registry encoding: metadata columns and measured extrapolation."""
    from poslab.positional import ENCODINGS, small_encoding

    measured = measurements(store_path)
    rows = []
    for name in ENCODINGS:
        m = small_encoding(name).meta
        got = measured.get(name, {})
        rows.append(dict(encoding=name, kind=m.kind, sites=", ".join(m.sites) or "-", parameters=m.parameters,
                         cost=m.cost, kv_cache="yes" if m.kv_cache else "no",
                         fixed_offset=got.get("fixed_offset", NOT_MEASURED), lm=got.get("lm", NOT_MEASURED)))
    return rows


HEADER = dict(encoding="encoding", kind="kind", sites="where position enters", parameters="extra parameters",
              cost="cost", kv_cache="KV cache", fixed_offset="fixed-offset acc. beyond L_train",
              lm="LM loss at 2x / 4x L0")
