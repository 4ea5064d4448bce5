"""K = 1 of the seed paper: the immediate neighbour needs no pre-rotation. RoPE retrieval heads
(Table 1 protocol) with K in {1, 2, 3}; per member the carrier alignment at delta = 0 and -K,
the self-logit against the target's attention, and the content covariance of Remark 1. What each
probe and claim reads is explained in docs/table1-k1-controls.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from poslab import probes
from poslab.experiments import Trained
from poslab.experiments.config import QUICK, StudyConfig
from poslab.experiments.outputs import Column, Lines, Table, joined, select, write_outputs
from poslab.experiments.spec import (
    ClaimSpec,
    InRange,
    Ref,
    at_least,
    is_,
    judge_all,
    mean,
    neg,
    probe,
    seed_states,
    share,
)
from poslab.probes.weights import content_covariance
from poslab.studies.kit.fixed_offset import EXTRAPOLATION, length_rows
from poslab.tasks import eval_batch

K1 = probe("member") & is_("K", 1)
PRE = probe("member") & at_least("K", 2)
# what each claim is (its role follows: experiments/spec.role_of)
K1_PARAGRAPH = seed_states("K = 1 paragraph: for the immediate neighbor the carriers are near-parallel (kernel "
                           "centered at 0) and suppressing the self-logit suffices, via the content covariance of "
                           "Remark 1")
PRE_ROTATION = seed_states("K = 1 paragraph / Lemma 2: the explicit pre-rotation appears only for K >= 2")
# the learned-in-range gate: the study states no in-range line, so the project's default 0.9, per K
GATE = InRange(where=probe("length") & is_("in_range", True), column="accuracy", threshold=0.9, match=("K",),
               text="in-range accuracy (L <= L_max, mean over seeds and lengths)")
GATED = ("2026-12-07: the learned-in-range gate (issue 53): a claim on a trained head's mechanism is n.a. where its "
         "models did not learn the task in range")
DECIDED = "2026-12-07: judged where the task decides (issue 53), was n.a. (undecidable): "
CLAIMS = [
    ClaimSpec(name="K=1: carrier profile argmax over delta <= 0 at 0 (kernel centred at 0)",
              paper="near-parallel carriers, kernel centred at 0", where=K1, per=("K",),
              measure=share("profile_peak", "==", 0), op=">=", threshold=1.0, percent=True, source=K1_PARAGRAPH,
              setting="seed", trained=True, revised=GATED, note="share of {seeds} seeds"),
    ClaimSpec(name="K=1: attention at delta = -1 exceeds attention at delta = 0 (L = L_max)",
              paper="self-logit suppressed", where=K1, per=("K",),
              measure=share("target_weight", ">", Ref("self_weight")), op=">=", threshold=1.0, percent=True,
              source=K1_PARAGRAPH, setting="seed", trained=True, revised=GATED, note="share of {seeds} seeds"),
    ClaimSpec(name="K=1: content covariance (diag - off-diag of G at delta = 0, in std of G)",
              paper="suppresses the self-logit (Remark 1)", where=K1, per=("K",), measure=mean("content_covariance"),
              op="<", threshold=0.0, source=K1_PARAGRAPH, setting="seed", trained=True, revised=GATED,
              note="mean over {seeds} seeds"),
    ClaimSpec(name="K=1: cos(m_Q, R_0 m_K)", paper="near-parallel", where=K1, per=("K",), measure=mean("cos_0"),
              op=">", threshold=0.5, source=K1_PARAGRAPH, setting="seed", trained=True,
              revised=DECIDED + "'near-parallel' by the carrier-alignment bar the validation study judges cos(m_Q, "
                                "R_-K m_K) by (> 0.5), this claim's original line (fb03655); " + GATED[12:],
              note="mean over {seeds} seeds; > 0.5: validation's bar for an aligned carrier"),
    ClaimSpec(name="K=1: attention at delta = 0 minus a uniform head's 1/L (L = L_max)", paper="suppressed",
              where=K1, per=("K",), measure=mean("self_minus_uniform"), op="<", threshold=0.0, source=K1_PARAGRAPH,
              setting="seed", trained=True,
              revised=DECIDED + "'suppressed' by this claim's original line, attention at delta = 0 below a "
                                "uniform head's 1/L (fb03655); " + GATED[12:],
              note="mean over {seeds} seeds; < 0: the self-key gets less than a uniform head's 1/L"),
    ClaimSpec(name="K={K}: carrier pre-rotated to the target: profile argmax over delta <= 0 is -K",
              paper="yes (K >= 2)", where=PRE, per=("K",), measure=share("profile_peak", "==", neg("K")), op=">=",
              threshold=1.0, percent=True, source=PRE_ROTATION, setting="seed", trained=True, revised=GATED,
              note="share of {seeds} seeds"),
    ClaimSpec(name="K={K}: cos(m_Q, R_-K m_K) - cos(m_Q, R_0 m_K)", paper="pre-rotation: first > second",
              where=PRE, per=("K",), measure=mean("cos_target_minus_0"), op=">", threshold=0.0, source=PRE_ROTATION,
              setting="seed", trained=True, revised=GATED, note="mean over {seeds} seeds"),
]

TABLES = [Table("Carriers, self-logit and content covariance by K (probes at L = L_max)", by=("K",),
                where=probe("member"),
                columns=(Column("cos(m_Q, R_0 m_K)", "cos_0"), Column("cos(m_Q, R_-K m_K)", "cos_target"),
                         Column("profile argmax per seed", joined("profile_peak")),
                         Column("attention at delta=0", "self_weight"),
                         Column("1/L", lambda g: f"{g[0]['uniform']:.4f}"), Column("attention at -K", "target_weight"),
                         Column("content covariance", "content_covariance"), Column("key carrier", "carrier_k"),
                         Column("accuracy at the longest length", "accuracy_longest")))]
PLOTTED = {"cos_0": "cos(m_Q, R_0 m_K)", "cos_target": "cos(m_Q, R_-K m_K)", "content_covariance": "content covariance"}
FIGURES = [Lines("k1.png", x="K", y="value", series=("quantity",), where=probe("plot"), hline=0.0, ylabel="")]


# Paper preset: the Table 2 protocol (5 seeds, 4000 steps) with K in {1, 2, 3}.
BASE = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(m=20), grid={"task.K": (1, 2, 3)},
                   seeds=5)
PRESETS = {"paper": {}, "quick": QUICK}


def evaluate(ctx) -> list[dict]:
    study, model, K = ctx.study, ctx.model, ctx.task.K
    rows = length_rows(ctx)
    Lmax = study.train.max_length
    batch = eval_batch(ctx.task, Lmax, study.eval.n_sequences, study.eval.seed, device=ctx.device)
    offsets = np.arange(-(Lmax - 1), 1)
    profile = probes.carrier_profile(model, batch, offsets)
    cos = probes.carrier_profile(model, batch, [0, -K], normalize=True)
    at = {r["offset"]: r["weight"] for r in select(rows, "attention", length=Lmax)}
    rows.append(dict(probe="member", cos_0=float(cos[0]), cos_target=float(cos[1]),
                     profile_peak=int(offsets[int(np.argmax(profile))]), self_weight=at.get(0, float("nan")),
                     target_weight=at.get(-K, float("nan")), uniform=1 / Lmax,
                     content_covariance=content_covariance(model), carrier_k=probes.carrier(model, batch)["carrier_k"]))
    return rows


def derived(rows: list[dict], longest: int) -> list[dict]:
    """Member rows with the differences the claims read and the member's accuracy at ``longest``."""
    acc = {(r["K"], r["seed"]): r["accuracy"] for r in select(rows, "length") if r["length"] == longest}
    return [{**r, "self_minus_uniform": r["self_weight"] - r["uniform"],
             "cos_target_minus_0": r["cos_target"] - r["cos_0"], "accuracy_longest": acc.get((r["K"], r["seed"]))}
            for r in select(rows, "member")]


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    longest = max(study.eval.lengths)
    members = derived(rows, longest)
    plot = [dict(probe="plot", K=r["K"], seed=r["seed"], quantity=label, value=r[key])
            for r in members for key, label in PLOTTED.items()]
    intro = (f"RoPE, mean ± std over seeds 0..{study.seeds - 1}; {study.train.steps} steps, lengths in "
             f"[{study.train.min_length}, {study.train.max_length}] drawn per {study.train.length_sampling}. Probes "
             f"at L = {study.train.max_length}; accuracy at L = {longest}.")
    claims = judge_all(CLAIMS, members + select(rows, "length"), GATE)  # the length rows: the gate's in-range score
    return write_outputs(out, title=EXPERIMENT.title, rows=members + plot, claims=claims,
                         intro=intro, tables=TABLES, figures=FIGURES, csv_rows=select(rows, "length"),
                         csvs={"members.csv": "member"})


EXPERIMENT = Trained(name="k1", title="K = 1: near-parallel carriers and a suppressed self-logit, against K = 2 "
                                         "and K = 3", base=BASE, presets=PRESETS,
                     evaluate=evaluate, report=report, in_run_all=True,
                        extrapolation=EXTRAPOLATION)
