"""The seed paper's head-count paragraph: H in {1, 2, 4} rotary retrieval heads.

Two sweeps over H, at fixed width d_model = 64 and at fixed per-head width d_head = 64, on
content-conditioned retrieval (K1 = 2, K2 = 3) and on fixed offset K = 2; peak height per query
class. The set-up and the paper's words are in docs/two-layer-heads.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poslab import probes
from poslab.experiments import Trained
from poslab.experiments.config import QUICK, StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, select, value_range, write_outputs
from poslab.experiments.rows import RowKind, column, frame, groups, lookup, of_kind, pick, where_is
from poslab.experiments.spec import (
    ClaimSpec,
    Extrapolation,
    InRange,
    above,
    at_most,
    is_,
    judge_all,
    mean,
    probe,
    seed_states,
)
from poslab.lazy import pandas as pd
from poslab.probes.per_head import head_summaries, peak_heights
from poslab.tasks import eval_batch

WIDTH, LONGEST = 64, 48
MIN_DROP = 0.05  # the H=1 -> H=4 peak drop below which "the share of it undone" is not computed
SETTINGS = {  # H heads at fixed d_model = 64, and at fixed d_head = 64 (d_model = 64 H)
    **{f"H={H}": {"model.n_heads": H, "model.d_model": 64} for H in (1, 2, 4)},
    **{f"H={H}, d_head=64": {"model.n_heads": H, "model.d_model": 64 * H} for H in (2, 4)},
}
CC, FIXED = is_("K2", 3), is_("K2", 2)  # content-conditioned (K1 = 2, K2 = 3) and fixed offset K = 2
AT_48 = probe("length") & is_("length", LONGEST) & is_("d_model", WIDTH)
PAPER_PEAK = {1: 0.69, 4: 0.30}
PAPER_SV = (0.39, 0.57)  # "top singular-value energy 0.39-0.57": the range over the heads of the H >= 2 models
# what each claim is (its role follows: experiments/spec.role_of): the seed's paragraph is content-conditioned
# retrieval at d_model = 64; fixed offset and the fixed-d_head sweep are other settings
HEADS = seed_states("Heads paragraph: on the content-conditioned task a single head implements both offsets; with two "
                    "heads the selection is solved at 1.00; each head's W has top singular-value energy 0.39-0.57; "
                    "splitting width across heads raises dilution (peak attention at L = 48 falls from 0.69 at H = 1 "
                    "to 0.30 at H = 4); the operative resource is the per-head frequency count")
# the learned-in-range gate: the study's own line (accuracy at trained lengths >= 0.97), per task x H x width
GATE = InRange(where=probe("length") & at_most("length", 16), column="accuracy", threshold=0.97,
               match=("task", "n_heads", "d_model"), text="in-range accuracy (L <= 16, mean over seeds and lengths)")
GATED = ("2026-12-07: the learned-in-range gate (issue 53): a claim past the range or on a trained head's mechanism "
         "is n.a. where its models did not learn the task in range")
ROLE = "2026-12-07: role computed from source x setting (issue 53): "
IN_RANGE: dict[str, Any] = dict(
                name="{task}, H={n_heads}, d_head={d_head}: accuracy at trained lengths (L ≤ 16)", paper="1.00",
                per=("task", "n_heads", "d_head"), measure=mean("accuracy"), op=">=", threshold=0.97, source=HEADS,
                revised=ROLE + "the seed's paragraph is content-conditioned retrieval at d_model = 64; fixed offset "
                               "and the fixed-d_head sweep are other settings (control, were paper)")
CLAIMS = [
    ClaimSpec(**IN_RANGE, where=probe("length") & at_most("length", 16) & CC & is_("d_model", WIDTH), setting="seed"),
    ClaimSpec(**IN_RANGE, where=probe("length") & at_most("length", 16) & CC & above("d_model", WIDTH),
              setting="other", note="{seeds} seeds, {n} rows; d_head = 64 at H >= 2: this study's sweep, a control"),
    ClaimSpec(**IN_RANGE, where=probe("length") & at_most("length", 16) & FIXED, setting="other",
              note="{seeds} seeds, {n} rows; fixed offset: the seed's number is the content-conditioned task's"),
    *[ClaimSpec(name=f"{{task}}, H={H}, d_model=64: peak attention at L=48 (per query class, highest head)",
                paper=f"{p}", where=AT_48 & CC & is_("n_heads", H), per=("task",), measure=mean("peak_height"),
                op="~", threshold=p, tol=0.1, source=HEADS, setting="seed", trained=True, revised=GATED)
      for H, p in PAPER_PEAK.items()],
    *[ClaimSpec(name=f"{{task}}, H={H}, d_model=64: peak attention at L=48 (per query class, highest head)",
                paper=f"{p} (content-conditioned)", where=AT_48 & FIXED & is_("n_heads", H), per=("task",),
                measure=mean("peak_height"), op="~", threshold=p, tol=0.1, source=HEADS, setting="other",
                trained=True, revised=GATED,
                note="the paper's number is the content-conditioned task's; the same criterion on fixed offset")
      for H, p in PAPER_PEAK.items()],
    *[ClaimSpec(name="{task}, H=2, d_model=64: peak attention at L=48 (per query class, highest head)",
                paper="between 0.69 and 0.30 (splitting width across heads raises dilution)",
                where=AT_48 & task & is_("n_heads", 2), per=("task",), measure=mean("peak_height"), op="~",
                threshold=(PAPER_PEAK[1] + PAPER_PEAK[4]) / 2, tol=(PAPER_PEAK[1] - PAPER_PEAK[4]) / 2, source=HEADS,
                setting=setting, trained=True,
                revised="2026-12-07: judged where the task decides (issue 53), was n.a. (comparison only, role "
                        "control): 'splitting width across heads raises dilution' puts H = 2 between the seed's own "
                        "H = 1 and H = 4 peaks, 0.69 and 0.30 (the interval they span); role from source x setting "
                        "(content-conditioned: paper; fixed offset: control); " + GATED[12:],
                note="{seeds} seeds; the seed gives no H = 2 number: its statement that splitting width raises "
                     "dilution places H = 2 between its H = 1 and H = 4 peaks" + extra)
      for task, setting, extra in ((CC, "seed", ""), (FIXED, "other", "; fixed offset: the content-conditioned "
                                                                      "task's numbers, a control"))],
    *[ClaimSpec(name="{task}, H={n_heads}, d_model=64: per-head top singular-value energy of W, range over heads "
                     f"x seeds overlaps the seed's {PAPER_SV[0]}-{PAPER_SV[1]}",
                renamed_from="{task}, H={n_heads}, d_model=64: per-head top singular-value energy of W, range {range} "
                             f"over heads x seeds overlaps the seed's {PAPER_SV[0]}-{PAPER_SV[1]}",
                paper=f"{PAPER_SV[0]}-{PAPER_SV[1]} over heads", where=probe("sv_range") & task,
                per=("task", "n_heads"),
                measure=mean("overlap", text="length of the intersection of the two ranges"), op=">", threshold=0.0,
                source=HEADS, setting=setting, trained=True,
                revised=GATED + "; 2026-12-07: the measured range left the claim's name and its groups (per task x H, "
                                "was per task x H x range): a name holding a measured number changed with every run, "
                                "so the registry could not follow the claim; the range is in the table beside it",
                note=f"[min, max] over heads x seeds at L = 16; overlap > 0: the measured range meets the "
                     f"seed's (the share of the seed's range it covers is in the table){extra}")
      for task, setting, extra in ((CC, "seed", ""), (FIXED, "other", "; the seed's range is the content-conditioned "
                                                                       "task's, the same criterion on fixed offset"))],
    *[ClaimSpec(name="{task}: share of the H=1 -> H=4 peak drop (longest L) undone by keeping d_head = 64",
                paper="the operative resource is the per-head frequency count", where=probe("resource") & task,
                per=("task",), measure=mean("recovered"), op=">=", threshold=0.5, source=HEADS, setting=setting,
                trained=True,
                revised=(ROLE + "fixed offset is another setting than the seed's content-conditioned paragraph "
                                "(control, was paper); " if setting == "other" else "2026-12-07: ") + GATED[12:],
                note="(peak[H=4, d_head=64] - peak[H=4, d_model=64]) / (peak[H=1] - peak[H=4, d_model=64]), mean "
                     "over {seeds} seeds; ≥ 0.5: per-head width explains most of the drop")
      for task, setting in ((CC, "seed"), (FIXED, "other"))],
]


TABLES = [
    Table("Accuracy by length", by=("task", "setting"), where=probe("length"),
          pivot=Pivot("length", "accuracy", "L={}")),
    Table("Peak attention at L = 48", by=("task", "setting"), where=probe("length") & is_("length", LONGEST),
          intro="per class: each query class's own mean attention, its maximum, the highest head, mean over the "
                "two classes (the measure judged); pooled: attention averaged over both classes first (the "
                "earlier measure, a control). 'mean head': the same over heads instead of the highest.",
          columns=(Column("per class", "peak_height"), Column("per class, mean head", "peak_height_mean"),
                   Column("class q < m/2", "peak_class0"), Column("class q ≥ m/2", "peak_class1"),
                   Column("pooled", "peak_pooled"), Column("pooled, mean head", "peak_pooled_mean"))),
    Table("Per head at L = 16", by=("task", "setting"), where=probe("head"),
          columns=(Column("carrier q", "carrier_q"), Column("carrier k", "carrier_k"),
                   Column("sigma_1^2 share (min-max)", value_range("rank_concentration")),
                   Column("sigma_1^2 share", "rank_concentration"))),
    Table("Per-head top singular-value energy of W: range over heads x seeds against the seed's 0.39-0.57",
          by=("task", "n_heads"), where=probe("sv_range"),
          columns=(Column("lowest", mean("lo")), Column("highest", mean("hi")), Column("overlap", mean("overlap")),
                   Column("share of 0.39-0.57 covered", mean("covered")))),
    Table("Per-head width as the resource (peak at the longest length, per seed)", by=("task",),
          where=probe("resource"),
          columns=(Column("H=1", "peak_h1"), Column("H=4, d_model=64", "peak_h4"),
                   Column("H=4, d_head=64", "peak_h4_wide"), Column("share of the drop undone", "recovered"))),
]
FIGURES = [Lines("peak_by_heads.png", x="n_heads", y="peak_height", series=("sweep",), panel="task",
                 where=probe("sweep"), xlabel="heads H", ylabel="peak attention, longest L (per class)")]


# Paper preset: 3 seeds (the paper gives none for this paragraph), 4000 steps.
BASE = StudyConfig(model_type="retrieval_head", task_type="content_conditioned", task=dict(m=20, K1=2),
                   grid={"setting": tuple(SETTINGS), "task.K2": (3, 2)}, settings=SETTINGS, seeds=3)
PRESETS = {"paper": {}, "quick": QUICK}


def evaluate(ctx) -> list[dict]:
    study, task, model = ctx.study, ctx.task, ctx.model
    label = f"fixed offset K={task.K1}" if task.K1 == task.K2 else f"content-conditioned K1={task.K1}, K2={task.K2}"
    shape = dict(task=label, n_heads=model.cfg.n_heads, d_model=model.cfg.d_model, d_head=model.cfg.d_head)
    rows = []
    for L in study.eval.lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, attn = probes.accuracy_and_attention(model, batch, chunk=study.eval.chunk)  # attn [h, L]
        rows.append(dict(probe="length", length=L, accuracy=acc, chance=task.chance, **shape,
                         **peak_heights(model, batch, task.m, study.eval.chunk, attn)))
    batch = eval_batch(task, study.train.max_length, study.eval.n_sequences, study.eval.seed, device=ctx.device)
    return rows + [dict(probe="head", head=h, **shape, **s) for h, s in enumerate(head_summaries(model, batch))]


SWEEP = RowKind("sweep", {"sweep": str, "task": str, "seed": int, "n_heads": int, "peak_height": float})
RESOURCE = RowKind("resource", {"task": str, "K2": int | None, "seed": int, "peak_h1": float, "peak_h4": float,
                                "peak_h4_wide": float, "recovered": float})
SV_RANGE = RowKind("sv_range", {"task": str, "K2": int | None, "n_heads": int, "d_model": int, "lo": float,
                                "hi": float, "range": str, "overlap": float, "covered": float, "seeds": int})


def derived_rows(rows: list[dict]) -> list[dict]:
    """``sweep`` rows (the peak at the longest length, 48 in the presets, in each sweep: H=1 belongs to
    both) and per (task, seed) a ``resource`` row: the share of the H=1 -> H=4 drop at d_model=64 that
    d_head=64 undoes (only where that drop is at least ``MIN_DROP``: a smaller one makes the share noise);
    and the ``sv_range`` rows (:func:`sv_range_rows`)."""
    df = frame(rows)
    lengths = of_kind(df, "length")
    at = where_is(lengths, "length", max(column(lengths, "length"), default=None))
    out = [SWEEP(sweep=f"{name} = {WIDTH}", task=r["task"], seed=r["seed"], n_heads=r["n_heads"],
                 peak_height=r["peak_height"]) for r in pick(rows, at) for name in ("d_model", "d_head")
           if r[name] == WIDTH]
    return out + resource_rows(at) + sv_range_rows(rows)


def resource_rows(at: pd.DataFrame) -> list[dict]:
    """Per (task, seed), the share of the H=1 -> H=4 peak drop at d_model = 64 that d_head = 64 undoes,
    where the drop is at least ``MIN_DROP``."""
    peak = lookup(at, ("task", "seed", "n_heads", "d_head"), "peak_height")
    k2 = lookup(at, ("task",), "K2")
    out = []
    for task, seed in sorted(set(zip(column(at, "task"), column(at, "seed"), strict=True))):
        h1, h4, wide = (peak.get((task, seed, H, d)) for H, d in ((1, WIDTH), (4, WIDTH // 4), (4, WIDTH)))
        if h1 is not None and h4 is not None and wide is not None and h1 - h4 >= MIN_DROP:
            out.append(RESOURCE(task=task, K2=k2[(task,)], seed=seed, peak_h1=h1, peak_h4=h4, peak_h4_wide=wide,
                                recovered=(wide - h4) / (h1 - h4)))
    return out


def sv_range_rows(rows: list[dict]) -> list[dict]:
    """Per (task, H >= 2) at d_model = 64 an ``sv_range`` row: the [lo, hi] of the heads' top
    singular-value energy over heads x seeds, its ``overlap`` with the seed's :data:`PAPER_SV` (0 when
    they do not meet) and the share of the seed's range it ``covered``."""
    heads = where_is(frame(select(rows, "head")), "d_model", WIDTH)
    heads = heads[column(heads, "n_heads", 0).map(lambda h: h >= 2).astype(bool)]
    out = []
    for (task, H), mine in groups(heads, ("task", "n_heads"), sort=True):
        lo, hi = min(mine["rank_concentration"]), max(mine["rank_concentration"])
        overlap = max(0.0, min(hi, PAPER_SV[1]) - max(lo, PAPER_SV[0]))
        out.append(SV_RANGE(task=task, K2=column(mine, "K2").iloc[0], n_heads=H, d_model=WIDTH, lo=lo, hi=hi,
                            range=f"[{lo:.3f}, {hi:.3f}]", overlap=overlap,
                            covered=overlap / (PAPER_SV[1] - PAPER_SV[0]), seeds=len(set(mine["seed"]))))
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    rows = rows + derived_rows(rows)
    intro = (f"Mean ± std over seeds 0..{study.seeds - 1}; RoPE; {study.train.steps} steps, lengths in "
             f"[{study.train.min_length}, {study.train.max_length}] drawn per {study.train.length_sampling}; "
             f"{study.eval.n_sequences} sequences per length. Settings: H heads at d_model = 64 (the paper's sweep) "
             "and at d_head = 64 (d_model = 64 H). Carrier energies and W's top singular-value energy per head at "
             "L = 16.")
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=judge_all(CLAIMS, rows, GATE), intro=intro,
                         tables=TABLES, figures=FIGURES, csv_rows=select(rows, "length"),
                         csvs={"heads.csv": "head"})


EXPERIMENT = Trained(name="heads", title="Head count: H in {1, 2, 4} at fixed width and at fixed per-head width, "
                        "on content-conditioned and fixed-offset retrieval", base=BASE, presets=PRESETS,
                     evaluate=evaluate,
                        report=report, in_run_all=True,
                        extrapolation=Extrapolation("fixed_offset", probe("length"), "accuracy"))  # every H and task
