"""Character-level language models on TinyShakespeare, anchored on nanoGPT's ``shakespeare_char``.

    loss = - 1/N sum_t log p(c_{t+1} | c_{<=t})        over every character of the validation split

A causal pre-LN :class:`~poslab.models.transformer.Transformer` trained on windows of the
corpus (task ``text``), one member per encoding x seed. The ``paper`` preset is nanoGPT's own CPU
recipe for this corpus: 4 layers, 4 heads, width 128, context 64, batch 12, 2000 iterations,
AdamW at lr 1e-3 (betas 0.9 / 0.99, weight decay 0.1 on matrices only), 100 warm-up steps, cosine
to 1e-4, gradient clip 1.0, no biases, dropout 0, learned absolute positions; nanoGPT reports
validation loss 1.886 in 74.6 s on the issue's machine (0.80M parameters, ~31 ms/iteration).
``gpu`` is its GPU recipe (6 layers, 6 heads, width 384, context 256, batch 64, 5000 iterations,
dropout 0.2; 1.47 published). ``quick`` runs in seconds, for the tests.

Differences from nanoGPT that stay: the readout U is not tied to the token embedding W_E, and
weights start at poslab's initialisation (W_E ~ N(0, 1), uniform 1/sqrt(fan_in) projections),
not nanoGPT's N(0, 0.02).

Evaluation (:func:`validation_loss`): the mean cross-entropy over the WHOLE validation split (the
last 10% of the corpus), tiled by consecutive non-overlapping windows of the training context,
``eval.chunk`` windows per forward; at most ``eval.n_sequences`` windows (the presets' value
exceeds the split's count, so rows say ``whole_split``). nanoGPT's 1.886 is an estimate from
200 random batches of 12 windows instead.

Position-wise loss (``eval.lengths``, default: the training context): the cross-entropy at each
position t of a window of L characters, averaged over position buckets (log-spaced 0, 1, [2, 4),
[4, 8), ... and, where L <= 64 x context / 4, the context-extension study's linear ones of width
context / 4). At L <= the context it is the mean over the split's non-overlapping windows (at
most ``eval.n_sequences``), from the model's forward; past the context it is ONE window, the
first L + 1 characters of the validation split, or, when the split is shorter (TinyShakespeare's
holds 111,540), of the whole corpus, whose start is training text (rows say so in ``source``:
that loss measures positional extrapolation, not held-out generalization), evaluated exactly in
bounded memory by :func:`poslab.probes.lm_streaming.positionwise_loss` (layer by layer, online
softmax over key chunks of ``eval.chunk`` x 8 positions on CPU, x 64 on an accelerator; stream
and keys on disk past 256 MiB on CPU, in device memory up to 16 GiB on an accelerator).
Lengths past the context need an encoding that streams (no Shaw, no length-dependent schedule).
Tables are as long as the training context whatever the eval lengths (:func:`table_length`), so
the trained model is the one the default run trains, and a learned APE past its table meets its
``out_of_range`` policy: ``error`` (the default) refuses before any work, ``clamp`` streams.
``--set eval.lengths=[64,100000,1000000] --set grid.encoding=[rope]``; ~1e3 L^2 flops for the
paper model, so 10^6 is for a GPU (``--device``).

Every member's row also carries its training wall time and throughput: ``train_seconds`` is the
ensemble's wall time (members of one encoding train together), ``seconds_per_member`` that
divided by the members in the group, ``tokens_per_s`` the characters per second over all of them;
``train_threads`` of the machine's ``cores`` trained the group, so ``machine_seconds_per_member``
= seconds_per_member x train_threads / cores is the machine's wall time per member when every
core works like this group (two groups side by side, one core each, on two cores: half their
wall time each). The claim on nanoGPT's 74.6 s reads that.

Other studies reuse the recipe: :func:`lm_study` (``encodings=``, any StudyConfig changes) and
:func:`validation_loss`; ``poslab sample`` reads stored members through :mod:`poslab.sampling`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from poslab.errors import ConfigError, check_choice
from poslab.experiments.config import EvalConfig, StudyConfig
from poslab.experiments.outputs import Column, Lines, Table, write_outputs
from poslab.experiments.runner import Experiment
from poslab.experiments.spec import ClaimSpec, is_, judge_all, mean, probe
from poslab.probes.positionwise import position_losses
from poslab.tasks.text import CharText
from poslab.train import evaluate_loss, lm_recipe

name = "lm"
title = "Character-level LM on TinyShakespeare (nanoGPT shakespeare_char recipe)"

PRESETS = ("paper", "gpu", "quick")

# nanoGPT's figures for its recipes (README and the measurement on its CPU).
NANOGPT = dict(paper=dict(val_loss=1.886, seconds=74.6, params=0.80e6, ms_per_iter=31.0),
               gpu=dict(val_loss=1.47))
TARGET_LOSS = 1.90  # the target for learned APE, paper preset

# Per preset: model fields, context, and the training recipe.
RECIPES = {
    "paper": dict(model=dict(d_model=128, n_layers=4, n_heads=4, bias=False, dropout=0.0), context=64,
                  batch_size=12, steps=2000, warmup_steps=100),
    "gpu": dict(model=dict(d_model=384, n_layers=6, n_heads=6, bias=False, dropout=0.2), context=256,
                batch_size=64, steps=5000, warmup_steps=100),
    "quick": dict(model=dict(d_model=32, n_layers=2, n_heads=2, bias=False, dropout=0.0), context=32,
                  batch_size=8, steps=30, warmup_steps=5),
}
ENCODINGS = ("learned", "rope")
COLUMNS = ["probe", "encoding", "seed", "context", "val_loss", "val_accuracy", "val_windows", "val_targets",
           "whole_split", "train_seconds", "group_size", "seconds_per_member", "train_threads", "cores",
           "machine_seconds_per_member", "tokens_per_s", "ms_per_step", "params", "final_train_loss", "length",
           "bucket_start", "bucket_end", "scale", "loss", "positions", "windows", "source", "seconds", "storage"]
CHECKS_EVAL_LENGTHS = True  # check() validates eval.lengths: past the split, against the whole corpus
STREAM_CHUNK = dict(cpu=8, accelerator=64)  # streamed block = eval.chunk x this positions (eval.chunk counts
# windows): 512 was the fastest on this CPU; an accelerator wants fewer, larger blocks (kernel launches)


def lm_study(preset: str = "paper", encodings: tuple[str, ...] | None = None, **changes) -> StudyConfig:
    """The LM study of ``preset`` over ``encodings`` (default: learned APE and RoPE).

    ``changes`` are StudyConfig fields; the dict fields ``model``, ``task`` and
    ``encoding_options`` are merged into the preset's, and ``train`` / ``eval`` may be given as
    dicts of fields to replace (``train=dict(steps=500)``) or as whole configs.
    """
    check_choice("preset", preset, PRESETS)
    r = RECIPES[preset]
    L = r["context"]
    train = lm_recipe(steps=r["steps"], batch_size=r["batch_size"], context=L, warmup_steps=r["warmup_steps"])
    ev = EvalConfig(lengths=(L,), n_sequences=64 if preset == "quick" else 1 << 20, seed=0, chunk=64)
    encodings = tuple(encodings or ENCODINGS)
    study = StudyConfig(model_type="transformer", model=dict(r["model"]), task_type="text", task={},
                        encoding=encodings[0], grid={"encoding": encodings}, seeds=1 if preset == "quick" else 2,
                        train=train, eval=ev)
    for key in ("model", "task", "encoding_options"):
        if key in changes:
            changes[key] = {**getattr(study, key), **changes[key]}
    for key in ("train", "eval"):
        if isinstance(changes.get(key), dict):
            changes[key] = dataclasses.replace(getattr(study, key), **changes[key])
    return dataclasses.replace(study, **changes)


def study(preset: str) -> StudyConfig:
    return lm_study(preset)


def check(study: StudyConfig) -> None:
    """A character-level task trained on one context length; eval lengths that fit the corpus, and
    past the context, members whose model streams (:func:`~poslab.probes.lm_streaming.check_streamable`)."""
    from poslab.experiments.runner import members, variant_members
    from poslab.probes.lm_streaming import check_streamable, text_window

    if not hasattr(_task_class(study.task_type), "windows"):
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
        trained = members(name, study)
        for member in trained + [variant for variant, _ in variant_members(name, study, trained)]:
            check_streamable(member.model_config)


def table_length(study: StudyConfig) -> int:
    """Positions the model's tables hold (the runner asks): the training context, not the longest
    eval length, as nanoGPT's block_size; longer windows are extrapolation."""
    return study.train.max_length


