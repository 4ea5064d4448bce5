"""Positional leakage where attention sinks exist: a pretrained checkpoint (seed 001, third abstract).

The leakage study (``poslab.studies.leakage``) trains small models; this one reads a pretrained
checkpoint, where sinks are known to form, through its own ``collect`` (poslab.pretrained), on
``windows`` windows of ``length`` tokens of the checkpoint's tokenization of TinyShakespeare's
validation split, in two input modes (the ``bos`` column):

    "with BOS"      the checkpoint's BOS token, then length - 1 text tokens
    "without BOS"   length text tokens (a content token at position 0)

The cpu preset's checkpoint is SmolLM2-135M-Instruct, quantised Q4_1 in a GGUF file (``smollm2-135m``,
poslab.pretrained.loading), dequantised to float32. Its tokenizer sets add_bos_token=False: "without
BOS" is its own set-up, and the abstract's auto-prepended BOS is not. Claims in that mode are
``paper``; claims "with BOS" (prepended explicitly here) are ``control``, labelled so in their names.

Per layer and head, in each mode:

- ``sink_share``: the mean attention weight on key 0 of queries i >= ``first_query`` (16); a head
  is a sink head when it is >= 0.3 (``probes.leakage.SINK_THRESHOLD``, the leakage study's bar);
- components (a) and (b), and (b) at early queries i < ``first_query``, with the corrected
  decomposition of ``probes/leakage.py`` (centred logits, cross-fitted halves; the checkpoint's own
  sliding window if it has one); (b) is split into its key-0 part (the residual product on the pairs
  (i, 0): position 0 read by the queries, the abstract's mechanism, judged) and the rest.

The closed-system check (``probe="closed"``): per layer (0: the embedding, l: leaving layer l),
the mean pairwise cosine of the position-0 residual across the windows, with BOS at 0 (the same
token everywhere: 1 by causality) and with each window's own first token at 0.

With BOS, the same windows are also read (the ``variant`` column):

- under two inference-time variants of the one checkpoint, standing in for the abstract's three
  architectures: NTK-scaled RoPE (``set_schedule``, factor ``ntk_factor``) and a sliding-window mask
  of ``window`` keys (``set_window``). They are the same weights under another position map or
  mask, not models trained that way: they show how (a) and (b) of these weights respond to the
  change, not what a model trained with NTK scaling or a window would learn;
- under the three BOS replacements of the leakage study (``probe="intervention"``): the most
  frequent token of the windows, a random vector of the BOS embedding's norm, and the mean token
  embedding, each put in place of the input embedding at position 0; the change of the mean early
  (b) is judged against the published -40% only where all three agree (all within 20 points, or all
  outside), else n.a. with their range: the abstract names no replacement.

Replicates: the windows are split into ``groups`` disjoint groups of consecutive windows, and every
per-head quantity above is computed on each group on its own (its own cross-fit), with the group
index in the ``seed`` column. One checkpoint has no training seeds; the groups are what another
sample of text would change, so tables give mean ± std over groups, and a quantity whose estimate
is 0 when absent is judged present when its group mean less two standard errors is above 0
(``lower_bound``, as the leakage study judges over seeds): (b) at key 0 and over every key, NTK's
suppression of (b) and the ordering margin, the last two paired within each group (the same windows
under each variant). (a) > 0 holds by construction under a causal mask (the leakage study's note):
a check. Removing key 0 in the sink heads (the leakage study's ``drop_key0``) is not run here:
the pretrained ``collect`` takes a BOS replacement only.

Presets: quick = a tiny random Llama built in code (64-token context; windows of 48 tokens; the
sink and (b) claims are n.a. on random weights, the closed-system check is architectural and
judged; 8 windows in 2 groups); cpu = SmolLM2-135M-Instruct Q4_1 (``smollm2-135m``), 16 windows of
512 tokens in 4 groups of 4. The leakage fit holds per-pair sums and solves its one-hot least
squares through the Gram matrix (:class:`poslab.probes.leakage.OneHotFit`), about 8 GiB at 512
tokens for 30 layers x 9 heads (:func:`poslab.probes.leakage.leakage_bytes`; the dense design and
pseudo-inverse it replaced needed about 22 GiB there, and a run was killed for memory on this
23 GiB machine, so the earlier cpu preset read 4 windows of 256 tokens). The BOS swaps read
windows cut at ``first_query``: their early (b) sees nothing later.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from poslab.errors import ConfigError, check_choice
from poslab.experiments import Experiment, no_member_rows
from poslab.experiments.config import StudyConfig
from poslab.experiments.outputs import Column, Lines, Table, mean_std, write_outputs
from poslab.experiments.spec import (
    ClaimSpec,
    above,
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
from poslab.probes import leakage as lk
from poslab.store import config_hash
from poslab.studies.kit import leakage_rows as lr
from poslab.studies.kit.checkpoints import TINY, checkpoint_source, loaded, source_path
from poslab.studies.kit.leakage_rows import PRESENT

PRESETS = ("quick", "cpu")
MODES = ("with BOS", "without BOS")
SETTINGS = ("checkpoint", "length", "windows", "groups", "first_query", "dtype", "ntk_factor", "window")
STANDARD, NTK, WINDOW = "standard", "NTK RoPE (inference)", "sliding window (inference)"
CHECKPOINT_NAMES = {"smollm2-135m": "SmolLM2-135M-Instruct, Q4_1 GGUF, dequantised; its tokenizer adds no BOS",
                    TINY: "a tiny random Llama built in code"}
SWAPS = {"token": "bos_token", "random": "bos_random", "mean": "bos_mean"}

MODEL = probe("model") & is_("variant", STANDARD)  # derived: one row per mode, variant and group, means over heads
OWN = is_("bos", "without BOS")  # the checkpoint's own set-up: its tokenizer adds no BOS
PREPENDED = is_("bos", "with BOS")
BOS_LABEL = "BOS prepended explicitly (the tokenizer sets add_bos_token=False)"
GROUPS = "{seeds} window groups (mean - 2 standard errors over them)"
KEY0 = ("(b) at key 0: its residual product on the pairs (i, 0), position 0 read by the queries (the abstract's "
        "mechanism)")
EVERY_KEY = "(b) over every key (the earlier reading): not the abstract's position-0 mechanism alone"
MODES_ROLES = (("without BOS", OWN, "paper", "the checkpoint's own set-up (content token at 0)"),
               ("with BOS (prepended explicitly)", PREPENDED, "control", BOS_LABEL))
SWAP = dataclasses.replace(
    lr.SWAP, name="with BOS (prepended explicitly): BOS swap changes early (b), all three replacements",
    where=probe("swap3"), role="control",
    note=BOS_LABEL + "; the abstract names no replacement: most frequent token, mean embedding, random vector of the "
         "BOS norm, each the mean change over the window groups; decided only where all three agree")
CLAIMS = [
    *[ClaimSpec(name=f"{mode}: sink heads exist", paper="sinks read downstream by sink-reading heads",
                where=MODEL & where, measure=minimum("sink_heads", "fewest sink heads (key-0 share >= 0.3) of a "
                                                                   "window group"),
                op=">=", threshold=1.0, role=role, note="queries i >= first_query; {seeds} window groups; " + why)
      for mode, where, role, why in MODES_ROLES],
    *[ClaimSpec(name=f"{mode}: component (b) at key 0 present", paper="present in all three architectures",
                where=MODEL & where, measure=lower_bound("component_b_key0", "group mean of (b) at key 0 - 2 "
                                                                             "standard errors"),
                op=">", threshold=0.0, role=role, note=GROUPS + "; " + KEY0 + "; " + why)
      for mode, where, role, why in MODES_ROLES],
    *[ClaimSpec(name=f"{mode}: component (b) over every key present", paper="present in all three architectures",
                where=MODEL & where, measure=lower_bound("component_b", "group mean of (b) - 2 standard errors"),
                op=">", threshold=0.0, role="control", note=GROUPS + "; " + EVERY_KEY + "; " + why)
      for mode, where, _, why in MODES_ROLES],
    *[ClaimSpec(name=f"{mode}: component (a) present", paper="present in all three architectures (by construction: "
                "the causal mask's per-query denominator)", where=MODEL & where,
                measure=lower_bound("component_a", "group mean of (a) - 2 standard errors"), op=">", threshold=0.0,
                role="check", note=GROUPS + "; > 0 by construction under a causal mask (the leakage study's note)")
      for mode, where, _, _ in MODES_ROLES],
    *[ClaimSpec(name=f"with BOS (prepended explicitly): NTK scaling (at inference) suppresses (b) {part}",
                paper="(b) smaller under NTK than standard RoPE", where=probe("contrast"), role="control",
                measure=lower_bound(column, f"group mean of (b) {part}, standard - NTK (inference), - 2 standard "
                                            "errors"),
                op=">", threshold=0.0, note="one checkpoint, NTK applied at inference; " + GROUPS + ", paired; " + why)
      for part, column, why in (("at key 0", "standard_minus_ntk_key0", KEY0),
                                ("over every key", "standard_minus_ntk", EVERY_KEY))],
    *[ClaimSpec(name="with BOS (prepended explicitly): standard RoPE sits between NTK and a sliding window, "
                     f"(b) {part}",
                paper="NTK < standard < sliding window", where=probe("contrast"), role="control",
                measure=lower_bound(column, f"group mean of min(standard - NTK, window - standard) of (b) {part} - 2 "
                                            "standard errors"),
                op=">", threshold=0.0,
                note="one checkpoint, both variants applied at inference; " + GROUPS + "; " + why)
      for part, column, why in (("at key 0", "margin_key0", KEY0), ("over every key", "margin", EVERY_KEY))],
    ClaimSpec(name="BOS swap changes early (b) (the checkpoint's set-up)", paper="-40%", where=probe("swap3"),
              measure=mean("swap_decisive", "the deciding replacement's change"),
              na=undecidable("its tokenizer adds no BOS (add_bos_token=False), so the abstract's auto-prepended BOS "
                             "is not this checkpoint's set-up; the control below prepends one explicitly")),
    SWAP,
    ClaimSpec(name="with BOS (prepended explicitly): position-0 residual identical across inputs",
              paper="constant fingerprint with BOS", where=probe("closed"),
              measure=minimum("bos_at_0", "min cosine over layers"), op=">", threshold=0.9999, role="check",
              note="follows from causality: position 0 sees only itself, the same token in every window"),
    ClaimSpec(name="content token at 0: position-0 residual varies with it at every layer",
              paper="varies with the token otherwise", where=probe("closed") & above("layer", 0),
              measure=maximum("content_at_0", "highest cosine over layers 1 on", by=("layer",)), op="<",
              threshold=0.99, note="each window's own first token at 0 (the checkpoint's set-up); the least varying "
                                   "layer decides"),
]
ARCHITECTURAL = ("content token at 0: position-0 residual varies with it at every layer",)  # judged on random weights

TABLES = [
    Table("Sinks and components per mode and variant", by=("bos", "variant"), where=probe("model"),
          intro="Means over layers and heads in each window group, then mean ± std over the groups. Sink share: mean "
                "weight on key 0 of queries i >= first_query.",
          columns=(Column("sink heads", "sink_heads", 0), Column("sink share", "sink_share"),
                   Column("(a)", "component_a"), Column("(b)", "component_b"),
                   Column("(b) at key 0", "component_b_key0"),
                   Column("(b) other keys", "component_b_rest"), Column("early (b)", "early_component_b"),
                   Column("early (b) at key 0", "early_component_b_key0"))),
    Table("BOS replacements: early (b)", by=("intervention",), where=probe("swap"),
          intro="With BOS (prepended explicitly), standard RoPE: the input embedding at position 0 replaced; early "
                "(b) = (b) at queries < first_query, mean over layers and heads. The abstract's -40% is judged only "
                "where all three changes are within 20 points of it, or all three outside.",
          columns=(Column("early (b)", "early_component_b"), Column("as is", "base"),
                   Column("change (%)", lambda g: mean_std([100 * r["change"] for r in g if r["change"] is not None],
                                                           1, signed=True, empty="n.a.")))),
    Table("By layer", by=("bos", "variant", "layer"), where=probe("head"),
          intro="Mean ± std over heads and window groups.",
          columns=(Column("sink share", "sink_share"), Column("share of sink heads", "sink"),
                   Column("(a)", "component_a"), Column("(b)", "component_b"),
                   Column("(b) at key 0", "component_b_key0"),
                   Column("early (b)", "early_component_b"))),
    Table("Closed-system check: position-0 residual across inputs", by=("layer",), where=probe("closed"),
          intro="Mean pairwise cosine of the position-0 residual over the windows (layer 0: the embedding).",
          columns=(Column("BOS at 0", "bos_at_0", 6), Column("content token at 0", "content_at_0", 6))),
]
FIGURES = [Lines(f"fig_{y}_by_layer.png", x="layer", y=y, series=("bos", "variant"), where=probe("head"),
                 hline=0.0,
                 ylabel=label, title=label)
           for y, label in (("sink_share", "attention on key 0 (queries >= first_query)"),
                            ("component_a", "(a) causal-mask normaliser share"),
                            ("component_b", "(b) key position and interactions"))]


def study(preset: str) -> StudyConfig:
    check_choice("preset", preset, PRESETS)
    if preset == "quick":
        model = dict(checkpoint=TINY, length=48, windows=8, groups=2, first_query=16, dtype="float32",
                     ntk_factor=4.0, window=8)
    else:
        model = dict(checkpoint="smollm2-135m", length=512, windows=16, groups=4, first_query=16, dtype="float32",
                     ntk_factor=4.0, window=64)
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
    for key, lo in (("length", 8), ("windows", 4), ("first_query", 1), ("window", 1)):
        if not isinstance(m[key], int) or isinstance(m[key], bool) or m[key] < lo:
            raise ConfigError(f"model.{key}", m[key], f"an integer >= {lo}")
    if not isinstance(m["groups"], int) or isinstance(m["groups"], bool) or m["groups"] < 1 or \
            m["windows"] % m["groups"] or m["windows"] // m["groups"] < 2:
        raise ConfigError("model.groups", m["groups"], f"a divisor of model.windows ({m['windows']}) leaving at least "
                                                       "2 windows a group (each group is cross-fitted in halves)")
    if m["first_query"] >= m["length"]:
        raise ConfigError("model.first_query", m["first_query"], f"an integer below model.length ({m['length']})")
    check_choice("model.dtype", m["dtype"], ("float32",))
    if not isinstance(m["ntk_factor"], (int, float)) or isinstance(m["ntk_factor"], bool) or m["ntk_factor"] <= 1:
        raise ConfigError("model.ntk_factor", m["ntk_factor"], "a number > 1 (the NTK variant's scale factor)")
    for mode in study.axis("model.bos"):
        check_choice("model.bos", mode, MODES)
    return m


def check(study: StudyConfig) -> None:
    from poslab.machine import MEMORY_FRACTION, memory_bytes
    from poslab.pretrained.loading import read_causal_config, require_transformers
    from poslab.pretrained.model import require_attention_fits

    m = settings(study)
    require_transformers()
    cfg = read_causal_config(checkpoint_source(m["checkpoint"]))
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    require_attention_fits("model.length", m["length"], m["length"], heads, layers, batch=2,
                           what="scores and patterns (collect, with and without BOS)")
    need, have = fit_bytes(m["length"], cfg), memory_bytes() * MEMORY_FRACTION
    if need > have:
        raise ConfigError("model.length", m["length"], f"a length whose leakage fit fits in memory: about "
                                                       f"{need / 2**30:.1f} GiB for {layers} layers x {heads} heads, "
                                                       f"{have / 2**30:.1f} GiB available")


def fit_bytes(length: int, cfg: dict) -> int:
    """Bytes one mode's leakage fit holds at its peak."""
    from poslab.probes.leakage import leakage_bytes

    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    return leakage_bytes(length, layers, heads)


