"""Positional leakage where attention sinks exist: pretrained checkpoints (seed 001, third abstract).

The leakage study (``poslab.studies.leakage``) trains small models; this one reads pretrained
checkpoints, where sinks are known to form, through their own modules (poslab.pretrained), on
``windows`` windows of ``length`` tokens of each checkpoint's tokenization of TinyShakespeare's
validation split, in two input modes (the ``bos`` column):

    "with BOS"      the checkpoint's BOS token, then length - 1 text tokens
    "without BOS"   length text tokens (a content token at position 0)

The cpu preset reads two checkpoints side by side (grid axis ``model.checkpoint``; ``--model``
names one instead), both dequantised to float32:

- SmolLM2-135M-Instruct, Q4_1 GGUF (``smollm2-135m``): 30 full-attention layers of 9 heads. Its
  tokenizer sets add_bos_token=False: "without BOS" is its own set-up;
- Gemma 3 270M, Q4_K_M GGUF (``gemma3-270m``): 18 layers of 4 heads, 5 sliding-window layers
  (512 keys, theta 10^4) : 1 full-attention layer (theta 10^6), three times (full layers 5, 11,
  17). Its tokenizer prepends BOS (id 2): "with BOS" is its own set-up, the abstract's.

Each row carries ``setup``: "own" in the checkpoint's own mode (the one its tokenizer gives), else
"other". Claims in the own set-up are ``paper``, in the other ``control`` (SmolLM2's "with BOS" is a
BOS prepended explicitly, Gemma 3's "without BOS" one removed), labelled so in their names.

Per layer and head, in each mode:

- ``sink_share``: the mean attention weight on key 0 of queries i >= ``first_query`` (16); a head
  is a sink head when it is >= 0.3 (``probes.leakage.SINK_THRESHOLD``, the leakage study's bar);
  ``layer_type`` is the layer's (``sliding_attention`` / ``full_attention``), and sink heads are
  counted per type;
- components (a) and (b), and (b) at early queries i < ``first_query``, with the corrected
  decomposition of ``probes/leakage.py`` (centred logits, cross-fitted halves), over the pairs each
  layer attends: its own window read from the model (``model.attended_windows``: Gemma's sliding
  layers keep 512 keys, its full layers all); (b) is split into its key-0 part (the residual
  product on the pairs (i, 0): position 0 read by the queries, the abstract's mechanism, judged)
  and the rest.

"Accumulates with depth" (the abstract: sliding-window attention lets the residual-stream
component accumulate with depth): the least-squares slope of the per-layer mean over heads of (b)
at key 0 on the layer index, per window group, over a set of layers: Gemma 3's sliding layers,
its full layers, SmolLM2's (full-attention) layers. Judged: the sliding layers' slope > 0, and
above the full layers' slope of the same model (paired within each group) -- ``paper``; above
SmolLM2's slope -- ``control`` (two checkpoints differ in more than the attention span: depth,
width, data, theta). Each model in its own set-up.

The closed-system check (``probe="closed"``): per layer (0: the embedding, l: leaving layer l),
the mean pairwise cosine of the position-0 residual across the windows, with BOS at 0 (the same
token everywhere: 1 by causality) and with each window's own first token at 0.

With BOS, the same windows are also read (the ``variant`` column):

- under inference-time variants of the one checkpoint, standing in for the abstract's three
  architectures: NTK-scaled RoPE (``set_schedule``, factor ``ntk_factor``) on the layers of
  ``schedule_layers`` (default the full-attention layers only, as the checkpoints' own
  long-context configs do: every layer of SmolLM2, layers 5, 11 and 17 of Gemma 3; on a model with
  several layer types also on every layer, a control), and, on a model without sliding layers of
  its own, a sliding-window mask of ``window`` keys (``set_window``). They are the same weights
  under another position map or mask, not models trained that way;
- under the three BOS replacements of the leakage study (``probe="intervention"``): the most
  frequent token of the windows, a random vector of the BOS embedding's norm, and the mean token
  embedding, each put in place of the input embedding at position 0; the change of the mean early
  (b) is judged against the published -40% only where all three agree (all within 20 points, or all
  outside), else n.a. with their range: the abstract names no replacement. It is ``paper`` on a
  checkpoint whose tokenizer prepends BOS (Gemma 3), a ``control`` on SmolLM2.

Replicates: the windows are split into ``groups`` disjoint groups of consecutive windows, and every
per-head quantity above is computed on each group on its own (its own cross-fit), with the group
index in the ``seed`` column. A checkpoint has no training seeds; the groups are what another
sample of text would change, so tables give mean ± std over groups, and a quantity whose estimate
is 0 when absent is judged present when its group mean less two standard errors is above 0
(``lower_bound``). (a) > 0 holds by construction under a causal mask: a check. Removing key 0 in
the sink heads is not run here: the pretrained model takes a BOS replacement only.

Memory: the forward hands each layer's logits and weights to the leakage sums as it passes them
(``PretrainedLM.stream``: one layer's [b, h, L, L] at a time, no vocabulary logits), the sums keep
only what the abstract's definitions read (``LeakageSums(old=False)``: two [l, h, L, L] float64
arrays), and the fit is solved one layer at a time. Measured peak RSS of one worker: see
docs/reasoning-leakage.md (``poslab bench leakage-memory``). Settings that differ by checkpoint
(``length``, ``windows``, ``groups``) may be given as {checkpoint: value}.

Presets: quick = a tiny random Llama built in code (or ``--model``), windows of 48 tokens (the
sink and (b) claims are n.a. on random weights, the closed-system check is architectural and
judged; 8 windows in 2 groups); cpu = both checkpoints, 16 windows in 4 groups of 4: 512 tokens
for SmolLM2 and 640 for Gemma 3 (past its 512-key window, so the sliding layers' window binds for
the last 128 queries). The BOS swaps read windows cut at ``first_query``: their early (b) sees
nothing later.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from poslab.errors import ConfigError, check_choice
from poslab.experiments import EvaluateOnly, Job
from poslab.experiments.config import StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, mean_std, write_outputs
from poslab.experiments.rows import RowKind, column, frame, has, of_kind, values, where_is
from poslab.experiments.spec import (
    ClaimSpec,
    above,
    comparison_only,
    derivation,
    is_,
    judge_all,
    lower_bound,
    maximum,
    mean,
    minimum,
    not_run,
    probe,
    undecidable,
)
from poslab.lazy import pandas as pd
from poslab.probes import leakage as lk
from poslab.studies.kit import leakage_rows as lr
from poslab.studies.kit.checkpoints import TINY, checkpoint_source, loaded, preflight_checkpoint, source_path
from poslab.studies.kit.leakage_rows import (
    BALANCE,
    BOTH,
    FINGERPRINT,
    MASK,
    PRESENT,
    SINK_READING,
    SWAP_SOURCE,
)

MODES = ("with BOS", "without BOS")
SETTINGS = ("checkpoint", "length", "windows", "groups", "first_query", "dtype", "ntk_factor", "window",
            "schedule_layers")
PER_CHECKPOINT = ("length", "windows", "groups")  # a value, or {checkpoint: value}
STANDARD, NTK, NTK_ALL, WINDOW = ("standard", "NTK RoPE (inference)", "NTK RoPE (inference, all layers)",
                                  "sliding window (inference)")
VARIANTS = (STANDARD, NTK, NTK_ALL, WINDOW)
SLIDING, FULL = "sliding_attention", "full_attention"
CHECKPOINT_NAMES = {"smollm2-135m": "SmolLM2-135M-Instruct, Q4_1 GGUF, dequantised; its tokenizer adds no BOS",
                    "gemma3-270m": "Gemma 3 270M, Q4_K_M GGUF, dequantised; its tokenizer prepends BOS (id 2); "
                                   "5 sliding (512 keys) : 1 full layers, three times",
                    TINY: "a tiny random Llama built in code"}
LABELS = {"smollm2-135m": "SmolLM2-135M", "gemma3-270m": "Gemma 3 270M", TINY: "tiny Llama"}
SWAPS = {"token": "bos_token", "random": "bos_random", "mean": "bos_mean"}

MODEL = probe("model") & is_("variant", STANDARD)  # derived: one row per mode, variant and group, means over heads
OWN = is_("setup", "own")  # the checkpoint's own set-up: the mode its tokenizer gives
OTHER = is_("setup", "other")
GROUPS = "{seeds} window groups (mean - 2 standard errors over them)"
KEY0 = ("(b) at key 0: its residual product on the pairs (i, 0), position 0 read by the queries (the abstract's "
        "mechanism)")
EVERY_KEY = "(b) over every key (the earlier reading): not the abstract's position-0 mechanism alone"
OTHER_WHY = ("not the checkpoint's set-up: BOS prepended explicitly where the tokenizer adds none (SmolLM2), removed "
             "where it prepends one (Gemma 3)")
# what each claim is (its role follows: experiments/spec.role_of). The leakage abstract (seed 001, third) states the
# claims for pretrained RoPE models, the BOS auto-prepended where the tokenizer does: a checkpoint in its own set-up
# is the seed's setting; the other BOS mode, NTK applied at inference (not an NTK-trained model) and a comparison
# across two checkpoints are other settings (controls)
CAUSALITY = derivation("position 0 sees only itself under causal attention, the same BOS token in every window")
MODES_ROLES = (("{bos}, its own set-up", OWN, "seed", "the mode the checkpoint's tokenizer gives"),
               ("{bos}, not its set-up", OTHER, "other", OTHER_WHY))
SLOPE = ("slope of the per-layer mean (b) at key 0 on the layer index (least squares, per window group), "
         "{seeds} groups, mean - 2 standard errors")
SWAP_NOTE = ("the abstract names no replacement: most frequent token, mean embedding, random vector of the BOS norm, "
             "each the mean change over the window groups; decided only where all three agree")
SWAP = dataclasses.replace(
    lr.SWAP, name="{label}, with BOS, its own set-up: BOS swap changes early (b), all three replacements",
    where=probe("swap3") & OWN, per=("label",), source=SWAP_SOURCE, setting="seed", revised=lr.AGREED,
    note="the tokenizer prepends BOS; " + SWAP_NOTE)
SWAP_OTHER = dataclasses.replace(
    lr.SWAP, name="{label}, with BOS, not its set-up: BOS swap changes early (b), all three replacements",
    where=probe("swap3") & OTHER, per=("label",), source=SWAP_SOURCE, setting="other", revised=lr.AGREED,
    note=OTHER_WHY + "; " + SWAP_NOTE)
CLAIMS = [
    *[ClaimSpec(name=f"{{label}}, {mode}: sink heads exist", paper="sinks read downstream by sink-reading heads",
                where=MODEL & where, per=("label", "bos"), source=SINK_READING, setting=setting,
                measure=minimum("sink_heads", "fewest sink heads (key-0 share >= 0.3) of a window group"),
                op=">=", threshold=1.0, note="queries i >= first_query; {seeds} window groups; " + why)
      for mode, where, setting, why in MODES_ROLES],
    *[ClaimSpec(name=f"{{label}}, {mode}: component (b) at key 0 present", paper="present in all three architectures",
                where=MODEL & where, per=("label", "bos"), source=BOTH, setting=setting,
                measure=lower_bound("component_b_key0", "group mean of (b) at key 0 - 2 standard errors"),
                op=">", threshold=0.0, note=GROUPS + "; " + KEY0 + "; " + why)
      for mode, where, setting, why in MODES_ROLES],
    *[ClaimSpec(name=f"{{label}}, {mode}: component (b) over every key present",
                paper="present in all three architectures", where=MODEL & where, per=("label", "bos"),
                measure=lower_bound("component_b", "group mean of (b) - 2 standard errors"), op=">", threshold=0.0,
                source=BOTH, setting="other", note=GROUPS + "; " + EVERY_KEY + "; " + why)
      for mode, where, _, why in MODES_ROLES],
    *[ClaimSpec(name=f"{{label}}, {mode}: component (a) present", paper="present in all three architectures (by "
                "construction: the causal mask's per-query denominator)", where=MODEL & where, per=("label", "bos"),
                measure=lower_bound("component_a", "group mean of (a) - 2 standard errors"), op=">", threshold=0.0,
                source=MASK, setting="seed",
                note=GROUPS + "; > 0 by construction under a causal mask (the leakage study's note)")
      for mode, where, _, _ in MODES_ROLES],
    ClaimSpec(name="{label}, {bos}, its own set-up: (b) at key 0 accumulates with depth in the sliding-window layers",
              paper="sliding-window attention allows it to accumulate with depth",
              where=probe("depth") & OWN & above("sliding_layers", 0), per=("label", "bos"),
              measure=lower_bound("slope_sliding", "group mean of the sliding layers' slope - 2 standard errors"),
              op=">", threshold=0.0, source=BALANCE, setting="seed", note=SLOPE),
    ClaimSpec(name="{label}, {bos}, its own set-up: (b) at key 0 accumulates faster with depth in the sliding-window "
                   "layers than in the full-attention layers",
              paper="sliding-window attention allows it to accumulate with depth (standard RoPE sits between)",
              where=probe("depth") & OWN & above("sliding_layers", 0) & above("full_layers", 1), per=("label", "bos"),
              measure=lower_bound("slope_sliding_minus_full", "group mean of the sliding layers' slope less the full "
                                                              "layers' - 2 standard errors"),
              op=">", threshold=0.0, source=BALANCE, setting="seed",
              note="the same model and windows, paired within each group; " + SLOPE),
    ClaimSpec(name="{label} sliding-window layers accumulate (b) at key 0 faster with depth than {other}'s "
                   "full-attention layers (each in its own set-up)",
              paper="sliding-window attention allows it to accumulate with depth (standard RoPE sits between)",
              where=probe("depth_cross"), per=("label", "other"), source=BALANCE, setting="other",
              measure=lower_bound("slope_difference", "mean over groups of the difference of slopes - 2 standard "
                                                      "errors (groups paired by index: independent samples)"),
              op=">", threshold=0.0,
              note="two checkpoints differ in more than the attention span (depth, width, data, theta); " + SLOPE),
    ClaimSpec(name="{label}, {bos}, its own set-up: slope of (b) at key 0 with depth, full-attention layers",
              paper="(no number: standard RoPE sits between NTK and a sliding window)",
              where=probe("depth") & OWN & above("full_layers", 1), per=("label", "bos"),
              measure=mean("slope_full", "group mean of the full-attention layers' slope"), source=BALANCE,
              setting="seed",
              na=comparison_only("the abstract states no slope or criterion for full-attention layers; shown beside "
                                 "the sliding layers' slope")),
    *[ClaimSpec(name=f"{{label}}, with BOS: NTK scaling (at inference, {where_}) suppresses (b) {part}",
                paper="(b) smaller under NTK than standard RoPE", where=probe("contrast") & is_(flag, True),
                per=("label",), source=BALANCE, setting="other",
                measure=lower_bound(column, f"group mean of (b) {part}, standard - NTK (inference), - 2 standard "
                                            "errors"),
                op=">", threshold=0.0,
                note="one checkpoint, NTK applied at inference, not trained; " + GROUPS + ", paired; " + why)
      for where_, flag, part, column, why in (
          ("schedule_layers", "ntk_run", "at key 0", "standard_minus_ntk_key0", KEY0),
          ("schedule_layers", "ntk_run", "over every key", "standard_minus_ntk", EVERY_KEY),
          ("every layer", "ntk_all_run", "at key 0", "standard_minus_ntk_all_key0", KEY0))],
    *[ClaimSpec(name=f"{{label}}, with BOS: standard RoPE sits between NTK and a sliding window, (b) {part}",
                paper="NTK < standard < sliding window", where=probe("contrast") & is_("window_run", True),
                per=("label",), source=BALANCE, setting="other",
                measure=lower_bound(column, f"group mean of min(standard - NTK, window - standard) of (b) {part} - 2 "
                                            "standard errors"),
                op=">", threshold=0.0,
                note="one checkpoint, both variants applied at inference; " + GROUPS + "; " + why)
      for part, column, why in (("at key 0", "margin_key0", KEY0), ("over every key", "margin", EVERY_KEY))],
    SWAP,
    ClaimSpec(name="{label}: BOS swap changes early (b) (the checkpoint's set-up)", paper="-40%",
              where=probe("swap3") & OTHER, per=("label",),
              measure=mean("swap_decisive", "the deciding replacement's change"), source=SWAP_SOURCE, setting="seed",
              na=undecidable("its tokenizer adds no BOS (add_bos_token=False), so the abstract's auto-prepended BOS "
                             "is not this checkpoint's set-up; the control below prepends one explicitly")),
    SWAP_OTHER,
    ClaimSpec(name="{label}, with BOS: position-0 residual identical across inputs",
              paper="constant fingerprint with BOS", where=probe("closed"), per=("label",),
              measure=minimum("bos_at_0", "min cosine over layers"), op=">", threshold=0.9999, source=CAUSALITY,
              setting="seed",
              note="follows from causality: position 0 sees only itself, the same token in every window"),
    ClaimSpec(name="{label}, content token at 0: position-0 residual varies with it at every layer",
              paper="varies with the token otherwise", where=probe("closed") & above("layer", 0), per=("label",),
              measure=maximum("content_at_0", "highest cosine over layers 1 on", by=("layer",)), op="<",
              threshold=0.99, source=FINGERPRINT, setting="seed",
              note="each window's own first token at 0; the least varying layer decides"),
]
ARCHITECTURAL = ("{label}, content token at 0: position-0 residual varies with it at every layer",)  # random weights

SIDE = {  # the side-by-side table: quantity -> (derived probe, column, where on it)
    "sink heads, own set-up": ("model", "sink_heads", OWN),
    "sink heads, other mode": ("model", "sink_heads", OTHER),
    "share of sink heads, own set-up": ("model", "sink_head_share", OWN),
    "(b) at key 0, own set-up": ("model", "component_b_key0", OWN),
    "(b) at key 0, other mode": ("model", "component_b_key0", OTHER),
    "early (b), with BOS": ("model", "early_component_b", is_("bos", "with BOS")),
    "slope of (b) at key 0, sliding layers": ("depth", "slope_sliding", OWN),
    "slope of (b) at key 0, full layers": ("depth", "slope_full", OWN),
    "BOS swap, most frequent token (%)": ("swap", "change_pct", is_("intervention", "bos_token")),
    "BOS swap, random vector (%)": ("swap", "change_pct", is_("intervention", "bos_random")),
    "BOS swap, mean embedding (%)": ("swap", "change_pct", is_("intervention", "bos_mean")),
    "NTK (schedule_layers): standard - NTK, (b) at key 0": ("contrast", "standard_minus_ntk_key0",
                                                             is_("ntk_run", True)),
}
TABLES = [
    Table("The checkpoints side by side", by=("order", "quantity"), where=probe("side"),
          pivot=Pivot("label", "value"),
          intro="Mean ± std over the window groups, per checkpoint. Own set-up: with BOS for a checkpoint whose "
                "tokenizer prepends it (Gemma 3), without for one that adds none (SmolLM2). Slopes: of the per-layer "
                "mean (b) at key 0 on the layer index, standard variant, own set-up. BOS swaps: change of early (b), "
                "with BOS, standard."),
    Table("Sinks and components per mode and variant", by=("label", "bos", "variant"), where=probe("model"),
          intro="Means over layers and heads in each window group, then mean ± std over the groups. Sink share: mean "
                "weight on key 0 of queries i >= first_query.",
          columns=(Column("setup", lambda g: g[0]["setup"]), Column("sink heads", "sink_heads", 0),
                   Column("sink share", "sink_share"), Column("(a)", "component_a"), Column("(b)", "component_b"),
                   Column("(b) at key 0", "component_b_key0"),
                   Column("(b) other keys", "component_b_rest"), Column("early (b)", "early_component_b"),
                   Column("early (b) at key 0", "early_component_b_key0"))),
    Table("Sink heads and (b) at key 0 per layer type", by=("label", "bos", "variant", "layer_type"),
          where=probe("layer_type"),
          intro="Sink heads: heads with key-0 share >= 0.3 among the layers of the type (of the type's heads); "
                "slope: of the per-layer mean (b) at key 0 on the layer index over the type's layers.",
          columns=(Column("layers", lambda g: g[0]["layers"]), Column("sink heads", "sink_heads", 1),
                   Column("of heads", lambda g: g[0]["heads"]), Column("sink share", "sink_share"),
                   Column("(b) at key 0", "component_b_key0"), Column("slope of (b) at key 0", "slope", 4))),
    Table("BOS replacements: early (b)", by=("label", "intervention"), where=probe("swap"),
          intro="With BOS, standard RoPE: the input embedding at position 0 replaced; early (b) = (b) at queries < "
                "first_query, mean over layers and heads. The abstract's -40% is judged only where all three changes "
                "are within 20 points of it, or all three outside.",
          columns=(Column("setup", lambda g: g[0]["setup"]), Column("early (b)", "early_component_b"),
                   Column("as is", "base"),
                   Column("change (%)", lambda g: mean_std([100 * r["change"] for r in g if r["change"] is not None],
                                                           1, signed=True, empty="n.a.")))),
    Table("By layer", by=("label", "bos", "variant", "layer"), where=probe("head"),
          intro="Mean ± std over heads and window groups.",
          columns=(Column("type", lambda g: g[0].get("layer_type", FULL).split("_")[0]),
                   Column("sink share", "sink_share"), Column("share of sink heads", "sink"),
                   Column("(a)", "component_a"), Column("(b)", "component_b"),
                   Column("(b) at key 0", "component_b_key0"),
                   Column("early (b)", "early_component_b"))),
    Table("Closed-system check: position-0 residual across inputs", by=("label", "layer"), where=probe("closed"),
          intro="Mean pairwise cosine of the position-0 residual over the windows (layer 0: the embedding).",
          columns=(Column("BOS at 0", "bos_at_0", 6), Column("content token at 0", "content_at_0", 6))),
]
FIGURES = [Lines(f"fig_{y}_by_layer.png", x="layer", y=y, series=("label", "bos", "variant"), where=probe("head"),
                 hline=0.0, ylabel=label, title=label)
           for y, label in (("sink_share", "attention on key 0 (queries >= first_query)"),
                            ("component_b_key0", "(b) at key 0"),
                            ("component_b", "(b) key position and interactions"))]


# cpu: both checkpoints side by side (checkpoint None: the grid axis decides; ``--model`` sets one instead);
# quick: the tiny random checkpoint, every code path
BASE = StudyConfig(model_type="pretrained", task_type="text", task=dict(split="val"),
                   model=dict(checkpoint=None, length={"smollm2-135m": 512, "gemma3-270m": 640}, windows=16, groups=4,
                              first_query=16, dtype="float32", ntk_factor=4.0, window=64, schedule_layers=[FULL]),
                   grid={"model.checkpoint": ("smollm2-135m", "gemma3-270m"), "model.bos": MODES}, seeds=1)
PRESETS = {
    "quick": {"model": dict(checkpoint=TINY, length=48, windows=8, groups=2, first_query=16, dtype="float32",
                            ntk_factor=4.0, window=8, schedule_layers=[FULL]),
              "grid": {"model.bos": MODES}},
    "cpu": {},
}


# ----------------------------------------------------------------------------- checks (before any work)

def checkpoints(study: StudyConfig) -> tuple[str, ...]:
    """The checkpoints a run reads: ``model.checkpoint`` where set (``--model``), else its grid axis."""
    name = study.model.get("checkpoint")
    return (name,) if name is not None else tuple(study.grid.get("model.checkpoint", ()))


def of(m: dict, key: str, name: str):
    """Setting ``key`` for checkpoint ``name``: the value, or its entry in a {checkpoint: value} dict."""
    value = m[key]
    if isinstance(value, dict):
        if name not in value:
            raise ConfigError(f"model.{key}", value, f"a value, or one per checkpoint (missing {name!r})")
        return value[name]
    return value


def settings(study: StudyConfig, name: str | None = None) -> dict:
    """The model settings, checked; with ``name``, those of that checkpoint (per-checkpoint values resolved)."""
    m = dict(study.model)
    _check_keys(m)
    names = checkpoints(study)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError("model.checkpoint", m["checkpoint"], "a checkpoint name or path (--model), or a grid axis "
                                                               "of them")
    for each in names:
        for key in PER_CHECKPOINT:
            of(m, key, each)
    _check_shared(m)
    for mode in study.axis("model.bos"):
        check_choice("model.bos", mode, MODES)
    for each in names:
        _check_checkpoint(m, each)
    if name is None:
        return m
    return dict(m, checkpoint=name, **{k: of(m, k, name) for k in PER_CHECKPOINT})


def _check_keys(m: dict) -> None:
    """Every setting present, and no other key than the settings and ``bos``."""
    for key in m:
        if key not in (*SETTINGS, "bos"):
            raise ConfigError(f"model.{key}", key, ", ".join(SETTINGS))
    for key in SETTINGS:
        if key not in m:
            raise ConfigError(f"model.{key}", None, "set by the preset")


def _is_int(value, lo: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


def _check_shared(m: dict) -> None:
    """The settings every checkpoint shares: first query, window, dtype, NTK factor, schedule layers."""
    for key, lo in (("first_query", 1), ("window", 1)):
        if not _is_int(m[key], lo):
            raise ConfigError(f"model.{key}", m[key], f"an integer >= {lo}")
    check_choice("model.dtype", m["dtype"], ("float32",))
    if not isinstance(m["ntk_factor"], (int, float)) or isinstance(m["ntk_factor"], bool) or m["ntk_factor"] <= 1:
        raise ConfigError("model.ntk_factor", m["ntk_factor"], "a number > 1 (the NTK variant's scale factor)")
    layers = m["schedule_layers"]
    if layers != "all" and (not isinstance(layers, (list, tuple)) or not layers
                            or not all(isinstance(t, str) for t in layers)):
        raise ConfigError("model.schedule_layers", layers, '"all" or a list of layer types, e.g. ["full_attention"]')


def _check_checkpoint(m: dict, name: str) -> None:
    """One checkpoint's length, windows and groups (each a value, or its entry of a per-checkpoint dict)."""
    length, n, groups = (of(m, k, name) for k in PER_CHECKPOINT)
    for key, value, lo in (("length", length, 8), ("windows", n, 4)):
        if not _is_int(value, lo):
            raise ConfigError(f"model.{key}", value, f"an integer >= {lo}")
    if not _is_int(groups, 1) or n % groups or n // groups < 2:
        raise ConfigError("model.groups", groups, f"a divisor of model.windows ({n}) leaving at least 2 windows "
                                                  "a group (each group is cross-fitted in halves)")
    if m["first_query"] >= length:
        raise ConfigError("model.first_query", m["first_query"], f"an integer below model.length ({length})")


