"""Per-member rows of fixed-offset studies beyond :func:`poslab.studies.kit.fixed_offset.length_rows`.

A single retrieval head (the seed paper's Fig. 4 protocol): the margin and its bound at each
length (:func:`margin_length_rows`), carriers, rank and table norms of the trained and untrained
model and the carriers at every training snapshot, for co-emergence (:func:`carrier_rows`).
A multi-layer model on the full-sequence shift task (Section 5.2, :func:`shift_rows`): accuracy
split at L_max, per-head rows and the retrieving head (:mod:`poslab.probes.layer_heads`).
"""

from __future__ import annotations

import copy

from poslab import probes
from poslab.experiments import MemberContext
from poslab.probes.layer_heads import accuracy_split, head_rows, retrieving_head
from poslab.probes.weights import table_row_norms
from poslab.studies.kit.members import poslab_model, retrieval_head, task_offset
from poslab.tasks import eval_batch


def margin_length_rows(ctx: MemberContext) -> list[dict]:
    """At every evaluation length: accuracy, peak, a* (attention at -K), the margin mu over the
    strongest competitor, over the competitors' mean and the kernel's margin (mean logit profile),
    and the bound 1 / (1 + (L - 1) e^{-mu})."""
    study, task, model = ctx.study, ctx.task, retrieval_head(ctx.model)
    K, Lmax, chunk = task_offset(task), study.train.max_length, study.eval.chunk
    rows = []
    for L in study.eval.lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, attn = probes.accuracy_and_attention(model, batch, chunk=chunk)
        mu = float(probes.margin(model, batch, K, chunk=chunk))
        mu_mean = float(probes.margin(model, batch, K, chunk=chunk, against="mean"))
        mu_profile = probes.profile_margin(model, batch, K, chunk=chunk)
        rows.append(dict(probe="length", length=L, in_range=L <= Lmax, accuracy=acc, **probes.peak(attn[0], L),
                         a_star=probes.attention_at_offset(attn[0], L, -K), margin=mu, margin_mean=mu_mean,
                         margin_profile=mu_profile, bound=probes.margin_bound(mu, L), chance=task.chance))
    return rows


def carrier_rank(model, batch, chunk: int) -> tuple[float, float, float]:
    """Key and query carrier energies (head 0) and W = W_Q^T W_K's top singular-value energy."""
    c = probes.carrier(model, batch, chunk=chunk)
    return float(c["carrier_k"]), float(c["carrier_q"]), float(probes.rank_concentration(model))


def carrier_rows(ctx: MemberContext) -> list[dict]:
    """On the evaluation batch at L_max: a ``probe="member"`` row (learned-table row norms,
    :func:`carrier_rank` of the trained and the untrained model, shape, the rotary kernel ratio or
    None) and ``probe="snapshot"`` rows: :func:`carrier_rank` at each of ``ctx.snapshots``' steps,
    then at step 0 (untrained)."""
    study, task, model = ctx.study, ctx.task, retrieval_head(ctx.model)
    Lmax = study.train.max_length
    batch = eval_batch(task, Lmax, study.eval.n_sequences, study.eval.seed, device=ctx.device)
    ck, cq, rank = carrier_rank(model, batch, study.eval.chunk)
    uk, uq, urank = carrier_rank(ctx.untrained, batch, study.eval.chunk)
    theta = model.encoding.rotary_frequencies()
    rows = [dict(probe="member", **table_row_norms(model, ctx.untrained, Lmax), carrier_k=ck, carrier_q=cq,
                 rank_concentration=rank, untrained_carrier_k=uk, untrained_carrier_q=uq, untrained_rank=urank,
                 d_model=model.cfg.d_model, m=task.vocab_size, temperature=model.cfg.temperature, max_length=Lmax,
                 kernel_ratio=probes.kernel_ratio(theta) if theta is not None else None)]
    snap = copy.deepcopy(ctx.untrained)
    for step, state in sorted(ctx.snapshots.items()):
        snap.load_state_dict(state, strict=False)
        sk, sq, srank = carrier_rank(snap, batch, ctx.study.eval.chunk)
        rows.append(dict(probe="snapshot", step=step, carrier_k=sk, carrier_q=sq, rank_concentration=srank))
    return [*rows, dict(probe="snapshot", step=0, carrier_k=uk, carrier_q=uq, rank_concentration=urank)]


def shift_rows(ctx: MemberContext) -> list[dict]:
    """A multi-layer model on the shift task: per length a ``probe="length"`` row (accuracy over all
    targets, t < L_max, t >= L_max) and :func:`~poslab.probes.layer_heads.head_rows`; the retrieving
    head's ``probe="member"`` row, its last-query attention by offset at every length
    (``probe="offset"``) and its carrier kernel (``probe="kernel"``). Every row carries d_model, d_head."""
    study, task, model = ctx.study, ctx.task, poslab_model(ctx.model)
    K, Lmax, lengths = task_offset(task), study.train.max_length, sorted(study.eval.lengths)
    width = lengths[0]  # offsets -(width - 1) .. 0 exist at every evaluated length
    shape = dict(d_model=model.cfg.d_model, d_head=model.cfg.d_head)
    rows, heads, last = [], [], {}  # last[L]: the last query's mean attention [layers, h, L]
    for L in lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, acc_in, acc_out = accuracy_split(model, batch, Lmax)
        rows.append(dict(probe="length", length=L, accuracy=acc, accuracy_in=acc_in, accuracy_out=acc_out,
                         chance=task.chance, **shape))
        pattern = probes.mean_pattern(model, batch, chunk=study.eval.chunk)  # [layers, h, L, L]
        last[L] = pattern[:, :, L - 1, :]
        heads += head_rows(pattern, K, Lmax, width, **shape)
    ref = max([L for L in lengths if L <= Lmax] or lengths[:1])
    batch = eval_batch(task, ref, study.eval.n_sequences, study.eval.seed, device=ctx.device)
    member, kernel = retrieving_head(model, ctx.untrained, batch, heads, last, K, Lmax, width, study.eval.chunk)
    at = (member["layer"], member["head"])
    offsets = [dict(probe="offset", length=L, delta=d - (L - 1), attention=float(last[L][at][d]))
               for L in lengths for d in range(L)]
    return rows + heads + [dict(member, **shape)] + offsets + kernel


__all__ = ["carrier_rank", "carrier_rows", "margin_length_rows", "shift_rows"]
