"""The survey's implementation considerations, measured (seed ``001``: RoPE "in terms of ...
computational cost, compatibility with KV caching ... We also summarize implementation
considerations"): RoPE in low precision, and a KV cache under Dynamic NTK.

Models (the ``model`` column): a character LM (poslab's own Transformer with RoPE, trained here in
about a minute on TinyShakespeare at context L0 = ``char.context``) and the shipped checkpoints
SmolLM2-135M-Instruct and Gemma 3 270M (``poslab.pretrained``); the quick preset puts a tiny char
model and a tiny random Llama (``poslab.pretrained.tiny``) in their place.

Precision (:mod:`poslab.probes.precision`), per model:

- ``probe="angle"``: the rotation angle a recipe (positions, angles, cos/sin, rotation each in
  float32 / bfloat16 / float16, or a table precomputed in float64 and stored) realises, against
  p theta_i in float64, over ``angle_positions`` positions from each offset (0, 10^3 .. 10^6), for
  each distinct theta the model uses (Gemma 3: its sliding and its full layers);
- ``probe="pattern"``: real queries and keys before rotation (``collect`` on the first
  ``pattern_tokens`` tokens of the validation text, every layer and head) placed at positions
  offset + (0 .. n-1), rotated exactly and with the recipe: max |delta pattern| and KL(exact ||
  recipe) of the causal softmax (logits scaled by 1/sqrt(d_head), the checkpoints' own scaling);
- ``probe="format"`` (in the report, from the formats alone): positions held in bf16 / fp16, the
  share of distinct positions kept, neighbours collapsed and the error of the offset 1, in windows
  of 256 positions.

KV cache (:mod:`poslab.probes.kv_cache`): Dynamic NTK (factor ``factor``) with the schedule's L0
treated as ``L0`` tokens (the checkpoints': their own contexts are 8192 / 32768; a few hundred
tokens makes the scale change within a ~1k-token decode: at L = 4 L0 the NTK scale is 2 x 4 - 1 =
7; the char LM's L0 is its training context). Cached: every key rotated with the scale of its own
step (the checkpoint's own KV cache, fed one token a step after a prefill of L0 / 2 tokens; the char
LM: :class:`~poslab.probes.kv_cache.OwnStepRotary`); recompute: the forward of the whole prefix at
that step. On Gemma 3 the schedule goes on its full-attention layers (``set_schedule``'s default);
its sliding layers keep their own theta. Rows ``probe="kv"`` per step t (the logit gap, the loss at
t both ways); ``probe="kv_passkey"``: the standard passkey prompt (``pretrained-extension``'s) of
``decode`` tokens decoded both ways, and with the checkpoint's own rotary for reference.

Presets: quick (a test, seconds) and cpu (the two checkpoints and a char LM).
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np
import torch

from poslab.errors import ConfigError, check_choice
from poslab.experiments import EvaluateOnly, Job
from poslab.experiments.config import StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, write_outputs
from poslab.experiments.rows import RowKind, frame, groups, of_kind, values, where_is
from poslab.experiments.spec import (
    ClaimSpec,
    at_least,
    comparison_only,
    derivation,
    is_,
    judge_all,
    maximum,
    mean,
    minimum,
    probe,
    survey_names,
)
from poslab.lazy import pandas as pd
from poslab.probes import precision as pr

CHAR, TINY = "char", "tiny-llama"
OFFSETS = (0, 10**3, 10**4, 10**5, 10**6)  # positions offset + (0 .. n-1)
FORMAT_STARTS = (0, 256, 512, 10**3, 10**4, 10**5, 10**6)  # windows of FORMAT_WINDOW positions
FORMAT_WINDOW = 256
NOISE = 1e-6  # floor of the within-L0 gap in the ratio (float32 logits agree to about this)
GAP_RATIO = 10.0  # "differ": the gap past L0 is ten times the same decode's rounding gap within L0
WITHIN_TOL = 1e-3  # within L0 both are one computation up to float32 rounding
SETTINGS = ("L0", "decode", "factor", "stride", "pattern_tokens", "angle_positions", "depths", "char")
PATTERN_RECIPES = ("fp32", "bf16_cos_sin", "bf16_rotation", "bf16_positions", "bf16_angles", "fp16_cos_sin",
                   "fp16_positions", "table_fp32", "table_bf16")

KV = probe("kv_summary")
# what each claim is (its role follows: experiments/spec.role_of): the survey (seed 001) only names implementation
# considerations, KV-cache compatibility and precision; it states no outcome: its measurements are predictions,
# and what holds by the format or the schedule is a derivation (a check)
BF16 = derivation("bf16 keeps 8 significant bits: integers are exact up to 256, neighbours collapse above")
SCHEDULE = derivation("Dynamic NTK's scale is 1 at L <= L0 and grows with L past it: a cached key keeps its own "
                      "step's scale, a recompute rescales every key, so the two differ past L0 and agree within it")
NAMED = survey_names("survey abstract: it compares encodings by compatibility with KV caching and summarizes "
                     "implementation considerations (numerical precision among them); it states no outcome")
ROLE_REVISED = "2026-12-07: role computed from source x setting (issue 53): "
AS_PREDICTION = ROLE_REVISED + "the survey names the measurement, not its outcome: a prediction"
CLAIMS = [
    ClaimSpec(name="bf16 positions: neighbours p, p + 1 collapse to one value in [256, 512)",
              paper="(no number: bf16 keeps 8 significant bits, so integers are exact only up to 256)",
              where=probe("format") & is_("format", "bf16") & is_("start", 256),
              measure=mean("neighbour_collapse", "share of p whose p + 1 rounds to the same bf16 value"),
              op=">", threshold=0.0, source=BF16, setting="usual",
              note="holds by the format (ties to even: bf16(257) = 256)"),
    ClaimSpec(name="bf16 positions: every position below 256 is kept", paper="(the format)",
              where=probe("format") & is_("format", "bf16") & is_("start", 0),
              measure=minimum("distinct_share", "distinct bf16 values over distinct positions"), op=">=",
              threshold=1.0, source=BF16, setting="usual", note="holds by the format"),
    ClaimSpec(name="{model}: Dynamic NTK with a KV cache differs from a full recompute past L0",
              paper="length-dependent schedules are not compatible with KV caching (cached keys keep the "
                    "scale of their own step)", where=KV, per=("model",),
              measure=mean("gap_ratio", "max |delta logit| past L0 over the same decode's max within L0"),
              op=">=", threshold=GAP_RATIO, source=SCHEDULE, setting="usual",
              revised=ROLE_REVISED + "a cached key keeps its own step's scale while a recompute rescales it: the "
                                     "two differ past L0 by the schedule's construction (a check)",
              note=f"by construction (a cached key keeps its step's scale); within-L0 gap floored at {NOISE:g}; "
                   f"past L0 the gap must be {GAP_RATIO:g}x the rounding gap "
                   "the same decode shows where cache and recompute are one computation"),
    ClaimSpec(name="{model}: within L0 the cached decode equals the recompute", paper="(the schedule: scale 1 "
              "at L <= L0)", where=KV, per=("model",), measure=maximum("gap_within", "max |delta logit| within L0"),
              op="<=", threshold=WITHIN_TOL, source=SCHEDULE, setting="usual",
              note="holds by the schedule, up to float32 rounding"),
    ClaimSpec(name="{model}: loss past L0, cached minus recompute (nats)", paper="(the survey gives no number)",
              where=KV, per=("model",), measure=mean("loss_diff"),
              na=comparison_only("the survey names KV-cache compatibility, no size of its effect on the loss"),
              source=NAMED, setting="usual", revised=AS_PREDICTION),
    ClaimSpec(name="{model}: passkey exact match, cached minus recompute", paper="(the survey gives no number)",
              where=KV & at_least("passkeys", 1), per=("model",), measure=mean("passkey_diff"),
              na=comparison_only("the survey names KV-cache compatibility, no size of its effect on retrieval"),
              source=NAMED, setting="usual", revised=AS_PREDICTION),
    ClaimSpec(name="{model}, {recipe}: max |delta pattern| at positions 10^6 + (0 .. n-1)",
              paper="(the survey lists precision among implementation considerations, no number)",
              where=probe("pattern") & is_("offset", 10**6) & is_("recipe", "fp32", "bf16_cos_sin", "table_fp32"),
              per=("model", "recipe"), measure=maximum("max_delta"),
              na=comparison_only("the survey gives no criterion for numerical error"), source=NAMED, setting="usual",
              revised=AS_PREDICTION),
]

TABLES = [
    Table("Positions held in a low-precision format", by=("format", "start"), where=probe("format"),
          intro=f"Windows of {FORMAT_WINDOW} integer positions from each start. Kept: distinct values over distinct "
                "positions; collapsed: share of p with p + 1 on the same value; offset error: |(r(p+1) - r(p)) - 1|.",
          columns=(Column("kept", "distinct_share", 4), Column("neighbours collapsed", "neighbour_collapse", 3),
                   Column("offset-1 error, mean", "offset_error_mean", 2),
                   Column("offset-1 error, max", "offset_error_max", 0))),
    Table("Rotation angle error, max over pairs and positions (radians)", by=("model", "theta", "recipe"),
          where=probe("angle"), pivot=Pivot("offset", "max", "p ≥ {}", 5),
          intro="Against p theta_i in float64; n.a. where no entry is finite (float16 positions past 65504)."),
    Table("Attention-pattern error: max |delta pattern| over layers, heads and queries", by=("model", "recipe"),
          where=probe("pattern"), pivot=Pivot("offset", "max_delta", "offset {}", 4),
          intro="Real queries and keys before rotation re-rotated at offset + (0 .. n-1); causal softmax in "
                "float64 from the rotated vectors."),
    Table("Attention-pattern error: mean KL(exact || recipe) over layers, heads and queries (nats)",
          by=("model", "recipe"), where=probe("pattern"), pivot=Pivot("offset", "kl_mean", "offset {}", 6)),
    Table("KV cache under Dynamic NTK: cached decode against a full recompute", by=("model",), where=KV,
          columns=(Column("L0", "L0", 0), Column("decode to", "decode", 0), Column("gap within L0", "gap_within", 7),
                   Column("gap past L0 (max)", "gap_past", 4), Column("gap past L0 (mean)", "gap_past_mean", 4),
                   Column("gap at the last step", "gap_last", 4),
                   Column("loss past L0, cached", "loss_cached"), Column("recompute", "loss_recompute"),
                   Column("top-1 agree", "argmax_agree"), Column("passkey cached", "passkey_cached", 2),
                   Column("passkey recompute", "passkey_recompute", 2),
                   Column("passkey, own rotary", "passkey_own", 2)),
          intro="Gap: max |delta logit| over the vocabulary at each compared step; loss: mean next-token loss over the "
                "compared steps past L0; passkey: exact match over the depths (empty for the char LM, not trained "
                "on passkeys)."),
]
FIGURES = [
    Lines("pattern_error.png", x="offset", y="log10_max_delta", series=("recipe",), panel="model",
          where=probe("pattern") & at_least("offset", 1), logx=True, ylabel="log10 max |delta pattern|",
          xlabel="position offset"),
    Lines("kv_gap.png", x="step", y="logit_gap", series=("model",), where=probe("kv"),
          ylabel="max |delta logit|, cached - recompute", xlabel="step t (position of the last token)"),
]


BASE = StudyConfig(model_type="pretrained", task_type="text", task=dict(split="val"),
                   model=dict(L0=256, decode=1024, factor=2.0, stride=64, pattern_tokens=64, angle_positions=256,
                              depths=[0.25, 0.75], char=dict(d_model=64, n_layers=2, n_heads=4, context=64, steps=600,
                                                             batch_size=16, windows=4)),
                   grid={"model.checkpoint": (CHAR, "smollm2-135m", "gemma3-270m")}, seeds=1)
PRESETS = {
    "quick": {"model": dict(L0=16, decode=48, factor=2.0, stride=8, pattern_tokens=12, angle_positions=32,
                            depths=[0.5], char=dict(d_model=32, n_layers=1, n_heads=2, context=16, steps=10,
                                                    batch_size=8, windows=2)),
              "grid.model.checkpoint": (CHAR, TINY)},
    "cpu": {},
}


# ----------------------------------------------------------------------------- checks (before any work)

def settings(study: StudyConfig) -> dict:
    m = {k: v for k, v in study.model.items() if k != "checkpoint"}
    for key in m:
        check_choice("model setting", key, SETTINGS)
    for key in SETTINGS:
        if key not in m:
            raise ConfigError(f"model.{key}", None, "set by the preset")
    for key, lo in (("L0", 4), ("decode", 8), ("stride", 1), ("pattern_tokens", 2), ("angle_positions", 1)):
        if not isinstance(m[key], int) or isinstance(m[key], bool) or m[key] < lo:
            raise ConfigError(f"model.{key}", m[key], f"an integer >= {lo}")
    if m["decode"] <= m["L0"]:
        raise ConfigError("model.decode", m["decode"], f"more than model.L0 ({m['L0']}): the decode must pass L0")
    if not isinstance(m["factor"], (int, float)) or isinstance(m["factor"], bool) or m["factor"] <= 1:
        raise ConfigError("model.factor", m["factor"], "a number > 1 (Dynamic NTK's factor)")
    return m


NEEDS = ("record", "schedule")  # collect (the pattern rows) and Dynamic NTK in place of the checkpoint's rotary


def check(study: StudyConfig) -> None:
    """Every refusal before any work: settings; per checkpoint its config and what the study asks of
    its model type (``NEEDS``), then one short forward of its weights."""
    from poslab.pretrained.checks import require_capable
    from poslab.pretrained.loading import read_causal_config, require_transformers
    from poslab.studies.kit.checkpoints import checkpoint_source, preflight_checkpoint

    settings(study)
    names = [name for name in study.axis("model.checkpoint") if name != CHAR]
    if names:
        require_transformers()
    for name in names:
        require_capable(read_causal_config(checkpoint_source(name)), NEEDS, "--model", name)
    for name in names:  # last: loads the weights
        preflight_checkpoint(name, NEEDS)


# ----------------------------------------------------------------------------- the members

def jobs(study: StudyConfig) -> list[Job]:
    """One member per model, keyed by its weights' hash (or the char LM's recipe) and the settings."""
    from poslab.pretrained.loading import content_hash
    from poslab.studies.kit.checkpoints import checkpoint_source, source_path

    m = settings(study)
    out = []
    for name in study.axis("model.checkpoint"):
        args: dict = {}
        if name == CHAR:
            weights = "char"
        else:
            source = checkpoint_source(name)
            args, weights = dict(source=source_path(source)), content_hash(source)
        config = dict(experiment=EXPERIMENT.name, model=name, weights=weights, **m, text=dict(study.task))
        out.append(Job(config, args=args, label=name))
    return out


def run_job(job: Job, *, device: str) -> list[dict]:
    """One model's rows (precision, then the KV cache), in whichever process runs it."""
    config = job.config
    torch.manual_seed(0)
    if config["model"] == CHAR:
        rows = char_rows(config, device)
    else:
        from poslab.pretrained.model import load

        rows = checkpoint_rows(load(job.args["source"], dtype="float32", device=device), config)
    return [dict(r, model=config["model"]) for r in rows]


