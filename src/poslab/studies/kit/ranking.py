"""Do two scores rank the same methods alike? Kendall's tau between, e.g., a task's exact match and
the loss past the training length (the survey: perplexity alone does not judge context extension).

    tau_b = (C - D) / sqrt((C + D + T_x) (C + D + T_y))

over the pairs of methods (C concordant, D discordant, T_x pairs tied only in x, T_y only in y).
Used by the character-level (``context-extension``) and the pretrained (``pretrained-extension``)
studies.

An exact match is k correct of n examples; its 95% interval is Wilson's (Wilson 1927),

    (p + z^2 / 2n +- z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n),   p = k / n, z = 1.96,

which stays inside [0, 1] and keeps a width at k = 0 (0 of 80: [0, 0.046]). Two methods whose
intervals overlap are not told apart by the task: the ranking counts them as tied.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from poslab.experiments.outputs import select

Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


def wilson(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson's 95% interval (lo, hi) of a share of k successes in n trials (n > 0)."""
    if n <= 0:
        raise ValueError(f"wilson: n must be positive, got {n}")
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))


def kendall_tau(x: list[float], y: list[float], x_tied: Callable[[int, int], bool] | None = None) -> float | None:
    """Kendall's tau-b of two score lists (ties counted as neither concordant nor discordant);
    ``x_tied(i, j)``: pairs also counted as tied in x (e.g. scores whose intervals overlap).
    None when either list is constant (every pair tied)."""
    n, conc, disc, tx, ty = len(x), 0, 0, 0, 0
    for i in range(n):
        for j in range(i + 1, n):
            a, b = (x[i] > x[j]) - (x[i] < x[j]), (y[i] > y[j]) - (y[i] < y[j])
            if x_tied is not None and x_tied(i, j):
                a = 0
            conc += a * b > 0
            disc += a * b < 0
            tx += a == 0 and b != 0
            ty += b == 0 and a != 0
    denom = ((conc + disc + tx) * (conc + disc + ty)) ** 0.5
    return None if denom == 0 else (conc - disc) / denom


def rank_agreement(by_task: dict[str, float], by_loss: dict[str, float],
                   intervals: dict[str, tuple[float, float]] | None = None) -> dict | None:
    """Methods scored by a task (higher is better) and by a loss (lower is better), over the
    methods that have both: tau between the two orders, how many methods, and each order's best
    (ties to the name that sorts first; None where every method scores the same). With
    ``intervals`` (each method's task-score interval): two methods whose intervals overlap are
    tied in the task's order, the best by task is named only where its interval clears every
    other's, and ``resolved`` counts the pairs of methods the task tells apart. None for fewer
    than two methods."""
    methods = sorted(set(by_task) & set(by_loss))
    if len(methods) < 2:
        return None
    task = [by_task[m] for m in methods]
    neg_loss = [-by_loss[m] for m in methods]
    ci = None if intervals is None else [intervals[m] for m in methods]

    def overlap(i: int, j: int) -> bool:
        assert ci is not None
        return ci[i][0] <= ci[j][1] and ci[j][0] <= ci[i][1]

    def best(scores: list[float], resolved: bool = False) -> str | None:
        if len(set(scores)) == 1:
            return None
        top = max(range(len(methods)), key=lambda i: scores[i])
        if resolved and ci is not None and any(overlap(top, j) for j in range(len(methods)) if j != top):
            return None
        return methods[top]
    out = dict(tau=kendall_tau(task, neg_loss, overlap if ci is not None else None), methods=len(methods),
               best_task=best(task, resolved=True), best_loss=best(neg_loss))
    if ci is not None:
        pairs = [(i, j) for i in range(len(methods)) for j in range(i + 1, len(methods))]
        out["resolved"] = sum(not overlap(i, j) for i, j in pairs)
        out["pairs"] = len(pairs)
    return out


