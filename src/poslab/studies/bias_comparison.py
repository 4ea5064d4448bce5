"""Section 5.1 of the seed paper: "the account is not RoPE-specific".

The Table 1 protocol with every encoding of the registry, each judged by what the account
predicts for its kind. The seed's families keep their hand-tuned settings (ALiBi slopes, T5
buckets) and claims; every other registered encoding, plugins' included, is taken from
:func:`poslab.positional.registered` at the study's K values, and routed by what the account
can say of its form, computed from the class (:func:`prediction`): a logit that depends on
positions only through the offset (Lemma 1: -K at every length), a content-free bias highest at
the nearest key (ALiBi's case: -1 at K = 1, never -K at K >= 2), or neither (a contextual or
length-dependent logit: accuracy shown for comparison). The predictions and controls are told
in docs/bias-comparison.md.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch

from poslab.experiments import Experiment
from poslab.experiments.config import StudyConfig, quick
from poslab.experiments.outputs import (
    Column,
    Lines,
    Pivot,
    Table,
    at_largest,
    mean_std_where,
    most_common,
    write_outputs,
)
from poslab.experiments.spec import (
    ClaimSpec,
    at_least,
    below,
    comparison_only,
    is_,
    judge_all,
    kind,
    mean,
    neg,
    probe,
    share,
    undecidable,
)
from poslab.positional import PositionalEncoding, build_encoding, encoding_class, registered
from poslab.studies.kit.fixed_offset import EXTRAPOLATION, bucket_coverage_at, length_rows

name = "bias-comparison"
title = "Section 5.1: ALiBi, T5 bias and RoPE (and the other families) under the Table 1 protocol"

FORMULA = ("rope", "mope", "shaw", "transformer_xl")  # relative/rotary, kernel learned at every offset
UNPREDICTED = ("nope", "sinusoidal")
ALIBI: dict[str, dict[str, Any]] = {  # setup label -> ALiBi options
    "alibi m=2^-8": {},  # control: the published slope for one head
    "alibi m=0.5": {"slope": 0.5},
    "alibi learned m (from 2^-8)": {"learned_slope": True},
    "alibi learned m (from 0.5)": {"learned_slope": True, "slope": 0.5},
}
T5: dict[str, dict[str, Any]] = {  # setup label -> T5 options
    "t5 32/128 N(0,1)": {},  # T5's published buckets (the field's usual choice: the seed names none): paper role
    "t5 32/128 zeros": {"init": "zeros"},
    "t5 16/16 N(0,1)": {"num_buckets": 16, "max_distance": 16},
}
# ALiBi slopes at least this order neighbouring offsets beyond the probe's sampling noise: their mean
# attention differs by a factor e^-m <= 0.95 (at 2^-8 it is 0.996, and a(-1), a(-2) agree to four decimals)
USABLE_SLOPE = 0.05
KS = (1, 2, 3)  # the study's K values: every registered encoding runs at each (quick preset: QUICK_KS)
QUICK_KS = (2,)
# the seed's families, hand-tuned for its claims: setting name -> encoding, its options and K
HAND: dict[str, dict[str, Any]] = {
    **{f"{enc} K=2": {"encoding": enc, "task.K": 2} for enc in (*FORMULA, *UNPREDICTED)},
    **{f"{label} K={K}": {"encoding": "alibi", "encoding_options": {"alibi": opts}, "task.K": K}
       for label, opts in ALIBI.items() for K in (1, 2, 3)},
    **{f"{label} K=2": {"encoding": "t5", "encoding_options": {"t5": opts}, "task.K": 2} for label, opts in T5.items()},
}
SEED_FAMILIES = (*FORMULA, *UNPREDICTED, "alibi", "t5")  # encodings the seed's claims name; the rest are by kind


def registry_settings(ks: tuple[int, ...] = KS) -> dict[str, dict]:
    """Every registered encoding (plugins' included) at its default options and each K of ``ks``,
    but where a hand setting already runs that encoding at its defaults and that K."""
    covered = {(s["encoding"], s["task.K"]) for s in HAND.values()
               if not s.get("encoding_options", {}).get(s["encoding"])}
    return {f"{setup_label(enc, {})} K={K}": {"encoding": enc, "task.K": K}
            for enc in registered() for K in ks if (enc, K) not in covered}


def study(preset: str) -> StudyConfig:
    """Paper preset: 3 seeds, 4000 steps; each setting fixes the encoding, its options and K. The
    quick preset runs the encodings outside the hand settings at QUICK_KS only."""
    settings = {**HAND, **registry_settings(QUICK_KS if preset == "quick" else KS)}
    cfg = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(m=20),
                      grid={"setting": tuple(settings)}, settings=settings, seeds=3)
    return quick(cfg) if preset == "quick" else cfg


AT_K = share("peak_offset", "==", neg("K"), text="share of seed x length cells whose mean attention peaks at -K")


def _at_k_percent(rows: list[dict]) -> str:
    """AT_K as a whole percentage (the tables' cells all carry a peak offset)."""
    value = AT_K(rows)
    if value is None:
        raise ValueError("no cell of the group has a peak offset")
    return f"{100 * value:.0f}%"


CELLS = probe("length")
MONOTONE_WHY = ("a monotone bias -m|i-j| cannot select -K >= 2: the keys at -1 and -K are exchangeable on "
                "i.i.d. tokens, and pairing each sequence with its swap gives E[a(-1)] >= E[a(-K)] for every "
                "content weight and m > 0")
FLAT_WHY = (f"with m < {USABLE_SLOPE:g} neighbouring offsets' mean attention differ by a factor e^-m > 0.95 (0.996 at "
            "m = 2^-8), within the probe's sampling noise: the account orders the expectations, E[a(-1)] >= "
            "E[a(-K)], and bounds the target's weight by 1/(1 + sum_d e^(-m d)), near 1/L, but the sample's "
            "argmax among near-equal means is noise")
T5_PAPER = "t5 32/128 N(0,1)"
T5_CONTROLS = tuple(label for label in T5 if label != T5_PAPER)
UNTRAINED = ("judged at every length, also where evaluation distances fall in buckets no training distance "
             "reaches (they keep their initial bias; the coverage of each length is in the table)")

BY_KIND = CELLS & is_("by_kind", True)  # encodings outside SEED_FAMILIES, taken from the registry
PREDICTIONS = ("no offset", "offset", "nearest-first", "contextual", "not offset-only")  # what `prediction` says
CONTEXTUAL_WHY = ("a pair's logit depends on the tokens between the query and the key (the class is contextual), "
                  "not on the offset alone: Lemma 1 does not apply, and the account predicts nothing for it")
NOT_OFFSET_WHY = ("its logit at a given offset changes with the query position or the sequence length (a "
                  "length-dependent schedule, a position-normalised bias), so Lemma 1 does not apply past the "
                  "training lengths and the account predicts nothing for it")

CLAIMS = [
    ClaimSpec(name="{setup}, K={K}: cells selecting -K", paper="relative: -K at every length (Lemma 1)",
              where=CELLS & is_("encoding", *FORMULA), per=("setup", "K"), measure=AT_K, op=">=", threshold=1.0,
              percent=True),
    ClaimSpec(name="{setup}, K={K}: cells selecting -K, every length", paper="relative: -K at every length (Lemma 1)",
              where=CELLS & is_("setup", T5_PAPER), per=("setup", "K"), measure=AT_K, op=">=", threshold=1.0,
              percent=True, note="{seeds} seeds, {n} cells; T5's published 32 buckets / max distance 128 (the seed "
                                 "names no setting); " + UNTRAINED),
    ClaimSpec(name="{setup}, K={K}: cells selecting -K, every length", paper="relative: -K at every length (Lemma 1)",
              where=CELLS & is_("setup", *T5_CONTROLS), per=("setup", "K"), measure=AT_K, op=">=", threshold=1.0,
              percent=True, role="control", note="{seeds} seeds, {n} cells; another bucket setting or initial "
                                                 "table; " + UNTRAINED),
    ClaimSpec(name="{setup}, K={K}: cells selecting -1 (usable slope)",
              paper="K = 1: a kernel peaked at 0 and a suppressed self-logit suffice",
              where=CELLS & is_("encoding", "alibi") & is_("K", 1) & at_least("slope", USABLE_SLOPE),
              per=("setup", "K"), measure=AT_K, op=">=", threshold=1.0, percent=True,
              note=f"{{seeds}} seeds, {{n}} cells; slope >= {USABLE_SLOPE:g}"),
    ClaimSpec(name="{setup}, K={K}: cells selecting -K (monotone bias: predicted none)",
              paper="not RoPE-specific: the account's prediction for a monotone bias",
              where=CELLS & is_("encoding", "alibi") & at_least("K", 2) & at_least("slope", USABLE_SLOPE),
              per=("setup", "K"), measure=AT_K, op="<=", threshold=0.0, percent=True, role="check",
              note="{seeds} seeds, {n} cells; a check, true by derivation: " + MONOTONE_WHY),
    ClaimSpec(name="{setup}, K={K}: cells selecting -K, slope too flat to order the offsets", paper="not predicted",
              where=CELLS & is_("encoding", "alibi") & below("slope", USABLE_SLOPE), per=("setup", "K"),
              measure=AT_K, percent=True, na=undecidable(FLAT_WHY)),
    ClaimSpec(name="{setup}, K={K}: cells selecting -K", paper="not predicted (no relative offset in the logit)",
              where=CELLS & kind("absolute", "none"), per=("setup", "K"), measure=AT_K,
              na=undecidable("the account predicts nothing for an absolute or position-free logit"), percent=True),
    ClaimSpec(name="{setup}, K={K}: mean accuracy at unseen lengths", paper="no number given",
              where=CELLS & is_("in_range", False), per=("setup", "K"), measure=mean("accuracy"),
              na=comparison_only("Section 5.1 states no accuracy and no criterion for it; shown beside the "
                                 "selection claims for comparison")),
    # every other registered encoding, routed by its form (PREDICTIONS, computed by `prediction`): the
    # seed's statements in another setting (controls), ALiBi's derivation for any nearest-first bias (checks)
    ClaimSpec(name="{setup}, K={K}: cells selecting -K, every length", paper="relative: -K at every length (Lemma 1)",
              where=BY_KIND & is_("prediction", "offset"), per=("setup", "K"), measure=AT_K, op=">=",
              threshold=1.0, percent=True, role="control",
              note="{seeds} seeds, {n} cells; taken by kind: its logit depends on positions only through the "
                   "offset (checked on the class at random parameters), so Lemma 1 applies; judged at every "
                   "length, also at offsets no training length reaches"),
    ClaimSpec(name="{setup}, K={K}: cells selecting -1 (usable gap)",
              paper="K = 1: a kernel peaked at 0 and a suppressed self-logit suffice",
              where=BY_KIND & is_("prediction", "nearest-first") & is_("K", 1) & at_least("gap", USABLE_SLOPE),
              per=("setup", "K"), measure=AT_K, op=">=", threshold=1.0, percent=True, role="control",
              note=f"{{seeds}} seeds, {{n}} cells; taken by kind: a content-free bias highest at the nearest key; "
                   f"trained gap b(-1) - max b(-d>=2) >= {USABLE_SLOPE:g}"),
    ClaimSpec(name="{setup}, K={K}: cells selecting -K (nearest-first bias: predicted none)",
              paper="not RoPE-specific: the account's prediction for a monotone bias",
              where=BY_KIND & is_("prediction", "nearest-first") & at_least("K", 2) & at_least("gap", USABLE_SLOPE),
              per=("setup", "K"), measure=AT_K, op="<=", threshold=0.0, percent=True, role="check",
              note="{seeds} seeds, {n} cells; a check, true by derivation: ALiBi's argument needs only "
                   "b(-1) >= b(-K): " + MONOTONE_WHY),
    ClaimSpec(name="{setup}, K={K}: cells selecting -K, gap too flat to order the offsets", paper="not predicted",
              where=BY_KIND & is_("prediction", "nearest-first") & below("gap", USABLE_SLOPE), per=("setup", "K"),
              measure=AT_K, percent=True, na=undecidable(FLAT_WHY.replace("with m <", "with a gap b(-1) - b(-2) <"))),
    *(ClaimSpec(name="{setup}, K={K}: cells selecting -K", paper="not predicted", where=BY_KIND & is_("prediction", p),
                per=("setup", "K"), measure=AT_K, percent=True, na=comparison_only(why))
      for p, why in (("contextual", CONTEXTUAL_WHY), ("not offset-only", NOT_OFFSET_WHY))),
]
TABLES = [
    Table("Every encoding: accuracy in and past the training range", by=("setup", "kind", "K"), where=CELLS,
          columns=(Column("prediction", most_common("prediction")),
                   Column("acc. in range", mean_std_where("accuracy", lambda r: r["in_range"])),
                   Column("acc. past training range", mean_std_where("accuracy", lambda r: not r["in_range"])),
                   Column("at -K", _at_k_percent)),
          intro="Mean ± std over seed x length cells. In range: evaluation lengths up to the longest training "
                "length; past it: the longer ones. `prediction`: what the account can say of the encoding's "
                "form, computed from its class (`offset`: the logit depends on positions only through the offset, "
                "Lemma 1; `nearest-first`: a content-free bias highest at the nearest key, ALiBi's case; "
                "`contextual` or `not offset-only`: nothing predicted; `no offset`: kind none or absolute)."),
    Table("Accuracy by evaluation length", by=("setup", "K"), where=CELLS,
          pivot=Pivot("length", "accuracy", "L={}"),
          columns=(Column("at -K", _at_k_percent),
                   Column("most common offset", most_common("peak_offset")),
                   Column("peak height at longest L", at_largest("peak_height")),
                   Column("slope m (trained)", "slope"), Column("bucket coverage at longest L",
                                                               at_largest("coverage"))),
          intro="Mean ± std over seeds. `at -K`: share of seed x length cells whose mean attention peaks at "
                "offset -K. `slope m`: ALiBi's slope after training (fixed ones unchanged). `bucket coverage`: "
                "share of the evaluation offsets 0..L-1 whose T5 bucket some training distance (0..L_max-1) "
                "reaches."),
    Table("T5: trained-bucket coverage by evaluation length", by=("setup", "K"), where=CELLS & is_("encoding", "t5"),
          pivot=Pivot("length", "coverage", "L={}"),
          intro="Share of the relative offsets 0..L-1 at each length whose T5 bucket some training distance "
                "(0..L_max-1) reaches; the rest read their bucket's initial value."),
]
FIGURES = [Lines("accuracy.png", x="length", y="accuracy", series=("setup", "K"), panel="panel",
                 where=CELLS & is_("by_kind", False), xlabel="evaluation length L", ylim=(-0.02, 1.02),
                 vline=lambda rows: max(r["length"] for r in rows if r["in_range"])),  # longest trained length
           Lines("accuracy_by_kind.png", x="length", y="accuracy", series=("setup", "K"), panel="kind", where=BY_KIND,
                 xlabel="evaluation length L", ylim=(-0.02, 1.02),
                 vline=lambda rows: max(r["length"] for r in rows if r["in_range"]))]
INTRO = ("The paper gives no numbers for Section 5.1; each encoding is judged by what the account predicts "
         "for its kind. ALiBi's monotone bias cannot select -K >= 2 on i.i.d. tokens: those rows are checks, "
         "true by derivation. T5 is judged at every length, also where distances fall in never-trained buckets "
         "(each length's trained-bucket coverage is tabled): 32 buckets / max distance 128 with an N(0,1) table, "
         "T5's published buckets, as the paper's setting; the zero table and 16 / 16 as controls. "
         "alibi m=2^-8 is the old run, kept. Every other registered encoding (plugins' included) runs at its "
         "defaults at each K and is judged where the account predicts something for its form (controls, and checks "
         "for a nearest-first bias), else shown for comparison; the first table gives each one's accuracy in and "
         "past the training range.")


def setup_label(encoding: str, options: dict) -> str:
    """The table's name for an encoding with these options (the settings' labels)."""
    for table, enc in ((ALIBI, "alibi"), (T5, "t5")):
        if encoding == enc:
            return next((label for label, opts in table.items() if opts == options), f"{enc} {options}")
    return encoding if not options else f"{encoding} {options}"


def evaluate(ctx) -> list[dict]:
    enc_name, enc = ctx.study.encoding, ctx.model.encoding
    options = ctx.study.encoding_options.get(enc_name, {})
    lengths = (min(ctx.study.eval.lengths), max(ctx.study.eval.lengths))
    extra = dict(encoding=enc_name, kind=encoding_class(enc_name).kind, K=ctx.task.K,
                 setup=setup_label(enc_name, options), panel=enc_name if enc_name in ("alibi", "t5") else "others",
                 by_kind=enc_name not in SEED_FAMILIES, prediction=prediction(enc_name, json.dumps(options), *lengths))
    if enc_name == "alibi":
        extra["slope"] = float(enc.slopes.detach()[0])
    if extra["prediction"] == "nearest-first":
        extra["gap"] = nearest_gap(enc, lengths[1])
    rows = []
    for r in length_rows(ctx):
        r = {**r, **extra}
        if enc_name == "t5" and r["probe"] == "length":
            r["coverage"] = bucket_coverage_at(enc, ctx.study.train.max_length, r["length"])
        rows.append(r)
    return rows


def options_of(encoding: str, setup: str) -> dict:
    """The options behind a setup label (the inverse of ``setup_label`` for the settings' labels)."""
    for table, enc in ((ALIBI, "alibi"), (T5, "t5")):
        if encoding == enc:
            return table.get(setup, {})
    return {}


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    lengths = (min(study.eval.lengths), max(study.eval.lengths))
    for r in rows:  # rows stored before the registry settings existed lack these columns
        if r.get("probe") == "length" and "prediction" not in r:
            r["by_kind"] = r["encoding"] not in SEED_FAMILIES
            r["prediction"] = prediction(r["encoding"], json.dumps(options_of(r["encoding"], r["setup"])), *lengths)
    return write_outputs(out, title=title, rows=rows, claims=judge_all(CLAIMS, rows), intro=INTRO,
                         tables=TABLES, figures=FIGURES, csv_rows=[r for r in rows if r.get("probe") == "length"],
                         columns=["setup", "encoding", "kind", "prediction", "K", "seed", "length", "in_range",
                                  "accuracy", "peak_offset", "peak_position", "peak_height", "a_star", "slope", "gap",
                                  "coverage", "chance"])


# ----------------------------------------------------------------------------- the account by form

DRAWS = 4  # random parameter draws a form must hold at


@cache
def prediction(name: str, options: str = "{}", short: int = 12, long: int = 48) -> str:
    """What the account can say of encoding ``name`` (``options`` as JSON), one of PREDICTIONS, from
    its class: built at a small geometry, its parameters drawn at random ``DRAWS`` times (a form that
    holds at every draw is the class's, not one training's), queried at lengths ``short`` and ``long``:

    - ``no offset``: kind none or absolute (no relative offset in the logit);
    - ``contextual``: the class says a pair's bias reads other tokens (``contextual``, ``reads_stream``);
    - ``not offset-only``: the last query's logit at some offset differs between the two lengths;
    - ``nearest-first``: position enters only as a content-free score bias whose value, at every
      offset 2 .. long - 1, is at most its value at offset 1, and non-increasing over offsets 1 .. max(KS);
    - ``offset``: any other logit that depends on positions only through the offset.
    """
    enc = _encoding(name, json.loads(options), long)
    if enc.kind in ("none", "absolute"):
        return "no offset"
    if enc.contextual or enc.reads_stream:
        return "contextual"
    g = torch.Generator().manual_seed(0)
    offset_only, nearest_first = True, enc.sites == ("score_bias",)
    for _ in range(DRAWS):
        enc = _encoding(name, json.loads(options), long)
        with torch.no_grad():
            for p in enc.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
            q, k = torch.randn(2, enc.d_head, generator=g)
            at_long = offset_logits(enc, long, q, k)  # [h, long]
            offset_only &= torch.allclose(offset_logits(enc, short, q, k), at_long[:, :short], atol=1e-4)
            b = offset_logits(enc, long, torch.zeros_like(q), torch.zeros_like(k))  # the bias alone
            steps = b[:, 1:max(KS)] - b[:, 2:max(KS) + 1]  # b(d) - b(d + 1), d = 1 .. max(KS) - 1
            nearest_first &= bool((b[:, 2:] <= b[:, 1:2] + 1e-6).all() and (steps >= -1e-6).all())
    if not offset_only:
        return "not offset-only"
    return "nearest-first" if nearest_first else "offset"


def _encoding(name: str, options: dict, long: int) -> PositionalEncoding:
    with torch.random.fork_rng(devices=[]):  # building draws parameters: leave the caller's RNG as it was
        return build_encoding(name, d_model=64, n_heads=1, d_head=64, max_len=max(long, 64), **options)


def offset_logits(enc: PositionalEncoding, L: int, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The last query's logit against every key of a length-``L`` sequence, by offset d = 0 .. L-1, for
    the same query vector ``q`` and key vector ``k`` [d_head] at every position (content fixed, so
    only position varies): rotate_qk and score_bias, the hooks a relative logit uses. [h, L]"""
    device = next((t.device for t in (*enc.parameters(), *enc.buffers())), torch.device("cpu"))
    pos = torch.arange(L, device=device)
    Q = q.to(device).expand(1, enc.n_heads, L, -1)  # [1, h, i, d]
    K = k.to(device).expand(1, enc.n_heads, L, -1)  # [1, h, j, d]
    rq, rk = enc.rotate_qk(Q, K, pos, pos)
    logits = (rq[..., -1:, :] * rk).sum(-1)  # [1, h, j]
    bias = enc.score_bias(Q, K, pos, pos)
    if bias is not None:
        logits = logits + bias[..., -1, :]
    return logits[0].flip(-1).float().cpu()  # [h, d]


def nearest_gap(enc: PositionalEncoding, L: int) -> float:
    """A trained nearest-first bias's margin b(-1) - max_{d >= 2} b(-d) at length ``L`` (smallest over
    heads): at least USABLE_SLOPE orders the offsets beyond the probe's noise, as ALiBi's slope does."""
    with torch.no_grad():
        zeros = torch.zeros(enc.d_head)
        b = offset_logits(enc, L, zeros, zeros)  # [h, L]
    return float((b[:, 1] - b[:, 2:].max(-1).values).min())


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, in_run_all=True,
                        extrapolation=EXTRAPOLATION)