# a worker's peak over fit_bytes: 11.5-12.3 GB measured (SmolLM2, 512 tokens) at 8.9 GB; two such
# workers were killed for memory on a 23 GiB machine, so modes run side by side only where they fit
PROCESS_OVER_FIT = 1.5


# ----------------------------------------------------------------------------- the run

def run(study: StudyConfig, *, store, out: Path, device: str = "cpu", force: bool = False, progress: bool = True,
        workers: int = 1, executor=None) -> dict:
    """Evaluate each mode the store lacks (keyed by the weights' hash and the settings), one job
    each on the executor (:func:`poslab.experiments.runner.evaluate_members`, as many side by side
    as fit in memory); then the report."""
    from poslab.experiments import evaluate_members
    from poslab.pretrained.loading import content_hash, read_config

    start = time.perf_counter()
    m = settings(study)
    source = checkpoint_source(m["checkpoint"])
    worker_bytes = PROCESS_OVER_FIT * fit_bytes(m["length"], read_config(source))
    members = []
    for mode in study.axis("model.bos"):
        config = dict(experiment=EXPERIMENT.name, checkpoint=content_hash(source), bos=mode,
                      **{k: m[k] for k in SETTINGS if k != "checkpoint"}, text=dict(study.task))
        members.append((config_hash(config), config))
    evaluated = evaluate_members(EXPERIMENT.name, members, partial(mode_job, source=source_path(source), device=device),
                                 store=store, force=force, executor=executor, workers=workers, device=device,
                                 progress=progress, worker_bytes=worker_bytes)
    rows = store.rows(keys=[k for k, _ in members])
    files = report(rows, study, out)
    return dict(members=len(members), trained=evaluated, reused=len(members) - evaluated, variants=0, evaluated=0,
                seconds=time.perf_counter() - start, files=files)