def needs(study: StudyConfig, cfg: dict) -> tuple[str, ...]:
    """What the study asks of a checkpoint with config ``cfg``: its attention recorded in every mode;
    with BOS in the modes, a rotary checkpoint's rotary replaced too (the NTK variants)."""
    from poslab.pretrained.table import entry_from_config

    rotary = entry_from_config(cfg)["encoding"] == "rope"
    return ("record", "schedule") if rotary and "with BOS" in study.axis("model.bos") else ("record",)


def check(study: StudyConfig) -> None:
    """Every refusal before any work: settings; per checkpoint its config, what the study asks of its
    model type (:func:`needs`), length and memory, then one short forward of its weights
    (:func:`~poslab.studies.kit.checkpoints.preflight_checkpoint`)."""
    from poslab.machine import MEMORY_FRACTION, memory_bytes
    from poslab.pretrained.architectures import find
    from poslab.pretrained.checks import require_capable
    from poslab.pretrained.loading import config_count, read_causal_config, require_transformers
    from poslab.pretrained.model import require_attention_fits

    settings(study)
    require_transformers()
    wanted = {}
    for name in checkpoints(study):
        m = settings(study, name)
        cfg = read_causal_config(checkpoint_source(name))
        wanted[name] = needs(study, cfg)
        require_capable(cfg, wanted[name], "--model", name)
        arch = find(cfg.get("model_type"))
        chunks = [c for c in (arch.layer_chunks(cfg) if arch is not None else []) if c]
        if chunks and m["length"] > min(chunks):  # the probe's kept keys: causal or a sliding window, not chunks
            raise ConfigError("model.length", m["length"], f"at most {min(chunks)} tokens for {name} (its "
                                                           f"{cfg.get('model_type')!r} layers attend in chunks of "
                                                           f"{min(chunks)}; the leakage probe's kept keys are causal "
                                                           f"or a sliding window)")
        heads = config_count(cfg, "num_attention_heads", "n_head")
        context = cfg.get("max_position_embeddings") or cfg.get("n_positions")
        if context and m["length"] > context:
            raise ConfigError("model.length", m["length"], f"at most the checkpoint's context ({context}, {name})")
        require_attention_fits("model.length", m["length"], m["length"], heads, 1, batch=2,
                               what="scores and patterns of one layer (stream, two windows)")
        need, have = worker_bytes(m["length"], cfg), memory_bytes() * MEMORY_FRACTION
        if need > have:
            raise ConfigError("model.length", m["length"], f"a length whose leakage fit fits in memory: about "
                                                           f"{need / 2**30:.1f} GiB for {name}, "
                                                           f"{have / 2**30:.1f} GiB available")
    for name, asked in wanted.items():  # last: loads the weights
        preflight_checkpoint(name, asked)


