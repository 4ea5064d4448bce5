"""The seed paper's second next step: "a true two-layer induction circuit (Olsson et al., 2022),
where a content match rather than a query token sets the offset". Section 5.2's model (two
layers, four heads, MLP and LayerNorm) on the induction task (:mod:`poslab.tasks.induction`:
a distinct random prefix, then repeated; predict the token after the earlier occurrence of the
current one), per encoding (RoPE, learned APE, NoPE, ALiBi, T5), trained at L in [8, 16] and
evaluated to L = 48.

Probes per layer and head at every length, from the mean attention pattern: the share of
attention at offset -1 and the share of queries whose argmax key is the previous token (the
previous-token head, layer 1), the same for the key after the earlier occurrence of the query's
token (the induction head, layer 2: a content match, its offset -(P - 1) moves with L), and the
last query's peak offset. Queries are split at the training length (t < 16, t >= 16). Each
member's previous-token head is its layer-1 head with the most attention at -1 over the trained
lengths, its induction head the layer-2 head with the most attention on the induction key.
Set-up, criteria and results: docs/next-steps.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from poslab import probes
from poslab.experiments import Trained
from poslab.experiments.config import QUICK, EvalConfig, Preset, StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, joined, select, write_outputs
from poslab.experiments.spec import (
    ClaimSpec,
    InRange,
    at_most,
    is_,
    judge_all,
    mean,
    minimum,
    next_step,
    probe,
    seed_states,
)
from poslab.positional import encoding_class
from poslab.probes.common import split_batch
from poslab.studies.kit.depth_probes import argmax_share, offset_share
from poslab.tasks import eval_batch
from poslab.tasks.scoring import sequence_scores
from poslab.train import TrainConfig

ENCODINGS = ("rope", "learned", "nope", "alibi", "t5")
RELATIVE = ("rope", "alibi", "t5")  # a relative offset reaches the logits: the account predicts transfer
LMAX, LONGEST = 16, 48
TRAINED = probe("length") & at_most("length", LMAX)
MEMBER = probe("member")
CONTROL_NOTE = "; the seed's statement in another setting (a next step's task): a control"
PREDICTION_NOTE = "; no seed states this outcome (the seed names the step): a prediction"
PREDICTS = {"rope": "transfers (a relative offset, Lemma 1)", "alibi": "transfers (relative bias)",
            "t5": "transfers (relative bias; distance 1 is a trained bucket)",
            "nope": "transfers if causal masking induces relative structure (the seed's next step 1)",
            "learned": "does not transfer (absolute rows past 16 are untrained: Proposition 2)"}
# what each claim is (its role follows: experiments/spec.role_of). The task is a next step's: the seed names "a true
# two-layer induction circuit", not its outcome. Its statements measured here (RoPE generalizes and APE degrades in
# Section 5.2's two-layer model, the relative biases in Section 5.1, the trained heads near-perfect in range) are in
# another setting: controls; the circuit itself and NoPE's outcome no seed states: a next step's predictions
STEP = next_step("seed 000, limitations: a true two-layer induction circuit (Olsson et al., 2022), where a content "
                 "match sets the offset; the seed names the step, not its outcome")
IN_RANGE = {"rope": seed_states("Table 1 / Section 5.2: the trained RoPE models are near-perfect in range"),
            "learned": seed_states("Table 1 / Section 5.2: APE ~1 in range"),
            "alibi": seed_states("Section 5.1: the ALiBi/T5/rotary comparison (the account is not RoPE-specific)"),
            "nope": STEP}
IN_RANGE["t5"] = IN_RANGE["alibi"]
TRANSFER = {"rope": seed_states("Section 5.2: in a two-layer, four-head transformer with MLP and LayerNorm RoPE "
                                "generalizes and its head remains offset-equivariant out of distribution"),
            "learned": seed_states("Section 5.2 / Proposition 2: APE degrades out of range, the APE head pins"),
            "alibi": IN_RANGE["alibi"], "t5": IN_RANGE["alibi"], "nope": STEP}
# the learned-in-range gate: the study's own in-range line (accuracy on the second copy at L <= 16, >= 0.95)
GATE = InRange(where=TRAINED, column="accuracy", threshold=0.95, match=("encoding",),
               text="accuracy on the second copy at trained lengths (L ≤ 16, mean over seeds and lengths)")
ROLE_REVISED = "2026-12-07: role computed from source x setting (issue 53): "
WAS = {"rope": "paper", "nope": "control", "learned": "control", "alibi": "control", "t5": "control"}
GATED = ("2026-12-07: the learned-in-range gate (issue 53): a claim past the range or on a trained head is n.a. "
         "where its models did not learn the task in range")


def _revised(source, was: str, trained: bool) -> str | None:
    role = "prediction" if source.kind == "next-step" else "control"
    why = {"prediction": "no seed states this outcome (a next step's prediction)",
           "control": "the seed's statement in a next step's task (another setting)"}[role]
    notes = ([ROLE_REVISED + why] if role != was else []) + ([GATED] if trained else [])
    return "; ".join(notes) or None


def per_encoding(name: str, paper: str, where, measure, op: str, threshold: float, note: str,
                 sources: dict, was: dict, trained: bool) -> list[ClaimSpec]:
    """One claim per encoding, its role from what the claim is for that encoding (``sources``)."""
    return [ClaimSpec(name=name, paper=paper, where=where & is_("encoding", e), per=("encoding",), measure=measure,
                      op=op, threshold=threshold, source=sources[e], setting="other", trained=trained,
                      revised=_revised(sources[e], was[e], trained),
                      note=note + (PREDICTION_NOTE if sources[e].kind == "next-step" else CONTROL_NOTE))
            for e in ENCODINGS]


CLAIMS = [
    *per_encoding("{encoding}: accuracy on the second copy at trained lengths (L ≤ 16)",
                  "a two-layer induction circuit", TRAINED, mean("accuracy"), ">=", 0.95,
                  "mean over {seeds} seeds and the trained lengths; the study's learned-in-range gate", IN_RANGE,
                  WAS, trained=False),
    *per_encoding("{encoding}: layer-1 previous-token head, queries whose argmax key is t - 1 (L ≤ 16)",
                  "the previous-token head attends at offset -1 (layer 1)", MEMBER, mean("prev_argmax_trained"), ">=",
                  0.9, "mean over {seeds} seeds; each seed's layer-1 head with most attention at -1",
                  dict.fromkeys(ENCODINGS, STEP), WAS, trained=True),
    *per_encoding("{encoding}: layer-2 induction head, second-copy queries whose argmax key is the token after "
                  "the earlier occurrence (L ≤ 16)", "a content match sets the offset (layer 2)", MEMBER,
                  mean("ind_argmax_trained"), ">=", 0.9,
                  "mean over {seeds} seeds; each seed's layer-2 head with most attention on that key",
                  dict.fromkeys(ENCODINGS, STEP), WAS, trained=True),
    *[ClaimSpec(name="{encoding}: previous-token head past the training length, queries t ≥ 16 (L > 16) whose "
                     "argmax key is t - 1", paper=PREDICTS[e], where=MEMBER & is_("encoding", e), per=("encoding",),
                measure=mean("prev_argmax_unseen"), op=">=" if e != "learned" else "<",
                threshold=0.9 if e != "learned" else 0.5, source=TRANSFER[e], setting="other", trained=True,
                revised=_revised(TRANSFER[e], "paper" if e in ("rope", "nope") else "control", True),
                note="mean over {seeds} seeds" + ("; the NoPE hypothesis, judged with the relative line"
                                                  + PREDICTION_NOTE if e == "nope" else CONTROL_NOTE))
      for e in ENCODINGS],
    *[ClaimSpec(name="{encoding}: accuracy on the second copy at L = 48 (every position)",
                paper="RoPE generalizes (Section 5.2's line)" if e != "learned" else "APE degrades out of range",
                where=probe("length") & is_("length", LONGEST) & is_("encoding", e), per=("encoding",),
                measure=mean("accuracy" if e != "learned" else "accuracy_out"), op=">=" if e != "learned" else "<",
                threshold=0.9 if e != "learned" else 0.5, source=TRANSFER[e], setting="other", trained=True,
                revised=_revised(TRANSFER[e], "paper" if e in ("rope", "nope") else "control", True),
                note="mean over {seeds} seeds; two-layer's lines (≥ 0.9 relative; < 0.5 at t ≥ 16 for APE)"
                     + (PREDICTION_NOTE if e == "nope" else CONTROL_NOTE))
      for e in ENCODINGS],
    *[ClaimSpec(name="{encoding}: lowest accuracy at positions t ≥ 16 over the unseen lengths", paper="(shown)",
                where=probe("length") & is_("in_range", False) & is_("encoding", *encodings), per=("encoding",),
                measure=minimum("accuracy_out", by=("length",)), op=">=", threshold=0.9, source=source,
                setting="other", trained=True, revised=_revised(source, "control", True),
                note="mean over {seeds} seeds at each length, its lowest; positions past the training length only"
                     + (PREDICTION_NOTE if source is STEP else CONTROL_NOTE))
      for encodings, source in ((RELATIVE, TRANSFER["rope"]), (("nope",), STEP))],
]

TABLES = [
    Table("Accuracy on the second copy by length (all second-copy positions)", by=("encoding",),
          where=probe("length"), pivot=Pivot("length", "accuracy", "L={}")),
    Table("Accuracy at positions past the training length (t ≥ 16)", by=("encoding",),
          where=probe("length") & is_("in_range", False), pivot=Pivot("length", "accuracy_out", "L={}")),
    Table("Exact match of the whole second copy by length", by=("encoding",), where=probe("length"),
          pivot=Pivot("length", "exact_match", "L={}")),
    Table("The previous-token and induction heads of each seed", by=("encoding", "seed"), where=MEMBER,
          intro="prev = layer-1 head (layer.head) with most attention at -1 over L ≤ 16; argmax@-1: share of "
                "queries whose argmax key is t - 1 (trained: t < 16, L ≤ 16; unseen: t ≥ 16, L > 16); "
                "share@-1: mean attention at -1 (same split); last-query peak offsets by length. ind = layer-2 "
                "head with most attention on the key after the earlier occurrence; argmax: share of second-copy "
                "queries whose argmax key is that one (same split).",
          columns=(Column("prev", joined("prev_head")), Column("argmax@-1 trained", "prev_argmax_trained"),
                   Column("argmax@-1 unseen", "prev_argmax_unseen"), Column("share@-1 trained", "prev_share_trained"),
                   Column("share@-1 unseen", "prev_share_unseen"), Column("last-query peaks", joined("prev_peaks")),
                   Column("ind", joined("ind_head")), Column("ind argmax trained", "ind_argmax_trained"),
                   Column("ind argmax unseen", "ind_argmax_unseen"))),
    Table("Last query's peak offset per layer and head at L = 48 (mean over seeds; heads.csv has every length)",
          by=("encoding", "layer", "head"), where=probe("head") & is_("length", LONGEST),
          columns=(Column("peak offset", "peak_offset", 1), Column("share@-1", "prev_share_all"),
                   Column("argmax@-1", "prev_argmax_all"), Column("induction share", "ind_share_all"))),
]
FIGURES = [
    Lines("accuracy.png", x="length", y="accuracy", series=("encoding",), where=probe("length"), vline=LMAX,
          ylim=(-0.02, 1.02), xlabel="evaluation length L", ylabel="accuracy on the second copy"),
    Lines("previous_token_head.png", x="length", y="prev_argmax_all", series=("encoding",),
          where=probe("head") & is_("role_head", "previous"), vline=LMAX, ylim=(-0.02, 1.02),
          xlabel="evaluation length L", ylabel="previous-token head: queries with argmax at t - 1"),
    Lines("induction_head.png", x="length", y="ind_argmax_all", series=("encoding",),
          where=probe("head") & is_("role_head", "induction"), vline=LMAX, ylim=(-0.02, 1.02),
          xlabel="evaluation length L", ylabel="induction head: second-copy queries with argmax on the answer's key"),
]


# Paper preset: Section 5.2's model and recipe (d_model = 256, four heads, 2000 steps of batch 64, Adam 1e-3, L in
# [8, 16]) on induction over m = 64 tokens, 3 seeds, 512 sequences at each of 8 .. 48. ``cpu``: d_model = 64
# (d_head = 16, Section 5.2's control width), 2 seeds, 1000 steps, 256 sequences a length.
BASE = StudyConfig(model_type="transformer", model=dict(d_model=256, n_layers=2, n_heads=4, layer_norm=True),
                   task_type="induction", task=dict(m=64), grid={"encoding": ENCODINGS}, seeds=3,
                   train=TrainConfig(steps=2000, batch_size=64, lr=1e-3, min_length=8, max_length=LMAX),
                   eval=EvalConfig(lengths=(8, 12, 16, 20, 24, 32, 40, 48), n_sequences=512, chunk=256))
PRESETS: dict[str, Preset] = {"paper": {},
           "quick": {**QUICK, "train.steps": 30, "train.batch_size": 16, "seeds": 1, "model.d_model": 32,
                     "eval.lengths": (8, 16, 24), "eval.n_sequences": 32},
           "cpu": {"model.d_model": 64, "seeds": 2, "train.steps": 1000, "eval.n_sequences": 256}}


def scores(model, batch, Lmax: int, chunk: int) -> dict:
    """Accuracy over every target, targets at t < Lmax and at t >= Lmax, and exact match of the second copy."""
    hits, total, exact = np.zeros(2), np.zeros(2), []
    with torch.no_grad():
        for part in split_batch(batch, chunk, next(model.parameters()).device):
            pred = model(part.tokens, lengths=part.lengths).argmax(-1)  # [b, s]
            ok = (pred == part.targets) & part.loss_mask
            t = torch.arange(ok.shape[1], device=ok.device)
            for i, where in enumerate((t < Lmax, t >= Lmax)):
                hits[i] += float(ok[:, where].sum())
                total[i] += float(part.loss_mask[:, where].sum())
            exact += sequence_scores(pred, part)[1].tolist()
    split = [h / n if n else None for h, n in zip(hits, total, strict=True)]
    return dict(accuracy=float(hits.sum() / total.sum()), accuracy_in=split[0], accuracy_out=split[1],
                exact_match=float(np.mean(exact)))


def head_probes(pattern: np.ndarray, L: int, Lmax: int) -> dict[str, np.ndarray]:
    """Per (layer, head), each ``[layers, h]``: attention at -1 and argmax share at t - 1 over queries t >= 1
    (all, t < Lmax, t >= Lmax); the same for the induction key t - P + 1 over second-copy queries t >= P."""
    t = np.arange(L)
    P = (L + 1) // 2
    prev_q, ind_q = t >= 1, t >= P
    ind_key = t - P + 1
    out = {}
    for split, where in (("all", np.ones(L, bool)), ("in", t < Lmax), ("out", t >= Lmax)):
        out[f"prev_share_{split}"] = offset_share(pattern, -1, prev_q & where)
        out[f"prev_argmax_{split}"] = argmax_share(pattern, t - 1, prev_q & where)
        q = ind_q & where
        out[f"ind_share_{split}"] = np.nanmean(pattern[:, :, t[q], ind_key[q]], -1) if q.any() \
            else np.full(pattern.shape[:2], np.nan)
        out[f"ind_argmax_{split}"] = argmax_share(pattern, ind_key, q)
    return out


def evaluate(ctx) -> list[dict]:
    study, task, model = ctx.study, ctx.task, ctx.model
    Lmax, lengths = study.train.max_length, sorted(study.eval.lengths)
    enc = dict(kind=encoding_class(study.encoding).kind)
    rows, heads = [], []
    for L in lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        rows.append(dict(probe="length", length=L, in_range=L <= Lmax, chance=task.chance, **enc,
                         **scores(model, batch, Lmax, study.eval.chunk)))
        pattern = probes.mean_pattern(model, batch, chunk=study.eval.chunk)  # [layers, h, L, L]
        got = head_probes(pattern, L, Lmax)
        for layer in range(pattern.shape[0]):
            for h in range(pattern.shape[1]):
                heads.append(dict(probe="head", length=L, layer=layer, head=h, **enc,
                                  **{k: _num(v[layer, h]) for k, v in got.items()},
                                  **probes.peak(pattern[layer, h, L - 1], L)))
    return rows + heads + [member_row(heads, Lmax, **enc)]


def member_row(heads: list[dict], Lmax: int, **extra) -> dict:
    """The member's previous-token head (layer 0) and induction head (layer 1), chosen over the trained
    lengths, and their numbers at trained and unseen lengths; tags those heads' rows with ``role_head``."""
    def pick(layer: int, column: str) -> int:
        mine = [r for r in heads if r["layer"] == layer and r["length"] <= Lmax and r[column] is not None]
        return max({r["head"] for r in mine}, key=lambda h: np.mean([r[column] for r in mine if r["head"] == h]))

    def avg(head: tuple[int, int], column: str, unseen: bool) -> float | None:
        vals = [r[column] for r in heads if (r["layer"], r["head"]) == head and (r["length"] > Lmax) == unseen
                and r[column] is not None]
        return float(np.mean(vals)) if vals else None

    prev, ind = (0, pick(0, "prev_share_in")), (1, pick(1, "ind_share_in"))
    for r in heads:
        r["role_head"] = {prev: "previous", ind: "induction"}.get((r["layer"], r["head"]))
    return dict(probe="member", prev_head=f"{prev[0]}.{prev[1]}", ind_head=f"{ind[0]}.{ind[1]}", **extra,
                prev_argmax_trained=avg(prev, "prev_argmax_in", False),
                prev_argmax_unseen=avg(prev, "prev_argmax_out", True),
                prev_share_trained=avg(prev, "prev_share_in", False),
                prev_share_unseen=avg(prev, "prev_share_out", True),
                prev_peaks=" ".join(str(r["peak_offset"]) for r in heads if r["role_head"] == "previous"),
                ind_argmax_trained=avg(ind, "ind_argmax_in", False), ind_argmax_unseen=avg(ind, "ind_argmax_out", True))


