"""Hybrid position layouts (issue 57): rope and no-rope layers interleaved, local and global windows.

Five layouts of poslab's four-layer ``Transformer`` (:mod:`poslab.models.layout`), each trained on
three tasks, one member per task x layout x seed (the ``setting`` axis, ``TASK-LAYOUT``):

    rope    uniform RoPE                                    every layer rotates, full causal attention
    nope    uniform NoPE                                    no layer sees position but through the mask
    rnope   rope,rope,rope,nope                             Yang et al. 2025 (arXiv 2501.18795), SmolLM3
    swan    rope:window=w x3, nope                          SWAN-GPT (arXiv 2504.08719), Command A
    irope   rope:chunk=c x3, nope, qk_norm                  Llama 4's iRoPE (constant temperature here)

    lm          the character LM (kit/charlm: nanoGPT's shakespeare_char CPU shape, context 64),
                position-wise loss past the context streamed, as trained and with YaRN on the rope
                layers at evaluation (variants ``yarn-LAYOUT``)
    retrieval   the seed's fixed-offset retrieval (K = 2, m = 20, lengths U[8, 16]) at depth 4,
                one head a layer, evaluated at 12 .. 48 (kit/depth_probes)
    reverse     Kazemnejad et al.'s reverse (issue 56's benchmarks), trained on 2 .. 20 and scored by
                exact match to 40, at the scale where their five encodings learned it in range (4 layers
                of d_model 64, 4000 cosine-decayed steps: docs/lengthgen.md's calibration)

Probes per layer type (:mod:`poslab.probes.layer_types`): each layer's mass on key 0, on the last
four keys and its mean distance; the seed's carrier per rope layer; seed 001's leakage (b) per
layer with its own window (chunked layers: none); the retrieving head's peak offset and the
dilution of its target weight with length, per layout. Scale and criteria: docs/hybrid.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from poslab.errors import ConfigError
from poslab.experiments import Trained
from poslab.experiments.config import QUICK, EvalConfig, StudyConfig, apply_point
from poslab.experiments.outputs import Column, Lines, Pivot, Table, joined, select, write_outputs
from poslab.experiments.rows import RowKind, column, frame, groups, has, lookup, of_kind, pick, values
from poslab.experiments.spec import (
    ClaimSpec,
    InRange,
    above,
    cited,
    hypothesis,
    is_,
    judge_all,
    lower_bound,
    mean,
    minimum,
    neg,
    next_step,
    probe,
    seed_states,
    share,
)
from poslab.lazy import pandas as pd
from poslab.probes import layer_types as lt
from poslab.studies.kit import benchmarks, charlm
from poslab.studies.kit.charlm import positionwise_rows, recipe_train, validation_loss
from poslab.studies.kit.depth_probes import last_query, last_query_rows
from poslab.studies.kit.fixed_offset import dilution_fit_rows
from poslab.tasks import eval_batch
from poslab.train import TrainConfig

LAYOUT_NAMES = ("rope", "nope", "rnope", "swan", "irope")
HYBRIDS = ("rnope", "swan", "irope")
TASKS = ("lm", "retrieval", "reverse")
LM_BAR = 2.5  # nats / char: an LM below it at its context has learned in range (uniform over 65 chars: 4.17)
RETRIEVAL_BAR = 0.9  # in-range accuracy of the retrieval gate (nope-depth's)
REVERSE_BAR = 0.9  # in-range exact match of reverse (lengthgen's gate, LEARNED_IN_RANGE)


def layout_fields(layout: str, span: int) -> dict:
    """The model fields of a layout, ``span`` the window (SWAN) or chunk (iRoPE) of its rope layers."""
    rope3 = {"swan": f"rope:window={span}", "irope": f"rope:chunk={span}", "rnope": "rope"}
    fields = {"encoding": "nope" if layout == "nope" else "rope", "model.layout": None, "model.qk_norm": False}
    if layout in rope3:
        fields["model.layout"] = ",".join([rope3[layout]] * 3 + ["nope"])
    if layout == "irope":
        fields["model.qk_norm"] = True
    return fields


@dataclasses.dataclass(frozen=True)
class Scale:
    """One preset's sizes: per task its model, training, span (window / chunk) and evaluation."""

    seeds: int
    lm_model: dict
    lm_train: TrainConfig
    lm_lengths: tuple[int, ...]
    lm_windows: int  # validation windows for the loss at the context and the probes
    retrieval_model: dict
    retrieval_train: TrainConfig
    retrieval_lengths: tuple[int, ...]
    retrieval_sequences: int
    reverse_model: dict
    reverse_train: dict  # train fields (kit/benchmarks' form: one benchmark's)
    reverse_sequences: int
    lm_span: int = 16
    retrieval_span: int = 8
    reverse_span: int = 16  # of 43 tokens at the longest trained length
    layouts: tuple[str, ...] = LAYOUT_NAMES

    def span(self, task: str) -> int:
        return {"lm": self.lm_span, "retrieval": self.retrieval_span, "reverse": self.reverse_span}[task]