def fit_bytes(length: int, cfg: dict) -> int:
    """Bytes one mode's leakage fit holds at its peak (the lean sums, one layer streamed at a time)."""
    from poslab.pretrained.loading import config_count

    heads = config_count(cfg, "num_attention_heads", "n_head")
    layers = config_count(cfg, "num_hidden_layers", "n_layer")
    return lk.leakage_bytes(length, layers, heads, old=False)


def worker_bytes(length: int, cfg: dict) -> int:
    """A worker's peak: the fit, the float32 weights twice (the de-quantised checkpoint and what loading keeps
    while it builds it) and the interpreter with torch and transformers (PROCESS_BYTES)."""
    vocab, width = cfg.get("vocab_size") or 0, cfg.get("hidden_size") or cfg.get("n_embd") or 0
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0
    inter = cfg.get("intermediate_size") or 4 * width
    params = vocab * width + layers * (4 * width * width + 3 * width * inter)  # an upper estimate
    return fit_bytes(length, cfg) + 2 * 4 * params + PROCESS_BYTES


PROCESS_BYTES = 1 << 30  # python, torch, transformers and the tokenizer in one worker


# ----------------------------------------------------------------------------- the members

def jobs(study: StudyConfig) -> list[Job]:
    """One member per (checkpoint, mode), keyed by the weights' hash and the settings; each says its
    peak memory (:func:`worker_bytes`), so no more run side by side than fit."""
    from poslab.pretrained.loading import content_hash, read_config

    settings(study)
    out = []
    for name in checkpoints(study):
        m = settings(study, name)
        source = checkpoint_source(name)
        memory, weights = worker_bytes(m["length"], read_config(source)), content_hash(source)
        for mode in study.axis("model.bos"):
            config = dict(experiment=EXPERIMENT.name, checkpoint=weights, name=name, bos=mode,
                          **{k: m[k] for k in SETTINGS if k != "checkpoint"}, text=dict(study.task))
            out.append(Job(config, args=dict(source=source_path(source)), label=f"{name}, {mode}", memory=memory))
    return out


