"""Context extension evaluated as the survey demands (seed ``001``, survey abstract).

"The ability to compute positional features beyond the training length does not imply reliable
long-context generalization; context extension must be evaluated through short-context
retention, position-wise perplexity, retrieval ..." This module trains a character-level RoPE
language model (nanoGPT's CPU recipe for TinyShakespeare: 4 layers, 4 heads, width 128, context
L0 = 64, batch 12, 2000 AdamW steps), with a documented share of passkey windows in its training
text (``task.share`` = 0.1, their answer digits weighted ``task.answer_weight`` = 10 in the loss,
see :mod:`poslab.tasks.passkey` and ``PASSKEY_SHARE`` below), then applies every context-extension
schedule to it and measures three protocols.

Methods (target length L_t = s L0, s = ``FACTOR`` = 4):

- training-free, as evaluate-only ``variants`` of the stored member (same weights, another
  ``rope_scaling`` dict, :mod:`poslab.positional.rope_scaling`): ``pi`` (linear / Position
  Interpolation), ``ntk`` (NTK-aware), ``dynamic`` (dynamic NTK), ``ntk_by_parts``, ``yarn``
  (with its attention factor 0.1 ln s + 1), ``llama3`` (low / high frequency factors 1 / 4);
- ``longrope``: per-pair rescale factors lambda_i >= 1 and n-hat found by a small evolutionary
  search (Ding et al. 2024, scaled down: population ``SEARCH["population"]``,
  ``SEARCH["generations"]`` generations, mutation by log-normal steps, uniform crossover, factors
  kept non-decreasing in i as LongRoPE constrains them) on the language-model loss at L_t; n-hat,
  the number of initial positions that keep the original RoPE angles (section 3.2; poslab's
  ``n_hat`` key of the longrope dict), is searched among ``N_HATS``, the paper's candidate set
  scaled down to L0. Then a set of short factors is searched the same way at L0 with that n-hat.
  The HF ``longrope`` schedule picks short (L <= L0) or long factors and scales attention by
  sqrt(1 + ln s / ln L0). The search reads *training-split* windows; every protocol below reads
  the validation split;
- LongRoPE's progressive extension, scaled down (256k -> 2048k in the paper, here s = 4 -> 8):
  ``longrope+ft`` fine-tunes at L_t (the ``pi+ft`` budget below) under the searched ``longrope``
  schedule; ``longrope-progressive`` takes that model, searches long factors and n-hat again for
  ``PROGRESSIVE`` x L0 (factors in [1, 2 x 8], the first stage's long factors x 2 among the
  starting points) without fine-tuning at that length, then readjusts the short factors at L0 on
  it (LongRoPE's short-context recovery). The report gives the validation loss at L0 before and
  after the readjustment, the searched n-hat per seed and the wall time of each stage;
- ``longrope2``: the same search guided by a needle-driven loss (Shang et al. 2025): the loss
  on the answer digits of planted passkeys only, at L_t (training-split haystacks);
- fine-tuned: ``pi+ft`` and ``yarn+ft`` (``ft_steps`` = 2.5% of the pre-training steps at L_t on
  the training mix), and ``longrope2+ft``: LongRoPE2's mixed context-window fine-tuning, steps
  alternating between the rescaled RoPE on windows of L_t and the original RoPE on windows of
  L0; evaluated with the original RoPE at L <= L0 and the rescaled one beyond.

Protocols, on the validation split (the last 10% of the corpus):

- **position-wise loss**: mean cross-entropy per position bucket (width L0 / 4), over the first
  ``eval.n_sequences`` non-overlapping windows of each length L in {1, 2, 4, 8} x L0 (fewer
  when the split holds fewer); the mean over all positions is the loss at L;
- **short-context retention**: the loss at L0 of each method beside plain RoPE's (report);
- **passkey retrieval**: ``PASSKEY_DEPTHS`` x lengths, ``eval.n_sequences // 4`` passkeys per
  cell (validation-split haystacks, fixed by (evaluation seed, L, depth)); exact-match accuracy
  of the whole digit string by greedy argmax per digit (teacher-forced), digit accuracy and the
  loss on the digits. The accuracy at L0 is the ceiling the extensions are measured against.

The report also shows the RoPE scaling-law helpers (:mod:`poslab.positional.scaling_laws`) for
the trained model: its critical dimension and the predicted extrapolation bound.

Dynamic NTK (and LongRoPE's short/long choice) is applied as in one forward over the whole
window: every position of a window of L uses the frequencies of length L, as Hugging Face does
for a full forward; in token-by-token decoding earlier positions would use smaller bases.

n-hat makes a position's angles depend on the position itself (positions below n-hat use theta_i,
the others theta_i / lambda_i, for queries and keys alike), so the logits no longer depend on the
offset alone there; the streamed evaluations (:mod:`poslab.probes.streaming`,
:mod:`poslab.probes.lm_streaming`) refuse every length-dependent schedule, longrope included, and
the rotary probes (``probes.rotary_theta``) refuse n-hat > 0.

Not done: LongRoPE2's per-layer search details beyond the needle-driven objective.
"""