# reverse: the scale of issue 56's calibration where Kazemnejad et al.'s five encodings learned it in range
# (docs/lengthgen.md): 4 layers, d_model 64, 4000 steps of Adam 1e-3 decayed by a cosine after a 6% warm-up
# (their trainer's warm-up share; a constant rate left ALiBi at 0.875 even after 8000 steps)
REVERSE_MODEL = dict(d_model=64, n_layers=4, n_heads=4)
REVERSE_TRAIN = dict(steps=4000, batch_size=32, lr=1e-3, optimizer="adam", lr_schedule="cosine", warmup_steps=240,
                     length_sampling="sequence")


SCALES = {
    # nanoGPT's shakespeare_char CPU recipe for the LM (4 layers, 4 heads, d_model 128, context 64, batch 12,
    # 2000 steps) and nope-depth's protocol at depth 4 for retrieval (4000 steps of batch 256)
    "paper": Scale(seeds=3, lm_model=dict(charlm.CPU_MODEL, bias=False), lm_train=recipe_train("paper"),
                   lm_lengths=(64, 128, 256, 512), lm_windows=256,
                   retrieval_model=dict(d_model=64, n_layers=4, n_heads=1), retrieval_train=TrainConfig(),
                   retrieval_lengths=(12, 16, 20, 24, 32, 40, 48), retrieval_sequences=4096,
                   reverse_model=REVERSE_MODEL, reverse_train=REVERSE_TRAIN, reverse_sequences=512),
    # sized for about 45 minutes with 2 workers on the 2-core machine (docs/hybrid.md: the measurement)
    "cpu": Scale(seeds=2, lm_model=dict(charlm.CPU_MODEL, bias=False),
                 lm_train=dataclasses.replace(recipe_train("paper"), steps=1000),
                 lm_lengths=(64, 128, 256, 512), lm_windows=128,
                 retrieval_model=dict(d_model=64, n_layers=4, n_heads=1),
                 retrieval_train=TrainConfig(steps=1200, batch_size=64),  # nope-depth's cpu training
                 retrieval_lengths=(12, 16, 20, 24, 32, 40, 48), retrieval_sequences=512,
                 reverse_model=REVERSE_MODEL, reverse_train=REVERSE_TRAIN, reverse_sequences=128),
    "quick": Scale(seeds=1, lm_model=dict(d_model=32, n_layers=4, n_heads=2, bias=False),
                   lm_train=dataclasses.replace(recipe_train("quick"), steps=12),
                   lm_lengths=(32, 64), lm_windows=8,
                   retrieval_model=dict(d_model=16, n_layers=4, n_heads=1),
                   retrieval_train=TrainConfig(steps=12, batch_size=16),
                   retrieval_lengths=(12, 16, 20), retrieval_sequences=16,
                   reverse_model=dict(d_model=16, n_layers=4, n_heads=2),
                   reverse_train=dict(REVERSE_TRAIN, steps=12, batch_size=8, warmup_steps=2), reverse_sequences=8,
                   lm_span=8, retrieval_span=6, reverse_span=6,
                   layouts=("rope", "swan", "irope")),  # a window, a chunk, a no-rope layer, qk-norm
}


def _train(t: TrainConfig) -> dict:
    def plain(v):  # tuples as the lists a setting's JSON holds
        return [plain(x) for x in v] if isinstance(v, (tuple, list)) else v
    return {f"train.{f.name}": plain(getattr(t, f.name)) for f in dataclasses.fields(t)}


def task_bundle(task: str, scale: Scale) -> dict:
    """Everything a task's members set: its task, model, training and evaluation."""
    if task == "lm":
        return {"task_type": "text", **{f"model.{k}": v for k, v in scale.lm_model.items()}, **_train(scale.lm_train),
                "eval.lengths": list(scale.lm_lengths), "eval.n_sequences": scale.lm_windows, "eval.chunk": 64}
    if task == "reverse":  # lengthgen's bundle: its lengths (train 2 .. 20, a few to 40), decoder form
        kz = benchmarks.KAZEMNEJAD
        one = benchmarks.Scale(model={kz: scale.reverse_model}, train={kz: scale.reverse_train}, eval_lengths="few",
                               n_sequences=scale.reverse_sequences, seeds=scale.seeds, tasks="cpu")
        # every train field, so none falls through from the LM's recipe (its AdamW weight decay 0.1 would be
        # Adam's coupled L2 here, which kept reverse at the uniform loss)
        return {**_train(TrainConfig(**scale.reverse_train)), **benchmarks.task_setting("reverse", one),
                "eval.n_sequences": scale.reverse_sequences, "eval.chunk": 64}
    return {"task_type": "fixed_offset", "task.m": 20, "task.K": 2,
            **{f"model.{k}": v for k, v in scale.retrieval_model.items()}, **_train(scale.retrieval_train),
            "eval.lengths": list(scale.retrieval_lengths), "eval.n_sequences": scale.retrieval_sequences,
            "eval.chunk": 1024}


