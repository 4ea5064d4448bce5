"""Where RoPE models get absolute position from (seed 001, third abstract): the leakage study.

Small character LMs with a BOS at position 0, trained alike as a 2 x 2 grid (RoPE or NTK-scaled
RoPE, full causal attention or a sliding window), are probed per layer and head for (a), the causal
mask's share, and (b), the residual stream's, also at early queries and under interventions at
position 0 (:mod:`poslab.probes.leakage`). The set-up, the definitions and how "present" is
judged are described in docs/leakage.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from poslab.errors import ConfigError
from poslab.experiments.charlm import CPU_MODEL, recipe_train
from poslab.experiments.checks import require_rotary
from poslab.experiments.config import EvalConfig, StudyConfig
from poslab.experiments.outputs import Column, Heatmap, Lines, Pivot, Table, select, write_outputs
from poslab.experiments.runner import Experiment
from poslab.experiments.spec import (
    ClaimSpec,
    above,
    is_,
    judge_all,
    lower_bound,
    mean,
    minimum,
    probe,
    share,
    undecidable,
)
from poslab.probes import leakage as lk
from poslab.probes.leakage import PRESENT
from poslab.tasks import eval_batch
from poslab.train import TrainConfig, evaluate_loss

FIXED = {"model.bos": "the study is about the BOS at position 0",
         "model.causal": "position 0 is a closed system only under a causal mask",
         "eval.lengths": "one evaluation length, the training length (train.max_length)"}


def study(preset: str) -> StudyConfig:
    """``paper``: nanoGPT's shakespeare_char CPU recipe (4 layers, 4 heads, d_model 128, context
    64, batch 12, 2000 steps, lr 1e-3 cosine to 1e-4, AdamW, no dropout), 3 seeds, window 16;
    ``quick``: a 2-layer d_model 32 model for 40 steps, every code path in seconds."""
    if preset == "quick":
        model, T, window, seeds = dict(d_model=32, n_layers=2, n_heads=2, bos=True), 16, 6, 2
        train = TrainConfig(steps=40, batch_size=16, lr=3e-3, optimizer="adamw", min_length=T, max_length=T)
        evaluation = EvalConfig(lengths=(T,), n_sequences=16, seed=0, chunk=16)
    else:
        model, T, window, seeds = dict(CPU_MODEL, bos=True), 64, 16, 3
        train = recipe_train("paper")
        evaluation = EvalConfig(lengths=(T,), n_sequences=256, seed=0, chunk=128)
    return StudyConfig(model_type="transformer", model=model, task_type="text", task={},
                       grid={"encoding": ("rope", "rope_ntk"), "model.window": (None, window)},
                       seeds=seeds, train=train, eval=evaluation)


MODEL = probe("model")  # derived: one row per model and seed, means over layers and heads
STANDARD = is_("model", "RoPE")
CLAIMS = [
    ClaimSpec(name="{model}: component (b) present", paper="present in all three", where=MODEL, per=("model",),
              measure=lower_bound("component_b", "seed mean of (b) - 2 standard errors"), op=">", threshold=0.0,
              note="{seeds} seeds; present: above 0 across seeds (the abstract gives no size); (b) is unbiased, 0 on "
                   "average without key-position terms"),
    ClaimSpec(name="{model}: component (a) present", paper="present in all three (by construction: the causal "
              "mask's per-query denominator)", where=MODEL, per=("model",),
              measure=lower_bound("component_a", "seed mean of (a) - 2 standard errors"),
              na=undecidable("true by construction under a causal mask: query i sees i + 1 keys, so the relative fit's "
                 "log-normaliser moves with i and (a) > 0 for any finite profile (tests/probes: pure relative logits "
                 "give (a) > 0); its size is what this task measures, shown here and in the next rows")),
    *[ClaimSpec(name=f"{{model}}: component ({c}) at least {PRESENT:g} of its variance (earlier line)",
                paper="present in all three (no size given)", where=MODEL, per=("model",),
                measure=mean(f"component_{c}", f"mean ({c}) over layers, heads and seeds"),
                na=undecidable(f"the abstract gives no size; {PRESENT:g} was poslab's own line, shown beside the presence rows "
                   "above")) for c in "ab"],
    ClaimSpec(name="NTK scaling suppresses (b)", paper="(b) smaller under NTK than standard RoPE",
              where=probe("gap") & is_("contrast", "standard - NTK"),
              measure=mean("gap", "mean (b) RoPE - NTK RoPE"), op=">", threshold=0.0),
    ClaimSpec(name="{model}: (b) grows with depth", paper="accumulates with depth",
              where=MODEL & is_("encoding", "rope") & above("window", 0), per=("model",),
              measure=mean("depth_slope", "slope of the layer-mean (b) on the layer"), op=">", threshold=0.0),
    ClaimSpec(name="standard RoPE sits between NTK and {model}", paper="NTK < standard < sliding window",
              where=probe("between"), per=("model",), op=">", threshold=0.0,
              measure=mean("margin", "min(standard - NTK, window - standard) of the seed-mean (b)"),
              note="on the means over seeds"),
    ClaimSpec(name="standard RoPE: BOS swap (most frequent token) changes early (b)", paper="-40%",
              where=probe("swap") & STANDARD & is_("intervention", "bos_token"), measure=mean("change"),
              op="~", threshold=-0.40, tol=0.20, percent=True,
              note="{seeds} seeds; a seed counts only where its early (b) as trained is at least PRESENT = 0.01"),
    ClaimSpec(name="standard RoPE: {intervention} changes early (b)", paper="-40% (BOS swap)",
              where=probe("swap") & STANDARD & is_("intervention", "bos_random", "bos_mean"),
              per=("intervention",), measure=mean("change"), percent=True,
              na=undecidable("the abstract names no replacement; the most frequent token's embedding is judged, these are shown")),
    ClaimSpec(name="fixed BOS: position-0 residual identical across inputs", paper="constant fingerprint with BOS",
              where=probe("closed"), measure=minimum("fixed_bos", "min cosine over layers and models"),
              op=">", threshold=0.9999),
    ClaimSpec(name="content token at 0: position-0 residual varies with it", paper="varies with the token otherwise",
              where=probe("closed") & above("layer", 0), measure=mean("content", "mean cosine after layer 1 on"),
              op="<", threshold=0.99),
    ClaimSpec(name="sink-reading heads (received_0 >= 0.3) exist", paper="read downstream by sink-reading heads",
              where=MODEL, measure=share("sink_heads", ">=", 1, "share of models x seeds with one"),
              op=">=", threshold=1.0, percent=True),
]


def _ab(prefix: str = "") -> tuple[Column, ...]:
    return (Column(f"{prefix}(a)", f"{prefix.replace(' ', '_')}component_a"),
            Column(f"{prefix}(b)", f"{prefix.replace(' ', '_')}component_b"))


TABLES = [
    Table("Components per model", by=("model",), where=MODEL,
          intro="Mean ± std over seeds of each seed's mean over layers and heads. (a): share of the log-weights' "
                "variance in the relative fit's log-normaliser; (b): share of the per-query-centred logits' "
                "variance beyond f(i - j) + g(i) (fitting x held-out halves), split in the next two columns.",
          columns=(*_ab(), Column("(b) key h(j)", "component_b_key"),
                   Column("(b) interactions", "component_b_interaction"), *_ab("early "),
                   Column("slope of (b) on layer", "depth_slope"), Column("sink heads", "sink_heads", 1),
                   Column("val loss", "val_loss"))),
    Table("Old definitions beside the new", by=("model",), where=MODEL,
          intro="Old (b): ΔR² of the raw logits, f(i-j) + g(i) + h(j) against f(i-j); old (a): ΔR²(log-weights) − "
                "ΔR²(logits). Both move with query-only terms that softmax cancels.",
          columns=(Column("old (a)", "old_component_a"), Column("new (a)", "component_a"),
                   Column("old (b)", "old_component_b"), Column("new (b)", "component_b"))),
    Table("Components by layer", by=("model", "layer"), where=probe("head"),
          intro="Mean ± std over heads and seeds.",
          columns=(*_ab(), Column("early (b)", "early_component_b"), Column("slope of log Z_i on log(i+1)",
                                                                           "log_z_slope"),
                   Column("share of sink-reading heads", "sink"))),
    Table("Interventions: change of early (b), %", by=("model",), where=probe("swap"),
          pivot=Pivot("intervention", "change_pct", "{}", 1),
          intro="Per seed, (mean early (b) under the intervention − as trained) / as trained, means over layers "
                "and heads; published for the BOS swap: −40%. Empty: no seed whose early (b) is at least 0.01, "
                "or no sink-reading head to remove."),
    Table("Closed-system check: position-0 residual across inputs", by=("model", "layer"), where=probe("closed"),
          intro="Mean pairwise cosine similarity of the position-0 residual over the evaluation windows "
                "(layer 0: the embedding, l: leaving layer l - 1).",
          columns=(Column("fixed BOS", "fixed_bos"), Column("content token at 0", "content"))),
]
FIGURES = [Lines(f"fig_{y}_by_layer.png", x="layer", y=y, series=("model",), where=probe("head"), hline=0.0,
                 ylabel=label, title=label)
           for y, label in (("component_a", "(a) causal-mask normaliser share"),
                            ("component_b", "(b) key position and interactions"),
                            ("early_component_b", "(b) at early queries"))] + [
    Heatmap("fig_sink_heads.png", value="received_0", y="layer", x="head", panel=("model",), where=probe("head"),
            annotate=lk.SINK_THRESHOLD, colorbar="attention received by key 0")]


def check(study: StudyConfig) -> None:
    require_rotary(study)
    if study.model.get("n_layers", 2) < 2:
        raise ConfigError("model.n_layers", study.model.get("n_layers"), "at least 2 (depth is a question here)")


def early_queries(study: StudyConfig) -> int:
    """Early queries are internal positions i < max(4, T / 4) (BOS at 0)."""
    return max(4, study.train.max_length // 4)


def model_label(encoding: str, window) -> str:
    base = {"rope": "RoPE", "rope_ntk": "NTK RoPE"}.get(encoding, encoding)
    return base if window is None else f"{base} + window {window}"


# ----------------------------------------------------------------------------- per member and derived rows

def evaluate(ctx) -> list[dict]:
    study, ev = ctx.study, ctx.study.eval
    batch = eval_batch(dataclasses.replace(ctx.task, split="val"), study.train.max_length, ev.n_sequences, ev.seed,
                       device=ctx.device)
    loss = evaluate_loss(ctx.model, batch, chunk=ev.chunk)
    rows = lk.leakage_rows(ctx.model, batch, early=early_queries(study), chunk=ev.chunk)
    return [dict(probe="member", val_loss=loss["loss"], val_accuracy=loss["accuracy"],
                 sink_heads=sum(r["sink"] for r in select(rows, "head")), early=early_queries(study)), *rows]


def labelled(rows: list[dict]) -> list[dict]:
    """Every row with its model's label (``model``)."""
    return [{**r, "model": model_label(r["encoding"], r.get("window"))} for r in rows]


