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
from poslab.experiments import Trained
from poslab.experiments.config import EvalConfig, StudyConfig
from poslab.experiments.outputs import Column, Heatmap, Lines, Pivot, Table, select, write_outputs
from poslab.experiments.rows import frame, groups, values, where_is
from poslab.experiments.spec import (
    ClaimSpec,
    above,
    derivation,
    is_,
    judge_all,
    lower_bound,
    maximum,
    mean,
    minimum,
    probe,
    share,
)
from poslab.probes import leakage as lk
from poslab.studies.kit import leakage_rows as lr
from poslab.studies.kit.charlm import CPU_MODEL, recipe_train
from poslab.studies.kit.checks import require_rotary
from poslab.studies.kit.leakage_rows import (
    BALANCE,
    BOTH,
    FINGERPRINT,
    MASK,
    SINK_READING,
    SWAP_SOURCE,
)
from poslab.tasks import eval_batch
from poslab.train import TrainConfig, evaluate_loss

FIXED = {"model.bos": "the study is about the BOS at position 0",
         "model.causal": "position 0 is a closed system only under a causal mask",
         "eval.lengths": "one evaluation length, the training length (train.max_length)"}


TRAINED = "as trained"  # the variant column of a trained member's rows (the NTK-at-inference variant: NTK_INFERENCE)
NTK_INFERENCE = "ntk_inference"
MODEL = probe("model") & is_("variant", TRAINED)  # derived: one row per model and seed, means over layers and heads
STANDARD = is_("model", "RoPE")
KEY0 = ("the key-0 part of (b): its residual product on the pairs (i, 0), position 0 read by the queries, the "
        "abstract's mechanism")
