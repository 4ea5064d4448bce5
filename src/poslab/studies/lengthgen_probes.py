"""The seed paper's third next step: its probes on "copying and arithmetic benchmarks", Kazemnejad
et al. 2023's decoder-form ``copy`` and ``addition`` (:mod:`poslab.tasks.kazemnejad`,
:mod:`poslab.tasks.kazemnejad_math`), for RoPE, learned APE and NoPE, trained on each task's
``train_range`` and evaluated past it (the benchmark set-up of :mod:`poslab.studies.lengthgen`).

Per output query i (a position whose next token is output) and each layer and head, on each
sequence's own pattern::

    argmax key          k*(i) = argmax_j pattern[i, j]
    peak offset         k*(i) - i                                   (from the query)
    source              copy: the input symbol the output copies,  src(i) = i - n   (n input symbols)
                        addition: the operand digits of the output digit's significance (one or two keys)
    source hit          k*(i) in src(i);  source offset  k*(i) - (the nearest source key)
    pinning (APE)       over queries at token positions i >= T (T = tokens of the longest trained length,
                        the learned table's trained rows): the least-squares slope of k* against i (a head
                        that follows its source: ~1; pinned to absolute positions: ~0) and the share of k*
                        inside [0, T)

The member's *copy head* is its (layer, head) with the highest source hit over the trained lengths.
APE is also evaluated with clamp-to-last (every table row >= T replaced by row T - 1, no retraining:
the seed's inference-time fix). Set-up, claims and results: docs/next-steps.md.

Notation: b batch, h head, i query index, j key index, L length (the task's unit), T trained tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from poslab.experiments import Trained
from poslab.experiments.config import EvalConfig, StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, joined, select, write_outputs
from poslab.experiments.spec import (
    ClaimSpec,
    InRange,
    is_,
    judge_all,
    mean,
    next_step,
    probe,
    seed_states,
    share,
)
from poslab.models.loss import aligned_logits
from poslab.probes.attention import SLOPE_MAX
from poslab.probes.common import over_chunks
from poslab.studies.kit import benchmarks as lg
from poslab.tasks import eval_batch
from poslab.tasks.scoring import sequence_scores

TASKS_RUN = ("copy", "addition")
ENCODINGS = ("rope", "learned", "nope")
PINNED_SHARE = 0.9  # a pinned head keeps at least this share of its argmax keys inside the trained positions

PRESETS = {
    # Kazemnejad et al.'s model and trainer (lengthgen's paper preset), every length of each task's ranges
    "paper": lg.Scale(model={lg.KAZEMNEJAD: lg.KAZEMNEJAD_MODEL}, train={lg.KAZEMNEJAD: lg.KAZEMNEJAD_TRAIN},
                      eval_lengths="every", n_sequences=512, seeds=3, tasks="all"),
    # sized here: 2 layers, d = 64, 4000 steps of batch 32 (lengthgen's cpu budget, at which copy is
    # learned in range by RoPE), 2 seeds (docs/next-steps.md)
    "cpu": lg.Scale(model={lg.KAZEMNEJAD: dict(n_layers=2, d_model=64, n_heads=4)},
                    train={lg.KAZEMNEJAD: dict(steps=4000, batch_size=32, lr=1e-3, optimizer="adam",
                                               length_sampling="sequence")},
                    eval_lengths="few", n_sequences=128, seeds=2, tasks="cpu"),
    "quick": lg.Scale(model={lg.KAZEMNEJAD: dict(n_layers=2, d_model=32, n_heads=2)},
                      train={lg.KAZEMNEJAD: dict(steps=10, batch_size=8, lr=1e-3, length_sampling="sequence")},
                      eval_lengths="few", n_sequences=16, seeds=1, tasks="quick"),
}

APE, RELATIVE = is_("encoding", "learned"), is_("encoding", "rope", "nope")
ROPE, NOPE = is_("encoding", "rope"), is_("encoding", "nope")
PLAIN, CLAMP = is_("clamp", False), is_("clamp", True)
UNSEEN = probe("length") & is_("in_range", False)
TRAINED = probe("length") & is_("in_range", True) & PLAIN
MEMBER = probe("member")
SCOPE = ("the seed states its mechanism for a fixed offset; here the source's offset grows with the length "
         "(copy: -n) or with the operands (addition), so the seed's statement does not decide it: a control")
APE_NOTE = ("learned APE (rows N(0, 0.02²)); {seeds} seeds; positions past T = tokens of the longest trained "
            "length, whose table rows were never trained")
# what each claim is (its role follows: experiments/spec.role_of). These are a next step's runs: the seed names
# "copying and arithmetic benchmarks" as a next step, so its own statements measured here (RoPE's Lemma 1 and
# Section 5.2, APE's Proposition 2, Section 5.2 and Fig. 4) are in another setting: controls, RoPE's and APE's
# alike; no seed states NoPE's outcome on them: a next step's prediction
ANOTHER = ("; a next step's run (the seed names copying and arithmetic benchmarks as a next step): the seed's "
           "statement in another setting, a control")
IN_RANGE = seed_states("§2 set-up / Table 1: the trained heads are near-perfect in range (RoPE ~1, APE ~1)")
LEMMA1 = seed_states("Lemma 1 / Section 5.2: RoPE's selected offset is length-invariant; RoPE generalizes")
SECTION52_APE = seed_states("Section 5.2: APE degrades out of range")
PROPOSITION2 = seed_states("Proposition 2: the trained APE head selects a fixed absolute position inside the "
                           "training range, so it misses the target outside that range")
FIG4_CLAMP = seed_states("Fig. 4: inference-time fixes (table interpolation, clamp-to-last, index rescaling) all "
                         "leave accuracy at chance")
NOPE_WHY = "no seed states NoPE's outcome on these tasks: a next step's prediction"
NOPE_STEP = next_step("seed 000, limitations: copying and arithmetic benchmarks, and NoPE (causal masking may "
                      "induce relative structure); the seed names the steps, not their outcomes")
# the learned-in-range gate: the study's own in-range line (per-token accuracy >= 0.95 at the trained lengths,
# the precondition claims below), per task and encoding
GATE = InRange(where=TRAINED, column="accuracy", threshold=0.95, match=("task", "encoding"),
               text="per-token accuracy at trained lengths (mean over seeds and lengths)")
ROLE_REVISED = "2026-12-07: role computed from source x setting (issue 53): "
GATED = ("2026-12-07: the learned-in-range gate (issue 53): a claim past the range or on a trained head's mechanism "
         "is n.a. where its models did not learn the task in range")
AS_CONTROL = (ROLE_REVISED + "the seed's statement on a next step's benchmark (another setting), as for RoPE "
              "(Proposition 2 is as fixed-offset as Lemma 1); " + GATED)
AS_PREDICTION = ROLE_REVISED + "no seed states NoPE's outcome on these tasks (a next step's prediction)"


CLAIMS = [
    *[ClaimSpec(name="{task}, {encoding}: per-token accuracy at trained lengths", paper="(learned in range)",
                where=TRAINED & is_("encoding", e), per=("task", "encoding"),
                measure=mean("accuracy"), op=">=", threshold=0.95,
                source=NOPE_STEP if e == "nope" else IN_RANGE, setting="other",
                revised=AS_PREDICTION if e == "nope" else None,
                note="mean over {seeds} seeds and the trained lengths evaluated; the precondition of the other "
                     "claims (the seed's models are near-perfect in range) and the study's learned-in-range gate")
      for e in ENCODINGS],
    # APE: Section 5.2's "APE degrades out of range" and Proposition 2's pinning, on the new tasks
    ClaimSpec(name="{task}, learned: accuracy on sourced outputs at positions past T (unseen lengths)",
              paper="APE degrades out of range (Section 5.2)", where=UNSEEN & APE & PLAIN, per=("task",),
              measure=mean("src_accuracy_out"), op="<", threshold=0.5, source=SECTION52_APE, setting="other",
              trained=True, revised=AS_CONTROL,
              note=APE_NOTE + "; Section 5.2's line (< 0.5 past the training range)" + ANOTHER),
    ClaimSpec(name="{task}, learned: copy head's queries past T whose argmax key is their source",
              paper="it misses the target outside that range (Proposition 2)", where=MEMBER & APE, per=("task",),
              measure=mean("hit_out"), op="<", threshold=0.5, source=PROPOSITION2, setting="other", trained=True,
              revised=AS_CONTROL,
              note=APE_NOTE + "; the copy head is the member's head with most source hits at trained lengths"
                   + ANOTHER),
    ClaimSpec(name="{task}, learned: copy heads pinned at every unseen length (|slope of k* on i| < "
                   f"{SLOPE_MAX} and ≥ {PINNED_SHARE:.0%} of k* inside [0, T))",
              paper="selects a fixed absolute position inside the training range (Proposition 2)",
              where=MEMBER & APE, per=("task",), measure=share("pinned", "==", True), op=">=", threshold=0.9,
              percent=True, source=PROPOSITION2, setting="other", trained=True, revised=AS_CONTROL,
              note=APE_NOTE + "; one (seed) copy head each" + ANOTHER),
    ClaimSpec(name="{task}, learned clamp-to-last: accuracy on sourced outputs at positions past T",
              paper="inference-time fixes (clamp-to-last) leave accuracy at chance (Fig. 4)",
              where=UNSEEN & APE & CLAMP, per=("task",), measure=mean("src_accuracy_out"), op="<=", threshold=2,
              scale_by="chance", source=FIG4_CLAMP, setting="other", trained=True, revised=AS_CONTROL,
              note=APE_NOTE + "; the same weights with rows >= T replaced by row T - 1; line 2 x chance" + ANOTHER),
    # RoPE and NoPE: the same probes; RoPE's as controls (the seed's statement is for a fixed offset), NoPE's as
    # a next step's predictions (no seed states them)
    *[ClaimSpec(name="{task}, {encoding}: per-token accuracy at unseen lengths", paper="generalizes (RoPE)",
                where=UNSEEN & enc, per=("task", "encoding"), measure=mean("accuracy"), op=">=", threshold=0.9,
                source=source, setting="other", trained=True, revised=revised,
                note="mean over {seeds} seeds and the unseen lengths; " + why)
      for enc, source, why, revised in ((ROPE, LEMMA1, SCOPE, GATED),
                                            (NOPE, NOPE_STEP, NOPE_WHY, f"{AS_PREDICTION}; {GATED}"))],
    *[ClaimSpec(name="{task}, {encoding}: copy head's source hits at unseen lengths",
                paper="the head keeps finding its target past training (RoPE)", where=MEMBER & enc,
                per=("task", "encoding"), measure=mean("hit_unseen"), op=">=", threshold=0.9, source=source,
                setting="other", trained=True, revised=revised,
                note="mean over {seeds} seeds of the copy head's share of sourced queries whose argmax key is a "
                     "source, over the unseen lengths; " + why)
      for enc, source, why, revised in ((ROPE, LEMMA1, SCOPE, GATED),
                                            (NOPE, NOPE_STEP, NOPE_WHY, f"{AS_PREDICTION}; {GATED}"))],
    *[ClaimSpec(name="{task}, {encoding}: slope of the copy head's argmax key on the query position past T",
                paper="relative: the peak moves with the query (not pinned)", where=MEMBER & enc,
                per=("task", "encoding"), measure=mean("slope_out"), op="~", threshold=1.0, tol=SLOPE_MAX,
                source=source, setting="other", trained=True, revised=revised,
                note="mean over {seeds} seeds and unseen lengths (a head that follows its source: 1; pinned: 0); "
                     + why)
      for enc, source, why, revised in ((ROPE, LEMMA1, SCOPE, GATED),
                                            (NOPE, NOPE_STEP, NOPE_WHY, f"{AS_PREDICTION}; {GATED}"))],
]

TABLES = [
    Table("Per-token accuracy on the output by length (task's unit)", by=("task", "encoding", "clamp"),
          where=probe("length"), pivot=Pivot("length", "accuracy", "L={}")),
    Table("Exact match of the whole output by length", by=("task", "encoding", "clamp"), where=probe("length"),
          pivot=Pivot("length", "exact", "L={}")),
    Table("Accuracy on sourced outputs at token positions past T (unseen lengths)", by=("task", "encoding", "clamp"),
          where=UNSEEN, pivot=Pivot("length", "src_accuracy_out", "L={}"),
          intro="Sourced outputs: copied symbols; sum digits with an operand digit of their significance. T = "
                "tokens of the longest trained length (copy 43, addition 33)."),
    Table("The copy head of each seed", by=("task", "encoding", "seed"), where=MEMBER,
          intro="head = layer.head with most source hits at trained lengths; hits: share of sourced queries whose "
                "argmax key is a source (trained lengths / unseen lengths / unseen queries at positions >= T); "
                "source offsets and peak offsets (argmax minus query): most common per unseen length; slope of the "
                "argmax key on the query position and share of argmax keys < T over queries >= T (mean over unseen "
                "lengths); pinned: at every unseen length with a query past T, |slope| < 0.1 and ≥ 90% of argmax "
                "keys < T.",
          columns=(Column("head", joined("head_name")), Column("hits trained", "hit_trained"),
                   Column("hits unseen", "hit_unseen"), Column("hits past T", "hit_out"),
                   Column("source offsets", joined("src_offsets")), Column("peak offsets", joined("peak_offsets")),
                   Column("slope past T", "slope_out"), Column("argmax < T", "in_trained_out"),
                   Column("pinned", lambda g: f"{sum(bool(r['pinned']) for r in g)} of {len(g)}"))),
    Table("Every head at the longest length (mean over seeds; heads.csv has every length)",
          by=("task", "encoding", "layer", "head"), where=probe("head") & PLAIN & is_("longest", True),
          columns=(Column("source hits", "hit"), Column("source offset", "src_offset", 1),
                   Column("peak offset", "peak_offset", 1), Column("slope past T", "slope_out"),
                   Column("argmax < T", "in_trained_out"), Column("mass < T minus uniform", "mass_excess_out"))),
]
FIGURES = [
    Lines("accuracy.png", x="length", y="accuracy", series=("encoding", "clamp"), panel="task",
          where=probe("length"), ylim=(-0.02, 1.02), xlabel="length (the task's unit)", ylabel="per-token accuracy"),
    Lines("copy_head.png", x="length", y="hit", series=("encoding",), panel="task",
          where=probe("head") & is_("copy_head", True), ylim=(-0.02, 1.02), xlabel="length (the task's unit)",
          ylabel="copy head: sourced queries whose argmax key is a source"),
]


# Copy and addition x RoPE, learned APE, NoPE, causal decoder; each task's lengths and model from
# :func:`poslab.studies.kit.benchmarks.task_setting` at this study's scale (PRESETS); APE also clamp-to-last.
BASE = StudyConfig(model_type="transformer", task_type=TASKS_RUN[0], grid={"setting": TASKS_RUN, "encoding": ENCODINGS},
                   variants={"clamp": {"where": {"encoding": "learned"}}},
                   eval=EvalConfig(chunk=128, lengths=(1,)))
PRESET_CHANGES = {name: {"settings": {t: lg.task_setting(t, scale) for t in TASKS_RUN}, "seeds": scale.seeds,
                         "eval.n_sequences": scale.n_sequences} for name, scale in PRESETS.items()}


# ----------------------------------------------------------------------------- sources

def sources(task: str, tokens: np.ndarray, ids: dict[str, int]) -> np.ndarray:
    """Source keys of every query, ``[b, s, 2]`` (-1: none): the key(s) holding what the next token is read from.

    copy: ``Copy: x_1 .. x_n [SEP] y_1 .. y_n </s>``; the query at SEP + k - 1 predicts y_k = x_k at key k.
    addition: ``Compute a + b ? The answer is s .``; the query before sum digit s_j (significance r, 0 = units)
    reads a's and b's digits of significance r (where the operand has one)."""
    b, s = tokens.shape
    out = np.full((b, s, 2), -1, dtype=np.int64)
    first = lambda row, w: int(np.argmax(row == ids[w]))  # noqa: E731  (every sequence holds each marker)
    for r, row in enumerate(tokens):
        if task == "copy":
            sep = first(row, "[SEP]")
            q = np.arange(sep, 2 * sep - 1)  # n = sep - 1 queries
            out[r, q, 0] = q - sep + 1
        elif task == "addition":
            plus, ask, is_at = first(row, "+"), first(row, "?"), first(row, "is")
            dot = is_at + int(np.argmax(row[is_at:] == ids["."]))
            da, db, ns = plus - 1, ask - plus - 1, dot - is_at - 1
            for j in range(ns):
                sig = ns - 1 - j
                if sig < da:
                    out[r, is_at + j, 0] = da - sig
                if sig < db:
                    out[r, is_at + j, 1] = plus + db - sig
        else:
            raise ValueError(f"no source rule for task {task!r}")
    return out


# ----------------------------------------------------------------------------- probes

def head_stats(pattern: np.ndarray, queries: np.ndarray, src: np.ndarray, T: int) -> dict[str, np.ndarray]:
    """Per (layer, head), each ``[layers, h]``, from per-sequence patterns ``[b, layers, h, i, j]`` (NaN: none):
    source hits over sourced queries (all, and at positions >= T), the most common source and peak offsets,
    the mean weight on the source, and over sourced queries at positions >= T the slope of the argmax key on the query
    position, the share of argmax keys < T and the mass on keys < T minus a uniform head's T / (i + 1)."""
    b, n_layers, h, s, _ = pattern.shape
    am = pattern.argmax(-1)  # [b, layers, h, i]
    i = np.broadcast_to(np.arange(s), (b, s))
    sourced = (src >= 0).any(-1) & queries  # [b, i]
    past = sourced & (i >= T)  # the pinning probe reads the queries that have a source to find
    nearest = np.where(src >= 0, src, 10 ** 6)  # [b, i, 2]
    out = {k: np.full((n_layers, h), np.nan) for k in
           ("hit", "hit_out", "src_offset", "src_mass", "peak_offset", "slope_out", "in_trained_out",
            "mass_excess_out")}
    for layer in range(n_layers):
        for head in range(h):
            k = am[:, layer, head]  # [b, i]
            w = pattern[:, layer, head]  # [b, i, j]
            if sourced.any():
                hit = ((k[..., None] == src) & (src >= 0)).any(-1)
                out["hit"][layer, head] = hit[sourced].mean()
                if (sourced & past).any():
                    out["hit_out"][layer, head] = hit[sourced & past].mean()
                gap = k[..., None] - nearest  # [b, i, 2]
                off = np.take_along_axis(gap, np.abs(gap).argmin(-1)[..., None], -1)[..., 0]
                out["src_offset"][layer, head] = _mode(off[sourced])
                on_src = np.where(src >= 0, np.take_along_axis(w, np.maximum(src, 0), -1), 0.0).sum(-1)
                out["src_mass"][layer, head] = on_src[sourced].mean()
            if queries.any():
                out["peak_offset"][layer, head] = _mode((k - i)[queries])
            if past.any():
                qi, kk = i[past], k[past]
                out["slope_out"][layer, head] = np.polyfit(qi, kk, 1)[0] if len(set(qi)) > 1 else np.nan
                out["in_trained_out"][layer, head] = (kk < T).mean()
                out["mass_excess_out"][layer, head] = (w[:, :, :T].sum(-1)[past] - T / (qi + 1)).mean()
    return out


