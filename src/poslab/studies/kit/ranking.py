"""Do two scores rank the same methods alike? Kendall's tau between, e.g., a task's exact match and
the loss past the training length (the survey: perplexity alone does not judge context extension).

    tau_b = (C - D) / sqrt((C + D + T_x) (C + D + T_y))

over the pairs of methods (C concordant, D discordant, T_x pairs tied only in x, T_y only in y).
Used by the character-level (``context-extension``) and the pretrained (``pretrained-extension``)
studies.
"""

from __future__ import annotations

import numpy as np


def kendall_tau(x: list[float], y: list[float]) -> float | None:
    """Kendall's tau-b of two score lists (ties counted as neither concordant nor discordant);
    None when either list is constant."""
    n, conc, disc, tx, ty = len(x), 0, 0, 0, 0
    for i in range(n):
        for j in range(i + 1, n):
            a, b = (x[i] > x[j]) - (x[i] < x[j]), (y[i] > y[j]) - (y[i] < y[j])
            conc += a * b > 0
            disc += a * b < 0
            tx += a == 0 and b != 0
            ty += b == 0 and a != 0
    denom = ((conc + disc + tx) * (conc + disc + ty)) ** 0.5
    return None if denom == 0 else (conc - disc) / denom


def rank_agreement(by_task: dict[str, float], by_loss: dict[str, float]) -> dict | None:
    """Methods scored by a task (higher is better) and by a loss (lower is better), over the
    methods that have both: tau between the two orders, how many methods, and each order's best
    (ties to the name that sorts first; None where every method scores the same). None for fewer
    than two methods."""
    methods = sorted(set(by_task) & set(by_loss))
    if len(methods) < 2:
        return None
    task = [by_task[m] for m in methods]
    neg_loss = [-by_loss[m] for m in methods]

    def best(scores: list[float]) -> str | None:
        return None if len(set(scores)) == 1 else methods[max(range(len(methods)), key=lambda i: scores[i])]
    return dict(tau=kendall_tau(task, neg_loss), methods=len(methods), best_task=best(task), best_loss=best(neg_loss))


def ranking_rows(rows: list[dict], L0: int) -> list[dict]:
    """probe="ranking" per (seed, task, length > L0): Kendall's tau between the methods ordered by
    mean exact match over depths (higher first) and by loss at that length (lower first)."""
    loss = {(r["method"], r["seed"], r["length"]): r["loss"] for r in rows if r.get("probe") == "loss"}
    cells: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        if r.get("probe") == "reasoning" and r["length"] > L0 and r.get("exact") is not None:
            cells.setdefault((r["seed"], r["task"], r["length"]), {}).setdefault(r["method"], []).append(r["exact"])
    out = []
    for (seed, task, L), exact in sorted(cells.items()):
        got = rank_agreement({m: float(np.mean(v)) for m, v in exact.items()},
                             {m: v for (m, s, length), v in loss.items() if s == seed and length == L})
        if got is not None:
            out.append(dict(probe="ranking", seed=seed, task=task, length=L, multiple=L / L0, **got))
    return out