def run_job(job: Job, *, device: str) -> list[dict]:
    """One (checkpoint, mode)'s rows, in whichever process runs it (the checkpoint loaded once per process)."""
    from poslab.pretrained.model import encode_text
    from poslab.tasks.text import CharText

    model = loaded(job.args["source"], job.config["dtype"], device)
    return evaluate_mode(model, encode_text(model, CharText(**job.config["text"]).text), job.config)


def bos_id(model) -> int:
    tok = getattr(model.tokenizer, "bos_token_id", None) if model.tokenizer is not None else None
    got = tok if tok is not None else getattr(model.config, "bos_token_id", None)
    if got is None:
        raise ConfigError("model.bos", "with BOS", "without BOS (the checkpoint defines no BOS token)")
    return int(got)


def windows(model, ids: torch.Tensor, config: dict) -> torch.Tensor:
    """[windows, length] token ids: consecutive text windows, BOS first in "with BOS" mode."""
    L, n = config["length"], config["windows"]
    text_len = L - (config["bos"] == "with BOS")
    if ids.numel() < n * text_len:
        raise ConfigError("model.windows", n, f"at most {ids.numel() // text_len} windows of {L} tokens")
    out = ids[:n * text_len].view(n, text_len)
    if config["bos"] == "with BOS":
        out = torch.cat([torch.full((n, 1), bos_id(model), dtype=torch.long), out], 1)
    return out