def _mode(values: np.ndarray) -> float:
    vals, counts = np.unique(values, return_counts=True)
    return float(vals[counts.argmax()])


def _num(v) -> float | None:
    return None if v is None or np.isnan(v) else float(v)


def evaluate(ctx) -> list[dict]:
    """Per length: per-token accuracy and exact match over the output, and per-token accuracy on sourced outputs
    at positions >= T; per layer and head (not under the clamp): :func:`head_stats`; and the member's copy head."""
    study, model, task = ctx.study, ctx.model, ctx.task
    Lmax, T = study.train.max_length, task.max_tokens(study.train.max_length)
    clamp = ctx.member.variant == "clamp"
    if clamp:  # clamp-to-last: positions >= T read row T - 1 (evaluate-only, as the phenomenon study's)
        W = model.encoding.W_pos
        model.encoding.W_pos = nn.Parameter(torch.cat([W[:T], W[T - 1].expand(len(W) - T, -1)]))
    ids = dict(task=study.task_type, encoding=study.encoding, clamp=clamp, chance=float(task.chance), T=T,
               max_length=Lmax)
    rows, heads = [], []
    longest = max(study.eval.lengths)
    for L in study.eval.lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, exact, right_out, n_out, patterns, srcs, masks = [], [], 0, 0, [], [], []
        with torch.no_grad():
            for part, inter in over_chunks(model, batch, study.eval.chunk):
                assert inter.logits is not None  # collect sets them
                pred = aligned_logits(inter.logits, part).argmax(-1)  # [b, s]
                a, e = sequence_scores(pred, part)
                acc.append(a)
                exact.append(e)
                src = sources(study.task_type, part.tokens.cpu().numpy(), task.ids)
                mask = part.loss_mask.cpu().numpy()
                out_q = mask & (src >= 0).any(-1) & (np.arange(mask.shape[1]) >= T)
                right_out += int(((pred == part.targets).cpu().numpy() & out_q).sum())
                n_out += int(out_q.sum())
                if not clamp:
                    p = inter.prefix  # a BOS vector, if any, is no token: keys and queries from the first token
                    patterns.append(np.stack([lay.pattern[:, :, p:, p:].double().cpu().numpy()
                                              for lay in inter.layers], 1))  # [b, layers, h, i, j]
                    srcs.append(src)
                    masks.append(mask)
        rows.append(dict(ids, probe="length", length=L, in_range=L <= Lmax, tokens=int(batch.tokens.shape[1]),
                         accuracy=float(torch.cat(acc).nanmean()), exact=float(torch.cat(exact).nanmean()),
                         src_accuracy_out=right_out / n_out if n_out else None))
        if not clamp:
            got = head_stats(np.concatenate(patterns), np.concatenate(masks), np.concatenate(srcs), T)
            heads += [dict(ids, probe="head", length=L, in_range=L <= Lmax, longest=L == longest, layer=layer,
                           head=h, **{k: _num(v[layer, h]) for k, v in got.items()})
                      for layer in range(got["hit"].shape[0]) for h in range(got["hit"].shape[1])]
    return rows + heads + ([] if clamp else [member_row(heads, Lmax, ids)])