def yarn(context: int, longest: int) -> dict:
    """YaRN (Peng et al. 2023) for a model trained on ``context``, stretched to ``longest``."""
    return {"rope_type": "yarn", "factor": float(longest) / context, "original_max_position_embeddings": context}


def settings(scale: Scale) -> dict[str, dict]:
    """Every task x layout at ``scale`` (the ``setting`` axis, ``TASK-LAYOUT``): the task's bundle and the layout."""
    return {f"{task}-{layout}": {**task_bundle(task, scale), **layout_fields(layout, scale.span(task))}
            for task in TASKS for layout in scale.layouts}


def variants(scale: Scale) -> dict[str, dict]:
    """YaRN on the rope layers of each LM layout with one (``yarn-LAYOUT``), stretched to its longest length."""
    context = scale.lm_train.max_length
    return {f"yarn-{layout}": {"where": {"setting": f"lm-{layout}"},
                               "encoding_options": {"rope": {"scaling": yarn(context, max(scale.lm_lengths))}}}
            for layout in scale.layouts if layout != "nope"}


def scale_changes(scale: Scale) -> dict:
    """The fields a preset's sizes decide: its settings (and so its grid), variants and seeds."""
    points = settings(scale)
    return {"grid.setting": tuple(points), "settings": points, "variants": variants(scale), "seeds": scale.seeds}


# Each setting carries its task's own training and evaluation; the study's train / eval (the LM's) are what
# --print-config shows and the char LM's check reads. Paper: the sizes above (SCALES; docs/hybrid.md).
PAPER = SCALES["paper"]
BASE = StudyConfig(model_type="transformer", task_type="text", grid={"setting": tuple(settings(PAPER))},
                   settings=settings(PAPER), variants=variants(PAPER), seeds=PAPER.seeds, train=PAPER.lm_train,
                   eval=EvalConfig(lengths=PAPER.lm_lengths, n_sequences=PAPER.lm_windows, chunk=64))
PRESETS = {
    "paper": {},
    "quick": {**QUICK, **scale_changes(SCALES["quick"]), "train.steps": 12, "train.batch_size": 8,
              "train.warmup_steps": 5, "train.min_length": 32, "train.max_length": 32, "eval.lengths": (32, 64),
              "eval.n_sequences": 8},
    "cpu": {**scale_changes(SCALES["cpu"]), "train.steps": 1000, "eval.n_sequences": 128},
}


def check(cfg: StudyConfig) -> None:
    """Each LM setting by the char LM's check (one context, lengths the corpus holds, streamable past
    it); each retrieval setting's lengths by its task; every setting named TASK-LAYOUT."""
    from poslab.experiments.experiment import resolve_task

    for setting in cfg.axis("setting"):
        task, _, layout = str(setting).partition("-")
        if task not in TASKS or layout not in LAYOUT_NAMES:
            raise ConfigError("grid.setting", setting, [f"{t}-{n}" for t in TASKS for n in LAYOUT_NAMES])
        one = apply_point(cfg, {"setting": setting})
        if one.task_type == "text":
            charlm.check_lm(EXPERIMENT, one)
        else:
            for L in one.eval.lengths:
                resolve_task(one).validate(L)


def table_length(cfg: StudyConfig) -> int:
    """The LM's tables hold its context (longer windows are extrapolation); retrieval's every length; reverse's
    every token of its longest length (kit/benchmarks)."""
    if cfg.task_type == "text":
        return cfg.train.max_length
    if cfg.task_type == "reverse":
        return benchmarks.table_length(cfg)
    return max((*cfg.eval.lengths, cfg.train.max_length))


# ----------------------------------------------------------------------------- evaluation

def evaluate(ctx) -> list[dict]:
    task, _, layout = str(ctx.member.ids["setting"]).partition("-")
    ids = dict(task=task, layout=layout, schedule="yarn" if ctx.member.variant else "none")
    rows = {"lm": lm_rows, "retrieval": retrieval_rows, "reverse": reverse_rows}[task](ctx)
    return [{**r, **ids} for r in rows]


def lm_rows(ctx) -> list[dict]:
    """Validation loss at the context, position-wise loss at every eval length (streamed past it) and,
    as trained, the per-layer probes on validation windows of the context."""
    study, ev, model = ctx.study, ctx.study.eval, ctx.model
    L = study.train.max_length
    val = validation_loss(model, ctx.task, L, ev.chunk, limit=ev.n_sequences)
    rows = [dict(probe="lm", context=L, val_loss=val["loss"], val_accuracy=val["accuracy"]),
            dict(probe="learned", learned=LM_BAR / val["loss"])]
    for length in ev.lengths:
        rows += positionwise_rows(model, study.task.get("corpus"), length, L, ev.chunk, ev.n_sequences, ctx.device)
    if ctx.member.variant is None:
        batch = eval_batch(dataclasses.replace(ctx.task, split="val"), L, max(2, ev.n_sequences), ev.seed,
                           device=ctx.device)
        rows += lt.target_rows(model, batch, chunk=ev.chunk, length=L)
        rows += lt.leakage_rows(model, batch, chunk=ev.chunk, length=L)
    return rows