def contrast_rows(models: list[dict]) -> list[dict]:
    """The abstract's ordering as rows: per seed, mean (b) of standard RoPE minus NTK RoPE
    (probe "gap"); per windowed RoPE, min(standard - NTK, window - standard) of the seed means
    (probe "between")."""
    b = {(r["model"], r["seed"]): r["component_b"] for r in models}
    seeds = sorted({s for _, s in b})
    out = [dict(probe="gap", contrast="standard - NTK", seed=s, gap=b[("RoPE", s)] - b[("NTK RoPE", s)])
           for s in seeds if ("RoPE", s) in b and ("NTK RoPE", s) in b]
    avg = {m: float(np.mean([v for (mm, _), v in b.items() if mm == m])) for m, _ in b}
    for m in sorted({r["model"] for r in models if r["encoding"] == "rope" and r.get("window") is not None}):
        if "RoPE" in avg and "NTK RoPE" in avg:
            out.append(dict(probe="between", model=m, margin=min(avg["RoPE"] - avg["NTK RoPE"], avg[m] - avg["RoPE"])))
    return out


def derived_rows(rows: list[dict]) -> list[dict]:
    models = lk.model_rows(rows)
    return models + lk.swap_rows(rows) + contrast_rows(models)


# ----------------------------------------------------------------------------- report

def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    rows = labelled(rows)
    every = rows + derived_rows(rows)
    seeds = sorted({r["seed"] for r in rows})
    intro = (f"{len(seeds)} seeds ({', '.join(map(str, seeds))}). Held-out windows of the validation split, "
             f"L = {study.train.max_length} (+ BOS), {study.eval.n_sequences} windows (half fit, half held out). "
             f"Early queries: internal positions i < {early_queries(study)}. (b) is judged present when its seed "
             f"mean less two standard errors over seeds is above 0 (the abstract gives no size); (a) > 0 holds by "
             f"construction under a causal mask and is shown; the earlier line, {PRESENT:g} of the variance a "
             f"component is a share of, is shown beside both.")
    return write_outputs(out, title=EXPERIMENT.title, rows=every, csv_rows=rows, claims=judge_all(CLAIMS, every),
                         intro=intro, tables=TABLES, figures=FIGURES)


EXPERIMENT = Experiment(name="leakage",
                        title="Positional leakage in RoPE models: causal mask (a) and residual stream (b)",
                        study=study, evaluate=evaluate, report=report, fixed=FIXED, check=check)
