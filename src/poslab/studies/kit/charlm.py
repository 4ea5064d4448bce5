"""The character LM other studies build on: nanoGPT's ``shakespeare_char`` recipes and their evaluation.

    loss = - 1/N sum_t log p(c_{t+1} | c_{<=t})        over every character of the validation split

A causal pre-LN :class:`~poslab.models.transformer.Transformer` trained on windows of the
corpus (task ``text``), one member per encoding x seed (:func:`lm_study`). The ``paper`` recipe
is nanoGPT's own CPU recipe for this corpus: 4 layers, 4 heads, width 128, context 64, batch 12,
2000 iterations, AdamW at lr 1e-3 (betas 0.9 / 0.99, weight decay 0.1 on matrices only), 100
warm-up steps, cosine to 1e-4, gradient clip 1.0, no biases, dropout 0, learned absolute
positions; nanoGPT reports validation loss 1.886 in 74.6 s on the issue's machine (0.80M
parameters, ~31 ms/iteration). ``gpu`` is its GPU recipe (6 layers, 6 heads, width 384, context
256, batch 64, 5000 iterations, dropout 0.2; 1.47 published). ``quick`` runs in seconds, for the
tests. :data:`CPU_MODEL` and :func:`recipe_train` give the CPU recipe's shape and training to
studies that build their own models on it (leakage, context extension).

Differences from nanoGPT that stay: the readout U is not tied to the token embedding W_E, and
weights start at poslab's initialisation (W_E ~ N(0, 1), uniform 1/sqrt(fan_in) projections),
not nanoGPT's N(0, 0.02).

Evaluation (:func:`validation_loss`): the mean cross-entropy over the WHOLE validation split (the
last 10% of the corpus), tiled by consecutive non-overlapping windows of the training context,
``eval.chunk`` windows per forward; at most ``eval.n_sequences`` windows (the presets' value
exceeds the split's count, so rows say ``whole_split``). nanoGPT's 1.886 is an estimate from
200 random batches of 12 windows instead.

Position-wise loss (:func:`positionwise_rows`, at each of ``eval.lengths``, default: the training
context): the cross-entropy at each position t of a window of L characters, averaged over position
buckets (log-spaced 0, 1, [2, 4), [4, 8), ... and, where L <= 64 x context / 4, the
context-extension study's linear ones of width context / 4). At L <= the context it is the mean
over the split's non-overlapping windows (at most ``eval.n_sequences``), from the model's forward;
past the context it is ONE window, the first L + 1 characters of the validation split, or, when
the split is shorter (TinyShakespeare's holds 111,540), of the whole corpus, whose start is
training text (rows say so in ``source``: that loss measures positional extrapolation, not
held-out generalization), evaluated exactly in bounded memory by
:func:`poslab.probes.lm_streaming.positionwise_loss` (layer by layer, online softmax over key
chunks of ``eval.chunk`` x 8 positions on CPU, x 64 on an accelerator; stream and keys on disk past
256 MiB on CPU, in device memory up to 16 GiB on an accelerator). Lengths past the context need an
encoding that streams (no Shaw, no length-dependent schedule). Tables are as long as the training
context whatever the eval lengths (:func:`table_length`), so the trained model is the one the
default run trains, and a learned APE past its table meets its ``out_of_range`` policy: ``error``
(the default) refuses before any work, ``clamp`` streams. ``--set eval.lengths=[64,100000,1000000]
--set grid.encoding=[rope]``; ~1e3 L^2 flops for the paper model, so 10^6 is for a GPU
(``--device``). :func:`context_loss_rows` is the plainer protocol of the MoPE and context-extension
studies: equal-width buckets, ``buckets`` per training context, from the model's forward.

Training wall time and throughput (:func:`train_timing`): ``train_seconds`` is the ensemble's wall
time (members of one encoding train together), ``seconds_per_member`` that divided by the members
in the group, ``tokens_per_s`` the characters per second over all of them; ``train_threads`` of the
machine's ``cores`` trained the group, so ``machine_seconds_per_member`` = seconds_per_member x
train_threads / cores is the machine's wall time per member when every core works like this group
(two groups side by side, one core each, on two cores: half their wall time each).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from poslab.errors import ConfigError, check_choice
from poslab.experiments.config import EvalConfig, StudyConfig
from poslab.experiments.experiment import Experiment, members, variant_members
from poslab.probes.positionwise import loss_rows, position_losses
from poslab.tasks.text import CharText
from poslab.train import TrainConfig, evaluate_loss, lm_recipe

# nanoGPT's figures for its recipes (README and the measurement on its CPU).
NANOGPT = dict(paper=dict(val_loss=1.886, seconds=74.6, params=0.80e6, ms_per_iter=31.0),
               gpu=dict(val_loss=1.47))
CPU_MODEL = dict(d_model=128, n_layers=4, n_heads=4)  # nanoGPT shakespeare_char on CPU (biases and dropout aside)
# Per preset: model fields, context, and the training recipe.
RECIPES: dict[str, dict[str, Any]] = {
    "paper": dict(model=dict(**CPU_MODEL, bias=False, dropout=0.0), context=64, batch_size=12, steps=2000,
                  warmup_steps=100),
    "gpu": dict(model=dict(d_model=384, n_layers=6, n_heads=6, bias=False, dropout=0.2), context=256,
                batch_size=64, steps=5000, warmup_steps=100),
    "quick": dict(model=dict(d_model=32, n_layers=2, n_heads=2, bias=False, dropout=0.0), context=32,
                  batch_size=8, steps=30, warmup_steps=5),
}
PRESETS = ("paper", "gpu", "quick")
ENCODINGS = ("learned", "rope")
STREAM_CHUNK = dict(cpu=8, accelerator=64)  # streamed block = eval.chunk x this positions (eval.chunk counts
# windows): 512 was the fastest on this CPU; an accelerator wants fewer, larger blocks (kernel launches)


def recipe_train(preset: str = "paper", **changes) -> TrainConfig:
    """The training config of nanoGPT's recipe ``preset`` (``paper``: the CPU one) by
    :func:`poslab.train.lm_recipe`; ``changes`` replace any other TrainConfig field."""
    r = RECIPES[preset]
    return lm_recipe(steps=r["steps"], batch_size=r["batch_size"], context=r["context"],
                     warmup_steps=r["warmup_steps"], **changes)


def lm_study(preset: str = "paper", encodings: tuple[str, ...] | None = None, **changes) -> StudyConfig:
    """The LM study of ``preset`` over ``encodings`` (default: learned APE and RoPE).

    ``changes`` are StudyConfig fields; the dict fields ``model``, ``task`` and
    ``encoding_options`` are merged into the preset's, and ``train`` / ``eval`` may be given as
    dicts of fields to replace (``train=dict(steps=500)``) or as whole configs.
    """
    check_choice("preset", preset, PRESETS)
    L = RECIPES[preset]["context"]
    ev = EvalConfig(lengths=(L,), n_sequences=64 if preset == "quick" else 1 << 20, seed=0, chunk=64)
    encodings = tuple(encodings or ENCODINGS)
    study = StudyConfig(model_type="transformer", model=dict(RECIPES[preset]["model"]), task_type="text", task={},
                        encoding=encodings[0], grid={"encoding": encodings}, seeds=1 if preset == "quick" else 2,
                        train=recipe_train(preset), eval=ev)
    for key in ("model", "task", "encoding_options"):
        if key in changes:
            changes[key] = {**getattr(study, key), **changes[key]}
    for key in ("train", "eval"):
        if isinstance(changes.get(key), dict):
            changes[key] = dataclasses.replace(getattr(study, key), **changes[key])
    return dataclasses.replace(study, **changes)


def check_lm(experiment: Experiment, study: StudyConfig) -> None:
    """A character-level task trained on one context length; eval lengths that fit the corpus, and
    past the context, members of ``experiment`` whose model streams
    (:func:`~poslab.probes.lm_streaming.check_streamable`)."""
    from poslab.probes.lm_streaming import check_streamable, text_window
    from poslab.tasks import TASKS

    if not hasattr(TASKS.get(study.task_type, object), "windows"):
        raise ConfigError("task_type", study.task_type, "a text task (text) whose split tiles into windows")
    if study.train.min_length != study.train.max_length:
        raise ConfigError("train.min_length", study.train.min_length,
                          f"train.max_length={study.train.max_length}: the LM trains on one context length")
    context = study.train.max_length
    for L in study.eval.lengths:
        if L <= context:
            CharText(corpus=study.task.get("corpus"), split="val").validate(L)
        else:
            text_window(study.task.get("corpus"), L, field="eval.lengths")
    if max(study.eval.lengths) > context:
        trained = members(experiment, study)
        for member in trained + [variant for variant, _ in variant_members(study, trained)]:
            check_streamable(member.model_config)


def table_length(study: StudyConfig) -> int:
    """Positions the model's tables hold (the runner asks): the training context, not the longest
    eval length, as nanoGPT's block_size; longer windows are extrapolation."""
    return study.train.max_length