def retrieval_rows(ctx) -> list[dict]:
    """Accuracy and the last query's attention per layer at every length (nope-depth's rows, with each
    layer's type), the retrieving head (most attention at -K over the trained lengths) and its target
    weight at every length, and the per-layer probes at the longest trained length."""
    study, task, model = ctx.study, ctx.task, ctx.model
    Lmax, K, ev = study.train.max_length, task.K, study.eval
    kinds = {k.layer: k.row() for k in lt.layer_kinds(model)}
    lengths = sorted(ev.lengths)
    rows, heads, attn = [], [], {}
    for L in lengths:
        batch = eval_batch(task, L, ev.n_sequences, ev.seed, device=ctx.device)
        acc, attn[L] = last_query(model, batch, ev.chunk)
        rows.append(dict(probe="length", length=L, in_range=L <= Lmax, accuracy=acc, chance=task.chance))
        heads += [{**r, **kinds[r["layer"]]} for r in last_query_rows(attn[L], L, K)]
    trained = [L for L in lengths if L <= Lmax] or lengths[:1]
    score = np.mean([attn[L][:, :, L - 1 - K] for L in trained], axis=0)  # [layers, h]
    layer, head = (int(v) for v in np.unravel_index(int(score.argmax()), score.shape))
    mine = [r for r in heads if (r["layer"], r["head"]) == (layer, head)]
    rows += [dict(probe="dilution", length=r["length"], a_star=r["a_star"]) for r in mine]
    offsets = [r["peak_offset"] for r in mine]
    longest = max(trained)
    batch = eval_batch(task, longest, ev.n_sequences, ev.seed, device=ctx.device)
    carriers = lt.carrier_rows(model, batch, np.arange(-(longest - 1), 1), chunk=ev.chunk, length=longest)
    own = [c for c in carriers if (c["layer"], c["head"]) == (layer, head)]
    in_range = float(np.mean([r["accuracy"] for r in rows if r.get("in_range")]))
    rows.append(dict(probe="member", **kinds[layer], head=head, K=K, peak_at_minus_K=all(o == -K for o in offsets),
                     offsets=" ".join(map(str, offsets)), invariant=len(set(offsets)) == 1,
                     carrier_peak=own[0]["carrier_peak"] if own else None, in_range_accuracy=in_range))
    rows.append(dict(probe="learned", learned=in_range / RETRIEVAL_BAR))
    rows += heads + carriers + lt.target_rows(model, batch, chunk=ev.chunk, length=longest)
    rows += lt.leakage_rows(model, batch, chunk=ev.chunk, length=longest)
    return rows


def reverse_rows(ctx) -> list[dict]:
    """Per length: per-token accuracy and exact match over the output positions (lengthgen's scores, the
    decoder form); the learned row (in-range exact match over REVERSE_BAR); the per-layer probes on
    sequences of the longest trained length."""
    study, task, model, ev = ctx.study, ctx.task, ctx.model, ctx.study.eval
    Lmax = study.train.max_length
    rows = []
    for L in sorted(ev.lengths):
        accuracy, exact, _ = benchmarks.length_scores(model, task, L, ev, ctx.device)
        rows.append(dict(probe="length", length=L, in_range=L <= Lmax, accuracy=accuracy, exact=exact,
                         chance=task.chance))
    in_range = float(np.mean([r["exact"] for r in rows if r["in_range"]]))
    rows.append(dict(probe="learned", learned=in_range / REVERSE_BAR))
    batch = eval_batch(task, Lmax, ev.n_sequences, ev.seed, device=ctx.device)
    rows += lt.target_rows(model, batch, chunk=ev.chunk, length=Lmax)
    rows += lt.leakage_rows(model, batch, chunk=ev.chunk, length=Lmax)
    return rows


# ----------------------------------------------------------------------------- derived rows

def _excess(rows: list[dict], column: str) -> float:
    """Mean over rows of ``column`` beyond a content-blind head's (``uniform_<column>``): what training
    added to what the layer's mask gives by itself (a window of 8 puts half its weight on the last 4 keys)."""
    return float(np.mean([r[column] - r[f"uniform_{column}"] for r in rows]))


PAIR_KIND = RowKind("pair", {"task": str, "layout": str, "seed": int, "schedule": str, "length": int,
                            "minus_rope_long": float | None, "long_over_context": float | None,
                            "minus_rope_val": float}, optional=("minus_rope_val",))