from __future__ import annotations

from poslab.experiments.runner import Experiment

import copy
import dataclasses
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from poslab.errors import ConfigError  # noqa: E402
from poslab.experiments.claims import Claim, claims_markdown, write_claims  # noqa: E402
from poslab.experiments.config import EvalConfig, StudyConfig  # noqa: E402
from poslab.experiments.retrieval import fmt, save, select, write_csv  # noqa: E402
from poslab.positional import build_encoding  # noqa: E402
from poslab.positional.scaling_laws import critical_dimension, extrapolation_bound, full_period_pairs  # noqa: E402
from poslab.tasks.passkey import PasskeyText  # noqa: E402
from poslab.tasks.text import CharText  # noqa: E402
from poslab.train import TrainConfig  # noqa: E402

name = "context-extension"
title = "Survey §context extension: position-wise loss, short-context retention, passkey retrieval"

FACTOR = 4.0  # s: target length L_t = s L0
MULTIPLES = (1, 2, 4, 8)  # evaluation lengths, in units of L0
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
SEARCH = dict(population=8, generations=3, survivors=3, sigma=0.25)  # LongRoPE search, scaled down
# LongRoPE's n-hat candidates (the paper searches {0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256} at
# L0 = 4096): the small absolute values kept, cut at L0 / 4 (64 -> 16)
N_HATS = (0, 1, 2, 4, 8, 16)
PROGRESSIVE = 8.0  # LongRoPE's second stage: searched again on the model fine-tuned at s = FACTOR
FT_SHARE = 0.025  # fine-tune steps as a share of the pre-training steps (50 of 2000)
FT_LR = 1e-4  # constant, AdamW, gradient clip 1.0
BUCKETS = 4  # position buckets per L0
# The training mix: each window carries a passkey with probability PASSKEY_SHARE, and its answer
# digits count ANSWER_WEIGHT times in the loss (tasks/passkey.py). Measured at the paper preset
# (one seed, 2000 steps): with weight 1 the digits stayed at chance for shares 0.1-0.5, even after
# 6000 steps; weight 10 at share 0.1 copies every passkey within L0 and moves the text loss at L0
# from 1.607 to 1.625.
PASSKEY_SHARE, ANSWER_WEIGHT = 0.1, 10.0
FIXED = {"train.max_length": "the training length L0 every schedule is built around",
         "train.min_length": "the training length L0 (one window length)",
         "variants": "the schedules, built from L0 and FACTOR"}


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