EVERY_KEY = "(b) over every key (the earlier reading): not the abstract's position-0 mechanism alone"
# what each claim is (its role follows: experiments/spec.role_of). The leakage abstract (seed 001, third) states the
# claims for its three architectures (standard RoPE, NTK scaling, a sliding window) at no size: this grid of small
# character LMs is their setting ("seed"); a reading or an architecture the abstract does not use is "other"
CAUSALITY = derivation("position 0 sees only itself under causal attention and starts from the same BOS vector")
SWAP = dataclasses.replace(lr.SWAP, source=SWAP_SOURCE, setting="seed", revised=lr.AGREED)
CLAIMS = [
    ClaimSpec(name="{model}: component (b) at key 0 present", paper="present in all three", where=MODEL,
              per=("model",), measure=lower_bound("component_b_key0", "seed mean of (b) at key 0 - 2 standard errors"),
              op=">", threshold=0.0, source=BOTH, setting="seed",
              note="{seeds} seeds; " + KEY0 + "; unbiased, 0 on average without it"),
    ClaimSpec(name="{model}: component (b) over every key present", paper="present in all three", where=MODEL,
              per=("model",), measure=lower_bound("component_b", "seed mean of (b) - 2 standard errors"), op=">",
              threshold=0.0, source=BOTH, setting="other", note="{seeds} seeds; " + EVERY_KEY),
    ClaimSpec(name="{model}: component (a) present", paper="present in all three (by construction: the causal "
              "mask's per-query denominator)", where=MODEL, per=("model",),
              measure=lower_bound("component_a", "seed mean of (a) - 2 standard errors"), op=">", threshold=0.0,
              source=MASK, setting="seed",
              note="{seeds} seeds; > 0 by construction under a causal mask: query i sees i + 1 keys, so the relative "
                   "fit's log-normaliser moves with i (tests/probes: pure relative logits give (a) > 0); its size is "
                   "the measurement"),
    ClaimSpec(name="NTK scaling (trained with the NTK base) suppresses (b) at key 0",
              paper="(b) smaller under NTK than standard RoPE", where=probe("gap") & is_("contrast", "trained"),
              measure=mean("gap_key0", "mean (b) at key 0, RoPE - NTK RoPE"), op=">", threshold=0.0,
              source=BALANCE, setting="seed",
              note="{seeds} seeds; the abstract's NTK model is an architecture, trained that way; " + KEY0),
    ClaimSpec(name="NTK scaling (applied at inference to standard RoPE) suppresses (b) at key 0",
              paper="(b) smaller under NTK than standard RoPE", where=probe("gap") & is_("contrast", "inference"),
              measure=mean("gap_key0", "mean (b) at key 0, RoPE - the same weights under NTK"), op=">",
              threshold=0.0, source=BALANCE, setting="other",
              note="{seeds} seeds; the standard models' weights under the NTK base (factor 4), not trained with it"),
    ClaimSpec(name="NTK scaling (trained with the NTK base) suppresses (b) over every key",
              paper="(b) smaller under NTK than standard RoPE", where=probe("gap") & is_("contrast", "trained"),
              measure=mean("gap", "mean (b) RoPE - NTK RoPE"), op=">", threshold=0.0, source=BALANCE, setting="other",
              note="{seeds} seeds; " + EVERY_KEY),
    *[ClaimSpec(name=f"{{model}}: (b) {part} grows with depth", paper="accumulates with depth",
                where=MODEL & is_("encoding", "rope") & above("window", 0), per=("model",), source=BALANCE,
                setting=setting,
                measure=mean(column, f"slope of the layer-mean (b) {part} on the layer"), op=">", threshold=0.0,
                note="{seeds} seeds; " + why)
      for part, column, setting, why in (("at key 0", "depth_slope_key0", "seed", KEY0),
                                         ("over every key", "depth_slope", "other", EVERY_KEY))],
    *[ClaimSpec(name=f"standard RoPE sits between NTK and {{model}}, (b) {part}", paper="NTK < standard < sliding "
                "window", where=probe("between"), per=("model",), op=">", threshold=0.0, source=BALANCE,
                setting=setting,
                measure=mean(column, f"min(standard - NTK, window - standard) of the seed-mean (b) {part}"),
                note="on the means over seeds; " + why)
      for part, column, setting, why in (("at key 0", "margin_key0", "seed", KEY0),
                                         ("over every key", "margin", "other", EVERY_KEY))],
    SWAP,
    ClaimSpec(name="fixed BOS: position-0 residual identical across inputs", paper="constant fingerprint with BOS",
              where=probe("closed"), measure=minimum("fixed_bos", "min cosine over layers and models"),
              op=">", threshold=0.9999, source=CAUSALITY, setting="seed",
              note="follows from causality: position 0 sees only itself and starts from the same vector"),
    ClaimSpec(name="content token at 0: position-0 residual varies with it at every layer",
              paper="varies with the token otherwise", where=probe("closed") & above("layer", 0),
              measure=maximum("content", "highest seed-mean cosine over models and layers 1 on",
                              by=("model", "layer")),
              op="<", threshold=0.99, source=FINGERPRINT, setting="seed",
              note="{seeds} seeds; the least varying layer decides"),
    ClaimSpec(name="sink-reading heads (received_0 >= 0.3) exist", paper="read downstream by sink-reading heads",
              where=MODEL, measure=share("sink_heads", ">=", 1, "share of models x seeds with one"),
              op=">=", threshold=1.0, percent=True, source=SINK_READING, setting="seed"),
    *[ClaimSpec(name=f"{{model}}: (b) at key 0 drops when key 0 is removed in {where}",
                paper="downstream attention reads position 0 through sink-reading heads",
                where=probe("pathway") & is_("ablation", where), per=("model",), source=SINK_READING,
                setting=setting,
                measure=lower_bound("key0_drop", "seed mean of the drop of (b) at key 0, layers >= 1, - 2 standard "
                                                 "errors"), op=">", threshold=0.0, note="{seeds} seeds; " + why)
      for where, setting, why in (
          ("sink-reading heads", "seed", "drop_key0: key 0 removed for queries i >= 1 in the heads with received_0 "
                                          ">= 0.3 (runs only where one exists); layer 0 reads the embeddings"),
          ("every head", "other", "drop_key0_all: key 0 removed for queries i >= 1 in every head, sink or not; "
                                    "layer 0 reads the embeddings"))],
]


def _ab(prefix: str = "") -> tuple[Column, ...]:
    return (Column(f"{prefix}(a)", f"{prefix.replace(' ', '_')}component_a"),
            Column(f"{prefix}(b)", f"{prefix.replace(' ', '_')}component_b"))