def schedule_layers(config: dict):
    layers = config.get("schedule_layers", [FULL])
    return layers if layers == "all" else tuple(layers)


def evaluate_mode(model, ids: torch.Tensor, config: dict) -> list[dict]:
    """Rows of one mode: per (layer, head) sinks and components; with BOS also under the
    inference-time variants and the three BOS replacements, and per layer the closed-system check.
    Every row carries the checkpoint's ``name``, ``label`` and ``setup`` (own / other)."""
    from poslab.tasks.base import Batch

    model.check_length(config["length"], intermediates=True)
    tokens = windows(model, ids, config)
    n, L = tokens.shape
    size = n // config.get("groups", 1)
    batches = [Batch(tokens=t, targets=t, lengths=torch.full((len(t),), L),
                     loss_mask=torch.ones_like(t, dtype=torch.bool)) for t in tokens.split(size)]  # seed = group
    name = config.get("name", "checkpoint")
    with_bos = config["bos"] == "with BOS"
    tags = dict(name=name, label=LABELS.get(name, Path(str(name)).name),
                setup="own" if with_bos == model.prepends_bos else "other")

    def per_group(rows_of) -> list[dict]:
        return [dict(r, seed=g, **tags) for g, batch in enumerate(batches) for r in rows_of(batch)]

    scratch: dict = {}  # the sums' memory, reused by every fit of this mode

    def heads(variant: str) -> list[dict]:
        return per_group(lambda batch: sink_head_rows(model, batch, config, variant, scratch))

    rows = heads(STANDARD)
    if not with_bos:
        return rows
    if model.encoding == "rotary":
        ntk = {"rope_type": "ntk", "factor": float(config["ntk_factor"])}
        layers = schedule_layers(config)
        runs = [(NTK, layers)] + ([(NTK_ALL, "all")] if len(model.rotary_types) > 1 and layers != "all" else [])
        for variant, where in runs:
            model.set_schedule(ntk, layer_types=where)
            try:
                rows += heads(variant)
            finally:
                model.restore()
    if all(w is None for w in model.layer_windows):  # a model with sliding layers of its own keeps its own
        model.set_window(config["window"])
        try:
            rows += heads(WINDOW)
        finally:
            model.set_window(None)
    swaps = replacements(model, tokens)  # one replacement vector for every group: the most frequent token of all
    rows += per_group(lambda batch: swap_intervention_rows(model, batch, config, swaps))
    content = windows(model, ids, dict(config, bos="without BOS"))  # the closed-system check, same windows
    cos = {key: position0_cosines(model, t) for key, t in (("bos_at_0", tokens), ("content_at_0", content))}
    rows += [CLOSED(layer=k, bos_at_0=float(cos["bos_at_0"][k]), content_at_0=float(cos["content_at_0"][k]), **tags)
             for k in range(model.n_layers + 1)]
    return rows