def mode_job(config: dict, *, source: str, device: str) -> list[dict]:
    """One mode's rows, in whichever process runs it (the checkpoint loaded once per process)."""
    from poslab.pretrained.model import encode_text
    from poslab.tasks.text import CharText

    model = loaded(source, config["dtype"], device)
    return evaluate_mode(model, encode_text(model, CharText(**config["text"]).text), config)


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
    """Rows of one mode: per (layer, head) sinks and components; with BOS also under the two
    inference-time variants and the three BOS replacements, and per layer the closed-system check."""
    from poslab.tasks.base import Batch

    tokens = windows(model, ids, config)
    n, L = tokens.shape
    size = n // config.get("groups", 1)
    batches = [Batch(tokens=t, targets=t, lengths=torch.full((len(t),), L),
                     loss_mask=torch.ones_like(t, dtype=torch.bool)) for t in tokens.split(size)]  # seed = group

    def per_group(rows_of) -> list[dict]:
        return [dict(r, seed=g) for g, batch in enumerate(batches) for r in rows_of(batch)]

    scratch: dict = {}  # the per-pair sums' memory, reused by every fit of this mode (gigabytes at 512 tokens)

    def heads(variant: str) -> list[dict]:
        return per_group(lambda batch: sink_head_rows(model, batch, config, variant, scratch))

    rows = heads(STANDARD)
    if config["bos"] != "with BOS":
        return rows
    if model.encoding == "rotary":
        model.set_schedule({"rope_type": "ntk", "factor": float(config["ntk_factor"])})
        try:
            rows += heads(NTK)
        finally:
            model.restore()
    model.set_window(config["window"])
    try:
        rows += heads(WINDOW)
    finally:
        model.set_window(None)
    swaps = replacements(model, tokens)  # one replacement vector for every group: the most frequent token of all
    rows += per_group(lambda batch: swap_intervention_rows(model, batch, config, swaps))
    content = windows(model, ids, dict(config, bos="without BOS"))  # the closed-system check, same windows
    cos = {name: position0_cosines(model, t) for name, t in (("bos_at_0", tokens), ("content_at_0", content))}
    rows += [dict(probe="closed", layer=k, bos_at_0=float(cos["bos_at_0"][k]),
                  content_at_0=float(cos["content_at_0"][k])) for k in range(model.n_layers + 1)]
    return rows