def study(preset: str) -> StudyConfig:
    if preset == "quick":
        L0, model = 32, dict(d_model=32, n_layers=1, n_heads=2)
        train = TrainConfig(steps=40, batch_size=8, lr=3e-3, optimizer="adamw", betas=(0.9, 0.99),
                            min_length=L0, max_length=L0)
        ev = EvalConfig(lengths=tuple(m * L0 for m in (1, 2, 4)), n_sequences=8, seed=0, chunk=8)
        seeds = 1
    else:
        L0, model = 64, dict(d_model=128, n_layers=4, n_heads=4)  # nanoGPT shakespeare_char on CPU
        train = TrainConfig(steps=2000, batch_size=12, lr=1e-3, optimizer="adamw", betas=(0.9, 0.99),
                            weight_decay=0.1, decay_1d=False, lr_schedule="cosine", warmup_steps=100, min_lr=1e-4,
                            min_length=L0, max_length=L0, grad_clip=1.0)
        ev = EvalConfig(lengths=tuple(m * L0 for m in MULTIPLES), n_sequences=64, seed=0, chunk=16)
        seeds = 2
    variants = {k: {"where": {"encoding": "rope"}, "encoding_options": {"rope": {"scaling": v}}}
                for k, v in schedules(L0).items()}
    return StudyConfig(model_type="transformer", model=model, task_type="passkey",
                       task=dict(share=PASSKEY_SHARE, answer_weight=ANSWER_WEIGHT),
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


# ----------------------------------------------------------------------------- protocols

def rope_encoding(model, scaling: dict | None):
    """The model's RoPE rebuilt with another schedule (its other options kept), on its device.
    (Its table covers lengths up to max_len; longrope clamps longer ones to the long factors, the
    same table, so a search at 8 L0 works past a quick preset's max_len.)"""
    cfg = model.cfg
    options = {k: v for k, v in cfg.encoding_options.items() if k != "scaling"}
    enc = build_encoding(cfg.encoding, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head,
                         max_len=cfg.max_len, **options, **({"scaling": scaling} if scaling else {}))
    return enc.to(next(model.parameters()).device)


def with_scaling(model, scaling: dict | None):
    """The same weights under another RoPE schedule: a copy whose encoding is rebuilt (RoPE has
    no parameters, and one encoding module serves every layer)."""
    out = copy.deepcopy(model)
    out.encoding = rope_encoding(model, scaling)
    return out.eval()


def swap(model, encoding):
    """``model`` reading positions through ``encoding`` from now on (weights untouched)."""
    model.encoding = encoding
    return model


def positionwise(model_at, corpus, lengths, L0: int, n: int, chunk: int, device) -> list[dict]:
    """Loss per position bucket and overall, on non-overlapping validation windows of each length."""
    text = CharText(corpus=corpus, split="val")
    width = max(1, L0 // BUCKETS)
    rows = []
    for L in lengths:
        model = model_at(L)
        total, count = torch.zeros(L, dtype=torch.float64), 0
        for batch in text.windows(L, batch_size=chunk, limit=n):
            batch = batch.to(device)
            logits = model(batch.tokens)  # [b, L, m]
            ce = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")  # [b, L]
            total += ce.double().sum(0).cpu()
            count += batch.size
        per_pos = total / count
        rows.append(dict(probe="loss", length=L, loss=float(per_pos.mean()), windows=count))
        for lo in range(0, L, width):
            rows.append(dict(probe="positionwise", length=L, bucket_start=lo, bucket_end=min(lo + width, L) - 1,
                             loss=float(per_pos[lo:lo + width].mean()), windows=count))
    return rows


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


def _cell_seed(seed: int, L: int, depth: float) -> int:
    return (seed * 1_000_003 + L * 1009 + int(round(depth * 1000))) % (2 ** 62)


def protocols(model_at, ctx, method: str) -> list[dict]:
    study, task = ctx.study, ctx.task
    L0, ev = study.train.max_length, study.eval
    rows = positionwise(model_at, task.corpus, ev.lengths, L0, ev.n_sequences, ev.chunk, ctx.device)
    rows += passkey(model_at, task.corpus, ev.lengths, max(2, ev.n_sequences // 4), ev.seed, task.digits,
                    ctx.device)
    return [{"method": method, **r} for r in rows]


def evaluate(ctx) -> list[dict]:
    if ctx.member.variant is not None:  # a training-free schedule: the encoding is already rescaled
        return protocols(lambda L: ctx.model, ctx, ctx.member.variant)
    model, study, task = ctx.model, ctx.study, ctx.task
    L0 = study.train.max_length
    target = int(FACTOR * L0)
    rows = protocols(lambda L: model, ctx, "rope")
    cfg = model.cfg
    rows.append(dict(probe="scaling_law", method="rope", head_dim=cfg.d_head, base=_base(model), train_length=L0,
                     critical_dimension=critical_dimension(_base(model), L0, cfg.d_head),
                     full_period_pairs=full_period_pairs(_base(model), L0, cfg.d_head),
                     extrapolation_bound=extrapolation_bound(_base(model), L0, cfg.d_head)))

    # LongRoPE: long factors and n-hat searched at L_t, then short factors at L0 (with that n-hat),
    # on training-split LM loss
    pairs = model.encoding.rotary_frequencies().numel()
    lm_short = _lm_objective(task, L0, study)
    lm_long = _lm_objective(task, target, study)
    long, n_hat, long_trace = search(model, L0, pairs, lm_long, ctx.member.seed + 1, n_hats=N_HATS)
    short, _, short_trace = search(model, L0, pairs, lm_short, ctx.member.seed, kind="short", other=long,
                                   n_hats=(n_hat,))
    lr_scaling = longrope(L0, short, long, n_hat=n_hat)
    lr_model = with_scaling(model, lr_scaling)
    rows += protocols(lambda L: lr_model, ctx, "longrope")
    rows += _search_rows("longrope", FACTOR, n_hat, short, long, short_trace, long_trace)

    # LongRoPE's progressive extension, scaled down: (a) fine-tune at L_t with the searched schedule,
    # (b) search factors and n-hat for PROGRESSIVE x L0 on the fine-tuned model (no fine-tuning there),
    # (c) readjust the short factors at L0 on that model
    steps = max(2, int(FT_SHARE * study.train.steps))
    clock = time.perf_counter()
    lr_tuned = finetune(model, {target: rope_encoding(model, lr_scaling)}, task, study, steps, ctx.member.seed,
                        ctx.device)
    seconds = dict(finetune=time.perf_counter() - clock)
    rows += protocols(lambda L: lr_tuned, ctx, "longrope+ft")
    clock = time.perf_counter()
    target2 = int(PROGRESSIVE * L0)
    long8, n_hat8, long8_trace = search(lr_tuned, L0, pairs, _lm_objective(task, target2, study),
                                        ctx.member.seed + 3, s=PROGRESSIVE, n_hats=N_HATS,
                                        starts=[np.asarray(long) * PROGRESSIVE / FACTOR])
    seconds["search_long"] = time.perf_counter() - clock
    clock = time.perf_counter()
    short8, _, short8_trace = search(lr_tuned, L0, pairs, lm_short, ctx.member.seed + 4, s=PROGRESSIVE,
                                     kind="short", other=long8, n_hats=(n_hat8,), starts=[np.asarray(short)])
    seconds["search_short"] = time.perf_counter() - clock
    prog = with_scaling(lr_tuned, longrope(L0, short8, long8, PROGRESSIVE, n_hat8))
    rows += protocols(lambda L: prog, ctx, "longrope-progressive")
    rows += _search_rows("longrope-progressive", PROGRESSIVE, n_hat8, short8, long8, short8_trace, long8_trace)
    ev = study.eval
    unadjusted = with_scaling(lr_tuned, longrope(L0, short, long8, PROGRESSIVE, n_hat8))
    for which, m in (("before", unadjusted), ("after", prog)):  # short-context loss around step (c)
        loss = positionwise(lambda L, m=m: m, task.corpus, [L0], L0, ev.n_sequences, ev.chunk, ctx.device)[0]
        rows.append(dict(probe="readjust", method="longrope-progressive", stage=which, length=L0, loss=loss["loss"]))
    rows += [dict(probe="timing", method="longrope-progressive", stage=k, seconds=v) for k, v in seconds.items()]

    # LongRoPE2: the long search guided by the loss on planted needles' digits only
    needle = _needle_objective(task, target, study)
    long2, _, long2_trace = search(model, L0, pairs, needle, ctx.member.seed + 2)
    lr2_model = with_scaling(model, longrope(L0, [1.0] * pairs, long2))
    rows += protocols(lambda L: lr2_model, ctx, "longrope2")
    rows += [dict(probe="search", method="longrope2", set="long", generation=i, objective=v)
             for i, v in enumerate(long2_trace)]
    rows += [dict(probe="factors", method="longrope2", set="long", pair=i, factor=float(f)) for i, f in enumerate(long2)]

    # Fine-tuned at the target length
    sched = schedules(L0)
    for method, scaling in (("pi+ft", sched["pi"]), ("yarn+ft", sched["yarn"])):
        enc = rope_encoding(model, scaling)
        tuned = finetune(model, {target: enc}, task, study, steps, ctx.member.seed, ctx.device)
        rows += protocols(lambda L, m=tuned: m, ctx, method)
    # LongRoPE2 mixed context-window fine-tuning: rescaled RoPE on L_t windows, original RoPE on L0
    encs = {target: rope_encoding(model, longrope(L0, [1.0] * pairs, long2)), L0: rope_encoding(model, None)}
    tuned = finetune(model, encs, task, study, steps, ctx.member.seed, ctx.device)
    rows += protocols(lambda L: swap(tuned, encs[L0] if L <= L0 else encs[target]), ctx, "longrope2+ft")
    rows.append(dict(probe="finetune", method="all", steps=steps, lr=FT_LR, target_length=target))
    return rows


def _base(model) -> float:
    return float(getattr(model.encoding, "base", 10000.0))


def longrope(L0: int, short, long, s: float = FACTOR, n_hat: int = 0) -> dict:
    """The HF longrope dict (plus poslab's ``n_hat`` when > 0: positions below it keep the original angles)."""
    out = {"rope_type": "longrope", "factor": s, "original_max_position_embeddings": L0,
           "short_factor": [float(x) for x in short], "long_factor": [float(x) for x in long]}
    return {**out, "n_hat": int(n_hat)} if n_hat else out


def _search_rows(method: str, s: float, n_hat: int, short, long, short_trace, long_trace) -> list[dict]:
    rows = [dict(probe="search", method=method, set=k, generation=i, objective=v)
            for k, trace in (("short", short_trace), ("long", long_trace)) for i, v in enumerate(trace)]
    rows += [dict(probe="factors", method=method, set=k, pair=i, factor=float(f), n_hat=n_hat, s=s)
             for k, fs in (("short", short), ("long", long)) for i, f in enumerate(fs)]
    return rows


def _lm_objective(task, L: int, study):
    """Mean next-character loss on fixed training-split text windows of length L."""
    n = max(2, study.eval.n_sequences // 8)
    text = CharText(corpus=task.corpus, split="train")
    g = torch.Generator().manual_seed(_cell_seed(study.eval.seed + 7, L, 0.0))
    batch = text.sample(g, n, L)

    def loss(model) -> float:
        batch_d = batch.to(next(model.parameters()).device)
        logits = model(batch_d.tokens)
        return float(F.cross_entropy(logits.flatten(0, 1), batch_d.targets.flatten()))
    return loss


def _needle_objective(task, L: int, study):
    """LongRoPE2's needle-driven loss: cross-entropy on the answer digits of passkeys only."""
    n = max(2, study.eval.n_sequences // 8)
    pk = PasskeyText(corpus=task.corpus, split="train", share=1.0, digits=task.digits, score="answer")
    g = torch.Generator().manual_seed(_cell_seed(study.eval.seed + 11, L, 0.0))
    batch, answer = pk.sample_with_answers(g, n, L)

    def loss(model) -> float:
        dev = next(model.parameters()).device
        logits = model(batch.tokens.to(dev))
        ce = F.cross_entropy(logits.transpose(1, 2), batch.targets.to(dev), reduction="none")
        return float(ce[answer.to(dev)].mean())
    return loss


def search(model, L0: int, pairs: int, objective, seed: int, *, s: float = FACTOR, kind: str = "long",
           other=None, n_hats=(0,), starts=()):
    """LongRoPE's evolutionary search over per-pair factors lambda_i in [1, 2 s], non-decreasing in i,
    and over n-hat among ``n_hats`` (the first positions left unscaled).

    ``kind`` "long" searches the long factors (the short ones fixed to ``other``, default 1), "short"
    the short ones (long fixed to ``other``). Initial population: uniform s ("long") or 1 ("short",
    plain RoPE), for "long" the NTK-aware and YaRN factors at s, the given ``starts``, all with
    n-hat = n_hats[0], then mutations of them with a random n-hat. Each generation keeps the
    ``survivors`` best and fills the population with children: uniform crossover per pair, a
    log-normal mutation (sigma) on about half the pairs, n-hat from either parent and moved to a
    neighbouring candidate with probability 1/2. The objective is evaluated with the HF
    ``longrope`` schedule at factor s (long factors beyond L0, short within, attention factor
    sqrt(1 + ln s / ln L0)) plus n-hat. The frequencies are those of the model's plain RoPE, so a
    model fine-tuned under another schedule is searched the same way. Returns (best factors,
    best n-hat, best objective per generation).
    """
    rng = np.random.default_rng(seed)
    plain = rope_encoding(model, None)
    theta = plain.rotary_frequencies().double().cpu().numpy()  # [r/2]
    hi = 2 * s
    other = np.ones(pairs) if other is None else np.asarray(other, dtype=np.float64)
    n_hats = tuple(n_hats)

    def legal(f):
        return np.maximum.accumulate(np.clip(f, 1.0, hi))

    def pick_n_hat():  # no draw when n-hat is fixed, so a fixed-n-hat search repeats the old one
        return n_hats[rng.integers(len(n_hats))] if len(n_hats) > 1 else n_hats[0]

    seeds = [np.full(pairs, s if kind == "long" else 1.0)]
    if kind == "long":
        orig = {"factor": s, "original_max_position_embeddings": L0}
        for scaling in ({"rope_type": "ntk", "factor": s}, {"rope_type": "yarn", **orig}):
            # their frequencies as per-pair factors theta_i / theta'_i
            scaled = rope_encoding(model, scaling).rotary_frequencies().double().cpu().numpy()
            seeds.append(theta / scaled)
    seeds += [np.asarray(f, dtype=np.float64) for f in starts]
    population = [(legal(f), n_hats[0]) for f in seeds]
    while len(population) < SEARCH["population"]:
        parent = population[rng.integers(len(seeds))][0]
        population.append((legal(parent * np.exp(rng.normal(0, SEARCH["sigma"], pairs))), pick_n_hat()))

    def score(f, n_hat):
        short, long = (other, f) if kind == "long" else (f, other)
        return objective(with_scaling(model, longrope(L0, short, long, s, n_hat)))

    scored = sorted(((score(f, n), i, f, n) for i, (f, n) in enumerate(population)), key=lambda t: t[:2])
    trace = [scored[0][0]]
    for _ in range(SEARCH["generations"]):
        parents = [(f, n) for _, _, f, n in scored[:SEARCH["survivors"]]]
        children = []
        while len(children) < SEARCH["population"] - len(parents):
            a, b = rng.choice(len(parents), 2)
            child = np.where(rng.random(pairs) < 0.5, parents[a][0], parents[b][0])
            child = child * np.exp(rng.normal(0, SEARCH["sigma"], pairs) * (rng.random(pairs) < 0.5))
            n_hat = parents[a][1]
            if len(n_hats) > 1:
                n_hat = parents[b][1] if rng.random() < 0.5 else n_hat
                if rng.random() < 0.5:
                    j = n_hats.index(n_hat) + rng.choice((-1, 1))
                    n_hat = n_hats[min(max(j, 0), len(n_hats) - 1)]
            children.append((legal(child), n_hat))
        scored = sorted(scored[:SEARCH["survivors"]] + [(score(f, n), 100 + len(trace) * 100 + i, f, n)
                                                         for i, (f, n) in enumerate(children)], key=lambda t: t[:2])
        trace.append(scored[0][0])
    return scored[0][2], int(scored[0][3]), [float(t) for t in trace]


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


# ----------------------------------------------------------------------------- report

ORDER = ("rope", "pi", "ntk", "dynamic", "ntk_by_parts", "yarn", "llama3", "longrope", "longrope2", "pi+ft",
         "yarn+ft", "longrope+ft", "longrope-progressive", "longrope2+ft")
FINETUNED = ("pi+ft", "yarn+ft", "longrope+ft", "longrope-progressive", "longrope2+ft")  # weights changed


def _method(r: dict) -> str:
    return r.get("method") or r.get("variant") or "rope"


def _stats(values):
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return (float(np.mean(values)), float(np.std(values)), len(values)) if values else (math.nan, math.nan, 0)


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    for r in rows:
        r["method"] = _method(r)
    L0 = study.train.max_length
    lengths = list(study.eval.lengths)
    methods = [m for m in ORDER if any(r["method"] == m for r in rows)]
    seeds = sorted({r["seed"] for r in rows})
    long_rows = []
    for r in rows:
        if r.get("probe") in ("loss", "positionwise", "passkey"):
            for metric in ("loss", "accuracy", "digit_accuracy"):
                if metric in r:
                    long_rows.append(dict(method=r["method"], seed=r["seed"], protocol=r["probe"], length=r["length"],
                                          depth=r.get("depth", ""), bucket_start=r.get("bucket_start", ""),
                                          bucket_end=r.get("bucket_end", ""), metric=metric, value=r[metric]))
    files = [write_csv(long_rows, out / "rows.csv", ["method", "seed", "protocol", "length", "depth", "bucket_start",
                                                     "bucket_end", "metric", "value"])]
    files.append(write_csv(select(rows, "factors"), out / "longrope_factors.csv"))

    def loss_at(method, L):
        return _stats([r["loss"] for r in select(rows, "loss", method=method, length=L)])

    def pk_at(method, L):
        return _stats([r["accuracy"] for r in select(rows, "passkey", method=method, length=L)])

    header = ["method"] + [f"loss @{L // L0}x ({L})" for L in lengths] + ["retention Δ @1x"] + \
             [f"passkey @{L // L0}x" for L in lengths]
    body = []
    base1 = loss_at("rope", L0)[0]
    for m in methods:
        cells = [fmt(*loss_at(m, L)[:2]) for L in lengths]
        delta = loss_at(m, L0)[0] - base1
        cells.append(f"{delta:+.3f}")
        cells += [fmt(*pk_at(m, L)[:2]) for L in lengths]
        body.append([m, *cells])
    law = select(rows, "scaling_law")
    ft = select(rows, "finetune")
    lines = [f"# {title}", "",
             f"Character-level RoPE LM trained at L0 = {L0} (seeds {seeds}), extended by s = {FACTOR:g} to "
             f"L_t = {int(FACTOR * L0)}. Mean ± std over seeds.",
             "",
             f"Loss: mean next-character cross-entropy (nats) over the first {study.eval.n_sequences} non-overlapping "
             f"validation windows of each length (fewer where the validation split holds fewer), every position "
             f"counted. Retention Δ: loss at L0 minus plain RoPE's loss at L0 (positive = short context got worse). "
             f"Passkey: exact-match accuracy of the {max(2, study.eval.n_sequences // 4)} planted passkeys per "
             f"(length, depth) cell, averaged over depths {list(PASSKEY_DEPTHS)}; the value at 1x is the ceiling "
             f"the extensions are measured against.", ""]
    if ft:
        lines += [f"Fine-tuned methods: {ft[0]['steps']} AdamW steps at lr {ft[0]['lr']} "
                  f"(PI, YaRN, LongRoPE: windows of {ft[0]['target_length']}; LongRoPE2+ft: alternating "
                  f"{ft[0]['target_length']} with the rescaled RoPE and {L0} with the original). "
                  f"longrope-progressive: the longrope+ft model with factors and n-hat searched again for "
                  f"{PROGRESSIVE:g} x L0 = {int(PROGRESSIVE * L0)} (no fine-tuning at that length) and its short "
                  f"factors readjusted at L0 (LongRoPE's progressive extension, scaled down).", ""]
    header_md = "| " + " | ".join(header) + " |\n|" + "---|" * len(header)
    lines += [header_md] + ["| " + " | ".join(str(c) for c in row) + " |" for row in body] + [""]
    if law:
        r = law[0]
        lines += ["## RoPE scaling law (Liu et al. 2023) for the trained model", "",
                  f"head dim d = {r['head_dim']}, base = {r['base']:g}, T_train = {r['train_length']}: "
                  f"{r['full_period_pairs']} of {r['head_dim'] // 2} pairs complete a period within T_train; "
                  f"critical dimension d_extra = {r['critical_dimension']}; predicted extrapolation bound "
                  f"T_extra = 2 pi base^(d_extra/d) = {r['extrapolation_bound']:.1f} positions "
                  f"({r['extrapolation_bound'] / L0:.2f} x L0).", ""]
    lines += _search_lines(rows, L0)
    claims = _claims(rows, study, methods, loss_at, pk_at, law)
    lines += ["## Claims beside this run", "", claims_markdown(claims), ""]
    (out / "table.md").write_text("\n".join(lines))
    files += [out / "table.md", write_claims(claims, out / "claims.json")]
    return files + figures(rows, study, out, methods, loss_at)


def _search_lines(rows, L0: int) -> list[str]:
    """The searched n-hat per LongRoPE method and seed, the search's objective, the readjustment and its cost."""
    factors = select(rows, "factors")
    methods = [m for m in ("longrope", "longrope-progressive") if any(r["method"] == m for r in factors)]
    if not methods:
        return []
    lines = ["## LongRoPE search", "",
             f"Population {SEARCH['population']}, {SEARCH['generations']} generations, n-hat candidates "
             f"{list(N_HATS)} (positions below n-hat keep the original RoPE angles). Objective: mean training-split "
             f"LM loss at the searched length (long: s L0, short: L0), best of the first -> last generation.", "",
             "| method | s | seed | n-hat | long objective | short objective |", "|---|---|---|---|---|---|"]
    for m in methods:
        for seed in sorted({r["seed"] for r in factors if r["method"] == m}):
            f = [r for r in factors if r["method"] == m and r["seed"] == seed]
            trace = {k: [r["objective"] for r in sorted(select(rows, "search", method=m, set=k, seed=seed),
                                                        key=lambda r: r["generation"])] for k in ("long", "short")}
            cells = [f"{t[0]:.3f} -> {t[-1]:.3f}" if t else "-" for t in (trace["long"], trace["short"])]
            lines.append(f"| {m} | {f[0]['s']:g} | {seed} | {f[0]['n_hat']} | {cells[0]} | {cells[1]} |")
    lines.append("")
    adjust = select(rows, "readjust")
    if adjust:
        before = _stats([r["loss"] for r in adjust if r["stage"] == "before"])
        after = _stats([r["loss"] for r in adjust if r["stage"] == "after"])
        lines += [f"Short-factor readjustment (longrope-progressive, validation loss at L0 = {L0}): "
                  f"{fmt(*before[:2])} with the first stage's short factors -> {fmt(*after[:2])} readjusted.", ""]
    timing = select(rows, "timing")
    if timing:
        parts = [f"{k} {_stats([r['seconds'] for r in timing if r['stage'] == k])[0]:.1f} s"
                 for k in ("finetune", "search_long", "search_short")]
        lines += [f"Wall time of the progressive stages per member (mean over seeds, this run's machine): "
                  f"{', '.join(parts)}.", ""]
    return lines


def _claims(rows, study, methods, loss_at, pk_at, law) -> list[Claim]:
    L0 = study.train.max_length
    lengths = list(study.eval.lengths)
    n = f"{len({r['seed'] for r in select(rows, 'loss', method='rope')})} seeds"
    out = []
    far = max(lengths)
    rope1, ropefar = loss_at("rope", L0)[0], loss_at("rope", far)[0]
    out.append(Claim(name=f"plain RoPE: loss rises beyond the training length (L0={L0} -> {far})",
                     paper="extrapolation fails without extension (survey)", measured=f"{rope1:.3f} -> {ropefar:.3f}",
                     holds=bool(ropefar > rope1), criterion="loss at max length > loss at L0", note=n))
    target = int(FACTOR * L0)
    if target in lengths:
        for m in methods:
            if m == "rope":
                continue
            lt, l1 = loss_at(m, target)[0], loss_at(m, L0)[0]
            out.append(Claim(name=f"{m}: loss at L_t={target} below plain RoPE's", paper="extension helps (survey)",
                             measured=f"{lt:.3f} vs {loss_at('rope', target)[0]:.3f}",
                             holds=bool(lt < loss_at("rope", target)[0]), criterion="lower", note=n))
            out.append(Claim(name=f"{m}: short-context retention at L0={L0}", paper="measured, not assumed (survey)",
                             measured=f"{l1 - rope1:+.3f} nats", holds=None,
                             note="loss at L0 minus plain RoPE's"))
    far8 = int(PROGRESSIVE * L0)
    if far8 in lengths and {"longrope+ft", "longrope-progressive"} <= set(methods):
        prog, ft = loss_at("longrope-progressive", far8)[0], loss_at("longrope+ft", far8)[0]
        out.append(Claim(name=f"longrope-progressive: loss at {PROGRESSIVE:g} L0 = {far8} below longrope+ft's "
                              f"(the same weights with the {FACTOR:g}x schedule)",
                         paper="a second search on the fine-tuned model extends further without fine-tuning "
                               "(Ding et al. 2024: 256k fine-tuned -> 2048k)",
                         measured=f"{prog:.3f} vs {ft:.3f}", holds=bool(prog < ft), criterion="lower", note=n))
    adjust = select(rows, "readjust")
    if adjust:
        before = _stats([r["loss"] for r in adjust if r["stage"] == "before"])[0]
        after = _stats([r["loss"] for r in adjust if r["stage"] == "after"])[0]
        out.append(Claim(name=f"longrope-progressive: readjusted short factors recover short-context loss at "
                              f"L0={L0}", paper="short-factor readjustment recovers short-context performance "
                                                "(Ding et al. 2024)",
                         measured=f"{before:.3f} -> {after:.3f}", holds=bool(after < before), criterion="lower after",
                         note=f"{n}; validation loss at L0 with the first stage's short factors, then readjusted"))
    ceiling = pk_at("rope", L0)[0]
    digit_loss = _stats([r["loss"] for r in select(rows, "passkey", method="rope", length=L0)])[0]
    out.append(Claim(name=f"passkey retrieval learned within the training length (the ceiling), L={L0}",
                     paper="the ceiling extensions are measured against", measured=float(ceiling),
                     holds=bool(ceiling >= 0.5), criterion=">= 0.5, else the grid cannot rank the extensions",
                     note=f"{n}; passkey share in training {study.task.get('share')}, answer digits weighted "
                          f"{study.task.get('answer_weight', 1.0)}; loss on the digits "
                          f"{digit_loss:.3f} (ln 10 = {math.log(10):.3f} if they were guessed, not copied)"))
    if law:
        bound = law[0]["extrapolation_bound"]
        past = [L for L in lengths if L > bound]
        if past:
            L = min(past)
            out.append(Claim(name=f"scaling law: plain RoPE degrades past the predicted bound {bound:.0f}",
                             paper="T_extra = 2 pi base^(d_extra/d) (Liu et al. 2023)",
                             measured=f"loss {loss_at('rope', L)[0]:.3f} at {L} vs {rope1:.3f} at {L0}",
                             holds=bool(loss_at("rope", L)[0] > rope1), criterion="higher past the bound", note=n))
    return out


def figures(rows, study, out: Path, methods, loss_at) -> list[Path]:
    paths = []
    L0 = study.train.max_length
    far = max(study.eval.lengths)
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        pos = select(rows, "positionwise", method=m, length=far)
        buckets = sorted({(r["bucket_start"], r["bucket_end"]) for r in pos})
        if not buckets:
            continue
        y = [np.mean([r["loss"] for r in pos if (r["bucket_start"], r["bucket_end"]) == b]) for b in buckets]
        ax.plot([(a + b) / 2 for a, b in buckets], y, lw=1.2, label=m, color=plt.cm.tab20(methods.index(m) % 20),
                ls="--" if m in FINETUNED else "-")
    ax.axvline(L0, color="grey", ls=":", lw=1)
    ax.axvline(FACTOR * L0, color="grey", ls="--", lw=1)
    ax.set(xlabel="position", ylabel="loss (nats)", title=f"position-wise loss on windows of {far}")
    ax.legend(fontsize=6, ncol=2)
    paths.append(save(fig, out / "positionwise_loss.png"))

    lengths = list(study.eval.lengths)
    cols = min(len(methods), 7)
    rows_n = math.ceil(len(methods) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(1.9 * cols + 1, 2.6 * rows_n), squeeze=False)
    for ax in axes.flat[len(methods):]:
        ax.set_visible(False)
    for ax, m in zip(axes.flat, methods):
        grid = np.array([[np.mean([r["accuracy"] for r in select(rows, "passkey", method=m, length=L, depth=d)] or
                                  [np.nan]) for L in lengths] for d in PASSKEY_DEPTHS])
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(L) for L in lengths], fontsize=6)
        ax.set_yticks(range(len(PASSKEY_DEPTHS)), [str(d) for d in PASSKEY_DEPTHS], fontsize=6)
        ax.set_title(m, fontsize=7)
        ax.set_xlabel("length", fontsize=6)
    for row in axes:
        row[0].set_ylabel("depth")
    fig.suptitle("passkey exact-match accuracy by depth x length (viridis: 0 dark, 1 yellow)", fontsize=9)
    paths.append(save(fig, out / "passkey_heatmap.png"))

    fig, ax = plt.subplots(figsize=(7, 3.2))
    base = loss_at("rope", L0)[0]
    deltas = [loss_at(m, L0)[0] - base for m in methods]
    errs = [loss_at(m, L0)[1] for m in methods]
    ax.bar(range(len(methods)), deltas, yerr=errs, color=["C0" if d <= 0 else "C3" for d in deltas])
    ax.set_xticks(range(len(methods)), methods, rotation=45, ha="right", fontsize=7)
    ax.axhline(0, color="black", lw=0.8)
    ax.set(ylabel=f"loss at L0={L0} minus RoPE's", title="short-context retention")
    paths.append(save(fig, out / "retention.png"))
    return paths


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, fixed=FIXED, check=check)