SCHEDULE_KIND = RowKind("schedule", {"task": str, "layout": str, "seed": int, "length": int,
                                     "yarn_minus_none": float})
LABOUR_KIND = RowKind("labour", {"task": str, "layout": str, "seed": int, "rope_minus_nope_recent": float,
                                 "nope_minus_rope_key0": float})
# one hybrid layout against uniform RoPE, past the training length (reverse): the layout's row holds the difference,
# the base's row (no value) names the second model the pair reads, so the gate checks both learned in range
VERSUS_KIND = RowKind("versus", {"task": str, "versus": str, "layout": str, "seed": int,
                                 "minus_rope_past": float | None, "past": float}, optional=("minus_rope_past",))
LEAK_KIND = RowKind("leak", {"task": str, "layout": str, "seed": int, "kind": str, "component_b": float,
                             "component_b_key0": float})


def pair_rows(rows: list[dict]) -> list[dict]:
    """At the longest length: ``pair`` rows (each layout against uniform RoPE, same seed and schedule; its
    loss over its loss at the context) and ``schedule`` rows (YaRN against as trained)."""
    df = frame(rows)
    long = lookup(of_kind(df, "long"), ("task", "layout", "seed", "schedule", "length"), "loss")
    val = lookup(of_kind(df, "lm"), ("layout", "seed", "schedule"), "val_loss")
    longest = max((k[-1] for k in long), default=None)
    out = []
    for (task, layout, seed, schedule, L), loss in long.items():
        if L != longest:
            continue
        base = long.get((task, "rope", seed, schedule, L))
        context = val.get((layout, seed, schedule))
        versus = {}
        if layout != "rope" and (base_val := val.get(("rope", seed, schedule))) is not None and context is not None:
            versus["minus_rope_val"] = context - base_val
        if schedule == "yarn" and (trained := long.get((task, layout, seed, "none", L))) is not None:
            out.append(SCHEDULE_KIND(task=task, layout=layout, seed=seed, length=L, yarn_minus_none=loss - trained))
        out.append(PAIR_KIND(task=task, layout=layout, seed=seed, schedule=schedule, length=L,
                        minus_rope_long=None if base is None or layout == "rope" else loss - base,
                        long_over_context=None if context is None else loss / context, **versus))
    return out


def versus_rows(rows: list[dict]) -> list[dict]:
    """Per seed and hybrid (every layout but uniform RoPE) on reverse: ``versus`` rows, the layout's exact match
    averaged over the lengths past training less uniform RoPE's (same seed), and RoPE's own row beside it."""
    df = frame(rows)
    lengths = of_kind(df, "length")
    lengths = lengths[(column(lengths, "task") == "reverse") & ~column(lengths, "in_range").map(bool).astype(bool)]
    past = {key: float(np.mean(values(g, "exact"))) for key, g in groups(lengths, ("layout", "seed"))}
    out = []
    for (layout, seed), score in sorted(past.items()):
        base = past.get(("rope", seed))
        if layout == "rope" or base is None:
            continue
        out.append(VERSUS_KIND(task="reverse", versus=layout, layout=layout, seed=seed, past=score,
                               minus_rope_past=score - base))
        out.append(VERSUS_KIND(task="reverse", versus=layout, layout="rope", seed=seed, past=base))
    return out


def _by_member(df: pd.DataFrame, *more: str) -> list[tuple[tuple, pd.DataFrame]]:
    """The rows grouped per member (task, layout, seed) and ``more``, the keys in order of their text."""
    return sorted(groups(df, ("task", "layout", "seed", *more)), key=lambda key_part: str(key_part[0]))


def labour_rows(rows: list[dict]) -> list[dict]:
    """``labour`` rows: per member with layers of both kinds, no-rope layers against rope layers, each
    layer's mass beyond a content-blind head's (:func:`_excess`)."""
    out = []
    targets = select(rows, "targets")
    for (task, layout, seed), mine in _by_member(frame(targets)):
        rotary = mine["rotary"].map(bool).astype(bool)
        rope, nope = pick(targets, mine[rotary]), pick(targets, mine[~rotary])
        if rope and nope:
            out.append(LABOUR_KIND(task=task, layout=layout, seed=seed,
                                   rope_minus_nope_recent=_excess(rope, "recent") - _excess(nope, "recent"),
                                   nope_minus_rope_key0=_excess(nope, "key0") - _excess(rope, "key0")))
    return out


def leak_rows(rows: list[dict]) -> list[dict]:
    """``leak`` rows: a member's mean (b), and (b) at key 0, per layer type (layers with a key-0 value)."""
    leaks = frame(select(rows, "layer_leakage"))
    out = []
    for (task, layout, seed, rotary), mine in _by_member(leaks[has(leaks, "component_b_key0")], "rotary"):
        out.append(LEAK_KIND(task=task, layout=layout, seed=seed, kind="rope" if rotary else "nope",
                             component_b=float(np.mean(values(mine, "component_b"))),
                             component_b_key0=float(np.mean(values(mine, "component_b_key0")))))
    return out