def dynamic(config: dict, L0: int) -> dict:
    return {"rope_type": "dynamic", "factor": float(config["factor"]), "original_max_position_embeddings": L0}


def kv_steps(L0: int, decode: int, stride: int, first: int) -> list[int]:
    """The compared steps: from ``first`` by ``stride``, plus L0 - 1, L0 and the last step."""
    return sorted({*range(first, decode - 1, stride), L0 - 1, L0, decode - 2})


# --- the char LM

def char_rows(config: dict, device: str) -> list[dict]:
    from poslab.models.transformer import Transformer, TransformerConfig
    from poslab.positional.rope import RoPE
    from poslab.probes import kv_cache as kv
    from poslab.tasks.base import Batch
    from poslab.tasks.text import CharText
    from poslab.train import lm_recipe, train_plain

    c = config["char"]
    L0, decode = c["context"], 4 * c["context"]
    task = CharText(split="train")
    shape = dict(vocab_size=task.vocab_size, d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                 bias=False, max_len=decode)
    recipe = lm_recipe(steps=c["steps"], batch_size=c["batch_size"], context=L0,
                       warmup_steps=min(100, c["steps"] // 10))
    trained, losses = train_plain(partial(Transformer, TransformerConfig(**shape, encoding="rope")), task, 0, recipe,
                                  device=device)
    assert isinstance(trained, Transformer)  # what make_model built
    trained.eval()
    scaled = Transformer(TransformerConfig(**shape, encoding="rope",
                                           encoding_options=dict(scaling=dynamic(config, L0)))).to(device).eval()
    scaled.load_state_dict(trained.state_dict())
    val = CharText(split="val").ids
    tokens = val[: c["windows"] * decode].view(c["windows"], decode).to(device)
    steps = kv_steps(L0, decode, max(1, c["context"] // 4), L0 // 2)
    rows = [dict(probe="kv", L0=L0, decode=decode, train_loss=float(np.mean(losses[-20:])), **r)
            for r in kv.cache_gap(scaled, tokens, steps)]
    n = config["pattern_tokens"]
    inter = trained.collect(Batch(tokens=tokens[:1, :n], targets=tokens[:1, :n], lengths=torch.tensor([n]),
                                  loss_mask=torch.ones(1, n, dtype=torch.bool)))
    rope = trained.encoding
    assert isinstance(rope, RoPE)  # encoding="rope"
    theta = rope.rotary_frequencies().double().cpu()
    qk = [(layer.q[0].double().cpu(), layer.k[0].double().cpu(), theta) for layer in inter.layers]
    rows += angle_rows({"rope (base 10^4)": theta}, config)
    rows += pattern_rows(qk, config, scale=1 / math.sqrt(trained.cfg.d_head), layout=rope.layout)
    return rows


# --- a checkpoint

def checkpoint_rows(model, config: dict) -> list[dict]:
    from poslab.pretrained.model import encode_text
    from poslab.tasks.base import Batch
    from poslab.tasks.text import CharText

    text = CharText(**config["text"]).text[:40_000]
    ids = encode_text(model, text, bos=model.prepends_bos)
    decode = config["decode"]
    if ids.numel() < decode:
        raise ConfigError("model.decode", decode, f"at most {ids.numel()} tokens (the text's)")
    device = next(model.parameters()).device
    tokens = ids[:decode][None].to(device)
    n = config["pattern_tokens"]
    inter = model.collect(Batch(tokens=tokens[:, :n], targets=tokens[:, :n], lengths=torch.tensor([n]),
                                loss_mask=torch.ones(1, n, dtype=torch.bool)))
    thetas = {t: model.rotary_frequencies(t).double().cpu() for t in model.rope_types}
    qk = [(layer.q[0].double().cpu(), layer.k[0].double().cpu(), thetas[model.layer_types[i]])
          for i, layer in enumerate(inter.layers)]
    rows = angle_rows({f"{t} (base {model.own_scaling(t)['rope_theta']:g})": th for t, th in thetas.items()}, config)
    rows += pattern_rows(qk, config, scale=1 / math.sqrt(model.d_head), layout=model.layout)
    rows += kv_rows(model, tokens, config)
    return rows


def with_dynamic(model, config: dict) -> None:
    """Dynamic NTK on the model with L0 = config["L0"]: poslab's rotary reads L0 from the model's
    context (Hugging Face's convention for dynamic), so the context is set to L0 while the rotary is
    built and put back after."""
    context = model.context
    model.context = config["L0"]
    try:
        model.set_schedule(dynamic(config, config["L0"]))
    finally:
        model.context = context


def kv_rows(model, tokens: torch.Tensor, config: dict) -> list[dict]:
    from poslab.probes import kv_cache as kv

    L0, decode = config["L0"], config["decode"]
    prefill = L0 // 2
    steps = kv_steps(L0, decode, config["stride"], prefill)
    rows = []
    with_dynamic(model, config)
    try:
        kept, _ = kv.hf_cached_logits(model.hf, tokens, prefill, steps)
        for t in steps:
            fresh = kv.hf_recompute_logits(model.hf, tokens, t)
            rows.append(dict(probe="kv", L0=L0, decode=decode, **kv.step_row(t, kept[t], fresh, tokens[:, t + 1])))
        rows += passkey_rows(model, config, prefill)
    finally:
        model.restore()
    return rows


def passkey_rows(model, config: dict, prefill: int) -> list[dict]:
    """The passkey prompt decoded with the cache and by recompute (Dynamic NTK on), and with the
    checkpoint's own rotary (cache and recompute agree there)."""
    from poslab.pretrained.model import decode_tokens, encode_text
    from poslab.studies.kit.checkpoints import passkey_prompt

    rows = []
    device = next(model.parameters()).device
    for i, depth in enumerate(config["depths"]):
        key = str(10_000 + (7919 * (i + 1)) % 90_000)
        prompt = passkey_prompt(model, config["decode"], depth, key)
        if prompt is None:
            continue
        prompt = prompt[None].to(device)
        n_new = len(encode_text(model, " " + key)) + 1
        got = {}
        for name, cached in (("cached", True), ("recompute", False)):
            got[name] = decode_tokens(model, model.greedy(prompt, n_new, cached=cached, prefill=prefill))
        model.restore()  # the checkpoint's own rotary, for reference; then Dynamic NTK again for the next depth
        got["own"] = decode_tokens(model, model.greedy(prompt, n_new))
        with_dynamic(model, config)
        rows.append(dict(probe="kv_passkey", depth=depth, key=key, prompt_tokens=int(prompt.shape[1]),
                         **{f"exact_{k}": float(v.strip().startswith(key)) for k, v in got.items()},
                         **{f"answer_{k}": v.strip()[:12] for k, v in got.items()}))
    return rows


# --- precision

def angle_rows(thetas: dict, config: dict) -> list[dict]:
    rows = []
    for label, theta in thetas.items():
        for offset in OFFSETS:
            pos = torch.arange(config["angle_positions"], dtype=torch.float64) + offset
            for recipe in pr.RECIPES:
                err = pr.angle_error(pos, theta, pr.RECIPES[recipe])
                rows.append(dict(probe="angle", theta=label, offset=offset, recipe=recipe, **err))
    return rows


def pattern_rows(qk: list[tuple], config: dict, *, scale: float, layout: str) -> list[dict]:
    """Per recipe and offset: max |delta pattern| and KL over every layer (their max and mean)."""
    rows = []
    for recipe in PATTERN_RECIPES:
        for offset in OFFSETS:
            got = [pr.pattern_error(q, k, theta, offset, pr.RECIPES[recipe], scale=scale, layout=layout)
                   for q, k, theta in qk]
            if any(g["nonfinite"] for g in got):
                rows.append(dict(probe="pattern", recipe=recipe, offset=offset, max_delta=None, kl_mean=None,
                                 kl_max=None, nonfinite=True))
                continue
            worst = max(g["max_delta"] for g in got)
            rows.append(dict(probe="pattern", recipe=recipe, offset=offset, max_delta=worst,
                             log10_max_delta=math.log10(max(worst, 1e-18)),
                             kl_mean=float(np.mean([g["kl_mean"] for g in got])),
                             kl_max=max(g["kl_max"] for g in got), nonfinite=False))
    return rows


# ----------------------------------------------------------------------------- derived rows and report

def format_rows() -> list[dict]:
    """Positions held in bf16 and fp16, in windows of FORMAT_WINDOW from each of FORMAT_STARTS."""
    rows = []
    for name in ("bf16", "fp16"):
        dtype = pr.FORMATS[name]
        for start in FORMAT_STARTS:
            pos = torch.arange(start, start + FORMAT_WINDOW, dtype=torch.float64)
            mean_err, max_err = pr.offset_error(pos, 1, dtype)
            rows.append(dict(probe="format", format=name, start=start, distinct_share=pr.distinct_share(pos, dtype),
                             neighbour_collapse=pr.neighbour_collapse(pos, dtype),
                             offset_error_mean=mean_err if math.isfinite(mean_err) else None,
                             offset_error_max=max_err if math.isfinite(max_err) else None))
    return rows


_PASSKEYS = ("passkey_cached", "passkey_recompute", "passkey_own", "passkey_diff")
KV_SUMMARY = RowKind("kv_summary", {
    "model": str, "L0": int, "decode": int, "gap_within": float, "gap_past": float, "gap_past_mean": float,
    "gap_last": float, "gap_ratio": float, "loss_cached": float, "loss_recompute": float, "argmax_agree": float,
    "passkeys": int, "loss_diff": float, **dict.fromkeys(_PASSKEYS, float)}, optional=_PASSKEYS)  # with passkeys


def derived_rows(rows: list[dict]) -> list[dict]:
    """probe="kv_summary" per model: the gaps within and past L0, their ratio, the losses past L0
    and the passkey exact matches."""
    df = frame(rows)
    kv_all, keys_all = of_kind(df, "kv"), of_kind(df, "kv_passkey")
    return [kv_summary(model, kv, where_is(keys_all, "model", model)) for (model,), kv in groups(kv_all, ("model",))]


def kv_summary(model: str, kv: pd.DataFrame, keys: pd.DataFrame) -> dict:
    """One model's KV-cache summary: its decode steps within and past L0, and its passkeys."""
    L0 = kv["L0"].iloc[0]
    inside = (kv["step"] + 1).map(lambda n: n <= L0).astype(bool)
    within, past = kv[inside], kv[~inside]
    gap_within, gap_past = max(within["logit_gap"]), max(past["logit_gap"])
    means = {k: float(np.mean(values(past, k))) for k in ("logit_gap", "loss_cached", "loss_recompute", "argmax_agree")}
    passkeys = {}
    if len(keys):
        passkeys = {f"passkey_{k}": float(np.mean(values(keys, f"exact_{k}"))) for k in ("cached", "recompute", "own")}
        passkeys["passkey_diff"] = passkeys["passkey_cached"] - passkeys["passkey_recompute"]
    last = max(zip(past["step"], past["logit_gap"], strict=True), key=lambda step_gap: step_gap[0])[1]
    return KV_SUMMARY(model=model, L0=L0, decode=kv["decode"].iloc[0], gap_within=gap_within, gap_past=gap_past,
                      gap_past_mean=means["logit_gap"], gap_last=last,
                      gap_ratio=gap_past / max(gap_within, NOISE), loss_cached=means["loss_cached"],
                      loss_recompute=means["loss_recompute"], argmax_agree=means["argmax_agree"], passkeys=len(keys),
                      loss_diff=means["loss_cached"] - means["loss_recompute"], **passkeys)


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    all_rows = rows + format_rows() + derived_rows(rows)
    m = study.model
    intro = (f"Models: {', '.join(study.axis('model.checkpoint'))}. Dynamic NTK factor {m.get('factor')}, L0 = "
             f"{m.get('L0')} tokens for the checkpoints (their own contexts are far longer: L0 is set small so the "
             f"scale changes within the decode), decoded to {m.get('decode')}; the char LM's L0 is its training "
             f"context {m.get('char', {}).get('context')}, decoded to 4 L0. Patterns on the first "
             f"{m.get('pattern_tokens')} tokens; angles over {m.get('angle_positions')} positions per offset.")
    return write_outputs(out, title=EXPERIMENT.title, rows=all_rows, claims=judge_all(CLAIMS, all_rows), intro=intro,
                         tables=TABLES, figures=FIGURES)


EXPERIMENT = EvaluateOnly(name="implementation", title="Survey: implementation considerations (RoPE precision, "
                                                     "KV cache under Dynamic NTK)",
                        base=BASE, presets=PRESETS, jobs=jobs, run_job=run_job, report=report, check=check)