def member_row(heads: list[dict], Lmax: int, ids: dict) -> dict:
    """The copy head (most source hits over the trained lengths) and its numbers past training; tags its rows."""
    best = _copy_head(heads)
    mine = sorted((r for r in heads if (r["layer"], r["head"]) == best), key=lambda r: r["length"])
    for r in heads:
        r["copy_head"] = (r["layer"], r["head"]) == best
    unseen = [r for r in mine if not r["in_range"]]
    return dict(ids, probe="member", head_name=f"{best[0]}.{best[1]}", layer=best[0], head=best[1],
                hit_trained=_avg([r for r in mine if r["in_range"]], "hit"), hit_unseen=_avg(unseen, "hit"),
                hit_out=_avg(unseen, "hit_out"), slope_out=_avg(unseen, "slope_out"),
                in_trained_out=_avg(unseen, "in_trained_out"), pinned=_pinned(unseen),
                src_offsets=" ".join(_fmt(r["src_offset"]) for r in unseen),
                peak_offsets=" ".join(_fmt(r["peak_offset"]) for r in unseen))


def _copy_head(heads: list[dict]) -> tuple[int, int]:
    """(layer, head) with the most source hits on average over the trained lengths (the first of a tie)."""
    trained = [r for r in heads if r["in_range"] and r["hit"] is not None]
    names = sorted({(r["layer"], r["head"]) for r in heads})
    return max(names, key=lambda p: np.mean([r["hit"] for r in trained if (r["layer"], r["head"]) == p] or [-1]))


