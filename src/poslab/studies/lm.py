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
:func:`validation_loss`; :func:`load_member` and :func:`generate` serve ``poslab sample``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import matplotlib

from poslab.experiments.runner import Experiment

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from poslab.errors import ConfigError, check_choice  # noqa: E402
from poslab.experiments.claims import Claim, claims_markdown, markdown_table, write_claims  # noqa: E402
from poslab.experiments.config import EvalConfig, StudyConfig  # noqa: E402
from poslab.experiments.outputs import fmt, group_stats, save, select, write_csv  # noqa: E402
from poslab.tasks.text import CharText  # noqa: E402
from poslab.train import TrainConfig, evaluate_loss  # noqa: E402

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
    train = TrainConfig(steps=r["steps"], batch_size=r["batch_size"], lr=1e-3, optimizer="adamw", betas=(0.9, 0.99),
                        weight_decay=0.1, decay_1d=False, lr_schedule="cosine", warmup_steps=r["warmup_steps"],
                        min_lr=1e-4, min_length=L, max_length=L, grad_clip=1.0)
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
        total, windows = torch.zeros(L, dtype=torch.float64), 0
        hits = 0
        val = CharText(corpus=corpus, split="val")
        with torch.no_grad():
            for batch in val.windows(L, batch_size=chunk, limit=limit):
                batch = batch.to(device)
                logits = model(batch.tokens)  # [b, L, m]
                total += F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none").double().sum(0).cpu()
                hits += int((logits.argmax(-1) == batch.targets).sum())
                windows += batch.size
        per = (total / windows).numpy()
        sums = [(float(per[lo:hi].sum()), hi - lo) for lo, hi in buckets]
        loss, accuracy, source, storage = float(per.mean()), hits / (windows * L), "validation split", "forward"
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
                  scale="log" if i < len(log_buckets(L)) else "linear", loss=s / c, positions=c, windows=windows,
                  source=source) for i, ((lo, hi), (s, c)) in enumerate(zip(buckets, sums, strict=False))]
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

