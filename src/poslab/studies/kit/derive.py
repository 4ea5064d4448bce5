"""Rows derived across members for a study's report.

Per-group dilution fits 1/a* = c (L - 1) + b (:func:`dilution_rows`), the relative range of a
seed mean over evaluation lengths (:func:`range_over`), how a quantity emerges over training
snapshots (:func:`emergence_rows`). Functions take tidy rows and return new ones; none reads a model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from poslab.experiments.outputs import groups
from poslab.probes.carriers import dilution_fit


def dilution_rows(cells: list[dict], by: tuple[str, ...], **extra) -> list[dict]:
    """A ``probe="dilution"`` row per group of length rows (``length``, ``a_star``): the fit
    1/a* = c (L - 1) + b over its lengths (:func:`poslab.probes.dilution_fit`), where there are
    two lengths at least and every a* > 0. ``extra`` columns follow the ``by`` ones."""
    out = []
    for key, mine in groups(cells, by).items():
        pts = sorted((r["length"], r["a_star"]) for r in mine)
        if len(pts) >= 2 and all(a > 0 for _, a in pts):
            out.append(dict(probe="dilution", **dict(zip(by, key, strict=True)), **extra,
                            **dilution_fit(*zip(*pts, strict=False))))
    return out


def range_over(rows: list[dict], column: str, over: str = "length") -> float | None:
    """(max - min) / |mean| over the values of ``over`` of the mean of ``column`` (the seed mean);
    None with fewer than two values or a value without data."""
    mu = [np.mean([r[column] for r in g if r.get(column) is not None] or [np.nan])
          for g in groups(rows, (over,)).values()]
    if len(mu) >= 2 and not np.isnan(mu).any():
        return float((max(mu) - min(mu)) / abs(np.mean(mu)))
    return None


def emergence_rows(snaps: list[dict], quantities: Sequence[str], late_from: int, reach: float = 0.9,
                   **extra) -> list[dict]:
    """How each quantity emerges over training snapshots (rows with ``step``; step 0 = untrained).

    Per quantity: ``probe="emergence_plot"`` rows, the seed mean at each step (``step_plot``: 0
    drawn at 1 on a log axis), and with two steps at least one ``probe="emergence"`` row:
    ``reach_step``, the first step whose mean reaches ``reach`` of the final mean, and
    ``late_change``, the largest |mean - final| / final from step ``late_from`` on (None unless
    two steps are that late). ``extra`` columns come before ``quantity``."""
    out = []
    for q in quantities:
        by_step = {st: np.mean([r[q] for r in g]) for (st,), g in groups(snaps, ("step",)).items()}
        out += [dict(probe="emergence_plot", quantity=q, step_plot=max(st, 1), value=v) for st, v in by_step.items()]
        if len(by_step) >= 2:
            final = by_step[max(by_step)]
            late = [abs(v - final) / abs(final) for st, v in by_step.items() if st >= late_from]
            out.append(dict(probe="emergence", **extra, quantity=q,
                            reach_step=next(st for st, v in by_step.items() if v >= reach * final),
                            late_change=float(max(late)) if len(late) >= 2 else None))
    return out


__all__ = ["dilution_rows", "emergence_rows", "range_over"]
