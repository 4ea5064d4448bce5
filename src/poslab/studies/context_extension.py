"""Context extension evaluated as the survey demands (seed ``001``, survey abstract).

"The ability to compute positional features beyond the training length does not imply reliable
long-context generalization; context extension must be evaluated through short-context
retention, position-wise perplexity, retrieval ..." A character-level RoPE language model
(nanoGPT's CPU recipe for TinyShakespeare: 4 layers, 4 heads, width 128, context L0 = 64, batch
12, 2000 AdamW steps; 10% of training windows carry a passkey whose answer digits weigh 10 in the
loss, and 25% end with an example of a reasoning or code task whose answer characters weigh 10,
:mod:`poslab.tasks.passkey`) is extended to L_t = s L0 (s = ``FACTOR`` = 4) by every method of
``METHODS`` and measured by four protocols on the validation split: the loss per position bucket
(width L0 / 4) on windows of {1, 2, 4, 8} L0, short-context retention (loss at L0 minus plain
RoPE's), passkey retrieval at depths ``PASSKEY_DEPTHS``, and the reasoning and code tasks
(``REASONING``: multi-key and multi-value needles, variable tracking, brackets, code, in the compact
form of :mod:`poslab.tasks.reasoning` that fits L0) by the same depth x length grid, exact match of
the greedy answer (:func:`reasoning`). Per task and length past L0 the methods are ranked by exact
match and by loss (probe "ranking", Kendall's tau, :mod:`poslab.experiments.ranking`): the survey
predicts the two rankings need not agree.

``METHODS`` is the registry: ``{name: Method(build, trains, stored)}``. Every method but ``rope``
(the trained member) is an evaluate-only variant of the trained member, so each is a run of its own
in the store (its own key, resumed like training, its search and fine-tuning rows beside its
protocol rows). A searched or fine-tuned method is also a stage of its own
(:mod:`poslab.experiments.stages`): its searched schedule or fine-tuned weights are stored under a
key of the trained member, the method and the search / fine-tuning constants, so a resumed run,
or a later method built on it (``stage(ctx, name)``: LongRoPE+ft fine-tunes under LongRoPE's
searched factors), reads it back instead of searching or fine-tuning again.

- training-free schedules (:mod:`poslab.positional.rope_scaling`): ``pi``, ``ntk``, ``dynamic``,
  ``ntk_by_parts``, ``yarn``, ``llama3`` (the variant carries the schedule dict, so it is keyed);
- ``longrope`` (Ding et al. 2024, scaled down): :func:`search` for long factors in [1, 2s],
  non-decreasing, and n-hat among ``N_HATS`` on the training-split LM loss at L_t, then short
  factors at L0; HF ``longrope`` schedule (attention factor sqrt(1 + ln s / ln L0));
- ``longrope2`` (Shang et al. 2025): the theoretical critical dimension from the RoPE scaling law
  (:func:`poslab.positional.scaling_laws.critical_dimension`); the real one searched between the
  pair that completes ``PERIODS`` periods in L0 and it; NTK factors below it, searched factors
  (non-decreasing, in [s, 2s]) from it on; objective: the loss on the answer digits of passkeys
  planted at the start of the window (depth 0, "needle-driven"), at L_t;
- fine-tuned (``FT_SHARE`` of the pre-training steps, AdamW at ``FT_LR``): ``pi+ft``, ``yarn+ft``,
  ``longrope+ft`` at L_t; ``longrope-progressive`` (LongRoPE's second stage scaled down: search
  again for ``PROGRESSIVE`` L0 on longrope+ft, then readjust the short factors at L0);
  ``longrope2+ft`` (mixed context windows: rescaled RoPE on L_t, original RoPE on L0, evaluated so);
- ``base2x+ft``: the RoPE scaling law's Theorem 2 checked (Liu et al. 2023): fine-tuned at L0
  (``BASE_FT_SHARE`` of the pre-training steps) with the base ``base_for_length(2 T_extra)``
  whose predicted bound is twice plain RoPE's; its bend should move with it.

Every search reports its budget (population x generations = evaluations, wall time) and which
initial seed its winner descends from. n-hat makes angles depend on the position itself, so the
streamed evaluations refuse longrope; dynamic NTK (and LongRoPE's short/long choice) uses the
frequencies of the window's length for every position, as one Hugging Face forward does.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from poslab.errors import ConfigError
from poslab.experiments.config import EvalConfig, StudyConfig
from poslab.experiments.longrope_search import (
    SearchConfig,
    SearchSpace,
    longrope,
    rope_encoding,
    search,
    swap,
    with_scaling,
)
from poslab.experiments.outputs import Column, Heatmap, Lines, Pivot, Table, write_outputs
from poslab.experiments.ranking import rank_agreement
from poslab.experiments.runner import Experiment
from poslab.experiments.spec import ClaimSpec, is_, judge_all, mean, probe
from poslab.positional.scaling_laws import (
    base_for_length,
    critical_dimension,
    extrapolation_bound,
    full_period_pairs,
    pair_with_periods,
)
from poslab.probes.positionwise import loss_rows
from poslab.tasks import reasoning as rs
from poslab.tasks.passkey import PasskeyText
from poslab.tasks.text import CharText
from poslab.train import TrainConfig, lm_recipe

name = "context-extension"
title = "Survey §context extension: position-wise loss, short-context retention, passkey retrieval"

FACTOR = 4.0  # s: target length L_t = s L0
MULTIPLES = (1, 2, 4, 8)  # evaluation lengths, in units of L0
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
# LongRoPE's n-hat candidates (the paper: {0, 1, 2, 4, ..., 256} at L0 = 4096), cut at L0 / 4
N_HATS = (0, 1, 2, 4, 8, 16)
PERIODS = 10  # LongRoPE2: the real critical pair is searched from the pair completing this many periods in L0
PROGRESSIVE = 8.0  # LongRoPE's second stage: searched again on the model fine-tuned at s = FACTOR
FT_SHARE, FT_LR = 0.025, 1e-4  # fine-tune steps as a share of the pre-training steps (50 of 2000); AdamW
BASE_FT_SHARE = 0.1  # base2x+ft: fine-tune steps at L0 with the larger base (200 of 2000)
BEND_DELTA = 0.1  # nats: a bucket "rises" when its loss exceeds the in-range reference by this much
# the control: a *sharp* rise (x1.65 perplexity), so that a gradual drift past L0 (attention over more keys)
# is not read as the bend; chosen after the paper run showed 0.1 firing on base2x+ft's drift (docs say so)
BEND_SHARP = 0.5
BUCKETS = 4  # position buckets per L0
# The training mix: each window carries a passkey with probability PASSKEY_SHARE, its answer digits
# weighted ANSWER_WEIGHT (with weight 1 the copy was never learned, shares 0.1-0.5, up to 6000 steps)
PASSKEY_SHARE, ANSWER_WEIGHT = 0.1, 10.0
# ... and with probability REASONING_SHARE ends with an example of a reasoning task (compact form,
# rs.CHAR_PARAMS), its answer characters weighted REASONING_WEIGHT
REASONING = tuple(rs.TASKS)
REASONING_SHARE, REASONING_WEIGHT = 0.25, 10.0
SEARCH = SearchConfig(population=16, generations=8, survivors=4)  # 112 evaluations (LongRoPE: 64 x 40)
FIXED = {"train.max_length": "the training length L0 every schedule is built around",
         "train.min_length": "the training length L0 (one window length)",
         "variants": "the methods of METHODS, built from L0 and FACTOR"}


def schedules(L0: int, s: float = FACTOR) -> dict[str, dict]:
    """The training-free schedules as Hugging Face rope_scaling dicts, for a model trained on L0."""
    orig = {"factor": s, "original_max_position_embeddings": L0}
    return {
        "pi": {"rope_type": "linear", "factor": s},
        "ntk": {"rope_type": "ntk", "factor": s},
        "dynamic": {"rope_type": "dynamic", **orig},
        "ntk_by_parts": {"rope_type": "ntk_by_parts", **orig},
        "yarn": {"rope_type": "yarn", **orig},
        "llama3": {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0, **orig},
    }


# ----------------------------------------------------------------------------- claims, tables, figures

CEILING_NA = ("a precondition of the ranking, not a claim of the survey: below 0.5 exact match within L0 the task "
              "cannot rank the extensions; shown")
FINE_TUNING_METHODS = ("pi",)  # published with fine-tuning: their training-free use is shown, not judged


def _at(multiple: float):
    return probe("loss") & is_("multiple", multiple)


CLAIMS = [
    ClaimSpec(name="plain RoPE: loss at the longest length minus loss at L0",
              where=probe("loss") & is_("method", "rope")
              & is_("longest", True), measure=mean("delta_L0"), op=">", threshold=0.0,
              paper="extrapolation fails without extension (survey)"),
    ClaimSpec(name="passkey retrieval within the training length (the ceiling)", measure=mean("accuracy"),
              where=probe("passkey") & is_("method", "rope") & is_("multiple", 1.0),
              paper="the ceiling extensions are measured against", na=CEILING_NA),
    ClaimSpec(name="{task}: exact match within the training length (the ceiling)", measure=mean("exact"),
              where=probe("reasoning") & is_("method", "rope") & is_("multiple", 1.0), per=("task",),
              paper="the ceiling extensions are measured against", na=CEILING_NA),
    ClaimSpec(name="{task}: ranking of the methods by exact match agrees with the ranking by loss (x{multiple})",
              paper="survey: perplexity alone does not judge extension (reasoning and code tasks must)",
              where=probe("ranking"), per=("task", "multiple"), measure=mean("tau", "Kendall's tau"),
              na="the survey predicts disagreement but gives no number; tau is reported"),
    ClaimSpec(name="{method}: loss at L_t minus plain RoPE's", where=_at(FACTOR) & is_("extension", True)
              & is_("fine_tuning_method", False), per=("method",), measure=mean("delta_rope"), op="<", threshold=0.0,
              paper="extension helps (survey)"),
    ClaimSpec(name="{method} (no fine-tuning): loss at L_t minus plain RoPE's", where=_at(FACTOR)
              & is_("fine_tuning_method", True), per=("method",), measure=mean("delta_rope"),
              paper="extension helps (survey)", na="PI is published as a fine-tuning method (Chen et al. 2023 "
              "fine-tune after interpolating; NTK-aware scaling was proposed because interpolation alone hurts): "
              "judged as pi+ft, shown here"),
    ClaimSpec(name="longrope-progressive: loss at 8 L0 minus longrope+ft's", measure=mean("diff"),
              where=probe("vs") & is_("pair", "longrope-progressive - longrope+ft"), op="<", threshold=0.0,
              paper="a second search on the fine-tuned model extends further without fine-tuning "
                    "(Ding et al. 2024: 256k fine-tuned -> 2048k)"),
    ClaimSpec(name="longrope-progressive: loss at L0 after minus before the short-factor readjustment",
              where=probe("readjust"), measure=mean("gain"), op="<", threshold=0.0,
              paper="short-factor readjustment recovers short-context performance (Ding et al. 2024)"),
    ClaimSpec(name="longrope2 minus longrope: passkey digit loss at L_t", measure=mean("diff"),
              where=probe("vs") & is_("pair", "longrope2 - longrope"), op="<", threshold=0.0,
              paper="needle-driven search with the real critical dimension beats LM-loss search on "
                    "long-range retrieval (Shang et al. 2025)"),
    ClaimSpec(name="{method}: loss rise from L0 to the predicted bound (flat)", where=probe("bend"), per=("method",),
              measure=mean("flat_rise"), op="<=", threshold=BEND_DELTA,
              paper="flat up to T_extra = 2 pi base^(d_extra/d) (Liu et al. 2023)"),
    ClaimSpec(name="{method}: loss rise past the predicted bound", where=probe("bend"), per=("method",),
              measure=mean("past_rise"), op=">=", threshold=BEND_DELTA,
              paper="rising after T_extra (Liu et al. 2023)"),
    ClaimSpec(name="base2x+ft: bend position over plain RoPE's", where=probe("bend_shift"), measure=mean("ratio"),
              op="~", threshold=2.0, tol=0.5,
              paper="base_for_length(2 T_extra): a tuned base's bound moves to 2 T_extra (Liu et al. 2023, Thm 2)"),
    ClaimSpec(name=f"{{method}} (control, a sharp rise > {BEND_SHARP} nats): first such bucket over the bound",
              where=probe("bend"), per=("method",), measure=mean("sharp_over_bound"), op="~", threshold=1.0,
              tol=0.25, paper="the loss bends at T_extra (Liu et al. 2023)",
              note="{seeds} seeds; the bucket's start over T_extra (buckets L0 / 4 wide)"),
    ClaimSpec(name=f"base2x+ft (control, a sharp rise > {BEND_SHARP} nats): bend position over plain RoPE's",
              where=probe("bend_shift"), measure=mean("sharp_ratio"), op="~", threshold=2.0, tol=0.5,
              paper="base_for_length(2 T_extra): a tuned base's bound moves to 2 T_extra (Liu et al. 2023, Thm 2)"),
]

_BY = ("#", "method")
TABLES = [
    Table("Loss by length (nats)", by=_BY, where=probe("loss"), pivot=Pivot("length", "loss", "L={}"),
          intro="Mean next-character cross-entropy over non-overlapping validation windows of each length, every "
                "position counted; mean ± std over seeds."),
    Table("Loss minus plain RoPE's (same seed, same length); at L0 this is short-context retention", by=_BY,
          where=probe("loss"), pivot=Pivot("length", "delta_rope", "L={}")),
    Table("Passkey exact match (averaged over depths)", by=_BY, where=probe("passkey"),
          pivot=Pivot("length", "accuracy", "L={}")),
    Table("Passkey answer-digit loss (nats; ln 10 = 2.303 for a guess)", by=_BY, where=probe("passkey"),
          pivot=Pivot("length", "loss", "L={}")),
    Table("Reasoning and code: exact match of the greedy answer (averaged over depths)", by=(*_BY, "task"),
          where=probe("reasoning"), pivot=Pivot("length", "exact", "L={}")),
    Table("Reasoning and code: answer-character accuracy (teacher-forced, the leading space excluded)",
          by=(*_BY, "task"), where=probe("reasoning"), pivot=Pivot("length", "answer_accuracy", "L={}")),
    Table("Rankings: methods by exact match against methods by loss at the same length (L > L0)",
          by=("multiple", "task"), where=probe("ranking"),
          columns=(Column("Kendall tau", "tau"), Column("methods", lambda g: g[0]["methods"]),
                   Column("best by task", lambda g: g[0]["best_task"]),
                   Column("best by loss", lambda g: g[0]["best_loss"])),
          intro="Per seed: the methods ordered by mean exact match (over depths) and by validation loss at that "
                "length; tau is empty where every method has the same exact match."),
    Table("RoPE scaling law (Liu et al. 2023)", by=("method",), where=probe("scaling_law"), columns=(
        Column("head dim", "head_dim", 0), Column("base", "base", 0),
        Column("critical dim d_extra", "critical_dimension", 0),
        Column("full-period pairs", "full_period_pairs", 0), Column("bound T_extra", "extrapolation_bound", 1))),
    Table("The bend: position-wise loss on the longest windows against the predicted bound", by=("method",),
          where=probe("bend"), columns=(
              Column("bound", "bound", 1), Column("reference loss [L0/2, L0)", "ref"),
              Column("rise [L0, bound)", "flat_rise"), Column("rise past bound", "past_rise"),
              Column(f"first bucket rising > {BEND_DELTA}", "bend", 1),
              Column(f"first bucket rising > {BEND_SHARP} (control)", "sharp_bend", 1)),
          intro="Rise: mean bucket loss minus the reference (the loss at positions [L0/2, L0) of the same windows)."),
    Table("Searches: budget and the initial seed the winner descends from", by=("method", "set", "seed"),
          where=probe("search_result"), columns=(
              Column("s", "s", 0), Column("n-hat", "n_hat", 0),
              Column("critical pair (range)", lambda g: g[0].get("crit")),
              Column("winner from", lambda g: g[0]["origin"]),
              Column("objective first -> best", lambda g: g[0]["trace"]),
              Column("evaluations", "evaluations", 0), Column("seconds", "seconds", 1))),
    Table("Short-factor readjustment (longrope-progressive, validation loss at L0)", by=("method",),
          where=probe("readjust"), columns=(Column("before", "before"), Column("after", "after"))),
    Table("Wall time of the training stages (this machine)", by=("method", "stage"), where=probe("timing"),
          columns=(Column("seconds", "seconds", 1),)),
]
FIGURES: list[Lines | Heatmap] = [
    Heatmap("passkey_heatmap.png", value="accuracy", y="depth", x="length", panel=("#", "method"),
            where=probe("passkey"), title="passkey exact-match accuracy by depth (rows) x length (viridis: 0 dark, 1 "
                                          "yellow)"),
    Lines("positionwise_loss.png", x="position", y="loss", series=("method",), logx=True,
          where=probe("positionwise") & is_("longest", True), vline=lambda rows: rows[0]["L0"],
          ylabel="loss (nats)", title="position-wise loss on the longest windows (line: L0)"),
    Lines("bend.png", x="position", y="loss", panel="method", vline=lambda rows: rows[0]["bound"],
          where=probe("positionwise") & is_("longest", True) & is_("method", "rope", "base2x+ft"),
          ylabel="loss (nats)"),
    Lines("reasoning.png", x="length", y="exact", series=("method",), panel="task", where=probe("reasoning"),
          logx=True, vline=lambda rows: rows[0]["L0"], ylim=(-0.05, 1.05), ylabel="exact match",
          xlabel="window length (line: L0)"),
]


# ----------------------------------------------------------------------------- grid

def study(preset: str) -> StudyConfig:
    if preset == "quick":
        L0, model = 32, dict(d_model=32, n_layers=1, n_heads=2)
        train = TrainConfig(steps=40, batch_size=8, lr=3e-3, optimizer="adamw", betas=(0.9, 0.99),
                            min_length=L0, max_length=L0)
        ev = EvalConfig(lengths=tuple(m * L0 for m in (1, 2, 4)), n_sequences=8, seed=0, chunk=8)
        seeds = 1
    else:
        L0, model = 64, dict(d_model=128, n_layers=4, n_heads=4)  # nanoGPT shakespeare_char on CPU
        train = lm_recipe(steps=2000, batch_size=12, context=L0)
        ev = EvalConfig(lengths=tuple(m * L0 for m in MULTIPLES), n_sequences=64, seed=0, chunk=16)
        seeds = 2
    variants = {k: {"where": {"encoding": "rope"},
                    **({"encoding_options": {"rope": {"scaling": m.scaling(L0)}}} if m.scaling else {})}
                for k, m in METHODS.items() if k != "rope"}
    return StudyConfig(model_type="transformer", model=model, task_type="passkey",
                       task=dict(share=PASSKEY_SHARE, answer_weight=ANSWER_WEIGHT, reasoning=list(REASONING),
                                 reasoning_share=REASONING_SHARE, reasoning_weight=REASONING_WEIGHT),
                       encoding="rope", grid={"encoding": ("rope",)}, seeds=seeds, variants=variants, train=train,
                       eval=ev)


def check(study: StudyConfig) -> None:
    """Plain RoPE trained on one length, a passkey-capable text task, lengths past L0."""
    if tuple(study.axis("encoding")) != ("rope",):
        raise ConfigError("grid.encoding", list(study.axis("encoding")), "[\"rope\"]: the schedules rescale RoPE")
    if study.task_type != "passkey":
        raise ConfigError("task_type", study.task_type, "passkey (text with a share of passkey windows)")
    if study.train.min_length != study.train.max_length:
        raise ConfigError("train.min_length", study.train.min_length, f"train.max_length={study.train.max_length}")
    if study.encoding_options.get("rope", {}).get("scaling"):
        raise ConfigError("encoding_options.rope.scaling", study.encoding_options["rope"]["scaling"],
                          "none: the model trains with plain RoPE")


# ----------------------------------------------------------------------------- the method registry

@dataclass
class Built:
    """A method applied to one trained member: its model at each length, its stage rows, what a
    stored stage rebuilds it from (``info``, JSON: the searched schedule, the fine-tuning
    schedules) and the fine-tuned copy (``tuned``), which later stages reuse."""

    model_at: Callable[[int], torch.nn.Module]
    rows: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    tuned: torch.nn.Module | None = None


@dataclass(frozen=True)
class Method:
    build: Callable[..., Built]  # (ctx) -> Built
    trains: bool  # changes the weights (fine-tuning)
    scaling: Callable[[int], dict] | None = None  # training-free: its rope_scaling dict for L0 (the variant's)
    stored: bool = False  # a search or a fine-tune: a stage of its own in the store (experiments.stages)


_MEMO: dict[tuple[str, str], Built] = {}


def stage(ctx, method: str) -> Built:
    """``METHODS[method]`` built on ctx's trained member, once per process (keyed by the trained
    member's run key: a stage method's variant changes nothing else in the config). A stored
    method is read back from the store's stage when ``ctx.stages`` holds it, else computed and
    recorded there (its rows with ``info``, and the fine-tuned weights)."""
    member = dataclasses.replace(ctx.member, variant=None).key
    if (member, method) in _MEMO:
        return _MEMO[(member, method)]
    spec, stages = METHODS[method], ctx.stages
    stored = stages.get(stage_config(member, method)) if spec.stored and stages is not None else None
    if stored is None:
        clock = time.perf_counter()
        built = spec.build(ctx)
        if spec.stored and stages is not None:
            tuned = built.tuned
            weights = None if tuned is None else {k: v.detach().cpu() for k, v in tuned.state_dict().items()}
            stages.put(stage_config(member, method), [dict(probe="stage", info=json.dumps(built.info))] + built.rows,
                       weights, seconds=time.perf_counter() - clock)
    else:
        rows, weights = stored
        info = json.loads(rows[0]["info"])
        tuned = _reload(ctx, info, weights) if weights else None
        built = Built(_view(ctx, info, tuned), rows[1:], info, tuned)
    _MEMO[(member, method)] = built
    return built


def stage_config(member: str, method: str) -> dict:
    """What a stored stage is keyed by: the trained member, the method and every constant its
    search or fine-tuning reads."""
    return dict(stage=f"context-extension/{method}", member=member, factor=FACTOR, progressive=PROGRESSIVE,
                search=dataclasses.asdict(SEARCH), n_hats=list(N_HATS), periods=PERIODS, ft=[FT_SHARE, FT_LR],
                base_ft=BASE_FT_SHARE)


def _fixed(model) -> Callable[[int], torch.nn.Module]:
    return lambda L: model


def _as_loaded(ctx) -> Built:
    return Built(_fixed(ctx.model))


def _schedule(which: str) -> Method:
    return Method(build=_as_loaded, trains=False, scaling=lambda L0: schedules(L0)[which])


def _space(ctx, **kw) -> SearchSpace:
    cfg = ctx.model.cfg
    return SearchSpace(L0=ctx.study.train.max_length, head_dim=cfg.d_head, base=_base(ctx.model), **kw)


def _searched(ctx, scaling: dict, rows: list[dict], on: str | None = None, **info) -> Built:
    """A searched stage: ``scaling`` on the member (or on stage ``on``'s fine-tuned copy)."""
    info = dict(scaling=scaling, **({"on": on} if on else {}), **info)
    return Built(_view(ctx, info), rows, info)


def _view(ctx, info: dict, tuned: torch.nn.Module | None = None) -> Callable[[int], torch.nn.Module]:
    """A stage's model at each length, from its info (and fine-tuned copy)."""
    if "encodings" in info:  # fine-tuned: each length reads through its training schedule (or the first's)
        assert tuned is not None
        if not info.get("per_length"):
            return _fixed(tuned)
        encs = _encodings(ctx, info)
        L0, target = min(encs), max(encs)
        return lambda L: swap(tuned, encs[L0] if L <= L0 else encs[target])
    if "scaling" in info:
        base = stage(ctx, info["on"]).tuned if "on" in info else ctx.model
        return _fixed(with_scaling(base, info["scaling"]))
    return _fixed(ctx.model)


def _encodings(ctx, info: dict) -> dict:
    """{length: RoPE encoding} of a fine-tuned stage's info (JSON keys are strings)."""
    return {int(L): rope_encoding(ctx.model, scaling) for L, scaling in info["encodings"].items()}


def _reload(ctx, info: dict, weights: dict) -> torch.nn.Module:
    """A stored fine-tuned copy: the member's structure, reading through its first schedule."""
    tuned = copy.deepcopy(ctx.model)
    encs = _encodings(ctx, info)
    swap(tuned, encs[next(iter(encs))])
    tuned.load_state_dict(weights)
    return tuned.to(next(ctx.model.parameters()).device).eval()


def build_longrope(ctx) -> Built:
    model, L0, seed = ctx.model, ctx.study.train.max_length, ctx.member.seed
    long = search(model, lm_objective(ctx.task, int(FACTOR * L0), ctx.study), _space(ctx, s=FACTOR, n_hats=N_HATS),
                  SEARCH, seed=seed + 1)
    short = search(model, lm_objective(ctx.task, L0, ctx.study),
                   _space(ctx, s=FACTOR, kind="short", other=tuple(long.factors), n_hats=(long.n_hat,)), SEARCH,
                   seed=seed)
    return _searched(ctx, longrope(L0, short.factors, long.factors, FACTOR, long.n_hat),
                     long.rows("long") + short.rows("short"))


def build_longrope2(ctx) -> Built:
    model, L0 = ctx.model, ctx.study.train.max_length
    cfg = model.cfg
    crit = critical_dimension(_base(model), L0, cfg.d_head) // 2  # the theoretical critical pair
    lo = min(pair_with_periods(_base(model), L0, cfg.d_head, PERIODS), crit)
    long = search(model, needle_objective(ctx.task, int(FACTOR * L0), ctx.study),
                  _space(ctx, s=FACTOR, critical=(lo, min(crit, cfg.d_head // 2 - 1))), SEARCH,
                  seed=ctx.member.seed + 2)
    return _searched(ctx, longrope(L0, [1.0] * len(long.factors), long.factors, FACTOR), long.rows("long"))


def build_ft(which: str, ctx) -> Built:
    L0 = ctx.study.train.max_length
    return _finetuned(ctx, {int(FACTOR * L0): schedules(L0)[which]})


def build_longrope_ft(ctx) -> Built:
    L0 = ctx.study.train.max_length
    return _finetuned(ctx, {int(FACTOR * L0): stage(ctx, "longrope").info["scaling"]})


def build_longrope2_ft(ctx) -> Built:
    """Mixed context windows: the searched schedule on L_t, plain RoPE on L0, evaluated so."""
    L0 = ctx.study.train.max_length
    return _finetuned(ctx, {int(FACTOR * L0): stage(ctx, "longrope2").info["scaling"], L0: None}, per_length=True)


def build_progressive(ctx) -> Built:
    """LongRoPE's progressive extension, scaled down: on longrope+ft, search factors and n-hat for
    PROGRESSIVE x L0 (no fine-tuning there; the first stage's long factors x 2 among the seeds),
    then readjust the short factors at L0 (starting from the first stage's)."""
    L0, seed = ctx.study.train.max_length, ctx.member.seed
    first, tuned = stage(ctx, "longrope").info["scaling"], stage(ctx, "longrope+ft").tuned
    long = search(tuned, lm_objective(ctx.task, int(PROGRESSIVE * L0), ctx.study),
                  _space(ctx, s=PROGRESSIVE, n_hats=N_HATS,
                         starts={"stage-1 x2": tuple(np.asarray(first["long_factor"]) * PROGRESSIVE / FACTOR)}),
                  SEARCH, seed=seed + 3)
    short = search(tuned, lm_objective(ctx.task, L0, ctx.study),
                   _space(ctx, s=PROGRESSIVE, kind="short", other=tuple(long.factors), n_hats=(long.n_hat,),
                          starts={"stage-1": tuple(first["short_factor"])}), SEARCH, seed=seed + 4)
    prog = longrope(L0, short.factors, long.factors, PROGRESSIVE, long.n_hat)
    before = longrope(L0, first["short_factor"], long.factors, PROGRESSIVE, long.n_hat)
    ev = ctx.study.eval
    loss = [positionwise(_fixed(with_scaling(tuned, sc)), ctx.task.corpus, [L0], L0, ev.n_sequences, ev.chunk,
                         ctx.device)[0]["loss"] for sc in (before, prog)]
    rows = long.rows("long") + short.rows("short")
    rows.append(dict(probe="readjust", length=L0, before=loss[0], after=loss[1], gain=loss[1] - loss[0]))
    return _searched(ctx, prog, rows, on="longrope+ft")


def build_base2x(ctx) -> Built:
    """Theorem 2 of Liu et al. 2023: tuned at L0 with the base whose bound is 2 T_extra."""
    model, L0, d = ctx.model, ctx.study.train.max_length, ctx.model.cfg.d_head
    base = _base(model)
    beta = base_for_length(2 * extrapolation_bound(base, L0, d), L0, d, pretrain_base=base)
    steps = max(2, int(BASE_FT_SHARE * ctx.study.train.steps))
    built = _finetuned(ctx, {L0: {"rope_type": "default", "rope_theta": beta}}, steps)
    built.rows.append(_law_row(beta, L0, d, pretrain_base=base))
    return built


METHODS: dict[str, Method] = {  # a new method is one entry; the report lists every one
    "rope": Method(build=_as_loaded, trains=False),
    **{k: _schedule(k) for k in ("pi", "ntk", "dynamic", "ntk_by_parts", "yarn", "llama3")},
    "longrope": Method(build=build_longrope, trains=False, stored=True),
    "longrope2": Method(build=build_longrope2, trains=False, stored=True),
    "pi+ft": Method(build=partial(build_ft, "pi"), trains=True, stored=True),
    "yarn+ft": Method(build=partial(build_ft, "yarn"), trains=True, stored=True),
    "longrope+ft": Method(build=build_longrope_ft, trains=True, stored=True),
    "longrope-progressive": Method(build=build_progressive, trains=True, stored=True),
    "longrope2+ft": Method(build=build_longrope2_ft, trains=True, stored=True),
    "base2x+ft": Method(build=build_base2x, trains=True, stored=True),
}


# ----------------------------------------------------------------------------- evaluation

def evaluate(ctx) -> list[dict]:
    method = ctx.member.variant or "rope"
    built = stage(ctx, method)
    L0, ev = ctx.study.train.max_length, ctx.study.eval
    rows = positionwise(built.model_at, ctx.task.corpus, ev.lengths, L0, ev.n_sequences, ev.chunk, ctx.device)
    rows += passkey(built.model_at, ctx.task.corpus, ev.lengths, max(2, ev.n_sequences // 4), ev.seed,
                    ctx.task.digits, ctx.device)
    rows += reasoning(built.model_at, ctx.task, ev.lengths, max(2, ev.n_sequences // 4), ev.seed, ctx.device)
    rows += built.rows
    if method == "rope":
        rows.append(_law_row(_base(ctx.model), L0, ctx.model.cfg.d_head))
    return [{"method": method, **r} for r in rows]


def _law_row(base: float, L0: int, d: int, pretrain_base: float | None = None) -> dict:
    d_extra = critical_dimension(pretrain_base or base, L0, d)
    return dict(probe="scaling_law", head_dim=d, base=base, train_length=L0, critical_dimension=d_extra,
                full_period_pairs=full_period_pairs(base, L0, d),
                extrapolation_bound=extrapolation_bound(base, L0, d, pretrain_base=pretrain_base))


def _base(model) -> float:
    return float(getattr(model.encoding, "base", 10000.0))


def positionwise(model_at, corpus, lengths, L0: int, n: int, chunk: int, device) -> list[dict]:
    """Loss per position bucket (width L0 / BUCKETS) and overall, on validation windows of each length."""
    return loss_rows(model_at, CharText(corpus=corpus, split="val"), lengths, max(1, L0 // BUCKETS), n=n,
                     chunk=chunk, device=device)


def passkey(model_at, corpus, lengths, n: int, seed: int, digits: int, device) -> list[dict]:
    """Exact-match accuracy, digit accuracy and digit loss by depth x length (validation haystacks)."""
    rows = []
    for L in lengths:
        model = model_at(L)
        for depth in PASSKEY_DEPTHS:
            task = PasskeyText(corpus=corpus, split="val", share=1.0, digits=digits, depth=depth, score="answer")
            g = torch.Generator().manual_seed(_cell_seed(seed, L, depth))
            batch, answer = task.sample_with_answers(g, n, L)
            batch, answer = batch.to(device), answer.to(device)
            logits = model(batch.tokens)
            ce = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")  # [b, L]
            right = (logits.argmax(-1) == batch.targets) & answer  # [b, L]
            per_seq = right.sum(1) == answer.sum(1)
            rows.append(dict(probe="passkey", length=L, depth=depth, accuracy=float(per_seq.float().mean()),
                             digit_accuracy=float(right.sum() / answer.sum()), loss=float(ce[answer].mean()),
                             passkeys=n))
    return rows


def reasoning(model_at, task: PasskeyText, lengths, n: int, seed: int, device) -> list[dict]:
    """Exact match of the greedy answer per reasoning task of ``task`` by depth x length: ``n``
    examples per cell, each ending a validation window of L characters (:func:`reasoning_windows`).

    One teacher-forced forward per (length, task), every depth in it: greedy decoding writes the
    answer iff every answer character is the argmax after the characters before it, and the
    prediction after the last is not a letter or digit (``rs.score``'s run-on rule; strict about the
    single leading space a character model is trained on). Also the accuracy and loss of the
    answer's characters (its leading space excluded), as the training weights them. A depth whose
    example cannot fit L is left out."""
    alnum = torch.tensor([c.isalnum() for c in task.vocab], device=device)
    rows = []
    for L in lengths:
        model = model_at(L)
        for name in task.reasoning:
            cells = [(depth, cell) for depth in PASSKEY_DEPTHS
                     if (cell := reasoning_windows(task, name, L, depth, n, seed)) is not None]
            if not cells:
                continue
            tokens = torch.cat([c[0] for _, c in cells]).to(device)  # [cells x n, L]
            first = torch.cat([c[1] for _, c in cells]).to(device)  # [cells x n]
            full = model(tokens)  # [cells x n, L, vocab]
            logits = full[:, :-1]  # position t predicts token t + 1
            ce = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # [cells x n, L - 1]
            right = logits.argmax(-1) == tokens[:, 1:]
            t = torch.arange(L - 1, device=device)
            answer = t >= first[:, None] - 1  # predicting the answer, leading space included
            content = t >= first[:, None]  # ... without it
            exact = (right | ~answer).all(1) & ~alnum[full[:, -1].argmax(-1)]  # no run-on after the answer
            for k, (depth, _) in enumerate(cells):
                i = slice(k * n, (k + 1) * n)
                rows.append(dict(probe="reasoning", task=name, length=L, depth=depth,
                                 exact=float(exact[i].float().mean()),
                                 answer_accuracy=float(right[i][content[i]].float().mean()),
                                 loss=float(ce[i][content[i]].mean()), examples=n))
    return rows


@functools.lru_cache(maxsize=512)
def reasoning_windows(task: PasskeyText, name: str, L: int, depth: float, n: int,
                      seed: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``n`` windows of L characters (token ids of ``task``'s vocabulary, [n, L]) and the index of
    each one's answer (its leading space) [n]: validation text, a line break, then an example of
    ``name`` at ``depth`` (``rs.fitted`` with rs.CHAR_PARAMS, seed ``seed * 1000 + trial``), prompt and
    answer ending the window, as the training mixture writes them. None when it cannot fit L."""
    examples = [rs.fitted(name, L - 1, depth, seed * 1000 + trial, **rs.CHAR_PARAMS[name]) for trial in range(n)]
    if any(ex is None for ex in examples):
        return None
    text = CharText(corpus=task.corpus, split="val").ids  # corpus ids are the same in task's vocabulary
    g = torch.Generator().manual_seed(_cell_seed(seed + 101 + list(rs.TASKS).index(name), L, depth))
    starts = torch.randint(0, text.numel() - L, (n,), generator=g)
    tokens = text[starts[:, None] + torch.arange(L)]  # [n, L]
    first = torch.empty(n, dtype=torch.long)
    for i, ex in enumerate(examples):
        assert ex is not None
        ids = task.encode("\n" + ex.prompt + ex.answer)  # as the training mixture writes it
        tokens[i, L - len(ids):] = ids
        first[i] = L - len(ex.answer)
    return tokens, first


def _cell_seed(seed: int, L: int, depth: float) -> int:
    return (seed * 1_000_003 + L * 1009 + int(round(depth * 1000))) % (2 ** 62)


def lm_objective(task, L: int, study):
    """Mean next-character loss on fixed training-split text windows of length L."""
    n = max(2, study.eval.n_sequences // 8)
    batch = CharText(corpus=task.corpus, split="train").sample(
        torch.Generator().manual_seed(_cell_seed(study.eval.seed + 7, L, 0.0)), n, L)

    def loss(model) -> float:
        b = batch.to(next(model.parameters()).device)
        return float(F.cross_entropy(model(b.tokens).flatten(0, 1), b.targets.flatten()))
    return loss


def needle_objective(task, L: int, study):
    """LongRoPE2's needle-driven loss: cross-entropy on the answer digits of passkeys planted at the
    start of the window (depth 0), so every answer digit depends on the farthest positions."""
    n = max(4, study.eval.n_sequences // 4)
    pk = PasskeyText(corpus=task.corpus, split="train", share=1.0, digits=task.digits, depth=0.0, score="answer")
    batch, answer = pk.sample_with_answers(torch.Generator().manual_seed(_cell_seed(study.eval.seed + 11, L, 0.0)),
                                           n, L)

    def loss(model) -> float:
        dev = next(model.parameters()).device
        ce = F.cross_entropy(model(batch.tokens.to(dev)).transpose(1, 2), batch.targets.to(dev), reduction="none")
        return float(ce[answer.to(dev)].mean())
    return loss


def _finetuned(ctx, scalings: dict, steps: int | None = None, per_length: bool = False) -> Built:
    """A fine-tuned stage: ``scalings`` {length: rope_scaling dict or None}, trained on in turn."""
    steps = steps or max(2, int(FT_SHARE * ctx.study.train.steps))
    clock = time.perf_counter()
    encodings = {L: rope_encoding(ctx.model, scaling) for L, scaling in scalings.items()}
    tuned = finetune(ctx.model, encodings, ctx.task, ctx.study, steps, ctx.member.seed, ctx.device)
    rows = [dict(probe="timing", stage="finetune", seconds=time.perf_counter() - clock, steps=steps, lr=FT_LR,
                 lengths=",".join(map(str, encodings)))]
    info = dict(encodings=scalings, per_length=per_length)
    return Built(_view(ctx, info, tuned), rows, info, tuned)


def finetune(model, encodings: dict, task, study, steps: int, seed: int, device):
    """A fine-tuned copy of ``model``: step k trains on windows of the k-th length of ``encodings``
    (cycling) read through that length's RoPE schedule; AdamW at FT_LR, gradient clip 1.0, the
    training mix of the task. Returns the copy, reading through the first schedule."""
    tuned = copy.deepcopy(model).train()
    lengths = list(encodings)
    opt = torch.optim.AdamW(tuned.parameters(), lr=FT_LR, betas=study.train.betas,
                            weight_decay=study.train.weight_decay)
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.enable_grad():
        for k in range(steps):
            L = lengths[k % len(lengths)]
            swap(tuned, encodings[L])
            loss = tuned.loss(task.sample(g, study.train.batch_size, L).to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(tuned.parameters(), 1.0)
            opt.step()
    return swap(tuned.eval(), encodings[lengths[0]])


# ----------------------------------------------------------------------------- the LongRoPE search

# ----------------------------------------------------------------------------- report

def derived_rows(rows: list[dict], L0: int) -> list[dict]:
    """Adds to each row its method's registry index (#), L/L0 (multiple), whether it is an
    extension and at the longest length; to loss rows the loss minus plain RoPE's (delta_rope)
    and minus the same method's at L0 (delta_L0); to position-wise rows the method's predicted
    bound. Returns the comparison rows ("vs"), the bends and the bend shift."""
    order = {m: i for i, m in enumerate(METHODS)}
    longest = max((r["length"] for r in rows if r.get("length")), default=None)
    law = {(r["method"], r["seed"]): r["extrapolation_bound"] for r in rows if r.get("probe") == "scaling_law"}
    loss = {(r["method"], r["seed"], r["length"]): r["loss"] for r in rows if r.get("probe") == "loss"}
    digit = {}
    for r in rows:
        r["method"] = r.get("method") or r.get("variant") or "rope"
        r["#"], r["L0"], r["extension"] = order.get(r["method"], len(order)), L0, r["method"] != "rope"
        r["fine_tuning_method"] = r["method"] in FINE_TUNING_METHODS
        if r.get("length"):
            r["multiple"], r["longest"] = r["length"] / L0, r["length"] == longest
        if r.get("probe") == "loss":
            rope, here = loss.get(("rope", r["seed"], r["length"])), loss.get((r["method"], r["seed"], L0))
            r["delta_rope"] = None if rope is None else r["loss"] - rope
            r["delta_L0"] = None if here is None else r["loss"] - here
        if r.get("probe") == "positionwise":
            r["bound"] = law.get(("rope" if r["method"] != "base2x+ft" else r["method"], r["seed"]))
        if r.get("probe") == "passkey":
            digit.setdefault((r["method"], r["seed"], r["length"]), []).append(r["loss"])
    out = []
    seeds = sorted({r["seed"] for r in rows if "seed" in r})
    for a, b, L, table in (("longrope-progressive", "longrope+ft", PROGRESSIVE * L0, loss),
                           ("longrope2", "longrope", FACTOR * L0, {k: float(np.mean(v)) for k, v in digit.items()})):
        for seed in seeds:
            if (a, seed, int(L)) in table and (b, seed, int(L)) in table:
                out.append(dict(probe="vs", pair=f"{a} - {b}", seed=seed, length=int(L),
                                diff=table[(a, seed, int(L))] - table[(b, seed, int(L))]))
    out += bend_rows(rows, L0) + ranking_rows(rows, L0)
    bends = {(r["method"], r["seed"]): r for r in out if r["probe"] == "bend"}
    for seed in seeds:
        rope, tuned = bends.get(("rope", seed)), bends.get(("base2x+ft", seed))
        if rope and tuned and rope["bend"] and tuned["bend"]:
            sharp = tuned["sharp_bend"] / rope["sharp_bend"] if rope["sharp_bend"] and tuned["sharp_bend"] else None
            out.append(dict(probe="bend_shift", seed=seed, ratio=tuned["bend"] / rope["bend"], sharp_ratio=sharp))
    return out


def ranking_rows(rows: list[dict], L0: int) -> list[dict]:
    """probe="ranking" per (seed, task, length > L0): Kendall's tau between the methods ordered by
    mean exact match over depths (higher first) and by loss at that length (lower first)."""
    loss = {(r["method"], r["seed"], r["length"]): r["loss"] for r in rows if r.get("probe") == "loss"}
    cells: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        if r.get("probe") == "reasoning" and r["length"] > L0 and r.get("exact") is not None:
            cells.setdefault((r["seed"], r["task"], r["length"]), {}).setdefault(r["method"], []).append(r["exact"])
    out = []
    for (seed, task, L), exact in sorted(cells.items()):
        got = rank_agreement({m: float(np.mean(v)) for m, v in exact.items()},
                             {m: v for (m, s, length), v in loss.items() if s == seed and length == L})
        if got is not None:
            out.append(dict(probe="ranking", seed=seed, task=task, length=L, multiple=L / L0, **got))
    return out


def bend_rows(rows: list[dict], L0: int, delta: float = BEND_DELTA) -> list[dict]:
    """Per method with a predicted bound and seed, on the longest windows: the reference loss
    (buckets in [L0/2, L0)), the mean rise over buckets in [L0, bound) and past the bound, and the
    first bucket from L0 on whose loss exceeds the reference by ``delta`` (None if none does), and
    the same for a sharp rise (:data:`BEND_SHARP`, the control) with its start over the bound."""
    out = []
    for law in (r for r in rows if r.get("probe") == "scaling_law"):
        m, seed, bound = law["method"], law["seed"], law["extrapolation_bound"]
        pos = sorted((r for r in rows if r.get("probe") == "positionwise" and r.get("longest") and r["method"] == m
                      and r["seed"] == seed), key=lambda r: r["bucket_start"])
        ref = [r["loss"] for r in pos if L0 // 2 <= r["bucket_start"] and r["bucket_end"] < L0]
        if not ref:
            continue
        ref = float(np.mean(ref))
        flat = [r["loss"] - ref for r in pos if r["bucket_start"] >= L0 and r["bucket_end"] < bound]
        past = [r["loss"] - ref for r in pos if r["bucket_start"] >= bound]
        rising = [r["bucket_start"] for r in pos if r["bucket_start"] >= L0 and r["loss"] - ref > delta]
        sharp = [r["bucket_start"] for r in pos if r["bucket_start"] >= L0 and r["loss"] - ref > BEND_SHARP]
        out.append(dict(probe="bend", method=m, seed=seed, bound=bound, ref=ref,
                        flat_rise=float(np.mean(flat)) if flat else None,
                        past_rise=float(np.mean(past)) if past else None,
                        bend=rising[0] if rising else None, sharp_bend=sharp[0] if sharp else None,
                        sharp_over_bound=sharp[0] / bound if sharp else None))
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    L0 = study.train.max_length
    rows = rows + derived_rows(rows, L0)
    missing = [m for m in METHODS if not any(r.get("method") == m and r.get("probe") == "loss" for r in rows)]
    sections = [f"Methods without rows in this store: {', '.join(missing)}."] if missing else []
    intro = (f"Character-level RoPE LM trained at L0 = {L0}, extended by s = {FACTOR:g} to L_t = {int(FACTOR * L0)}. "
             f"Search budget: population {SEARCH.population} x {SEARCH.generations} generations "
             f"({SEARCH.evaluations} objective evaluations per search, {SEARCH.survivors} survivors). Fine-tuning: "
             f"{max(2, int(FT_SHARE * study.train.steps))} AdamW steps at lr {FT_LR} (base2x+ft: "
             f"{max(2, int(BASE_FT_SHARE * study.train.steps))} at L0). Passkeys: "
             f"{max(2, study.eval.n_sequences // 4)} per (length, depth), depths {list(PASSKEY_DEPTHS)}; "
             f"the reasoning and code tasks ({', '.join(study.task.get('reasoning', ()))}; training share "
             f"{study.task.get('reasoning_share', 0)}, answer weight {study.task.get('reasoning_weight', 1)}) "
             f"on the same grid, compact form.")
    return write_outputs(out, title=title, rows=rows, claims=judge_all(CLAIMS, rows), intro=intro, tables=TABLES,
                         figures=FIGURES, sections=sections)


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, fixed=FIXED, check=check)