def _avg(rs: list[dict], col: str) -> float | None:
    vals = [r[col] for r in rs if r[col] is not None]
    return float(np.mean(vals)) if vals else None


def _pinned(unseen: list[dict]) -> bool:
    """Whether the copy head's peak stays in the trained range, flat, at every unseen length that has a
    query past T."""
    # an unseen length whose sequences end at or before T has no query past T (copy at L = 21: 43 tokens,
    # T = 43): nothing to measure there, so pinning is judged on the unseen lengths that have one
    measured = [r for r in unseen if r["slope_out"] is not None]
    return bool(measured) and all(abs(r["slope_out"]) < SLOPE_MAX and r["in_trained_out"] >= PINNED_SHARE
                                  for r in measured)


def _fmt(v: float | None) -> str:
    return "-" if v is None else str(int(v))


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    s = {t: study.settings[t] for t in study.axis("setting")}
    scale = "; ".join(f"{t}: trained on {v['train.min_length']}-{v['train.max_length']}, evaluated at "
                      f"{', '.join(map(str, v['eval.lengths']))}" for t, v in s.items())
    first = next(iter(s.values()))
    intro = (f"Mean ± std over seeds 0..{study.seeds - 1}. Causal decoder, {first.get('model.n_layers')} layers, "
             f"d_model = {first.get('model.d_model')}, {first.get('model.n_heads')} heads; "
             f"{first.get('train.steps')} steps of batch {first.get('train.batch_size')} (lr "
             f"{first.get('train.lr'):g}); {study.eval.n_sequences} sequences per length. {scale}. Lengths are the "
             "task's unit (copy: input symbols; addition: digits of the longer operand). clamp = True: learned APE "
             "re-evaluated with every table row >= T replaced by row T - 1. Learned APE is role paper for the "
             "seed's APE statements (they hold for any absolute table); RoPE and NoPE are controls (the seed's "
             "RoPE statement is for a fixed offset). The paper preset is Kazemnejad et al.'s model and trainer.")
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=judge_all(CLAIMS, rows, GATE), intro=intro,
                         tables=TABLES, figures=FIGURES, csv_rows=select(rows, "length"),
                         csvs={"heads.csv": "head", "members.csv": "member"})


EXPERIMENT = Trained(name="lengthgen-probes", title="Next step: the seed's probes on copy and addition (source "
                                                       "hits, peak offsets and APE pinning past the training length)",
                        base=BASE, presets=PRESET_CHANGES, evaluate=evaluate, report=report, check=lg.check,
                        table_length=lg.table_length)
