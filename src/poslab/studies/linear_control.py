"""Section 7 of the seed paper: trained linear attention against softmax, and a width sweep.

RoPE retrieval heads (Table 1 protocol, K = 2), softmax and linear attention at d = 64 and
linear attention at d = 16 and 32 (softmax at d = 16 the capacity control); the linear score
profile beside its min-norm interpolant. The set-up and the frequency-versus-coefficient
reading are told in docs/validation-linear-survey.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from poslab import probes
from poslab.experiments import Trained
from poslab.experiments.config import QUICK, StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, groups, means, most_common, select, write_outputs
from poslab.experiments.spec import (
    ClaimSpec,
    Extrapolation,
    InRange,
    above,
    at_most,
    below,
    hypothesis,
    is_,
    judge_all,
    mean,
    probe,
    seed_states,
    undecidable,
)
from poslab.studies.kit.fixed_offset import BEYOND, interpolant_figure, length_rows, score_profile_fits
from poslab.tasks import eval_batch

PAPER = dict(linear_in=0.96, linear_48=0.07, softmax_acc=1.00, cos_linear=0.1, cos_softmax=0.83, carrier_linear=0.07,
             carrier_softmax=0.80, baseline=0.016)
SETTINGS = {f"{a} d={d}": {"model.attention": a, "model.d_model": d}
            for a, d in (("softmax", 64), ("linear", 64), ("linear", 32), ("linear", 16), ("softmax", 16))}
INTERPOLANT_CORR = 0.9  # "explained by the min-norm interpolant": off-support agreement, declared here
INTERPOLANT_RCOND = 1e-6  # relative singular-value cutoff of the interpolant (exact pinv: a control column)
LEARNED = 0.95  # a width is judged only once its seed-mean accuracy at the trained lengths reaches this
PAPER_D = is_("d", 64)
LINEAR, SOFTMAX = is_("attention", "linear"), is_("attention", "softmax")
IN_DIST, LONGEST = probe("length") & is_("in_range", True), probe("length") & is_("longest", True)
MEMBER = probe("member")
# what each claim is (its role follows: experiments/spec.role_of)
SECTION_7 = seed_states("Section 7: trained linear attention fits the task in distribution (0.96) by min-norm "
                        "interpolation, carrier cos ~0.1 and key carrier 0.07 against 0.83 and 0.80 under softmax; it "
                        "does not extrapolate (0.07 at L = 48, chance 0.05, softmax 1.00)")
CONDITION = seed_states("Section 7 / related work: removing softmax destroys extrapolation once the rotary frequencies "
                        "outnumber the training offsets; for d > |Delta| the linear profile is underdetermined off "
                        "support, where the min-norm interpolant is generically Theta(1)")
CONTRAST = hypothesis("the converse the seed does not state: with d <= |Delta| the linear profile is determined on "
                      "the training offsets and extrapolation is not destroyed")
# the learned-in-range gate: the study's own line (a width is judged once it reaches LEARNED in distribution)
GATE = InRange(where=IN_DIST, column="accuracy", threshold=LEARNED, match=("attention", "d"),
               text="in-distribution accuracy (L <= L_max, mean over seeds and lengths)")
GATED = ("2026-12-07: the learned-in-range gate (issue 53): a claim past the range or on a trained head's mechanism "
         "is n.a. where its models did not learn the task in range")
ONE_CLAIM = ("2026-12-07: one claim per width, the gate deciding (issue 53): the report's learned / did-not-learn "
             "split (a where on its 'learned' column, and a second claim whose name held the measured in-distribution "
             "accuracy) gives way to the engine's gate, so a width that did not learn is this claim's n.a. 'did not "
             "learn in range'")
CLAIMS = [
    ClaimSpec(name="linear, d=64: accuracy in distribution", paper=str(PAPER["linear_in"]),
              where=IN_DIST & LINEAR & PAPER_D, measure=mean("accuracy"), op="~", threshold=PAPER["linear_in"],
              tol=0.05, source=SECTION_7, setting="seed"),
    ClaimSpec(name="softmax, d=64: accuracy in distribution", paper=str(PAPER["softmax_acc"]),
              where=IN_DIST & SOFTMAX & PAPER_D, measure=mean("accuracy"), op="~", threshold=PAPER["softmax_acc"],
              tol=0.05, source=SECTION_7, setting="seed"),
    ClaimSpec(name="linear, d=64: accuracy at L={length}", paper=f"{PAPER['linear_48']} (chance 0.05)",
              where=LONGEST & LINEAR & PAPER_D, per=("length",), measure=mean("accuracy"), op="<=", threshold=2,
              scale_by="chance", source=SECTION_7, setting="seed", trained=True, revised=GATED,
              note="{seeds} seeds, {n} rows; also Section 7's condition at this width (32 frequencies > 16 training "
                   "offsets): one number, judged once here"),
    ClaimSpec(name="softmax, d=64: accuracy at L={length}", paper=str(PAPER["softmax_acc"]),
              where=LONGEST & SOFTMAX & PAPER_D, per=("length",), measure=mean("accuracy"), op=">=", threshold=0.95,
              source=SECTION_7, setting="seed", trained=True, revised=GATED),
    ClaimSpec(name="linear, d=64: cos(m_Q, R_-K m_K)", paper=f"~{PAPER['cos_linear']}", where=MEMBER & LINEAR & PAPER_D,
              measure=mean("carrier_cos"), op="<", threshold=0.3, source=SECTION_7, setting="seed", trained=True,
              revised=GATED),
    ClaimSpec(name="softmax, d=64: cos(m_Q, R_-K m_K)", paper=str(PAPER["cos_softmax"]),
              where=MEMBER & SOFTMAX & PAPER_D, measure=mean("carrier_cos"), op=">", threshold=0.5, source=SECTION_7,
              setting="seed", trained=True, revised=GATED),
    ClaimSpec(name="linear, d=64: key carrier fraction", paper=f"{PAPER['carrier_linear']} (baseline 0.016 = 1/d)",
              where=MEMBER & LINEAR & PAPER_D, measure=mean("carrier_k"), op="<", threshold=0.2, source=SECTION_7,
              setting="seed", trained=True, revised=GATED),
    ClaimSpec(name="softmax, d=64: key carrier fraction", paper=f"{PAPER['carrier_softmax']} (baseline 0.016 = 1/d)",
              where=MEMBER & SOFTMAX & PAPER_D, measure=mean("carrier_k"), op=">", threshold=0.5, source=SECTION_7,
              setting="seed", trained=True, revised=GATED),
    # Section 7's condition, from the width sweep; at d = 64 it is the claim "linear, d=64: accuracy at L=48"
    # above (the same number, counted once): judged here only at a width above the seed's
    ClaimSpec(name="linear, d={d} ({frequencies} frequencies > {train_offsets} training offsets): "
                   "accuracy at L={length}",
              paper="removing softmax destroys extrapolation once the frequencies outnumber the training offsets",
              where=LONGEST & LINEAR & above("excess_frequencies", 0) & above("d", 64),
              per=("d", "frequencies", "train_offsets", "length"),
              measure=mean("accuracy"), op="<=", threshold=2, scale_by="chance", source=CONDITION, setting="other",
              trained=True,
              revised="2026-12-07: counted once (issue 53): at d = 64 this is the number of 'linear, d=64: accuracy "
                      "at L=48' (withdrawn here), so the condition is judged only at widths above the seed's "
                      "(another setting: control); " + GATED[12:] + "; " + ONE_CLAIM),
    ClaimSpec(name="linear, d={d} ({frequencies} frequencies <= {train_offsets} training offsets, {d} coefficients "
                   "> {train_offsets}): accuracy at L={length}",
              paper="for d > |Delta| the linear profile is underdetermined off support (Section 7's derivation)",
              where=LONGEST & LINEAR & at_most("excess_frequencies", 0) & above("excess_coefficients", 0),
              per=("d", "frequencies", "train_offsets", "length"), measure=mean("accuracy"), op="<=", threshold=2,
              scale_by="chance", source=CONDITION, setting="seed", trained=True, revised=GATED + "; " + ONE_CLAIM),
    ClaimSpec(name="linear, d={d} ({d} coefficients <= {train_offsets} training offsets): accuracy at L={length}",
              paper="implied contrast: with d <= |Delta| the profile is determined and extrapolation not destroyed",
              where=LONGEST & LINEAR & at_most("excess_coefficients", 0),
              per=("d", "frequencies", "train_offsets", "length"), measure=mean("accuracy"), op=">", threshold=2,
              scale_by="chance", source=CONTRAST, setting="seed", trained=True,
              revised="2026-12-07: role computed from source x setting (issue 53): the seed does not state the "
                      "converse, a hypothesis (prediction, was paper); " + GATED[12:] + "; " + ONE_CLAIM),
    ClaimSpec(name="linear, d={d}: accuracy at L={length} read by the frequency count (earlier claim: "
                   "{frequencies} frequencies <= {train_offsets} offsets, so not destroyed)",
              paper="implied contrast of 'once the frequencies outnumber the training offsets'",
              where=LONGEST & LINEAR & at_most("excess_frequencies", 0) & above("excess_coefficients", 0),
              per=("d", "frequencies", "train_offsets", "length"), measure=mean("accuracy"), source=CONTRAST,
              setting="seed",
              revised="2026-12-07: role computed from source x setting (issue 53): the seed does not state the "
                      "converse, a hypothesis (prediction, was paper); " + ONE_CLAIM,
              na=undecidable("the paper's two statements part at this width: its sentence counts frequencies (not "
                             "more than the offsets), its derivation counts the d coefficients of f(delta) = sum_j "
                             "A_j cos(delta theta_j + psi_j) (more than the offsets: underdetermined); the derivation "
                             "is judged in the row above")),
    ClaimSpec(name="linear, d={d}: off-support f vs the min-norm interpolant of the on-support f: correlation",
              paper="fits the task by min-norm interpolation across rotary frequencies",
              where=MEMBER & LINEAR & above("excess_frequencies", 0), per=("d",),
              measure=mean("off_support_corr"), op=">=", threshold=INTERPOLANT_CORR, source=SECTION_7,
              setting="seed", trained=True, revised=GATED + "; " + ONE_CLAIM),
    ClaimSpec(name="linear, d={d}: mean abs(f) off support / f(-K)",
              paper="the min-norm interpolant is Theta(1) off support",
              where=MEMBER & LINEAR, per=("d",), measure=mean("off_support_scale"), source=CONDITION, setting="seed",
              na=undecidable("Theta(1) is an asymptotic statement with no finite threshold; the number is shown")),
    ClaimSpec(name="softmax, d={d}: accuracy at L={length} (capacity control for the sweep)",
              paper=f"softmax extrapolates ({PAPER['softmax_acc']} at d = 64)",
              where=LONGEST & SOFTMAX & below("d", 64), per=("d", "length"), measure=mean("accuracy"),
              op=">=", threshold=0.95, source=SECTION_7, setting="other", trained=True,
              revised=GATED + "; " + ONE_CLAIM,
              note="{seeds} seeds; the paper runs softmax at d = 64 only: the d = 64 criterion at a width the linear "
                   "sweep uses, to separate width from normalization"),
]
TABLES = [
    Table("Accuracy by length", by=("setting", "attention", "d", "frequencies", "train_offsets"),
          where=probe("length"), pivot=Pivot("length", "accuracy", "L={}"),
          columns=(Column("in distribution", mean("in_dist_accuracy")), Column("learned", most_common("learned")))),
    Table("Carrier and score profile", by=("setting",), where=MEMBER, columns=(
        Column("cos(m_Q, R_-K m_K)", "carrier_cos"), Column("key carrier", "carrier_k"),
        Column("untrained (iii)", means("baseline_k")),
        Column("off-support corr(f, interpolant)", "off_support_corr"),
        Column("same, support with delta = 0", "off_support_corr_with_self"),
        Column("same, exact pinv", "off_support_corr_exact"),
        Column("same, nearest the untrained profile", "off_support_corr_from_init"),
        Column("off-support mean abs(f) / f(-K)", "off_support_scale"))),
]
FIGURES = [Lines("accuracy_by_width.png", x="length", y="accuracy", series=("setting",), where=probe("length"),
                 ylim=(0, 1.02), hline=lambda rows: rows[0]["chance"])]


# Paper preset: K = 2, 3 seeds (the paper gives no seed count for Section 7), 4000 steps.
BASE = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(m=20, K=2),
                   grid={"setting": tuple(SETTINGS)}, settings=SETTINGS, seeds=3)
PRESETS = {"paper": {}, "quick": QUICK}


def evaluate(ctx) -> list[dict]:
    study, model, K = ctx.study, ctx.model, ctx.task.K
    Lmax, longest = study.train.max_length, max(study.eval.lengths)
    ids = dict(attention=model.cfg.attention, d=model.cfg.d_head, frequencies=model.cfg.d_head // 2,
               train_offsets=Lmax, excess_frequencies=model.cfg.d_head // 2 - Lmax,
               excess_coefficients=model.cfg.d_head - Lmax)
    rows = length_rows(ctx)
    batch = eval_batch(ctx.task, Lmax, study.eval.n_sequences, study.eval.seed, device=ctx.device)
    trained, base = probes.carrier(model, batch), probes.carrier(ctx.untrained, batch)
    cos = float(probes.carrier_profile(model, batch, [-K], normalize=True)[0])
    fits, scores = score_profile_fits(ctx, rows, INTERPOLANT_RCOND)
    rows += [dict(probe="member", carrier_k=trained["carrier_k"], carrier_q=trained["carrier_q"],
                  baseline_k=base["carrier_k"], carrier_cos=cos, profile_length=longest, **fits), *scores]
    for r in rows:
        r.update(ids)
    for r in select(rows, "length"):
        r["longest"] = r["length"] == longest
    return rows


def learned_flags(rows: list[dict]) -> list[dict]:
    """Every row with its setting's (attention, d) seed-mean accuracy at the trained lengths,
    ``in_dist_accuracy`` (3 decimals), and ``learned``: whether that reaches :data:`LEARNED`."""
    acc = {key: float(np.mean([r["accuracy"] for r in g]))
           for key, g in groups(rows, ("attention", "d"), probe("length") & is_("in_range", True)).items()}
    out = []
    for r in rows:
        a = acc.get((r.get("attention"), r.get("d")))
        out.append(r if a is None else {**r, "in_dist_accuracy": round(a, 3), "learned": a >= LEARNED})
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    Lmax = study.train.max_length
    rows = learned_flags(rows)
    intro = (f"RoPE, K = {study.task.get('K')}; mean ± std over seeds 0..{study.seeds - 1}; {study.train.steps} steps, "
             f"lengths in [{study.train.min_length}, {Lmax}] drawn per {study.train.length_sampling}. Carrier at "
             f"L = {Lmax}. Score profile f(delta): mean logit at offset delta at the longest length; interpolant: "
             f"minimum-norm fit through f at the {Lmax - 1} training offsets delta in [-{Lmax - 1}, -1] "
             f"(singular values below {INTERPOLANT_RCOND:g} x the largest dropped; exact pinv as a control). "
             f"`frequencies` = d/2 rotary frequencies, `train_offsets` = the {Lmax} offsets delta in [-{Lmax - 1}, 0]. "
             f"A width of the sweep is judged only where it learned the task: seed-mean accuracy at L <= {Lmax} "
             f"(`in distribution`) at least {LEARNED:g}; below that its points are n.a. (did not learn).")
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=judge_all(CLAIMS, rows, GATE), intro=intro,
                         tables=TABLES, figures=FIGURES, csv_rows=select(rows, "length"),
                         more_figures=lambda r, o: [interpolant_figure(
                             select(r, "score", attention="linear"), "d", Lmax, "linear attention, d = {}",
                             o / "score_profile.png")], csvs={"members.csv": "member", "profiles.csv": "score"})


EXPERIMENT = Trained(name="linear-control", title="Section 7: linear attention interpolates, softmax extrapolates",
                        base=BASE, presets=PRESETS, evaluate=evaluate, report=report, in_run_all=True,
                        extrapolation=Extrapolation("fixed_offset", BEYOND & is_("attention", "softmax"), "accuracy"))