def _task_class(task_type: str):
    from poslab.tasks import TASKS

    return TASKS.get(task_type, object)


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


def positionwise(model, corpus: str | None, L: int, context: int, chunk: int, limit: int, device) -> list[dict]:
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


def evaluate(ctx) -> list[dict]:
    study = ctx.study
    L = study.train.max_length
    val = validation_loss(ctx.model, ctx.task, L, study.eval.chunk, limit=study.eval.n_sequences)
    timings = getattr(ctx, "timings", None) or {}
    seconds, size = timings.get("group_train_seconds"), timings.get("group_size")
    threads, cores = timings.get("train_threads"), timings.get("cores")
    row = dict(probe="lm", context=L, val_loss=val["loss"], val_accuracy=val["accuracy"], val_windows=val["windows"],
               val_targets=val["targets"], whole_split=val["whole_split"],
               params=sum(p.numel() for p in ctx.model.parameters()),
               final_train_loss=(timings.get("final_loss") or [None])[-1], train_seconds=seconds, group_size=size)
    if seconds and size:
        steps, batch = study.train.steps, study.train.batch_size
        row.update(seconds_per_member=seconds / size, tokens_per_s=steps * batch * L * size / seconds,
                   ms_per_step=seconds / steps * 1e3)
        if threads and cores:  # the machine's wall time per member when every core is busy like this group's
            row.update(train_threads=threads, cores=cores, machine_seconds_per_member=seconds / size * threads / cores)
    rows = [row]
    for length in study.eval.lengths:
        rows += positionwise(ctx.model, study.task.get("corpus"), length, L, study.eval.chunk, study.eval.n_sequences,
                             ctx.device)
    curve = timings.get("loss_curve")
    if curve:
        every = max(1, len(curve) // 100)
        rows += [dict(probe="curve", step=s + 1, train_loss=float(np.mean(curve[max(0, s - every + 1):s + 1])))
                 for s in range(every - 1, len(curve), every)]
    return rows


# ----------------------------------------------------------------------------- report

PAPER_PRESET = is_("paper_preset", True)
OTHER_RECIPE = "not the paper preset's recipe: nanoGPT's figure is for its own"
CLAIMS = [
    ClaimSpec(name="learned APE: validation loss, whole split (paper preset)",
              paper=f"nanoGPT {NANOGPT['paper']['val_loss']} (20-batch estimate)",
              where=probe("lm") & is_("encoding", "learned") & PAPER_PRESET, measure=mean("val_loss"), op="<=",
              threshold=TARGET_LOSS, note="mean over {seeds} seeds; nanoGPT's own figure: 1.886"),
    ClaimSpec(name="learned APE: validation loss, whole split (this run's recipe)",
              paper=f"nanoGPT {NANOGPT['paper']['val_loss']} (20-batch estimate)",
              where=probe("lm") & is_("encoding", "learned") & is_("paper_preset", False), measure=mean("val_loss"),
              na=OTHER_RECIPE),
    ClaimSpec(name="RoPE: validation loss below learned APE at the same budget", paper="lower",
              where=probe("pair"), measure=mean("rope_minus_learned", "mean RoPE - mean learned APE"), op="<",
              threshold=0.0, note="means over {seeds} seeds"),
    ClaimSpec(name="{encoding}: training wall time per member (paper preset)",
              paper=f"nanoGPT {NANOGPT['paper']['seconds']} s", where=probe("lm") & PAPER_PRESET, per=("encoding",),
              measure=mean("machine_seconds_per_member"), op="<=", threshold=NANOGPT["paper"]["seconds"],
              note="the machine's wall time per member (group wall time / members x threads / cores), mean over "
                   "{seeds} seeds; noisy on a shared machine"),
    ClaimSpec(name="{encoding}: training wall time per member (this run's recipe)",
              paper=f"nanoGPT {NANOGPT['paper']['seconds']} s", where=probe("lm") & is_("paper_preset", False),
              per=("encoding",), measure=mean("machine_seconds_per_member"), na=OTHER_RECIPE),
]


def _seeds(group: list[dict]) -> str:
    return ", ".join(str(r["seed"]) for r in group)


TABLES = [
    Table("Validation loss", by=("encoding",), where=probe("lm"), columns=(
        Column("val loss", "val_loss"), Column("seeds", _seeds),
        Column("s / member", lambda g: _mean(g, "seconds_per_member", "{:.1f}")),
        Column("tokens / s", lambda g: _mean(g, "tokens_per_s", "{:,.0f}")),
        Column("parameters", lambda g: f"{g[0]['params']:,}"),
        Column("windows", lambda g: f"{g[0]['val_windows']} x {g[0]['context']}"
                                    + (" (whole split)" if g[0]["whole_split"] else "")))),
    Table("Position-wise loss at the eval lengths", by=("length", "encoding"), where=probe("long"), columns=(
        Column("loss", "loss"), Column("seeds", _seeds), Column("windows", lambda g: g[0]["windows"]),
        Column("source", lambda g: g[0]["source"]), Column("seconds", lambda g: _mean(g, "seconds", "{:.1f}")),
        Column("evaluated", lambda g: g[0]["storage"])),
        intro="Mean cross-entropy over all L positions of the window(s); per-bucket values in rows.csv (probe = "
              "positionwise) and lm_positionwise.png. Past the context it is one window evaluated streamed; a "
              "source that includes training text measures positional extrapolation, not held-out generalization."),
]
FIGURES = [
    Lines("lm_loss.png", x="step", y="train_loss", series=("encoding", "seed"), where=probe("curve"),
          hline=NANOGPT["paper"]["val_loss"], xlabel="step", ylabel="training loss (nats / char)",
          title="training loss (dotted: nanoGPT val 1.886)"),
    Lines("lm_positionwise.png", x="position", y="loss", series=("encoding", "length"),
          where=probe("positionwise") & is_("scale", "log"), logx=True, vline=lambda rows: rows[0]["context"],
          xlabel="position t (log-spaced buckets)", ylabel="loss (nats / char)",
          title="loss vs position (dashed: context)"),
]


def _mean(group: list[dict], column: str, form: str) -> str:
    vals = [r[column] for r in group if r.get(column) is not None]
    return form.format(float(np.mean(vals))) if vals else ""


def derived(rows: list[dict], study: StudyConfig) -> list[dict]:
    """Rows with the ``paper_preset`` flag the claims read, and one ``pair`` row (RoPE - learned APE)."""
    paper = study.train.steps == 2000 and study.train.max_length == 64 and study.model.get("d_model") == 128
    out = [{**r, "paper_preset": paper} for r in rows]
    lm = [r for r in rows if r.get("probe") == "lm"]
    by = {e: [r["val_loss"] for r in lm if r["encoding"] == e] for e in ("learned", "rope")}
    if by["learned"] and by["rope"]:
        out.append(dict(probe="pair", rope_minus_learned=float(np.mean(by["rope"]) - np.mean(by["learned"])),
                        seed=0, paper_preset=paper))
    return out


def claims(rows: list[dict], study: StudyConfig):
    return judge_all(CLAIMS, derived(rows, study))


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    t = study.train
    intro = (f"Validation loss: mean cross-entropy per character (nats) over the validation split (last 10%), "
             f"non-overlapping windows of the context; mean ± std over seeds. Recipe: {study.model}, context "
             f"{t.max_length}, batch {t.batch_size}, {t.steps} steps, AdamW lr {t.lr} -> {t.min_lr} (cosine, "
             f"{t.warmup_steps} warm-up), weight decay {t.weight_decay}. s / member = the ensemble's training time / "
             f"its members (its group's cores, not the machine, in rows.csv: train_threads of cores); timings depend "
             f"on the machine's load. nanoGPT (paper preset recipe): {NANOGPT['paper']['val_loss']} in "
             f"{NANOGPT['paper']['seconds']} s; gpu recipe: {NANOGPT['gpu']['val_loss']}.")
    kept = [r for r in rows if r.get("probe") in ("lm", "long", "positionwise")]
    return write_outputs(out, title=title, rows=rows, claims=claims(rows, study), intro=intro, tables=TABLES,
                         figures=FIGURES, csv_rows=kept, columns=COLUMNS)


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, presets=PRESETS,
                        check=check, table_length=table_length, checks_eval_lengths=CHECKS_EVAL_LENGTHS)
