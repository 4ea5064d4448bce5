"""Rows derived across members for a study's report, and small table-cell helpers.

Grouping (:func:`by_columns`), per-group dilution fits 1/a* = c (L - 1) + b (:func:`dilution_rows`),
the relative range of a seed mean over evaluation lengths (:func:`range_over`), how a quantity
emerges over training snapshots (:func:`emergence_rows`), and table cells: mean ± std over some of
a group's rows (:func:`mean_std_where`), one column's values joined (:func:`joined`). Functions
take tidy rows and return new ones; none reads a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from poslab.experiments.outputs import mean_std
from poslab.probes.carriers import dilution_fit


def by_columns(rows: list[dict], cols: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """Rows grouped by the values of ``cols`` (each must be present), in sorted key order."""
    out: dict[tuple, list[dict]] = {}
    for r in sorted(rows, key=lambda r: tuple(r[c] for c in cols)):
        out.setdefault(tuple(r[c] for c in cols), []).append(r)
    return out


def dilution_rows(cells: list[dict], by: tuple[str, ...], **extra) -> list[dict]:
    """A ``probe="dilution"`` row per group of length rows (``length``, ``a_star``): the fit
    1/a* = c (L - 1) + b over its lengths (:func:`poslab.probes.dilution_fit`), where there are
    two lengths at least and every a* > 0. ``extra`` columns follow the ``by`` ones."""
    out = []
    for key, mine in by_columns(cells, by).items():
        pts = sorted((r["length"], r["a_star"]) for r in mine)
        if len(pts) >= 2 and all(a > 0 for _, a in pts):
            out.append(dict(probe="dilution", **dict(zip(by, key, strict=True)), **extra,
                            **dilution_fit(*zip(*pts, strict=False))))
    return out


def range_over(rows: list[dict], column: str, over: str = "length") -> float | None:
    """(max - min) / |mean| over the values of ``over`` of the mean of ``column`` (the seed mean);
    None with fewer than two values or a value without data."""
    mu = [np.mean([r[column] for r in g if r.get(column) is not None] or [np.nan])
          for g in by_columns(rows, (over,)).values()]
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
        by_step = {st: np.mean([r[q] for r in g]) for (st,), g in by_columns(snaps, ("step",)).items()}
        out += [dict(probe="emergence_plot", quantity=q, step_plot=max(st, 1), value=v) for st, v in by_step.items()]
        if len(by_step) >= 2:
            final = by_step[max(by_step)]
            late = [abs(v - final) / abs(final) for st, v in by_step.items() if st >= late_from]
            out.append(dict(probe="emergence", **extra, quantity=q,
                            reach_step=next(st for st, v in by_step.items() if v >= reach * final),
                            late_change=float(max(late)) if len(late) >= 2 else None))
    return out


def mean_std_where(column: str, where: Callable[[dict], bool]) -> Callable[[list[dict]], str]:
    """A table cell: mean ± std of ``column`` over the group's rows meeting ``where``."""
    return lambda g: mean_std([r[column] for r in g if where(r)])


def joined(column: str, sep: str = " ", where: Callable[[dict], bool] = lambda r: True) -> Callable[[list[dict]], str]:
    """A table cell: the group's values of ``column`` (rows meeting ``where``) joined by ``sep``."""
    return lambda g: sep.join(str(r.get(column)) for r in g if where(r))


__all__ = ["by_columns", "dilution_rows", "emergence_rows", "joined", "mean_std_where", "range_over"]
