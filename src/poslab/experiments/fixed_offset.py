"""The rows every fixed-offset retrieval study evaluates per member (Table 1's protocol).

Rows are tidy dicts. ``probe="length"`` rows hold one (encoding, K, seed, length) cell;
``probe="member"`` rows hold per-member numbers (carrier energies, rank concentration);
``probe="profile"`` rows hold one offset of the carrier profile.
"""

from __future__ import annotations

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
