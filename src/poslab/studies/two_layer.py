"""The seed paper's Section 5.2: a two-layer, four-head transformer (MLP, LayerNorm) on the
full-sequence shift task, RoPE against a learned absolute table (APE), per-head width d_head in
{64 (headline), 16 (control)} as the grid axis ``setting``. Each seed is judged on its retrieving
head (:mod:`poslab.probes.layer_heads`); the recipe, the width choice and the criteria are
explained in docs/two-layer-heads.md.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from poslab.experiments import Trained
from poslab.experiments.config import QUICK, EvalConfig, StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, joined, select, write_outputs
from poslab.experiments.spec import (
    ClaimSpec,
    Extrapolation,
    InRange,
    Source,
    at_most,
    comparison_only,
    derivation,
    hypothesis,
    is_,
    judge_all,
    maximum,
    mean,
    probe,
    seed_states,
    share,
    undecidable,
)
from poslab.studies.kit.offset_rows import shift_rows
from poslab.train import TrainConfig

WIDTHS = {"d_head=64": {"model.d_model": 256}, "d_head=16": {"model.d_model": 64}}  # four heads each
ROPE, APE = is_("encoding", "rope"), is_("encoding", "learned")
LMAX, LONGEST, TV_MAX = 16, 48, 0.1

HEADLINE, CONTROL = "d_head=64", "d_head=16"
CONTROL_NOTE = ("; control (8 frequencies a head, the earlier reading of 'four-head'): the headline's criterion, a "
                "finding about how far the claim reaches")


# what each claim is (its role follows: experiments/spec.role_of). The seed states no width for Section 5.2: the
# headline's d_head = 64 is the usual reading (its 0.02 baseline is 1/64, the one-layer head's width), the
# control's d_head = 16 (d_model = 64 split over four heads) another setting
SECTION_5_2 = seed_states("Section 5.2 / contribution 5: in a two-layer, four-head transformer with MLP and LayerNorm "
                          "on a full-sequence shift task all three findings transfer: RoPE generalizes while APE "
                          "degrades out of range, the RoPE head remains offset-equivariant out of distribution while "
                          "the APE head pins, and it carries a strong target carrier (0.98 versus a 0.02 baseline)")
LEMMA_2 = seed_states("Lemma 2, transferred by Section 5.2: a target-aligned carrier gives a relative kernel with its "
                      "unique maximum at the target offset")
PIN = seed_states("Section 5.2 / Proposition 2: the APE head pins, selecting a fixed absolute position inside the "
                  "training range")
SECONDARY_PEAKS = hypothesis("this study's account of the control's misses: a 16-dimensional kernel (8 frequencies) "
                             "has secondary peaks near its maximum")
BASELINE = derivation("the carrier probe's random-direction share is 1/d_head by construction")
# the learned-in-range gate: the study's own line (accuracy at trained lengths >= 0.95), per encoding x width
GATE = InRange(where=probe("length") & at_most("length", LMAX), column="accuracy", threshold=0.95,
               match=("encoding", "setting"), text="in-range accuracy (L <= 16, mean over seeds and lengths)")
GATED = ("2026-12-07: the learned-in-range gate (issue 53): a claim past the range or on a trained head's mechanism "
         "is n.a. where its models did not learn the task in range")
ROLE = "2026-12-07: role computed from source x setting (issue 53): "


def both_widths(*, where, source: Source, note: str = "{seeds} seeds, {n} rows", **spec) -> list[ClaimSpec]:
    """A claim of the seed at the headline width (its usual reading: paper) and the same claim, with the same
    criterion, at the control width (another setting: control)."""
    return [ClaimSpec(**spec, where=where & is_("setting", HEADLINE), note=note, source=source, setting="usual"),
            ClaimSpec(**spec, where=where & is_("setting", CONTROL), note=note + CONTROL_NOTE, source=source,
                      setting="other")]


CLAIMS = [
    *both_widths(name="{encoding}, {setting}: accuracy at trained lengths (L ≤ 16)", paper="solved",
                 where=probe("length") & at_most("length", LMAX), per=("encoding", "setting"),
                 measure=mean("accuracy"), op=">=", threshold=0.95, source=SECTION_5_2),
    *both_widths(name="rope, {setting}: accuracy at L = 48 (all positions)", paper="RoPE generalizes",
                 where=probe("length") & ROPE & is_("length", LONGEST), per=("setting",), measure=mean("accuracy"),
                 op=">=", threshold=0.9, source=SECTION_5_2, trained=True, revised=GATED),
    *both_widths(name="rope, {setting}: carrier kernel phi_c over [-47, 0] has its single maximum at -K (Lemma 2)",
                 paper="unique maximum at the target offset", where=probe("member") & ROPE, per=("setting",),
                 measure=share("kernel_single_peak", "==", 1), op=">=", threshold=1.0, percent=True,
                 source=LEMMA_2, trained=True, revised=GATED,
                 note="share of {seeds} seeds (retrieving head's m_Q, m_K at L = 16)"),
    *both_widths(name="rope, {setting}: last query's global peak at -K at every unseen length (needs both lemmas)",
                 paper="offset-equivariant out of distribution", where=probe("member") & ROPE, per=("setting",),
                 measure=share("at_minus_K", "==", 1), op=">=", threshold=1.0, percent=True, source=SECTION_5_2,
                 trained=True, revised=GATED, note="share of {seeds} seeds: the earlier criterion"),
    ClaimSpec(name="rope, {setting} (control): carrier kernel's highest other local maximum over its maximum",
              paper="the control's artefact: a 16-dimensional kernel's secondary peaks (fidelity review)",
              where=probe("member") & ROPE & is_("setting", CONTROL), per=("setting",), measure=mean("kernel_ratio"),
              op=">=", threshold=0.9, source=SECONDARY_PEAKS, setting="other", trained=True,
              revised=ROLE + "this study's account, not a statement of the seed: a hypothesis (prediction, was "
                             "control); " + GATED[12:],
              note="mean over {seeds} seeds (phi_c over [-47, 0], as in the kernel column); this study's account of "
                   "the control's misses, not a statement of the seed"),
    ClaimSpec(name="rope, {setting}: carrier kernel's highest other local maximum over its maximum",
              paper="(the headline width, shown beside the control)", where=probe("member") & ROPE &
              is_("setting", HEADLINE), per=("setting",), measure=mean("kernel_ratio"), source=SECONDARY_PEAKS,
              setting="usual",
              revised=ROLE + "shown beside this study's hypothesis, not a statement of the seed (prediction, was "
                             "control)",
              na=undecidable("neither the seed nor this study states a line for the secondary peak at this width "
                             "(its single maximum is judged above); shown beside the control's")),
    *both_widths(name="learned, {setting}: accuracy at positions ≥ 16 of L = 48", paper="APE degrades out of range",
                 where=probe("length") & APE & is_("length", LONGEST), per=("setting",),
                 measure=mean("accuracy_out"), op="<", threshold=0.5, source=SECTION_5_2, trained=True,
                 revised=GATED),
    *both_widths(name="rope, {setting}: retrieving head peaks at one offset of the common window at every length",
                 paper="offset-equivariant out of distribution", where=probe("member") & ROPE, per=("setting",),
                 measure=share("same_window_peak", "==", 1), op=">=", threshold=1.0, percent=True,
                 source=SECTION_5_2, trained=True, revised=GATED,
                 note="share of {seeds} seeds; window = offsets present at every length, renormalized"),
    *both_widths(name="rope, {setting}: retrieving head's window profile, largest total variation from L = 16",
                 paper="offset-equivariant out of distribution", where=probe("member") & ROPE, per=("setting",),
                 measure=maximum("window_tv_max"), op="<=", threshold=TV_MAX, source=SECTION_5_2, trained=True,
                 revised=GATED, note="max over {seeds} seeds and every length (threshold this study's; the paper "
                                     "gives none)"),
    *both_widths(name="learned, {setting}: retrieving head's peak stays below 16 and does not move with L "
                      "(slope within ±0.1 over the unseen lengths)", paper="the APE head pins",
                 where=probe("member") & APE, per=("setting",), measure=share("absolute_peak", "==", 1), op=">=",
                 threshold=1.0, percent=True, source=PIN, trained=True, revised=GATED,
                 note="share of {seeds} seeds; slope of the peak's position against L: 0 absolute, 1 relative "
                      "(Table 1's reading)"),
    *both_widths(name="learned, {setting}: retrieving head peaks at one absolute position < 16 at every unseen "
                      "length",
                 paper="the APE head pins", where=probe("member") & APE, per=("setting",),
                 measure=share("pinned", "==", 1), op=">=", threshold=1.0, percent=True, source=PIN, trained=True,
                 revised=ROLE + "Proposition 2's 'selects a fixed absolute position inside the training range', read "
                                "literally, at the headline width: paper (was control; the control width stays a "
                                "control); " + GATED[12:],
                 note="share of {seeds} seeds; Proposition 2's literal reading (one fixed absolute position inside "
                      "the range): a one-position drift between lengths fails it, though the peak may neither leave "
                      "the training range nor move with L (the slope claim above)"),
    *both_widths(name="rope, {setting}: retrieving head's key carrier energy (L = 16)", paper="0.98",
                 where=probe("member") & ROPE, per=("setting",), measure=mean("carrier_k"), op="~", threshold=0.98,
                 tol=0.05, source=SECTION_5_2, trained=True, revised=GATED),
    ClaimSpec(name="{encoding}, {setting}: the carrier probe's random-direction baseline 1/d_head", paper="0.02",
              where=probe("member"), per=("encoding", "setting"), measure=mean("random_direction_head"),
              source=BASELINE, setting="usual",
              na=comparison_only("the 0.02 baseline is given beside the 0.98 carrier for comparison; here it is "
                                 "1/d_head of this width by construction (0.02 fits d_head = 64, not 16)")),
]


_text = partial(joined, sep=" / ")  # a cell holding each seed's value

TABLES = [
    Table("Accuracy by length (all target positions)", by=("encoding", "setting"), where=probe("length"),
          pivot=Pivot("length", "accuracy", "L={}")),
    Table("Accuracy at target positions beyond the training range (t ≥ 16)", by=("encoding", "setting"),
          where=probe("length"), pivot=Pivot("length", "accuracy_out", "L={}")),
    Table("The retrieving head of each seed", by=("encoding", "setting", "seed"), where=probe("member"),
          intro="layer.head; a* = mean attention at -K over L ≤ 16; window peak = argmax of the last query's "
                "attention over the common window, by length; TV = largest total variation of that "
                "renormalized window from L = 16; last-query peak offset and absolute position at each unseen "
                "length, and the least-squares slope of that position against L (0 absolute, 1 relative); "
                "kernel = argmax of phi_c over [-47, 0] and its highest other local maximum (ratio).",
          columns=(Column("head", _text("head_name")), Column("a*", "a_star_in"),
                   Column("window peak", _text("window_peaks")), Column("TV", "window_tv_max"),
                   Column("peak offsets (L > 16)", _text("offsets")), Column("positions", _text("positions")),
                   Column("slope", "slope"),
                   Column("kernel max", _text("kernel_argmax")), Column("2nd peak (ratio)", _text("kernel_second")),
                   Column("carrier k", "carrier_k"), Column("untrained", "carrier_k_untrained"))),
    Table("Rotary kernel g(s) = sum_j cos(s theta_j) of each width", by=("setting",), where=probe("member") & ROPE,
          intro="max over s in [4, 47] of g(s)/g(0) and where it sits; a trained carrier pre-rotated to -K puts "
                "that secondary peak near offset -K - s.",
          columns=(Column("d_head", _text("d_head")), Column("max g(s)/g(0)", "g_ratio"),
                   Column("at s", "g_second"))),
]
FIGURES = [
    Lines("accuracy.png", x="length", y="accuracy", series=("encoding",), panel="setting", where=probe("length"),
          vline=LMAX, ylim=(0, 1.02), ylabel="accuracy (all positions)"),
    Lines("offset_profile.png", x="delta", y="attention", series=("length",), panel="setting",
          where=probe("offset") & ROPE & is_("seed", 0), xlabel="offset delta = t - (L - 1)",
          ylabel="last-query attention (seed 0)"),
    Lines("kernel.png", x="delta", y="phi_norm", series=("setting",), where=probe("kernel"),
          xlabel="offset delta", ylabel="phi_c(delta) / max |phi_c|", title="retrieving head's carrier kernel"),
]


# Paper preset: 3 seeds x {rope, learned} x {d_head 64, 16}, 2000 steps of batch 64.
BASE = StudyConfig(model_type="transformer", model=dict(d_model=256, n_layers=2, n_heads=4, layer_norm=True),
                   task_type="shift", task=dict(m=20, K=2),
                   grid={"encoding": ("rope", "learned"), "setting": tuple(WIDTHS)}, settings=WIDTHS, seeds=3,
                   train=TrainConfig(steps=2000, batch_size=64, lr=1e-3, min_length=8, max_length=LMAX),
                   eval=EvalConfig(lengths=(8, 12, 16, 20, 24, 32, 40, 48), n_sequences=512, chunk=256))
PRESETS = {"paper": {}, "quick": {**QUICK, "train.steps": 100, "eval.n_sequences": 64}}


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    d_heads = sorted({r["d_head"] for r in select(rows, "member")})
    intro = (f"Mean ± std over seeds 0..{study.seeds - 1}. Two layers, four heads, MLP and pre-LayerNorm; shift by "
             f"K = {study.task.get('K', 2)} over m = {study.task.get('m', 20)} tokens; {study.train.steps} steps of "
             f"batch {study.train.batch_size}, lengths in [{study.train.min_length}, {study.train.max_length}] per "
             f"{study.train.length_sampling}; {study.eval.n_sequences} sequences per length. Per-head width "
             f"(setting): d_head in {d_heads} at four heads (d_model = 4 d_head); d_head = 64 is the headline "
             "because the paper's 0.02 baseline is 1/64, d_head = 16 (d_model = 64) the earlier setting, a "
             "control. The paper gives none of the recipe: these are this study's config values.")
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=judge_all(CLAIMS, rows, GATE), intro=intro,
                         tables=TABLES, figures=FIGURES, csv_rows=select(rows, "length"),
                         csvs={"heads.csv": "head", "members.csv": "member"})


EXPERIMENT = Trained(name="two-layer", title="Section 5.2: two layers, four heads, MLP and LayerNorm on the "
                        "full-sequence shift task", base=BASE, presets=PRESETS,
                     evaluate=shift_rows, report=report, in_run_all=True,
                        # the shift task's positions past the training range, at each evaluation length
                        extrapolation=Extrapolation("fixed_offset", probe("length"), "accuracy_out"))