HEAD_KEYS = ("component_a", "component_b", "component_b_key0", "component_b_rest", "early_component_b",
             "early_component_b_key0", "received_0")
MEANS = ("sink_share", "component_a", "component_b", "component_b_key0", "component_b_rest", "early_component_b",
         "early_component_b_key0")  # the model rows' means over layers and heads


def sink_head_rows(model, batch, config: dict, variant: str, scratch: dict | None = None) -> list[dict]:
    """Per (layer, head): the share of attention on key 0 of queries >= first_query, sink or not,
    and the components (a), (b) (with its key-0 part and the rest), early (b) (and its key-0 part)."""

    q0 = config["first_query"]
    comp = lk.leakage(model, batch, early=q0, chunk=2, scratch=scratch)
    sink_share = comp["to_key0"][..., q0:].mean(-1)  # mean weight on key 0 of queries i >= first_query, [l, h]
    return [dict(probe="head", bos=config["bos"], variant=variant, layer=layer, head=head,
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
        comp = lk.leakage(model, early, intervention=Intervention(bos_embedding=x0), early=q0, chunk=2)
        rows += [dict(probe="intervention", intervention=SWAPS[name], layer=layer, head=head,
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

def derived_rows(rows: list[dict]) -> list[dict]:
    """Per window group (``seed``): probe="model" per mode and variant (means over layers and heads,
    the count of sink heads); probe="contrast" (the abstract's ordering on (b), paired within the
    group) and probe="swap" (each replacement's change of the mean early (b), relative to the
    standard model with BOS on the same windows; None where that is below PRESENT); over the groups,
    probe="swap3" (each replacement's mean change and :func:`poslab.probes.leakage.three_swaps`)."""
    out = []
    for seed in sorted({r.get("seed", 0) for r in rows if r.get("probe") == "head"}):
        mine = [r for r in rows if r.get("seed", 0) == seed]
        model = []
        for mode in MODES:
            for variant in (STANDARD, NTK, WINDOW):
                heads = [r for r in mine if r.get("probe") == "head" and r.get("bos") == mode
                         and r.get("variant", STANDARD) == variant]
                if heads:
                    model.append(dict(probe="model", bos=mode, variant=variant, seed=seed,
                                      sink_heads=float(sum(r["sink"] for r in heads)),
                                      **{k: float(np.mean([r[k] for r in heads])) for k in MEANS}))
        out += model
        b = {r["variant"]: r for r in model if r["bos"] == "with BOS"}
        if STANDARD in b and NTK in b and WINDOW in b:
            contrast = dict(probe="contrast", seed=seed)
            for suffix, column in (("", "component_b"), ("_key0", "component_b_key0")):
                s, nt, w = (b[v][column] for v in (STANDARD, NTK, WINDOW))
                contrast.update({f"standard_minus_ntk{suffix}": s - nt, f"margin{suffix}": min(s - nt, w - s)})
            out.append(contrast)
        if STANDARD in b:
            base = b[STANDARD]["early_component_b"]
            for name in SWAPS.values():
                got = [r["early_component_b"] for r in mine if r.get("probe") == "intervention"
                       and r["intervention"] == name]
                if got:
                    value = float(np.mean(got))
                    out.append(dict(probe="swap", intervention=name, seed=seed, early_component_b=value, base=base,
                                    change=(value - base) / base if base >= PRESENT else None))
    swaps = [r for r in out if r["probe"] == "swap"]
    if swaps:
        changes = {}
        for short, name in SWAPS.items():
            got = [r["change"] for r in swaps if r["intervention"] == name and r["change"] is not None]
            changes[short] = float(np.mean(got)) if got else None
        out.append(dict(probe="swap3", seed=None, **lr.three_swaps(changes),
                        **{f"swap_{k}": v for k, v in changes.items()}))
    return out


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
    name = CHECKPOINT_NAMES.get(m.get("checkpoint"), m.get("checkpoint"))
    intro = (f"Checkpoint `{m.get('checkpoint')}` ({name}), {m.get('windows')} windows of {m.get('length')} tokens of "
             f"TinyShakespeare ({study.task.get('split', 'val')} split) in {m.get('groups', 1)} groups of consecutive "
             f"windows, each fitted on its own: mean ± std over the groups; sinks at queries >= "
             f"{m.get('first_query')}, early (b) at queries < {m.get('first_query')}.")
    specs = claims_for(study)
    swap = next(c for c in specs if c.name == SWAP.name)
    claims = lr.decided_when_agreed(judge_all(specs, all_rows), all_rows, swap)
    return write_outputs(out, title=EXPERIMENT.title, rows=all_rows, claims=claims, intro=intro, tables=TABLES,
                         figures=FIGURES)


EXPERIMENT = Experiment(name="pretrained-leakage", title="Positional leakage on a pretrained model (seed 001)",
                        study=study, evaluate=no_member_rows, report=report, presets=PRESETS, check=check, run=run)