def claims(rows: list[dict], study: StudyConfig) -> list[Claim]:
    lm = select(rows, "lm")
    loss = group_stats(lm, ("encoding",), "val_loss")
    timed = [r for r in lm if r.get("machine_seconds_per_member") is not None]
    wall = group_stats(timed, ("encoding",), "machine_seconds_per_member") if timed else {}
    out = []
    paper = study.train.steps == 2000 and study.train.max_length == 64 and study.model.get("d_model") == 128
    ref = NANOGPT["paper"]
    where = "paper preset" if paper else "this run's recipe (not the paper preset: compare with care)"
    if "learned" in {k[0] for k in loss}:
        m, s, n = loss[("learned",)]
        out.append(Claim(name=f"learned APE: validation loss, whole split ({where})",
                         paper=f"nanoGPT {ref['val_loss']} (20-batch estimate)", measured=m,
                         holds=(m <= TARGET_LOSS) if paper else None, criterion=f"<= {TARGET_LOSS}",
                         note=f"± {s:.3f} over {n} seeds; nanoGPT figure {ref['val_loss']}: "
                              f"{m - ref['val_loss']:+.3f}"))
    if ("learned",) in loss and ("rope",) in loss:
        rl, rr = loss[("learned",)][0], loss[("rope",)][0]
        out.append(Claim(name="RoPE: validation loss below learned APE at the same budget", paper="lower",
                         measured=f"{rr:.3f} vs {rl:.3f}", holds=rr < rl, criterion="rope < learned",
                         note=f"{loss[('rope',)][2]} and {loss[('learned',)][2]} seeds"))
    for (enc,), (m, _, _) in wall.items():
        cells = [r for r in timed if r["encoding"] == enc]
        sizes = sorted({r["group_size"] for r in cells})
        threads = sorted({r["train_threads"] for r in cells})
        alone = [r["seconds_per_member"] for r in cells if r["group_size"] == 1 and r["train_threads"] == r["cores"]]
        out.append(Claim(name=f"{enc}: training wall time per member ({where})", paper=f"nanoGPT {ref['seconds']} s",
                         measured=f"{m:.1f} s", holds=(m <= ref["seconds"]) if paper else None,
                         criterion=f"<= {ref['seconds']} s",
                         note=f"the machine's wall time per member: ensembles of {sizes} members, each group on "
                              f"{threads} of {cells[0]['cores']} cores (group wall time / members x threads / cores)"
                              + (f"; alone on every core: {np.mean(alone):.1f} s" if alone else "")
                              + "; noisy on a shared machine"))
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    lm = select(rows, "lm")
    long = select(rows, "long")
    files = [write_csv(lm + long + select(rows, "positionwise"), out / "rows.csv", COLUMNS)]
    body = []
    for enc in study.axis("encoding"):
        cells = [r for r in lm if r["encoding"] == enc]
        if not cells:
            continue
        loss = group_stats(cells, ("encoding",), "val_loss")[(enc,)]
        timed = [r for r in cells if r.get("seconds_per_member") is not None]
        body.append([enc, fmt(*loss[:2]), ", ".join(str(r["seed"]) for r in cells),
                     f"{np.mean([r['seconds_per_member'] for r in timed]):.1f}" if timed else "",
                     f"{np.mean([r['tokens_per_s'] for r in timed]):,.0f}" if timed else "",
                     f"{cells[0]['params']:,}", f"{cells[0]['val_windows']} x {cells[0]['context']}"
                     + (" (whole split)" if cells[0]["whole_split"] else "")])
    found = claims(rows, study)
    t = study.train
    text = [f"# {title}", "",
            f"Validation loss: mean cross-entropy per character (nats) over the validation split (last 10%), "
            f"non-overlapping windows of the context; mean ± std over seeds. Recipe: {study.model}, context "
            f"{t.max_length}, batch {t.batch_size}, {t.steps} steps, AdamW lr {t.lr} -> {t.min_lr} (cosine, "
            f"{t.warmup_steps} warm-up), weight decay {t.weight_decay}. s / member = the ensemble's "
            f"training time / its members (its group's cores, not the machine, in rows.csv: train_threads of cores); "
            f"timings depend on the machine's load.", "",
            markdown_table(["encoding", "val loss", "seeds", "s / member", "tokens / s", "parameters", "windows"],
                           body), "",
            f"nanoGPT (paper preset recipe): {NANOGPT['paper']['val_loss']} in {NANOGPT['paper']['seconds']} s; "
            f"gpu recipe: {NANOGPT['gpu']['val_loss']}.", "",
            "## The targets beside this run", "", claims_markdown(found), ""]
    if long:
        cells = sorted({(r["encoding"], r["length"]) for r in long}, key=lambda k: (k[1], k[0]))
        body = []
        for enc, length in cells:
            got = [r for r in long if (r["encoding"], r["length"]) == (enc, length)]
            loss = group_stats(got, ("encoding",), "loss")[(enc,)]
            body.append([enc, f"{length:,}", fmt(*loss[:2]), ", ".join(str(r["seed"]) for r in got),
                         got[0]["windows"], got[0]["source"], f"{np.mean([r['seconds'] for r in got]):.1f}",
                         got[0]["storage"]])
        text += ["## Position-wise loss at the eval lengths", "",
                 f"Mean cross-entropy over all L positions of the window(s); per-bucket values in rows.csv "
                 f"(probe = positionwise) and lm_positionwise.png. Past the context ({t.max_length}) it is one "
                 f"window evaluated streamed; a source that includes training text measures positional "
                 f"extrapolation, not held-out generalization.", "",
                 markdown_table(["encoding", "L", "loss", "seeds", "windows", "source", "seconds", "evaluated"], body),
                 ""]
    (out / "table.md").write_text("\n".join(text))
    files += [out / "table.md", write_claims(found, out / "claims.json")]
    files += figures(rows, study, out)
    return files