def derived_rows(rows: list[dict]) -> list[dict]:
    """``pair`` and ``schedule`` rows (:func:`pair_rows`), ``labour`` rows (:func:`labour_rows`), ``leak``
    rows (:func:`leak_rows`), ``fit`` rows (the dilution fit per member) and ``versus`` rows (:func:`versus_rows`)."""
    df = frame(rows)
    lengths = of_kind(df, "length")
    lengths = lengths[column(lengths, "task") == "retrieval"]
    lmax = max(column(lengths[column(lengths, "in_range").map(bool).astype(bool)], "length"), default=0)
    dilution = [dict(r, probe="length") for r in pick(rows, of_kind(df, "dilution"))]
    fits = [dict(r, task="retrieval") for r in dilution_fit_rows(dilution, lmax, ("layout", "seed"))]
    return pair_rows(rows) + labour_rows(rows) + leak_rows(rows) + fits + versus_rows(rows)


# ----------------------------------------------------------------------------- claims

YANG = cited("Yang et al. 2025, 'Rope to Nope and Back Again: A New Hybrid Attention Strategy', arXiv 2501.18795")
SWAN = cited("Puvvada et al. 2025, 'SWAN-GPT: An Efficient and Scalable Approach for Long-Context Language "
             "Modeling', arXiv 2504.08719")
YARN = cited("Peng et al. 2023, YaRN, arXiv 2309.00071")
YANG_ABSTRACT = ("abstract: the hybrid design 'surpasses conventional RoPE-based transformer models with full "
                 "attention in both long and short context tasks'")
SWAN_ABSTRACT = ("abstract: SWAN-GPT 'robustly generalizes to sequence lengths substantially longer than those seen "
                 "during training'")
SCALE_LM = ("scaled down: a 4-layer d_model 128 character LM with context 64, judged at 512 (x8) on TinyShakespeare "
            "({seeds} seeds), where the paper trains billion-parameter LMs on 8k-32k tokens and tests to 256k")
SCALE_RETRIEVAL = ("scaled down: 4 layers of one head, d_model 64, fixed-offset retrieval K = 2 trained on L in "
                   "[8, 16], judged at 20 .. 48 ({seeds} seeds)")
SCALE_REVERSE = ("scaled down: 4 layers, d_model 64, 4 heads, 4000 steps of batch 32 on Kazemnejad et al.'s reverse "
                 "(lengths 2 .. 20), exact match at 21 .. 40 ({seeds} seeds), where the papers train billion-parameter "
                 "LMs; both members of each pair gated on in-range exact match >= 0.9")
LABOUR = ("Yang et al.'s analysis of attention patterns: rope layers carry a recency bias, no-rope layers retrieve "
          "(the paper's summary: RNoPE 'balance[s] retrieval and recency bias'); here, per member, the mean over its "
          "layers of each kind of the mass on the last 4 keys beyond a content-blind head's under the same mask")
TABLE1 = seed_states("Table 1: a relative encoding near-perfect at every length, its head selecting -K")
NOPE_STEP = next_step("seed 000, limitations: depth with NoPE, where causal masking induces relative structure")
DILUTION = seed_states("Corollary 2: softmax over a growing context forces an inverse-linear decay of the target's "
                       "attention weight")
CARRIER = seed_states("Lemma 2: a target-aligned carrier, pre-rotated to the target offset, peaks the relative kernel "
                      "at the target")
LEAKAGE = seed_states("third abstract: both components appear in all three architectures we study", which="001")
GATE = InRange(where=probe("learned"), column="learned", threshold=1.0, match=("task", "layout"),
               text=f"in-range score over its bar (LM: {LM_BAR} nats / validation loss at the context; retrieval: "
                    f"in-range accuracy / {RETRIEVAL_BAR}; reverse: in-range exact match / {REVERSE_BAR})")
LM, RET, REV = is_("task", "lm"), is_("task", "retrieval"), is_("task", "reverse")
AS_TRAINED, WITH_YARN = is_("schedule", "none"), is_("schedule", "yarn")

