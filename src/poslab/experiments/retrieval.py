"""What the retrieval-head experiments share: per-member evaluation and the report helpers.

``markdown_table`` is re-exported from :mod:`poslab.experiments.claims` for the reports.

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
from poslab.experiments.runner import MemberContext
from poslab.tasks import eval_batch


def length_rows(ctx: MemberContext) -> list[dict]:
    """Accuracy, selected peak offset/position/height and target weight a* at every length.

    The target offset is the task's ``K`` (a fixed-offset retrieval task)."""
    study, task = ctx.study, ctx.task
    rows = []
    for L in study.eval.lengths:
        if L > STREAM_ABOVE:  # keys stream in chunks (probes/streaming.py): no per-offset rows
            rows.append(dict(probe="length", length=L, in_range=False, chance=task.chance, streamed=True,
                             **stream_row(ctx, L)))
            continue
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, attn = probes.accuracy_and_attention(ctx.model, batch, chunk=study.eval.chunk)
        attn = attn[0]  # head 0, [L]
        rows.append(dict(probe="length", length=L, in_range=L <= study.train.max_length,
                         accuracy=acc, **probes.peak(attn, L),
                         a_star=probes.attention_at_offset(attn, L, -task.K), chance=task.chance))
        rows += [dict(probe="attention", length=L, offset=t - (L - 1), weight=float(w)) for t, w in enumerate(attn)]
    return rows


STREAM_ABOVE = 4096  # longer evaluation lengths stream their keys in bounded memory


def stream_row(ctx: MemberContext, L: int) -> dict:
    """``length_rows``' numbers at a length too long to hold: uniform i.i.d. sequences drawn chunk by
    chunk (another draw than ``eval_batch``'s, from the same distribution)."""
    from poslab.probes.streaming import StreamedTokens, stream_length_row

    src = StreamedTokens(b=ctx.study.eval.n_sequences, m=ctx.task.vocab_size, L=L, seed=ctx.study.eval.seed)
    return stream_length_row(ctx.model, src, L, ctx.task.K, device=ctx.device, mass_below=ctx.study.train.max_length)


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


def save(fig, path: Path) -> Path:
    """Write a figure as PNG and release it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