def figures(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for enc in study.axis("encoding"):
        for seed in sorted({r["seed"] for r in select(rows, "curve", encoding=enc)}):
            pts = select(rows, "curve", encoding=enc, seed=seed)
            ax.plot([r["step"] for r in pts], [r["train_loss"] for r in pts], lw=1, label=f"{enc}, seed {seed}")
        for r in select(rows, "lm", encoding=enc):
            ax.axhline(r["val_loss"], ls=":", lw=0.8, color="grey")
    ax.axhline(NANOGPT["paper"]["val_loss"], color="k", ls="--", lw=1, label="nanoGPT val 1.886")
    ax.set(xlabel="step", ylabel="training loss (nats / char)", title="character LM (dotted: validation)")
    ax.legend(fontsize=7)
    files = [save(fig, out / "lm_loss.png")]
    pos = [r for r in select(rows, "positionwise") if r.get("scale") == "log"]
    if pos:
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        for enc in study.axis("encoding"):
            for L in sorted({r["length"] for r in pos if r["encoding"] == enc}):
                cells = [r for r in pos if r["encoding"] == enc and r["length"] == L]
                spans = sorted({(r["bucket_start"], r["bucket_end"]) for r in cells})
                y = [np.mean([r["loss"] for r in cells if (r["bucket_start"], r["bucket_end"]) == b]) for b in spans]
                ax.semilogx([max(0.5, (a + b) / 2) for a, b in spans], y, "o-", ms=3, lw=1, label=f"{enc}, L={L:,}")
        ax.axvline(study.train.max_length, color="grey", ls="--", lw=1, label="training context")
        ax.set(xlabel="position t (log-spaced buckets)", ylabel="loss (nats / char)",
               title="character LM: loss vs position")
        ax.legend(fontsize=7)
        files.append(save(fig, out / "lm_positionwise.png"))
    return files


# ----------------------------------------------------------------------------- sampling

def load_member(store, key: str | None = None, *, experiment: str = "lm", encoding: str | None = None,
                seed: int = 0):
    """(model in eval mode, its task, run key) of a stored member: by run key, or the latest
    finished trained member of ``experiment`` with that encoding and seed."""
    from poslab.models import model_classes
    from poslab.tasks import build_task

    runs = store.runs()
    if key is not None:
        found = [r for r in runs if r["key"] == key]
        if not found:
            raise ConfigError("--run", key, "the key of a run in the store (poslab report lists them)")
    else:
        found = [r for r in runs if r["experiment"] == experiment and r["status"] == "finished"
                 and r["config"].get("variant") is None and r["config"].get("seed") == seed
                 and (encoding is None or r["config"]["model"].get("encoding") == encoding)]
        if not found:
            have = sorted({(r["config"]["model"].get("encoding"), r["config"].get("seed")) for r in runs
                           if r["experiment"] == experiment and "model" in r["config"]})
            raise ConfigError("--encoding/--seed", (encoding, seed),
                              f"a trained member of {experiment!r} in the store: {have or 'none'}")
    run = found[-1]
    config = run["config"]
    model_cls, cfg_cls = model_classes(config["model_type"])
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    model = model_cls(cfg_cls(**{k: v for k, v in config["model"].items() if k in fields}))
    model.load_state_dict(store.load_weights(run["key"]))
    task = build_task(config["task_type"], **config["task"])
    if not hasattr(task, "decode"):
        raise ConfigError("--run", run["key"], "a run trained on text (its task decodes tokens to characters)")
    return model.eval(), task, run


def generate(model, task, prompt: str, length: int, *, temperature: float = 0.8, context: int | None = None,
             generator: torch.Generator | None = None) -> str:
    """``length`` characters sampled after ``prompt`` from softmax(logits / temperature), each
    conditioned on the last ``context`` characters (default: the model's table length)."""
    if not (isinstance(length, int) and length >= 1):
        raise ConfigError("--length", length, "a positive integer")
    if not temperature > 0:
        raise ConfigError("--temperature", temperature, "a positive number")
    if not prompt:
        raise ConfigError("--prompt", prompt, "at least one character of the corpus")
    ids = task.encode(prompt)  # ConfigError for characters outside the vocabulary
    context = context or model.cfg.max_len - int(model.cfg.bos)
    out = ids.tolist()
    with torch.no_grad():
        for _ in range(length):
            window = torch.tensor(out[-context:])[None]  # [1, s]
            logits = model(window)[0, -1] / temperature  # [m]
            out.append(int(torch.multinomial(logits.softmax(-1), 1, generator=generator)))
    return task.decode(torch.tensor(out[len(ids):]))


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, presets=PRESETS,
                        check=check, table_length=table_length, checks_eval_lengths=CHECKS_EVAL_LENGTHS)
