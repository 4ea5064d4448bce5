"""What the retrieval-head experiments share: per-member evaluation and the report helpers.

Rows are tidy dicts. ``probe="length"`` rows hold one (encoding, K, seed, length) cell;
``probe="member"`` rows hold per-member numbers (carrier energies, rank concentration);
``probe="profile"`` rows hold one offset of the carrier profile.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from poslab import probes
from poslab.experiments.config import StudyConfig
from poslab.models.retrieval_head import RetrievalHead
from poslab.tasks import build_task, eval_batch


def length_rows(model: RetrievalHead, member, study: StudyConfig, device: str) -> list[dict]:
    """Accuracy, selected peak offset/position/height and target weight a* at every length."""
    task = build_task("fixed_offset", m=study.m, K=member.K)
    rows = []
    for L in study.eval.lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=device)
        acc, attn = probes.accuracy_and_attention(model, batch)
        attn = attn[0]  # head 0, [L]
        ids = dict(encoding=member.encoding, K=member.K, seed=member.seed, length=L)
        rows.append(dict(probe="length", **ids, in_range=L <= study.train.max_length,
                         accuracy=acc, **probes.peak(attn, L),
                         a_star=probes.attention_at_offset(attn, L, -member.K), chance=task.chance))
        rows += [dict(probe="attention", **ids, offset=t - (L - 1), weight=float(w)) for t, w in enumerate(attn)]
    return rows


def select(rows: list[dict], probe: str, **where) -> list[dict]:
    return [r for r in rows if r.get("probe") == probe and all(r.get(k) == v for k, v in where.items())]


def group_stats(rows: list[dict], by: tuple[str, ...], value: str) -> dict[tuple, tuple[float, float, int]]:
    """(mean, std over seeds, n) of ``value`` for each combination of the ``by`` columns."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r.get(value) is not None:
            groups[tuple(r[k] for k in by)].append(float(r[value]))
    return {k: (float(np.mean(v)), float(np.std(v)), len(v)) for k, v in sorted(groups.items())}


def fmt(mean: float, std: float) -> str:
    return f"{mean:.3f} ± {std:.3f}"


def write_csv(rows: list[dict], path: Path, columns: list[str] | None = None) -> Path:
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def save(fig, path: Path) -> Path:
    """Write a figure as PNG and release it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def mark(ok: bool) -> str:
    return "yes" if ok else "**no**"