HEAD_KEYS = ("component_a", "component_b", "component_b_key0", "component_b_rest", "early_component_b",
             "early_component_b_key0", "received_0")
MEANS = ("sink_share", "component_a", "component_b", "component_b_key0", "component_b_rest", "early_component_b",
         "early_component_b_key0")  # the model rows' means over layers and heads


# The measured kinds of row, each declared once; every row of a run then carries its window group
# (``seed``) and its checkpoint's tags (``name``, ``label``, ``setup``: evaluate_mode's per_group).
_CHECKPOINT = {"name": str, "label": str, "setup": str}
HEAD = RowKind("head", {"bos": str, "variant": str, "layer": int, "head": int, "layer_type": str, "sink_share": float,
                        "sink": float, **dict.fromkeys(HEAD_KEYS, float)})
INTERVENTION = RowKind("intervention", {"intervention": str, "layer": int, "head": int, "early_component_b": float})
CLOSED = RowKind("closed", {"layer": int, "bos_at_0": float, "content_at_0": float, **_CHECKPOINT})


def sink_head_rows(model, batch, config: dict, variant: str, scratch: dict | None = None) -> list[dict]:
    """Per (layer, head): the share of attention on key 0 of queries >= first_query, sink or not,
    and the components (a), (b) (with its key-0 part and the rest), early (b) (and its key-0 part)."""
    q0 = config["first_query"]
    comp = lk.leakage(model, batch, early=q0, chunk=2, scratch=scratch, old=False)
    sink_share = comp["to_key0"][..., q0:].mean(-1)  # mean weight on key 0 of queries i >= first_query, [l, h]
    types = getattr(model, "layer_types", [FULL] * model.n_layers)
    return [HEAD(bos=config["bos"], variant=variant, layer=layer, head=head, layer_type=types[layer],
                 sink_share=float(sink_share[layer, head]), sink=float(sink_share[layer, head] >= lk.SINK_THRESHOLD),
                 **{k: float(comp[k][layer, head]) for k in HEAD_KEYS})
            for layer in range(model.n_layers) for head in range(model.n_heads)]