def correct(row: dict) -> tuple[int, int] | None:
    """(k, n) of one exact-match row: ``exact`` the share of its ``examples``; None without them."""
    if row.get("exact") is None or not row.get("examples"):
        return None
    n = int(row["examples"])
    return int(round(float(row["exact"]) * n)), n


def ranking_rows(rows: list[dict], L0: int) -> list[dict]:
    """probe="ranking" per (seed, task, length > L0): Kendall's tau between the methods ordered by
    mean exact match over depths (higher first) and by loss at that length (lower first). Where
    the rows give their examples, each method's exact match is k of n pooled over depths with its
    Wilson interval, and methods the task cannot tell apart (intervals overlap) are tied."""
    loss = {(r["method"], r["seed"], r["length"]): r["loss"] for r in select(rows, "loss")}
    cells, counts = _reasoning_cells(rows, L0)
    out = []
    for (seed, task, L), exact in sorted(cells.items()):
        got = rank_agreement({m: float(np.mean(v)) for m, v in exact.items()},
                             {m: v for (m, s, length), v in loss.items() if s == seed and length == L},
                             _intervals(counts[(seed, task, L)]))
        if got is not None:
            out.append(dict(probe="ranking", seed=seed, task=task, length=L, multiple=L / L0, **got))
    return out


def _reasoning_cells(rows: list[dict], L0: int) -> tuple[dict, dict]:
    """Per (seed, task, length > L0) and method, the exact matches of its reasoning rows and their (k, n)
    (:func:`correct`)."""
    cells: dict[tuple, dict[str, list[float]]] = {}
    counts: dict[tuple, dict[str, list[tuple[int, int] | None]]] = {}
    for r in select(rows, "reasoning"):
        if r["length"] > L0 and r.get("exact") is not None:
            cells.setdefault((r["seed"], r["task"], r["length"]), {}).setdefault(r["method"], []).append(r["exact"])
            counts.setdefault((r["seed"], r["task"], r["length"]), {}).setdefault(r["method"], []).append(correct(r))
    return cells, counts


def _intervals(kn: dict[str, list[tuple[int, int] | None]]) -> dict | None:
    """Each method's Wilson interval of its k of n pooled over depths; None where a row lacks its examples."""
    if not all(c is not None for v in kn.values() for c in v):
        return None
    return {m: wilson(sum(c[0] for c in v if c), sum(c[1] for c in v if c)) for m, v in kn.items()}


def exact_rows(rows: list[dict], L0: int) -> list[dict]:
    """probe="exact" per (method, task, length, seed): the exact match pooled over depths as k
    correct of n examples (``correct``, ``examples``), ``exact`` = k / n, its Wilson interval
    (``lo``, ``hi``) and L / L0 (``multiple``). Rows without their examples are left out."""
    cells: dict[tuple, list[int]] = {}
    for r in select(rows, "reasoning"):
        if (kn := correct(r)) is not None:
            cell = cells.setdefault((r["method"], r["task"], r["length"], r["seed"]), [0, 0])
            cell[0], cell[1] = cell[0] + kn[0], cell[1] + kn[1]
    out = []
    for (method, task, L, seed), (k, n) in sorted(cells.items(), key=lambda kv: str(kv[0])):
        lo, hi = wilson(k, n)
        out.append(dict(probe="exact", method=method, task=task, length=L, seed=seed, multiple=L / L0,
                        correct=k, examples=n, exact=k / n, lo=lo, hi=hi))
    return out


def pooled(rows: list[dict]) -> str:
    """A table cell over "exact" rows (one per seed): "p [lo, hi] k/n" pooled over the seeds, then
    each seed's share ("" without rows)."""
    if not rows:
        return ""
    k, n = sum(r["correct"] for r in rows), sum(r["examples"] for r in rows)
    lo, hi = wilson(k, n)
    seeds = " / ".join(f"{r['exact']:.2f}" for r in sorted(rows, key=lambda r: str(r["seed"])))
    return f"{k / n:.3f} [{lo:.3f}, {hi:.3f}] {k}/{n}; seeds {seeds}"