CLAIMS = [
    *[ClaimSpec(name=f"{label}: char-LM loss at 8x the context below uniform RoPE's ({{schedule}})",
                paper=paper, where=probe("pair") & LM & is_("layout", layout), per=("schedule",),
                measure=mean("minus_rope_long", "mean over seeds of (layout - RoPE) loss at the longest length"),
                op="<", threshold=0.0, source=source, setting="other", trained=True, note=SCALE_LM)
      for label, layout, paper, source in (("RNoPE", "rnope", YANG_ABSTRACT, YANG),
                                           ("SWAN", "swan", SWAN_ABSTRACT, SWAN),
                                           ("iRoPE", "irope", "(no paper: Llama 4's layout, as a hypothesis)",
                                            hypothesis("the study's own: Llama 4's iRoPE extrapolates like RNoPE")))],
    *[ClaimSpec(name=f"{label}: exact match past the training length above uniform RoPE's (reverse)",
                paper=paper, where=probe("versus") & is_("versus", layout),
                measure=mean("minus_rope_past", "mean over seeds of (layout - RoPE) exact match over lengths 21 .. 40"),
                op=">", threshold=0.0, source=source, setting="other", trained=True, note=SCALE_REVERSE)
      for label, layout, paper, source in (("RNoPE", "rnope", YANG_ABSTRACT, YANG),
                                           ("SWAN", "swan", SWAN_ABSTRACT, SWAN),
                                           ("iRoPE", "irope", "(no paper: Llama 4's layout, as a hypothesis)",
                                            hypothesis("the study's own: Llama 4's iRoPE extrapolates like RNoPE")),
                                           ("NoPE", "nope", "Kazemnejad et al. 2023: NoPE generalizes past the "
                                            "training length better than Rotary (their Figure 1 ordering)",
                                            cited("Kazemnejad et al. 2023, 'The Impact of Positional Encoding on "
                                                  "Length Generalization in Transformers', arXiv 2305.19466")))],
    ClaimSpec(name="RNoPE: char-LM loss at the context no worse than uniform RoPE's", paper=YANG_ABSTRACT,
              where=probe("pair") & LM & is_("layout", "rnope") & AS_TRAINED,
              measure=mean("minus_rope_val", "mean over seeds of (RNoPE - RoPE) validation loss at the context"),
              op="<=", threshold=0.0, source=YANG, setting="other", note=SCALE_LM),
    ClaimSpec(name="SWAN: char-LM loss at 8x the context within 5% of its loss at the context",
              paper=SWAN_ABSTRACT, where=probe("pair") & LM & is_("layout", "swan") & AS_TRAINED,
              measure=mean("long_over_context", "mean over seeds of loss(512) / loss(context)"), op="<=",
              threshold=1.05, source=SWAN, setting="other", trained=True,
              note="5% is this study's reading of 'robustly generalizes' (the abstract gives no number); " + SCALE_LM),
    ClaimSpec(name="{layout}: YaRN on the rope layers lowers the loss at 8x the context",
              paper="YaRN extends a RoPE model's context without training (applied at inference here)",
              where=probe("schedule") & LM, per=("layout",),
              measure=mean("yarn_minus_none", "mean over seeds of (YaRN - as trained) loss at the longest length"),
              op="<", threshold=0.0, source=YARN, setting="other", trained=True,
              note="YaRN factor = longest / context on every rope layer, no fine-tuning; " + SCALE_LM),
    ClaimSpec(name="{layout}: rope layers put more mass on the last 4 keys than no-rope layers ({task})",
              paper="rope layers: recency; no-rope layers: retrieval", where=probe("labour"), per=("task", "layout"),
              measure=mean("rope_minus_nope_recent",
                           "mean over seeds of (rope - no-rope) recency mass beyond the mask's"),
              op=">", threshold=0.0, source=YANG, setting="other", trained=True, note=LABOUR),
    ClaimSpec(name="{layout}: no-rope layers put more mass on key 0 than rope layers ({task})",
              paper="(the issue's question: do no-rope layers become sinks?)", where=probe("labour"),
              per=("task", "layout"),
              measure=mean("nope_minus_rope_key0", "mean over seeds of (no-rope - rope) key-0 mass beyond the mask's"),
              op=">", threshold=0.0, source=hypothesis("the study's own: the no-rope layers hold the sinks"),
              setting="other", trained=True,
              note="queries i >= 1 of validation windows (LM) or of the longest trained length; each layer's key-0 "
                   "mass beyond a content-blind head's under its own mask"),
    ClaimSpec(name="{layout}: lowest mean accuracy over the unseen lengths (retrieval at depth 4)",
              paper="Table 1: near-perfect at every length (RoPE, one layer)", where=probe("length") & RET
              & is_("in_range", False), per=("layout",), measure=minimum("accuracy", by=("length",)), op=">=",
              threshold=0.97, source=TABLE1, setting="other", trained=True, note=SCALE_RETRIEVAL),
    ClaimSpec(name="{layout}: retrieving head peaks at -K at every length (retrieval at depth 4)",
              paper="Table 1: 100% of cells", where=probe("member") & RET, per=("layout",),
              measure=share("peak_at_minus_K", "==", True), op=">=", threshold=1.0, percent=True,
              source=NOPE_STEP, setting="other", trained=True,
              note="the seed's line, on a layout at depth (NoPE at depth: the seed's next step); " + SCALE_RETRIEVAL),
    ClaimSpec(name="{layout}: the retrieving head's target weight dilutes with length (1/a* rises with L - 1)",
              paper="inverse-linear decay of the target weight", where=probe("fit") & is_("span", "all"),
              per=("layout",), measure=mean("slope", "mean over seeds of the slope of 1/a* on L - 1"), op=">",
              threshold=0.0, source=DILUTION, setting="other", trained=True, note=SCALE_RETRIEVAL),
    ClaimSpec(name="{layout}: a rope retrieving head's carrier profile peaks at -K",
              paper="a relative kernel peaked at the target", where=probe("member") & RET & is_("rotary", True),
              per=("layout",), measure=share("carrier_peak", "==", neg("K")), op=">=", threshold=1.0, percent=True,
              source=CARRIER, setting="other", trained=True,
              note="members whose retrieving head sits in a rope layer; " + SCALE_RETRIEVAL),
    ClaimSpec(name="{layout}, {kind} layers: component (b) at key 0 present (char LM)", paper="present in all three",
              where=probe("leak") & LM, per=("layout", "kind"),
              measure=lower_bound("component_b_key0", "seed mean of (b) at key 0 - 2 standard errors"), op=">",
              threshold=0.0, source=LEAKAGE, setting="other", trained=True,
              note="each layer with its own window, chunked layers left out; no BOS (key 0 is the first character); "
                   + SCALE_LM),
]