def replacements(model, tokens: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """The leakage study's three BOS replacements, each [D]: the most frequent token of ``tokens``
    after position 0, a random vector of the BOS embedding's norm, and the mean token embedding."""
    W_E = model.hf.get_input_embeddings().weight.detach()
    W_bos = W_E[bos_id(model)]
    token = int(torch.bincount(tokens[:, 1:].flatten().cpu()).argmax())
    r = torch.randn(W_bos.shape, generator=torch.Generator().manual_seed(seed), dtype=W_bos.dtype).to(W_bos.device)
    return dict(token=W_E[token].clone(), random=r * W_bos.norm() / r.norm(), mean=W_E.mean(0))


def swap_intervention_rows(model, batch, config: dict, swaps: dict[str, torch.Tensor] | None = None) -> list[dict]:
    """Per replacement (probe "intervention"): per (layer, head) early (b) with it in place.

    Early (b) reads only the pairs of queries i < first_query, and under a causal mask their
    logits depend only on positions < first_query: the windows are cut there, which gives the same
    numbers (tested) at a small share of the cost."""
    from poslab.models.intervention import Intervention
    from poslab.tasks.base import Batch

    q0 = config["first_query"]
    tokens = batch.tokens[:, :q0]
    early = Batch(tokens=tokens, targets=tokens, lengths=torch.full((len(tokens),), q0),
                  loss_mask=torch.ones_like(tokens, dtype=torch.bool))
    rows = []
    for name, x0 in (swaps if swaps is not None else replacements(model, batch.tokens)).items():
        comp = lk.leakage(model, early, intervention=Intervention(bos_embedding=x0), early=q0, chunk=2, old=False)
        rows += [INTERVENTION(intervention=SWAPS[name], layer=layer, head=head,
                              early_component_b=float(comp["early_component_b"][layer, head]))
                 for layer in range(model.n_layers) for head in range(model.n_heads)]
    return rows


def position0_cosines(model, tokens: torch.Tensor) -> np.ndarray:
    """Mean pairwise cosine of the position-0 residual across the windows, per layer ([n_layers + 1])."""
    from poslab.probes.leakage import mean_cosine
    from poslab.tasks.base import Batch

    inter = model.collect(Batch(tokens=tokens[:, :2], targets=tokens[:, :2], lengths=torch.full((len(tokens),), 2),
                                loss_mask=torch.ones_like(tokens[:, :2], dtype=torch.bool)))  # position 0 sees only 0
    per_layer = [inter.embed[:, 0]] + [layer.resid_post[:, 0] for layer in inter.layers]
    return np.array([mean_cosine(x.float()) for x in per_layer])


# ----------------------------------------------------------------------------- derived rows and report

# The derived kinds of row, each declared once: per window group (``seed``) and mode (``bos``) /
# inference-time variant; every one ends with the checkpoint's ``label``.
_TAGS = {"bos": str, "variant": str, "seed": int, "setup": str | None}
_LABEL = {"label": str | None}
MODEL_ROW = RowKind("model", {**_TAGS, "sink_heads": float, "sink_head_share": float, **dict.fromkeys(MEANS, float),
                          **_LABEL})
LAYER_TYPE = RowKind("layer_type", {**_TAGS, "layer_type": str, "layers": int, "heads": int, "sink_heads": float,
                                    "sink_share": float, "component_b_key0": float, "slope": float | None, **_LABEL})
DEPTH = RowKind("depth", {**_TAGS, "sliding_layers": int, "full_layers": int, "slope_sliding": float | None,
                          "slope_full": float | None, "slope_all": float | None,
                          "slope_sliding_minus_full": float | None, **_LABEL})
_CONTRASTS = tuple(f"{c}{suffix}" for suffix in ("", "_key0") for c in ("standard_minus_ntk", "standard_minus_ntk_all",
                                                                       "margin"))
CONTRAST = RowKind("contrast", {"seed": int, "setup": str | None, "ntk_run": bool, "ntk_all_run": bool,
                                "window_run": bool, **dict.fromkeys(_CONTRASTS, float), **_LABEL},
                   optional=_CONTRASTS)  # each where the variants it reads ran
SWAP_ROW = RowKind("swap", {"intervention": str, "seed": int, "setup": str | None, "early_component_b": float,
                            "base": float, "change": float | None, "change_pct": float | None, **_LABEL})
SWAP3 = RowKind("swap3", {"seed": type(None), "setup": str | None, "swap_min": float | None,
                          "swap_max": float | None, "swap_decisive": float | None, "swap_agree": bool | None,
                          **{f"swap_{k}": float | None for k in SWAPS}, **_LABEL})
DEPTH_CROSS = RowKind("depth_cross", {"label": str | None, "other": str | None, "seed": int, "slope_difference": float})
SIDE_ROW = RowKind("side", {"order": int, "quantity": str, "label": str | None, "seed": int | None, "value": float})


def depth_slope(heads: pd.DataFrame, layers: set[int]) -> float | None:
    """The least-squares slope of the per-layer mean (over heads) of (b) at key 0 on the layer
    index, over ``layers`` (None with fewer than two)."""
    chosen = sorted(layers)
    if len(chosen) < 2:
        return None
    means = [np.mean(values(where_is(heads, "layer", k), "component_b_key0")) for k in chosen]
    return float(np.polyfit(chosen, means, 1)[0])


def derived_rows(rows: list[dict]) -> list[dict]:
    """Per checkpoint (``label``), :func:`checkpoint_rows`; across checkpoints, probe "depth_cross"
    (a sliding-layer slope less another checkpoint's full-layer slope, each in its own set-up, the
    groups paired by index) and probe "side" (the side-by-side table)."""
    df = frame(rows)
    out = []
    for label in dict.fromkeys(column(of_kind(df, "head"), "label")):
        out += checkpoint_rows(where_is(df, "label", label), label)
    out += depth_cross_rows(frame(out))
    return out + side_rows(frame(out))


def depth_cross_rows(derived: pd.DataFrame) -> list[dict]:
    """Each checkpoint's sliding-layer slope less each other's full-layer slope (one with no sliding
    layers), both in their own set-up, paired by window group in seed order (the shorter's groups)."""
    depth = where_is(of_kind(derived, "depth"), "setup", "own")
    sliding = depth[has(depth, "slope_sliding")]
    full = depth[has(depth, "slope_full") & (column(depth, "sliding_layers") == 0)]
    out = []
    for a in dict.fromkeys(column(sliding, "label")):
        for b in (b for b in dict.fromkeys(column(full, "label")) if b != a):
            mine, theirs = (where_is(depth, "label", x).sort_values("seed", kind="stable") for x in (a, b))
            pairs = zip(mine["seed"], column(mine, "slope_sliding"), column(theirs, "slope_full"), strict=False)
            out += [DEPTH_CROSS(label=a, other=b, seed=x, slope_difference=s - f) for x, s, f in pairs]
    return out


def side_rows(derived: pd.DataFrame) -> list[dict]:
    """The side-by-side table's rows: per quantity of :data:`SIDE`, its column on the rows of the
    standard model its probe and ``where`` select."""
    out = []
    for order, (quantity, (source, name, where)) in enumerate(SIDE.items()):
        chosen = where.select(of_kind(derived, source))
        chosen = chosen[has(chosen, name) & (column(chosen, "variant", STANDARD) == STANDARD)]
        picked = zip(column(chosen, "label"), column(chosen, "seed"), column(chosen, name), strict=True)
        out += [SIDE_ROW(order=order, quantity=quantity, label=label, seed=seed, value=float(v))
                for label, seed, v in picked]
    return out


def checkpoint_rows(rows: list[dict] | pd.DataFrame, label: str | None = None) -> list[dict]:
    """One checkpoint's derived rows. Per window group (``seed``): probe="model" per mode and
    variant (means over layers and heads, the count of sink heads), probe="layer_type" (the same per
    layer type, with the depth slope over the type's layers), probe="depth" per mode (standard: the
    slopes over the sliding, full and all layers), probe="contrast" (NTK's suppression of (b) and
    the ordering margin, paired within the group) and probe="swap" (each replacement's change of
    the mean early (b), relative to the standard model with BOS on the same windows; None where
    that is below PRESENT); over the groups, probe="swap3" (:func:`leakage_rows.three_swaps`)."""
    df = rows if isinstance(rows, pd.DataFrame) else frame(rows)
    heads_all = of_kind(df, "head")
    setup = dict(zip(heads_all["bos"], column(heads_all, "setup"), strict=True))  # the last row of a mode's
    out = []
    for seed in sorted(set(column(heads_all, "seed", 0))):
        mine = where_is(df, "seed", seed, default=0)
        model = []
        for mode, variant in ((m, v) for m in MODES for v in VARIANTS):
            heads = where_is(where_is(of_kind(mine, "head"), "bos", mode), "variant", variant, default=STANDARD)
            if heads.empty:
                continue
            tags = dict(bos=mode, variant=variant, seed=seed, setup=setup.get(mode))
            model.append(MODEL_ROW(**tags, sink_heads=float(sum(heads["sink"])),
                               sink_head_share=float(np.mean(values(heads, "sink"))),
                               **{k: float(np.mean(values(heads, k))) for k in MEANS}, label=label))
            out += layer_rows(heads, tags, label)
        with_bos = {r["variant"]: r for r in model if r["bos"] == "with BOS"}
        out += model + contrast_rows(with_bos, seed, label) + swap_rows(mine, with_bos, seed, label)
    return out + swap3_rows(of_kind(frame(out), "swap"), label)


def layer_rows(heads: pd.DataFrame, tags: dict, label: str | None) -> list[dict]:
    """One mode and variant's rows per layer type (probe "layer_type") and, for the standard model,
    the depth slopes over its sliding, full and all layers (probe "depth")."""
    kinds = column(heads, "layer_type", FULL)
    by_type = {t: set(heads.loc[kinds == t, "layer"]) for t in sorted(set(kinds))}
    out = []
    for t, layers in by_type.items():
        got = heads[heads["layer"].isin(layers)]
        out.append(LAYER_TYPE(**tags, layer_type=t, layers=len(layers), heads=len(got),
                              sink_heads=float(sum(got["sink"])),
                              sink_share=float(np.mean(values(got, "sink_share"))),
                              component_b_key0=float(np.mean(values(got, "component_b_key0"))),
                              slope=depth_slope(got, layers), label=label))
    if tags["variant"] == STANDARD:
        sliding = set().union(*(v for t, v in by_type.items() if t != FULL))
        full = by_type.get(FULL, set())
        s, f = depth_slope(heads, sliding), depth_slope(heads, full)
        out.append(DEPTH(**tags, sliding_layers=len(sliding), full_layers=len(full), slope_sliding=s, slope_full=f,
                         slope_all=depth_slope(heads, sliding | full),
                         slope_sliding_minus_full=None if s is None or f is None else s - f, label=label))
    return out


def contrast_rows(b: dict[str, dict], seed: int, label: str | None) -> list[dict]:
    """With BOS, the standard model less each NTK variant's (b) (overall and at key 0) and the
    ordering margin (NTK < standard < window): one row where another variant than the standard ran."""
    if STANDARD not in b or len(b) == 1:
        return []
    diffs = {}
    for suffix, name in (("", "component_b"), ("_key0", "component_b_key0")):
        s = b[STANDARD][name]
        if NTK in b:
            diffs[f"standard_minus_ntk{suffix}"] = s - b[NTK][name]
        if NTK_ALL in b:
            diffs[f"standard_minus_ntk_all{suffix}"] = s - b[NTK_ALL][name]
        if NTK in b and WINDOW in b:
            diffs[f"margin{suffix}"] = min(s - b[NTK][name], b[WINDOW][name] - s)
    return [CONTRAST(seed=seed, setup=b[STANDARD]["setup"], ntk_run=NTK in b, ntk_all_run=NTK_ALL in b,
                     window_run=WINDOW in b, **diffs, label=label)]


def swap_rows(mine: pd.DataFrame, b: dict[str, dict], seed: int, label: str | None) -> list[dict]:
    """Each BOS replacement's mean early (b) and its change relative to the standard model with BOS
    (None where that is below PRESENT)."""
    if STANDARD not in b:
        return []
    base = b[STANDARD]["early_component_b"]
    out = []
    for name in SWAPS.values():
        early = values(where_is(of_kind(mine, "intervention"), "intervention", name), "early_component_b")
        if len(early):
            value = float(np.mean(early))
            change = (value - base) / base if base >= PRESENT else None
            out.append(SWAP_ROW(intervention=name, seed=seed, setup=b[STANDARD]["setup"], early_component_b=value,
                                base=base, change=change, change_pct=None if change is None else 100 * change,
                                label=label))
    return out


def swap3_rows(swaps: pd.DataFrame, label: str | None) -> list[dict]:
    """Over the window groups: each replacement's mean change and the three judged together
    (:func:`leakage_rows.three_swaps`)."""
    if swaps.empty:
        return []
    changes = {}
    for short, name in SWAPS.items():
        moved = values(where_is(swaps, "intervention", name), "change")
        changes[short] = float(np.mean(moved)) if len(moved) else None
    return [SWAP3(seed=None, setup=column(swaps, "setup").iloc[0], **lr.three_swaps(changes),
                  **{f"swap_{k}": v for k, v in changes.items()}, label=label)]


def claims_for(study: StudyConfig) -> list[ClaimSpec]:
    """CLAIMS; on the quick preset's random checkpoint every claim but the checks and the
    architectural one is n.a. (not run: it needs trained weights)."""
    if study.model.get("checkpoint") != TINY:
        return CLAIMS
    random = not_run("a trained checkpoint (the cpu preset): the quick preset's tiny random one runs the code path "
                     "and has no trained sinks")
    return [dataclasses.replace(c, op=None, threshold=None, tol=None, na=random)
            if c.op is not None and c.role != "check" and c.name not in ARCHITECTURAL else c for c in CLAIMS]


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    all_rows = rows + derived_rows(rows)
    m = study.model
    names = checkpoints(study)
    described = "; ".join(f"`{n}` ({CHECKPOINT_NAMES.get(n, n)}): {of(m, 'windows', n)} windows of "
                          f"{of(m, 'length', n)} tokens in {of(m, 'groups', n)} groups" for n in names)
    layers = m.get("schedule_layers")
    intro = (f"Checkpoints {described}; TinyShakespeare ({study.task.get('split', 'val')} split), consecutive "
             f"windows, each group fitted on its own: mean ± std over the groups; sinks at queries >= "
             f"{m.get('first_query')}, early (b) at queries < {m.get('first_query')}; NTK (factor "
             f"{m.get('ntk_factor')}) on the layers of type {layers if layers == 'all' else ', '.join(layers or [])}.")
    specs = claims_for(study)
    claims = judge_all(specs, all_rows)
    return write_outputs(out, title=EXPERIMENT.title, rows=all_rows, claims=claims, intro=intro, tables=TABLES,
                         figures=FIGURES)


EXPERIMENT = EvaluateOnly(name="pretrained-leakage", title="Positional leakage on pretrained models (seed 001)",
                        base=BASE, presets=PRESETS, jobs=jobs, run_job=run_job, report=report, check=check)
