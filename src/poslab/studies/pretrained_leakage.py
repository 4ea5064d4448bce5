"""Positional leakage where attention sinks exist: a pretrained checkpoint (seed 001, third abstract).

The leakage study (``poslab.studies.leakage``) trains small models; this one reads a pretrained
checkpoint, where sinks are known to form, through its own ``collect`` (poslab.pretrained), on
``windows`` windows of ``length`` tokens of the checkpoint's tokenization of TinyShakespeare's
validation split, in two input modes (the ``bos`` column):

    "with BOS"      the checkpoint's BOS token, then length - 1 text tokens
    "without BOS"   length text tokens (a content token at position 0)

Per layer and head, in each mode:

- ``sink_share``: the mean attention weight on key 0 of queries i >= ``first_query`` (16); a head
  is a sink head when it is >= 0.3 (``probes.leakage.SINK_THRESHOLD``, the leakage study's bar);
- components (a) and (b), and (b) at early queries i < ``first_query``, with the corrected
  decomposition of ``probes/leakage.py`` (centred logits, cross-fitted halves; the checkpoint's own
  sliding window if it has one).

The closed-system check (``probe="closed"``): per layer (0: the embedding, l: leaving layer l),
the mean pairwise cosine of the position-0 residual across the windows, with BOS at 0 (the same
token everywhere: 1 by causality) and with each window's own first token at 0.

Presets: quick = a tiny random Llama built in code (64-token context; windows of 48 tokens; the
sink and (b) claims are n.a. on random weights, the causal-mask (a) and the closed-system check are
architectural and judged); cpu = SmolLM2-135M (``smollm2-135m``), 4 windows of 512 tokens.
No inference-time variant (NTK-scaled RoPE, sliding window) of the checkpoint is run here.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from poslab.errors import ConfigError, check_choice
from poslab.experiments.config import StudyConfig
from poslab.experiments.outputs import Column, Lines, Table, write_outputs
from poslab.experiments.runner import Experiment
from poslab.experiments.spec import ClaimSpec, above, judge_all, maximum, mean, minimum, probe
from poslab.store import config_hash, git_revision
from poslab.studies.leakage import PRESENT

PRESETS = ("quick", "cpu")
TINY = "tiny-llama"
MODES = ("with BOS", "without BOS")
SETTINGS = ("checkpoint", "length", "windows", "first_query", "dtype")

MODEL = probe("model")  # derived: one row per mode, means over layers and heads
CLAIMS = [
    ClaimSpec(name="{bos}: sink heads exist", paper="sinks read downstream by sink-reading heads",
              where=MODEL, per=("bos",), measure=maximum("sink_heads", "sink heads (key-0 share >= 0.3)"),
              op=">=", threshold=1.0, note="queries i >= first_query"),
    ClaimSpec(name="{bos}: component (a) present", paper="present in all three architectures", where=MODEL,
              per=("bos",), measure=mean("component_a", "mean (a) over layers and heads"), op=">=",
              threshold=PRESENT),
    ClaimSpec(name="{bos}: component (b) present", paper="present in all three architectures", where=MODEL,
              per=("bos",), measure=mean("component_b", "mean (b) over layers and heads"), op=">=",
              threshold=PRESENT),
    ClaimSpec(name="BOS at 0: position-0 residual identical across inputs", paper="constant fingerprint with BOS",
              where=probe("closed"), measure=minimum("bos_at_0", "min cosine over layers"), op=">",
              threshold=0.9999),
    ClaimSpec(name="content token at 0: position-0 residual varies with it", paper="varies with the token otherwise",
              where=probe("closed") & above("layer", 0), measure=mean("content_at_0", "mean cosine after layer 1 on"),
              op="<", threshold=0.99),
]
TRAINED_ONLY = ("sink heads exist", "component (b) present")  # n.a. on random weights

TABLES = [
    Table("Sinks and components per mode", by=("bos",), where=MODEL,
          intro="Means over layers and heads. Sink share: mean weight on key 0 of queries i >= first_query.",
          columns=(Column("sink heads", "sink_heads", 0), Column("sink share", "sink_share"),
                   Column("(a)", "component_a"), Column("(b)", "component_b"),
                   Column("early (b)", "early_component_b"))),
    Table("By layer", by=("bos", "layer"), where=probe("head"), intro="Mean ± std over heads.",
          columns=(Column("sink share", "sink_share"), Column("share of sink heads", "sink"),
                   Column("(a)", "component_a"), Column("(b)", "component_b"),
                   Column("early (b)", "early_component_b"))),
    Table("Closed-system check: position-0 residual across inputs", by=("layer",), where=probe("closed"),
          intro="Mean pairwise cosine of the position-0 residual over the windows (layer 0: the embedding).",
          columns=(Column("BOS at 0", "bos_at_0", 6), Column("content token at 0", "content_at_0", 6))),
]
FIGURES = [Lines(f"fig_{y}_by_layer.png", x="layer", y=y, series=("bos",), where=probe("head"), hline=0.0,
                 ylabel=label, title=label)
           for y, label in (("sink_share", "attention on key 0 (queries >= first_query)"),
                            ("component_a", "(a) causal-mask normaliser share"),
                            ("component_b", "(b) key position and interactions"))]


def study(preset: str) -> StudyConfig:
    check_choice("preset", preset, PRESETS)
    if preset == "quick":
        model = dict(checkpoint=TINY, length=48, windows=8, first_query=16, dtype="float32")
    else:
        model = dict(checkpoint="smollm2-135m", length=512, windows=4, first_query=16, dtype="float32")
    return StudyConfig(model_type="pretrained", model=model, task_type="text", task=dict(split="val"),
                       grid={"model.bos": MODES}, seeds=1)


# ----------------------------------------------------------------------------- checks (before any work)

def settings(study: StudyConfig) -> dict:
    m = dict(study.model)
    for key in m:
        if key not in (*SETTINGS, "bos"):
            raise ConfigError(f"model.{key}", key, ", ".join(SETTINGS))
    for key in SETTINGS:
        if key not in m:
            raise ConfigError(f"model.{key}", None, "set by the preset")
    for key, lo in (("length", 8), ("windows", 4), ("first_query", 1)):
        if not isinstance(m[key], int) or isinstance(m[key], bool) or m[key] < lo:
            raise ConfigError(f"model.{key}", m[key], f"an integer >= {lo}")
    if m["first_query"] >= m["length"]:
        raise ConfigError("model.first_query", m["first_query"], f"an integer below model.length ({m['length']})")
    check_choice("model.dtype", m["dtype"], ("float32",))
    for mode in study.axis("model.bos"):
        check_choice("model.bos", mode, MODES)
    return m


def check(study: StudyConfig) -> None:
    from poslab.pretrained.loading import read_config, require_transformers
    from poslab.pretrained.model import require_attention_fits
    from poslab.studies.pretrained_extension import checkpoint_source

    m = settings(study)
    require_transformers()
    cfg = read_config(checkpoint_source(m["checkpoint"]))
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    require_attention_fits("model.length", m["length"], m["length"], heads, layers, batch=2,
                           what="scores and patterns (collect, with and without BOS)")


# ----------------------------------------------------------------------------- the run

def run(study: StudyConfig, *, store, out: Path, device: str = "cpu", force: bool = False,
        progress: bool = True) -> dict:
    """Evaluate each mode the store lacks (keyed by the weights' hash and the settings); then the report."""
    from poslab.pretrained.loading import content_hash
    from poslab.studies.pretrained_extension import checkpoint_source

    start = time.perf_counter()
    m = settings(study)
    source = checkpoint_source(m["checkpoint"])
    members = []
    for mode in study.axis("model.bos"):
        config = dict(experiment=EXPERIMENT.name, checkpoint=content_hash(source), bos=mode,
                      **{k: m[k] for k in SETTINGS if k != "checkpoint"}, text=dict(study.task))
        members.append((config_hash(config), config))
    keys = [k for k, _ in members]
    if force:
        for k in keys:
            store.delete(k)
    done = {r["key"] for r in store.runs(experiment=EXPERIMENT.name)} & set(keys)
    todo = [(k, c) for k, c in members if k not in done]
    if todo:
        from poslab.pretrained.model import encode_text, load
        from poslab.tasks.text import CharText

        model = load(source.path if source.kind != "hub" else source.name, dtype=m["dtype"], device=device)
        ids = encode_text(model, CharText(**study.task).text)
        revision = git_revision(Path(__file__).parent)
        for i, (key, config) in enumerate(todo):
            if progress:
                print(f"pretrained-leakage {i + 1}/{len(todo)}: {config['bos']}", flush=True)
            t0 = time.perf_counter()
            rows = evaluate_mode(model, ids, config)
            store.record(key, experiment=EXPERIMENT.name, config=config, rows=rows, status="finished",
                         timings=dict(eval_seconds=time.perf_counter() - t0), revision=revision)
    rows = store.rows(keys=keys)
    files = report(rows, study, out)
    return dict(members=len(members), trained=len(todo), reused=len(members) - len(todo), variants=0, evaluated=0,
                seconds=time.perf_counter() - start, files=files)


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


def evaluate_mode(model, ids: torch.Tensor, config: dict) -> list[dict]:
    """Rows of one mode: per (layer, head) sinks and components, per layer the closed-system check."""
    from poslab.probes import leakage as lk
    from poslab.tasks.base import Batch

    tokens = windows(model, ids, config)
    n, L, q0 = tokens.shape[0], tokens.shape[1], config["first_query"]
    batch = Batch(tokens=tokens, targets=tokens, lengths=torch.full((n,), L),
                  loss_mask=torch.ones_like(tokens, dtype=torch.bool))
    comp = lk.leakage(model, batch, early=q0, chunk=2)
    share = []
    for part in range(0, n, 2):  # mean weight on key 0 of queries i >= first_query, [l, h]
        inter = model.collect(Batch(tokens=tokens[part:part + 2], targets=tokens[part:part + 2],
                                    lengths=batch.lengths[part:part + 2], loss_mask=batch.loss_mask[part:part + 2]))
        share.append(torch.stack([x.pattern[:, :, q0:, 0].double().sum((0, 2)) for x in inter.layers]))
    sink_share = (sum(share) / (n * (L - q0))).numpy()
    rows = []
    for layer in range(model.n_layers):
        for head in range(model.n_heads):
            rows.append(dict(probe="head", bos=config["bos"], layer=layer, head=head,
                             sink_share=float(sink_share[layer, head]),
                             sink=float(sink_share[layer, head] >= lk.SINK_THRESHOLD),
                             **{k: float(comp[k][layer, head]) for k in ("component_a", "component_b",
                                                                          "early_component_b", "received_0")}))
    if config["bos"] == "with BOS":  # the closed-system check, both position-0 inputs, on the same windows
        content = windows(model, ids, dict(config, bos="without BOS"))
        cos = {name: position0_cosines(model, t) for name, t in (("bos_at_0", tokens), ("content_at_0", content))}
        rows += [dict(probe="closed", layer=k, bos_at_0=float(cos["bos_at_0"][k]),
                      content_at_0=float(cos["content_at_0"][k])) for k in range(model.n_layers + 1)]
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

def derived_rows(rows: list[dict]) -> list[dict]:
    """probe="model" per mode: means over layers and heads, and the count of sink heads."""
    out = []
    for mode in MODES:
        heads = [r for r in rows if r.get("probe") == "head" and r.get("bos") == mode]
        if heads:
            out.append(dict(probe="model", bos=mode, sink_heads=float(sum(r["sink"] for r in heads)),
                            **{k: float(np.mean([r[k] for r in heads])) for k in
                               ("sink_share", "component_a", "component_b", "early_component_b")}))
    return out


def claims_for(study: StudyConfig) -> list[ClaimSpec]:
    """CLAIMS; on the quick preset's random checkpoint the sink and (b) claims are n.a."""
    if study.model.get("checkpoint") != TINY:
        return CLAIMS
    return [dataclasses.replace(c, op=None, threshold=None, tol=None, na="a random tiny checkpoint (quick preset: "
                                "the code path) has no trained sinks") if any(t in c.name for t in TRAINED_ONLY)
            else c for c in CLAIMS]


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    all_rows = rows + derived_rows(rows)
    m = study.model
    intro = (f"Checkpoint `{m.get('checkpoint')}`, {m.get('windows')} windows of {m.get('length')} tokens of "
             f"TinyShakespeare ({study.task.get('split', 'val')} split); sinks at queries >= {m.get('first_query')}, "
             f"early (b) at queries < {m.get('first_query')}.")
    return write_outputs(out, title=EXPERIMENT.title, rows=all_rows, claims=judge_all(claims_for(study), all_rows),
                         intro=intro, tables=TABLES, figures=FIGURES)


EXPERIMENT = Experiment(name="pretrained-leakage", title="Positional leakage on a pretrained model (seed 001)",
                        study=study, evaluate=lambda ctx: [], report=report, presets=PRESETS, check=check, run=run)