TABLES = [
    Table("Char LM: loss past the context (mean ± std over seeds)", by=("layout", "schedule"),
          where=probe("long") & LM, pivot=Pivot("length", "loss", "L={}"),
          intro="Mean cross-entropy (nats / char) over all L positions; at the context: the validation split's "
                "windows; past it one window, streamed. schedule yarn: YaRN on the rope layers at evaluation."),
    Table("Retrieval at depth 4: accuracy by length", by=("layout",), where=probe("length") & RET,
          pivot=Pivot("length", "accuracy", "L={}")),
    Table("Reverse (Kazemnejad et al.): exact match by length", by=("layout",), where=probe("length") & REV,
          pivot=Pivot("length", "exact", "L={}"),
          intro="Trained on lengths 2 .. 20; exact match of the whole reversed output, per sequence."),
    Table("What each layer type attends to", by=("task", "layout", "layer_type"), where=probe("targets"),
          columns=(Column("key-0 mass", "key0"), Column("content-blind", "uniform_key0"),
                   Column("last-4 mass", "recent"), Column("content-blind ", "uniform_recent"),
                   Column("mean distance", "distance"), Column("content-blind  ", "uniform_distance")),
          intro="Mean over layers of the type, heads and seeds; queries i >= 1; content-blind: a head spreading "
                "evenly over the keys its mask keeps (what the mask gives by itself)."),
    Table("Leakage (b) per layer type", by=("task", "layout", "layer_type"), where=probe("layer_leakage")
          & above("component_b", -1e9), columns=(Column("(a)", "component_a"), Column("(b)", "component_b"),
                                                 Column("(b) at key 0", "component_b_key0"))),
    Table("Retrieving head per member", by=("layout", "seed"), where=probe("member"),
          columns=(Column("layer type", joined("layer_type")), Column("peaks by length", joined("offsets")),
                   Column("carrier peak", "carrier_peak"), Column("in-range accuracy", "in_range_accuracy"))),
]
FIGURES = [
    Lines("lm_positionwise.png", x="position", y="loss", series=("layout", "schedule"),
          where=probe("positionwise") & LM & is_("scale", "log"), panel="length", logx=True,
          xlabel="position t (log-spaced buckets)", ylabel="loss (nats / char)", title="char LM: loss vs position"),
    Lines("retrieval_accuracy.png", x="length", y="accuracy", series=("layout",), where=probe("length") & RET,
          ylim=(-0.02, 1.02), xlabel="evaluation length L", ylabel="accuracy"),
    Lines("reverse_exact.png", x="length", y="exact", series=("layout",), where=probe("length") & REV,
          ylim=(-0.02, 1.02), xlabel="evaluation length L (trained 2 .. 20)", ylabel="exact match"),
]


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    every = rows + derived_rows(rows)
    intro = (f"{len(study.axis('setting'))} task x layout settings, {study.seeds} seed(s); YaRN variants on the LM's "
             "rope layers at evaluation. Layouts, scale and each paper's statement beside the measured number: "
             "docs/hybrid.md.")
    return write_outputs(out, title=EXPERIMENT.title, rows=every, claims=judge_all(CLAIMS, every, GATE), intro=intro,
                         tables=TABLES, figures=FIGURES,
                         csv_rows=select(rows, ("lm", "long", "length", "member")),
                         csvs={"layers.csv": "targets", "leakage.csv": "layer_leakage", "carriers.csv": "carrier",
                               "heads.csv": "head"})


EXPERIMENT = Trained(name="hybrid",
                     title="Hybrid layouts: rope and no-rope layers interleaved, local and global windows (issue 57)",
                     base=BASE, presets=PRESETS, evaluate=evaluate, report=report, check=check,
                     table_length=table_length, checks_eval_lengths=True)
