"""Table 1 / Fig. 1 of the seed paper: the relative-versus-absolute gap at minimal scale.

One-layer single-head retrieval heads (d = 64, m = 20) with RoPE or a learned absolute
encoding (APE) are trained on fixed-offset retrieval, K in {1, 2, 3}, lengths uniform in
[8, 16], 8 seeds, and evaluated at L in {12, ..., 48}. The paper reports that RoPE keeps
near-perfect accuracy at every length and selects offset -K in 100% of seed x length cells,
while APE is near chance (1/m = 0.05) at every unseen length, its attention peak pinned to one
absolute position inside the training range. The paper states its mechanism claim for K >= 2
and treats K = 1 separately (study ``k1``): RoPE's accuracy at K = 1 is shown, not judged.

APE conditions (the rows past L_max never get a gradient, so their initialisation decides the
unseen lengths):

- ``learned 0.02`` — the headline: table rows N(0, 0.02^2) (GPT-2's initialisation, the
  encoding's default ``init_std``);
- ``learned 1.0`` — control, rows N(0, 1) (grid axis ``encoding_options.learned.init_std``);
- ``... clamp`` — control, evaluate-only: the same trained weights with every row >= L_max
  replaced by row L_max - 1 (clamp-to-last), no retraining.

A control is judged by what it is meant to show: that APE still fails at unseen lengths (under
an N(0, 1) table, or with clamp-to-last). Pinning (Proposition 2) is the headline's claim,
judged per (seed, K) head over the unseen lengths L > L_max: one peak position at every unseen
length and below L_max; the least-squares slope of the peak position against L (~0 absolute,
~1 relative); the attention mass inside [0, L_max) beside L_max / L (a uniform head's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from poslab.experiments.config import StudyConfig, quick
from poslab.experiments.fixed_offset import length_rows
from poslab.experiments.outputs import Column, Lines, Pivot, Table, group_stats, save, select, write_csv, write_outputs
from poslab.experiments.runner import Experiment
from poslab.experiments.spec import (
    ClaimSpec,
    abs_mean,
    at_least,
    is_,
    judge_all,
    kind,
    mean,
    minimum,
    neg,
    probe,
    share,
)
from poslab.positional import encoding_class

HEADLINE_INIT = 0.02  # the APE condition the headline claims use
RELATIVE = ("rotary", "relative", "none")  # judged by the RoPE claims (no table to memorize)
COLUMNS = ["condition", "encoding", "init_std", "variant", "length_sampling", "K", "seed", "length", "in_range",
           "accuracy", "peak_offset", "peak_position", "peak_height", "in_range_mass", "a_star", "chance"]
CONTROL_NA = ("pinning is the headline's claim (Proposition 2: a trained table from a small init); this control "
              "is judged by its unseen-length accuracy (N(0, 1) rows / clamp-to-last still fail)")

CLAIMS = [
    ClaimSpec(name="{condition}, K={K}: lowest mean accuracy over evaluation lengths", paper="near-perfect",
              where=probe("length") & kind(*RELATIVE) & at_least("K", 2), per=("condition", "K"),
              measure=minimum("accuracy", by=("length",)), op=">=", threshold=0.97),
    ClaimSpec(name="{condition}, K={K}: lowest mean accuracy over evaluation lengths",
              paper="claim stated for K >= 2", where=probe("length") & kind(*RELATIVE) & is_("K", 1),
              per=("condition", "K"), measure=minimum("accuracy", by=("length",)),
              na="the paper states its claim for K >= 2 and treats K = 1 apart (study k1); shown: K = 1's decay"),
    ClaimSpec(name="{condition}, K={K}: seed x length cells selecting offset -K", paper="100%",
              where=probe("length") & kind(*RELATIVE), per=("condition", "K"),
              measure=share("peak_offset", "==", neg("K")), op=">=", threshold=1.0, percent=True,
              note="{seeds} seeds, {n} cells"),
    ClaimSpec(name="{condition} ({role}): accuracy at trained lengths (<= L_max)", paper="~1",
              where=probe("length") & kind("absolute") & is_("in_range", True), per=("condition", "role"),
              measure=mean("accuracy"), op=">=", threshold=0.95, note="{seeds} seeds"),
    ClaimSpec(name="{condition} ({role}): accuracy at unseen lengths (> L_max)", paper="~chance (1/m = 0.05)",
              where=probe("length") & kind("absolute") & is_("in_range", False), per=("condition", "role"),
              measure=mean("accuracy"), op="<=", threshold=2, scale_by="chance", note="{seeds} seeds"),
    *[ClaimSpec(name=f"{{condition}} ({role}): {what}", paper=paper, where=probe("head") & is_("role", role),
                per=("condition",), measure=measure, note="{n} (seed, K) heads",
                **(dict(op=op, threshold=t, percent=pct) if role == "headline" else dict(na=CONTROL_NA)))
      for role in ("headline", "control")
      for what, paper, measure, op, t, pct in (
          ("(seed, K) heads whose peak is one position < L_max at every unseen length", "pinned (Proposition 2)",
           share("pinned", "==", True), ">=", 0.9, True),
          ("slope of peak position against L (unseen lengths)", "~0 (absolute; ~1 would be relative)",
           abs_mean("slope"), "<", 0.1, False),
          ("attention mass inside [0, L_max) at unseen lengths minus a uniform head's L_max/L",
           "pinned inside the range", mean("mass_excess"), ">", 0.0, False))],
]

TABLES = [
    Table("Accuracy by evaluation length", by=("condition", "K"), where=probe("length"),
          pivot=Pivot("length", "accuracy", "L={}"),
          columns=(Column("peak at -K", lambda g: f"{100 * np.mean([r['peak_offset'] == -r['K'] for r in g]):.0f}%"),)),
    Table("APE pinning per (seed, K) head over the unseen lengths L > L_max", by=("condition", "K", "seed"),
          where=probe("head") & kind("absolute"),
          intro="Peak position (absolute key index) at each unseen length; pinned = one position at every unseen "
                "length and < L_max; slope of peak position against L (0 absolute, 1 relative); mean attention "
                "mass inside [0, L_max) beside L_max/L, a uniform head's.",
          columns=(Column("peak positions", lambda g: g[0]["positions"]),
                   Column("pinned", lambda g: "yes" if g[0]["pinned"] else "no"),
                   Column("slope", lambda g: g[0]["slope"]), Column("mass in range", lambda g: g[0]["mass"]),
                   Column("L_max/L", lambda g: g[0]["uniform_mass"]))),
]

FIGURES = [Lines("fig1_accuracy.png", x="length", y="accuracy", series=("condition",), panel="K",
                 where=probe("length"), xlabel="evaluation length L", ylim=(-0.02, 1.02),
                 vline=lambda rows: rows[0]["max_length"], hline=lambda rows: rows[0]["chance"])]


def study(preset: str) -> StudyConfig:
    """The paper preset trains both APE initialisations (RoPE runs twice, identically: the grid
    is a product); the quick preset trains the headline one only (add the control with
    ``--set grid.encoding_options.learned.init_std=[0.02,1.0]``)."""
    grid = {"encoding": ("rope", "learned"), "task.K": (1, 2, 3)}
    cfg = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(m=20), grid=grid, seeds=8,
                      variants={"clamp": {"where": {"encoding": "learned"}}})
    if preset == "quick":
        return quick(cfg)
    return dataclasses.replace(cfg, grid={"encoding": grid["encoding"],
                                          "encoding_options.learned.init_std": (HEADLINE_INIT, 1.0),
                                          "task.K": grid["task.K"]})


def evaluate(ctx) -> list[dict]:
    Lmax = ctx.study.train.max_length
    if ctx.member.variant == "clamp":  # clamp-to-last: positions >= L_max read row L_max - 1
        W = ctx.model.encoding.W_pos
        W[Lmax:] = W[Lmax - 1]
    rows = length_rows(ctx)
    for r in rows:
        r["length_sampling"] = ctx.study.train.length_sampling
    by_length = {r["length"]: r for r in rows if r["probe"] == "length"}
    for r in rows:
        if r["probe"] == "attention" and r["offset"] + r["length"] - 1 < Lmax:
            by_length[r["length"]]["in_range_mass"] = by_length[r["length"]].get("in_range_mass", 0.0) + r["weight"]
    return rows


def labelled(rows: list[dict], Lmax: int) -> list[dict]:
    """Length and attention rows with their condition (rope, or learned <init_std> [clamp]),
    encoding kind, role (headline / control, APE only) and L_max; relative encodings keep only
    the headline init_std copy (the APE table's initialisation does not touch them)."""
    out = []
    for r in rows:
        if r.get("probe") not in ("length", "attention"):
            continue
        k = encoding_class(r["encoding"]).kind
        init = r.get("init_std", HEADLINE_INIT)
        if k != "absolute" and init != HEADLINE_INIT:
            continue
        cond, role = r["encoding"], None
        if k == "absolute":
            clamp = r.get("variant") == "clamp"
            cond += f" {init}" + (" clamp" if clamp else "")
            role = "headline" if init == HEADLINE_INIT and not clamp else "control"
        out.append({**r, "condition": cond, "kind": k, "role": role, "max_length": Lmax})
    return out


def head_pinning(cells: list[dict], Lmax: int) -> list[dict]:
    """Per (condition, K, seed) head over its unseen lengths: pinned?, slope, in-range mass."""
    heads = {}
    for r in cells:
        if r["length"] > Lmax:
            heads.setdefault((r["condition"], r["K"], r["seed"]), []).append(r)
    out = []
    for (cond, K, seed), rs in sorted(heads.items()):
        rs = sorted(rs, key=lambda r: r["length"])
        L = np.array([r["length"] for r in rs], dtype=float)
        pos = np.array([r["peak_position"] for r in rs], dtype=float)
        slope = float(np.polyfit(L, pos, 1)[0]) if len(L) >= 2 else float("nan")
        one = len(set(pos)) == 1
        mass, uniform = float(np.mean([r["in_range_mass"] for r in rs])), float(np.mean(Lmax / L))
        out.append(dict(probe="head", condition=cond, kind=rs[0].get("kind"), role=rs[0].get("role"), K=K, seed=seed,
                        pinned=bool(one and pos[0] < Lmax), position=int(pos[0]) if one else None,
                        below_Lmax_minus_1_minus_K=bool(one and pos[0] == Lmax - 1 - K), slope=slope, mass=mass,
                        uniform_mass=uniform, mass_excess=mass - uniform,
                        positions=" ".join(str(int(p)) for p in pos)))
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    Lmax = study.train.max_length
    rows = labelled(rows, Lmax)
    cells = select(rows, "length")
    heads = head_pinning(cells, Lmax)  # RoPE's heads too, for comparison (slope ~1); judged: APE only
    chance = cells[0]["chance"] if cells else float("nan")
    sampling = sorted({r["length_sampling"] for r in cells})
    intro = (f"Accuracy (mean ± std over {study.seeds} seeds: {', '.join(map(str, range(study.seeds)))}) by evaluation "
             f"length; training lengths uniform in [{study.train.min_length}, {Lmax}], drawn per "
             f"{' and per '.join(sampling)} (`train.length_sampling`: `batch` = one length per step for the whole "
             f"batch, `sequence` = one length per sequence); chance {chance:.2f}. Last column: seed x length cells "
             f"whose attention peak is at offset -K.\n\nAPE conditions: `learned {HEADLINE_INIT}` is the headline "
             f"(table rows N(0, {HEADLINE_INIT}²), the encoding's default); `learned 1.0` trains with rows N(0, 1); "
             f"`clamp` re-evaluates the same trained weights with every row >= {Lmax} replaced by row {Lmax - 1} "
             "(evaluate-only, no retraining). Controls are judged by their unseen-length accuracy, pinning by the "
             "headline. RoPE has no table: its runs are shown once.")
    files = write_outputs(out, title=EXPERIMENT.title, rows=cells + heads, claims=judge_all(CLAIMS, cells + heads),
                          intro=intro, tables=TABLES, figures=FIGURES, csv_rows=cells, columns=COLUMNS,
                          more_figures=lambda _, o: [attention_figure(rows, study, o)])
    return files + [write_csv(heads, out / "pinning.csv")]


def attention_figure(rows: list[dict], study: StudyConfig, out: Path) -> Path:
    """Mean attention against offset at L_max and the longest length, one panel per condition x K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attn = select(rows, "attention")
    conds = sorted({r["condition"] for r in attn})
    Ks = sorted({r["K"] for r in attn})
    show = sorted({study.train.max_length, max(study.eval.lengths)} & {r["length"] for r in attn})
    fig, axes = plt.subplots(len(conds), len(Ks), figsize=(4 * len(Ks), 2.8 * len(conds)), squeeze=False,
                             sharex=True)
    for i, cond in enumerate(conds):
        for j, K in enumerate(Ks):
            ax = axes[i][j]
            for L in show:
                stats = group_stats([r for r in attn if r["condition"] == cond and r["K"] == K and r["length"] == L],
                                    ("offset",), "weight")
                if stats:
                    ax.plot([d for d, in stats], [v[0] for v in stats.values()], marker=".", label=f"L={L}")
            ax.axvline(-K, color="grey", ls="--", lw=1)
            ax.set(title=f"{cond}, K = {K}", xlabel="offset t - n", ylabel="mean attention")
            ax.legend(fontsize=7)
    return save(fig, out / "fig1_attention.png")


EXPERIMENT = Experiment(name="phenomenon", title="Table 1 / Fig. 1: RoPE generalizes, APE memorizes", study=study,
                        evaluate=evaluate, report=report, in_run_all=True)