# ----------------------------------------------------------------------------- evaluation

def validation_loss(model, task, context: int, chunk: int = 64, limit: int | None = None) -> dict:
    """Mean cross-entropy of ``model`` over the validation split of ``task``'s corpus.

    The split is tiled by consecutive non-overlapping windows of ``context`` characters (every
    character but the last few is a target once; at most ``limit`` windows), ``chunk`` windows
    per forward. Returns ``loss``, ``accuracy`` (greedy next character), ``targets`` and
    ``windows``, and ``whole_split`` (False when ``limit`` cut it short).
    """
    val = task if getattr(task, "split", "val") == "val" else dataclasses.replace(task, split="val")
    total = (val.ids.numel() - 1) // context
    windows = total if limit is None else min(total, limit)
    out = evaluate_loss(model, val.windows(context, batch_size=chunk, limit=windows), chunk=chunk)
    return dict(out, windows=windows, whole_split=windows == total)


def positionwise_rows(model, corpus: str | None, L: int, context: int, chunk: int, limit: int,
                      device) -> list[dict]:
    """Rows of loss per position bucket at length L (see the module docstring), and one ``long``
    row with the loss over all L positions, its source, wall time and storage."""
    from poslab.probes.lm_streaming import MEMORY_LIMIT, linear_buckets, log_buckets, positionwise_loss, text_window

    width = max(1, context // 4)
    buckets = log_buckets(L) + (linear_buckets(L, width) if L <= 64 * width else [])
    start = time.perf_counter()
    if L <= context:  # the model's forward over the split's windows
        got = position_losses(model, CharText(corpus=corpus, split="val").windows(L, batch_size=chunk, limit=limit),
                              device)
        per = got.per_position.numpy()
        sums = [(float(per[lo:hi].sum()), hi - lo) for lo, hi in buckets]
        loss, accuracy, windows, source, storage = got.loss, got.accuracy, got.windows, "validation split", "forward"
    else:  # one window, streamed in bounded memory
        tokens, source = text_window(corpus, L, field="eval.lengths")
        on_cpu = torch.device(device).type == "cpu"  # an accelerator keeps the stream in its own memory
        out = positionwise_loss(model, tokens, chunk=chunk * STREAM_CHUNK["cpu" if on_cpu else "accelerator"],
                                buckets=buckets, device=device, memory_limit=MEMORY_LIMIT if on_cpu else 16 << 30)
        sums = list(zip(out.sums.tolist(), out.counts.tolist(), strict=False))
        loss, accuracy, windows, storage = out.loss, out.accuracy, 1, f"streamed ({out.storage})"
    seconds = time.perf_counter() - start
    rows = [dict(probe="long", length=L, context=context, loss=loss, accuracy=accuracy, windows=windows,
                 source=source, seconds=seconds, storage=storage)]
    rows += [dict(probe="positionwise", length=L, context=context, bucket_start=lo, bucket_end=hi - 1,
                  position=max(0.5, (lo + hi - 1) / 2), scale="log" if i < len(log_buckets(L)) else "linear",
                  loss=s / c, positions=c, windows=windows, source=source)
             for i, ((lo, hi), (s, c)) in enumerate(zip(buckets, sums, strict=False))]
    return rows


def context_loss_rows(model_at: Callable[[int], torch.nn.Module], text, lengths: Sequence[int], context: int, *,
                      n: int, chunk: int, device, buckets: int = 4) -> list[dict]:
    """:func:`~poslab.probes.positionwise.loss_rows` on ``text`` (a text task's split) with
    ``buckets`` equal-width position buckets per training ``context`` (width context // buckets, at
    least 1): a ``loss`` row and ``positionwise`` rows per length, ``model_at(L)`` the model at L."""
    return loss_rows(model_at, text, lengths, max(1, context // buckets), n=n, chunk=chunk, device=device)


def train_timing(timings: dict, train: TrainConfig) -> dict:
    """A member row's training fields from the runner's ``ctx.timings`` (see the module docstring):
    the last training loss, the ensemble's wall time and size and, where the runner timed it,
    seconds per member, tokens per second, ms per step and the machine's seconds per member."""
    seconds, size = timings.get("group_train_seconds"), timings.get("group_size")
    threads, cores = timings.get("train_threads"), timings.get("cores")
    row = dict(final_train_loss=(timings.get("final_loss") or [None])[-1], train_seconds=seconds, group_size=size)
    if seconds and size:
        row.update(seconds_per_member=seconds / size, ms_per_step=seconds / train.steps * 1e3,
                   tokens_per_s=train.steps * train.batch_size * train.max_length * size / seconds)
        if threads and cores:  # the machine's wall time per member when every core is busy like this group's
            row.update(train_threads=threads, cores=cores, machine_seconds_per_member=seconds / size * threads / cores)
    return row


def curve_rows(curve: Sequence[float] | None, points: int = 100) -> list[dict]:
    """About ``points`` ``curve`` rows of the training loss, each the mean over the steps since the last."""
    if not curve:
        return []
    every = max(1, len(curve) // points)
    return [dict(probe="curve", step=s + 1, train_loss=float(np.mean(curve[max(0, s - every + 1):s + 1])))
            for s in range(every - 1, len(curve), every)]