TABLES = [
    Table("Components per model", by=("model",), where=probe("model"),
          intro="Mean ± std over seeds of each seed's mean over layers and heads (NTK at inference: the standard "
                "models' weights under the NTK base). (a): share of the log-weights' variance in the relative fit's "
                "log-normaliser; (b): share of the per-query-centred logits' variance beyond f(i - j) + g(i) "
                "(fitting x held-out halves), split by term (key h(j), interactions) and by key (key 0, the "
                "others).",
          columns=(*_ab(), Column("(b) key h(j)", "component_b_key"),
                   Column("(b) interactions", "component_b_interaction"), Column("(b) at key 0", "component_b_key0"),
                   Column("(b) other keys", "component_b_rest"), *_ab("early "),
                   Column("early (b) at key 0", "early_component_b_key0"),
                   Column("slope of (b) on layer", "depth_slope"), Column("slope of (b) at key 0", "depth_slope_key0"),
                   Column("sink heads", "sink_heads", 1), Column("val loss", "val_loss"))),
    Table("Old definitions beside the new", by=("model",), where=probe("model"),
          intro="Old (b): ΔR² of the raw logits, f(i-j) + g(i) + h(j) against f(i-j); old (a): ΔR²(log-weights) − "
                "ΔR²(logits). Both move with query-only terms that softmax cancels.",
          columns=(Column("old (a)", "old_component_a"), Column("new (a)", "component_a"),
                   Column("old (b)", "old_component_b"), Column("new (b)", "component_b"))),
    Table("Components by layer", by=("model", "layer"), where=probe("head"),
          intro="Mean ± std over heads and seeds.",
          columns=(*_ab(), Column("(b) at key 0", "component_b_key0"), Column("(b) other keys", "component_b_rest"),
                   Column("early (b)", "early_component_b"), Column("slope of log Z_i on log(i+1)", "log_z_slope"),
                   Column("share of sink-reading heads", "sink"))),
    Table("Interventions: change of early (b), %", by=("model",), where=probe("swap"),
          pivot=Pivot("intervention", "change_pct", "{}", 1),
          intro="Per seed, (mean early (b) under the intervention − as trained) / as trained, means over layers "
                "and heads; published for the BOS swap: −40%. Empty: no seed whose early (b) is at least 0.01, "
                "or no sink-reading head to remove."),
    Table("Three BOS replacements: change of early (b), %", by=("model",), where=probe("swap3"),
          columns=(Column("most frequent token", "swap_token_pct", 1), Column("mean embedding", "swap_mean_pct", 1),
                   Column("random, BOS norm", "swap_random_pct", 1)),
          intro="Per model, each replacement's change (mean over seeds with early (b) >= 0.01). The abstract's -40% "
                "is judged only where all three are within 20 points of it, or all three outside."),
    Table("Key 0 removed: (b) at key 0, layers >= 1", by=("model", "ablation"), where=probe("pathway"),
          columns=(Column("as trained", "key0_trained"), Column("key 0 removed", "key0_ablated"),
                   Column("drop", "key0_drop")),
          intro="Mean over heads of layers >= 1, mean ± std over seeds; key 0 removed for queries i >= 1 in the "
                "sink-reading heads (received_0 >= 0.3; empty: none formed) or in every head."),
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


def model_label(encoding: str, window, variant: str | None = None) -> str:
    base = {"rope": "RoPE", "rope_ntk": "NTK RoPE"}.get(encoding, encoding)
    base = base if window is None else f"{base} + window {window}"
    return base if variant in (None, TRAINED) else f"{base}, NTK at inference"


# ----------------------------------------------------------------------------- per member and derived rows

def evaluate(ctx) -> list[dict]:
    study, ev = ctx.study, ctx.study.eval
    batch = eval_batch(dataclasses.replace(ctx.task, split="val"), study.train.max_length, ev.n_sequences, ev.seed,
                       device=ctx.device)
    loss = evaluate_loss(ctx.model, batch, chunk=ev.chunk)
    rows = lr.leakage_rows(ctx.model, batch, early=early_queries(study), chunk=ev.chunk,
                           intervene=ctx.member.variant is None)  # a variant is read as is, no interventions
    return [dict(probe="member", val_loss=loss["loss"], val_accuracy=loss["accuracy"],
                 sink_heads=sum(r["sink"] for r in select(rows, "head")), early=early_queries(study)), *rows]


def labelled(rows: list[dict]) -> list[dict]:
    """Every row with its model's label (``model``) and ``variant`` (TRAINED for a trained member)."""
    return [{**r, "variant": r.get("variant") or TRAINED, "model": model_label(r["encoding"], r.get("window"),
                                                                               r.get("variant"))} for r in rows]


def contrast_rows(models: list[dict]) -> list[dict]:
    """The abstract's ordering as rows, on (b) over every key and on its key-0 part (``_key0``): per
    seed, mean (b) of standard RoPE minus NTK RoPE (probe "gap", contrast "trained") and minus the
    same weights under the NTK base (contrast "inference"); per windowed RoPE, min(standard - NTK,
    window - standard) of the seed means (probe "between")."""
    out = []
    ntk = {"trained": "NTK RoPE", "inference": model_label("rope", None, NTK_INFERENCE)}
    for suffix, column in (("", "component_b"), ("_key0", "component_b_key0")):
        b = {(r["model"], r["seed"]): r[column] for r in models}
        for contrast, other in ntk.items():
            for s in sorted({s for _, s in b}):
                if ("RoPE", s) in b and (other, s) in b:
                    out.append(dict(probe="gap", contrast=contrast, seed=s, column=column,
                                    **{f"gap{suffix}": b[("RoPE", s)] - b[(other, s)]}))
        avg = {m: float(np.mean([v for (mm, _), v in b.items() if mm == m])) for m, _ in b}
        for m in sorted({r["model"] for r in models if r["encoding"] == "rope" and r.get("window") is not None
                         and r.get("variant") in (None, TRAINED)}):
            if "RoPE" in avg and "NTK RoPE" in avg:
                out.append(dict(probe="between", model=m, column=column,
                                **{f"margin{suffix}": min(avg["RoPE"] - avg["NTK RoPE"], avg[m] - avg["RoPE"])}))
    return out


def three_swap_rows(swaps: list[dict]) -> list[dict]:
    """Per model (probe "swap3"): each BOS replacement's change of early (b), mean over the seeds
    where it is defined (``swap_token``, ``swap_mean``, ``swap_random``, and ``_pct``), with
    :func:`poslab.probes.leakage.three_swaps` over them."""
    out = []
    for (m,), mine in groups(frame(swaps), ("model",), sort=True):
        changes = {}
        for name in ("token", "mean", "random"):
            got = values(where_is(mine, "intervention", f"bos_{name}"), "change")
            changes[name] = float(np.mean(got)) if len(got) else None
        out.append(dict(probe="swap3", model=m, seed=None, **lr.three_swaps(changes),
                        **{f"swap_{k}": v for k, v in changes.items()},
                        **{f"swap_{k}_pct": None if v is None else 100 * v for k, v in changes.items()}))
    return out


def derived_rows(rows: list[dict]) -> list[dict]:
    models = lr.model_rows(rows)
    swaps = lr.swap_change_rows(rows)
    return models + swaps + three_swap_rows(swaps) + contrast_rows(models) + lr.pathway_rows(rows)


# ----------------------------------------------------------------------------- report

def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    rows = labelled(rows)
    every = rows + derived_rows(rows)
    seeds = sorted({r["seed"] for r in rows})
    intro = (f"{len(seeds)} seeds ({', '.join(map(str, seeds))}). Held-out windows of the validation split, "
             f"L = {study.train.max_length} (+ BOS), {study.eval.n_sequences} windows (half fit, half held out). "
             f"Early queries: internal positions i < {early_queries(study)}. The residual-stream component is "
             f"judged on (b) at key 0 (position 0 read by the queries, the abstract's mechanism), (b) over every "
             f"key as a control; present: seed mean less two standard errors over seeds above 0 (the abstract "
             f"gives no size); (a) > 0 holds by construction under a causal mask (a check).")
    claims = judge_all(CLAIMS, every)
    return write_outputs(out, title=EXPERIMENT.title, rows=every, csv_rows=rows, claims=claims,
                         intro=intro, tables=TABLES, figures=FIGURES)


# ``paper``: nanoGPT's shakespeare_char CPU recipe (4 layers, 4 heads, d_model 128, context 64, batch 12, 2000
# steps, lr 1e-3 cosine to 1e-4, AdamW, no dropout), 3 seeds, window 16; ``quick``: a 2-layer d_model 32 model for
# 40 steps, every code path in seconds. The variant ``ntk_inference`` reads the standard RoPE models (no window)
# under the NTK base, evaluate-only.
BASE = StudyConfig(model_type="transformer", model=dict(CPU_MODEL, bos=True), task_type="text", task={},
                   grid={"encoding": ("rope", "rope_ntk"), "model.window": (None, 16)},
                   variants={NTK_INFERENCE: {"where": {"encoding": "rope", "window": None},  # rope_ntk's own scaling:
                                             "encoding_options": {"rope": {"scaling": {"rope_type": "ntk",
                                                                                       "factor": 4.0}}}}},
                   seeds=3, train=recipe_train("paper"), eval=EvalConfig(lengths=(64,), n_sequences=256, seed=0,
                                                                         chunk=128))
PRESETS = {
    "paper": {},
    "quick": {"model": dict(d_model=32, n_layers=2, n_heads=2, bos=True), "grid.model.window": (None, 6),
              "seeds": 2, "train": TrainConfig(steps=40, batch_size=16, lr=3e-3, optimizer="adamw", min_length=16,
                                               max_length=16),
              "eval": EvalConfig(lengths=(16,), n_sequences=16, seed=0, chunk=16)},
}


EXPERIMENT = Trained(name="leakage",
                        title="Positional leakage in RoPE models: causal mask (a) and residual stream (b)",
                        base=BASE, presets=PRESETS, evaluate=evaluate, report=report, fixed=FIXED, check=check)