def _num(v) -> float | None:
    return None if np.isnan(v) else float(v)


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    intro = (f"Mean ± std over seeds 0..{study.seeds - 1}. Two layers, {study.model['n_heads']} heads, d_model = "
             f"{study.model['d_model']}, MLP and pre-LayerNorm (Section 5.2's model); induction over m = "
             f"{study.task.get('m', 64)} tokens (a distinct prefix of ceil(L/2), then repeated; targets on the second "
             f"copy); {study.train.steps} steps of batch {study.train.batch_size} (Adam {study.train.lr:g}), lengths "
             f"U[{study.train.min_length}, {study.train.max_length}] per {study.train.length_sampling}; "
             f"{study.eval.n_sequences} sequences per length. RoPE is the seed's encoding (role paper); learned APE "
             "(rows N(0, 0.02²)), ALiBi and T5 are controls; NoPE carries the seed's depth hypothesis.")
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=judge_all(CLAIMS, rows, GATE), intro=intro,
                         tables=TABLES, figures=FIGURES, csv_rows=select(rows, "length"),
                         csvs={"heads.csv": "head", "members.csv": "member"})


EXPERIMENT = Trained(name="induction", title="Next step: a two-layer induction circuit per encoding (does the "
                                                "previous-token head transfer past the training length?)",
                        base=BASE, presets=PRESETS, evaluate=evaluate, report=report)
