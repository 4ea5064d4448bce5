"""The seed paper's first next step: depth with NoPE, "where causal masking induces relative
structure" (Kazemnejad et al. 2023). A causal transformer (one head a layer, d_model = 64, MLP
and LayerNorm) with no positional encoding at 1, 2 and 4 layers on fixed-offset retrieval
(Table 1's protocol: m = 20, K in {1, 2, 3}, lengths U[8, 16], 4000 steps of batch 256, evaluated
at 12 .. 48), with RoPE and a learned absolute table (APE) at the same depths as controls.

Per member and length: accuracy, and per layer and head the last query's mean attention over
offsets, its peak offset and the attention at -K. The *retrieving head* of a member is its
(layer, head) with the most attention at -K over the trained lengths; the question is whether
its peak offset is one offset (-K) at every length. Set-up, criteria and results:
docs/next-steps.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from poslab.experiments import Trained
from poslab.experiments.config import QUICK, EvalConfig, StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, joined, save, select, write_outputs
from poslab.experiments.spec import (
    ClaimSpec,
    InRange,
    above,
    at_least,
    derivation,
    is_,
    judge_all,
    maximum,
    mean,
    minimum,
    neg,
    next_step,
    probe,
    seed_states,
    share,
    undecidable,
)
from poslab.positional import encoding_class
from poslab.studies.kit.depth_probes import last_query, last_query_rows
from poslab.tasks import eval_batch
from poslab.train import TrainConfig

ENCODINGS = ("nope", "rope", "learned")
DEPTHS = (1, 2, 4)
NOPE, ROPE, APE = is_("encoding", "nope"), is_("encoding", "rope"), is_("encoding", "learned")
DEEP = at_least("n_layers", 2)
SHALLOW = is_("n_layers", 1)
RETRIEVING = probe("head") & is_("retrieving", True)
UNSEEN = probe("length") & is_("in_range", False)
TRAINED = probe("length") & is_("in_range", True)
ONE_LAYER_WHY = ("a one-layer NoPE head's logit to an earlier key depends on its token alone, and tokens are "
                 "i.i.d., so its mean attention over earlier keys is flat by exchangeability: its argmax is "
                 "sampling noise, no offset is selected")
HYPOTHESIS = ("the seed's next step (limitations paragraph) as a hypothesis, judged with Table 1's line for a "
              "relative encoding; {seeds} seeds, {n} rows")
CONTROL = "the same criterion on {encoding} at the same depth: a control; {seeds} seeds, {n} rows"
# what each claim is (its role follows: experiments/spec.role_of)
STEP = next_step("seed 000, limitations: NoPE at depth, where causal masking may induce relative structure; "
                 "the seed names the step, not its outcome")
TABLE1_ROPE = seed_states("Table 1: RoPE near-perfect at every length, its head selecting -K")
TABLE1_APE = seed_states("Table 1: a learned absolute table ~1 in range and ~chance past it")
BY_DEFINITION = derivation("a one-layer NoPE head sees no position (exchangeable i.i.d. tokens)")
# the learned-in-range gate: a claim past the range or about a mechanism needs its models to have learned
GATE = InRange(where=TRAINED, column="accuracy", threshold=0.9, match=("encoding", "n_layers"),
               text="in-range accuracy (L ≤ 16, mean over seeds and lengths)")
ROLES_REVISED = "2026-12-07: role computed from source x setting (issue 53): a next step's predicted outcome"
GATED = ("2026-12-07: the learned-in-range gate (issue 53): a claim past the range or on the mechanism is n.a. "
         "where its models did not learn the task in range")

CLAIMS = [
    # one layer: nothing positional reaches the logits, so no offset can be selected by construction
    ClaimSpec(name="nope, 1 layer: largest gap, either sign, of attention at -K from the mean over earlier keys",
              paper="(none: no position at one layer)", where=probe("flat") & NOPE & SHALLOW,
              measure=maximum("abs_excess"), op="<=", threshold=0.01, source=BY_DEFINITION, setting="seed",
              note="by construction: " + ONE_LAYER_WHY + "; max over {seeds} seeds, the longest trained length and "
                   "the longest length; its accuracy is above chance (tables) because a bag of the context's "
                   "tokens already beats 1/m"),
    ClaimSpec(name="nope, 1 layer: retrieving head's peak at -K in every seed x length cell",
              paper="(none: no position at one layer)", where=RETRIEVING & NOPE & SHALLOW,
              measure=share("peak_offset", "==", neg("K")), percent=True, source=BY_DEFINITION, setting="seed",
              na=undecidable(ONE_LAYER_WHY)),
    # two and four layers: the hypothesis, with Table 1's lines
    ClaimSpec(name="nope, {n_layers} layers: accuracy at trained lengths (L ≤ 16)", paper="causal masking induces "
              "relative structure", where=TRAINED & NOPE & DEEP, per=("n_layers",), measure=mean("accuracy"),
              op=">=", threshold=0.95, note=HYPOTHESIS, source=STEP, setting="seed", revised=ROLES_REVISED),
    ClaimSpec(name="nope, {n_layers} layers: lowest mean accuracy over the unseen lengths (L > 16)",
              paper="causal masking induces relative structure (Table 1: near-perfect)", where=UNSEEN & NOPE & DEEP,
              per=("n_layers",), measure=minimum("accuracy", by=("K", "length")), op=">=", threshold=0.97,
              note=HYPOTHESIS, source=STEP, setting="seed", trained=True, revised=f"{ROLES_REVISED}; {GATED}"),
    ClaimSpec(name="nope, {n_layers} layers: retrieving head's peak at -K in every seed x length cell",
              paper="causal masking induces relative structure (Table 1: 100% of cells)",
              where=RETRIEVING & NOPE & DEEP,
              per=("n_layers",), measure=share("peak_offset", "==", neg("K")), op=">=", threshold=1.0, percent=True,
              note=HYPOTHESIS, source=STEP, setting="seed", trained=True, revised=f"{ROLES_REVISED}; {GATED}"),
    ClaimSpec(name="nope, {n_layers} layers: retrieving head peaks at one offset at every length (any offset)",
              paper="a length-invariant peak offset", where=probe("member") & NOPE & DEEP, per=("n_layers",),
              measure=share("invariant", "==", True), op=">=", threshold=1.0, percent=True, note=HYPOTHESIS,
              source=STEP, setting="seed", trained=True, revised=f"{ROLES_REVISED}; {GATED}"),
    # controls: RoPE and APE at the same depth
    *[ClaimSpec(name="{encoding}, {n_layers} layer(s): lowest mean accuracy over the unseen lengths (L > 16)",
                paper="Table 1: RoPE near-perfect", where=UNSEEN & ROPE & where, per=("encoding", "n_layers"),
                measure=minimum("accuracy", by=("K", "length")), op=">=", threshold=0.97, note=note,
                source=TABLE1_ROPE, setting="other", trained=True, revised=GATED)
      for where, note in ((SHALLOW, "the one-layer model with MLP and LayerNorm (Table 1's head has neither): a "
                                    "control; {seeds} seeds, {n} rows"), (DEEP, CONTROL))],
    ClaimSpec(name="{encoding}, {n_layers} layer(s): retrieving head's peak at -K in every seed x length cell",
              paper="Table 1: 100% of cells (RoPE)", where=RETRIEVING & ROPE, per=("encoding", "n_layers"),
              measure=share("peak_offset", "==", neg("K")), op=">=", threshold=1.0, percent=True, note=CONTROL,
              source=TABLE1_ROPE, setting="other", trained=True, revised=GATED),
    ClaimSpec(name="{encoding}, {n_layers} layer(s): accuracy at trained lengths (L ≤ 16)", paper="Table 1: APE ~1",
              where=TRAINED & APE, per=("encoding", "n_layers"), measure=mean("accuracy"), op=">=", threshold=0.95,
              note=CONTROL, source=TABLE1_APE, setting="other"),
    ClaimSpec(name="{encoding}, {n_layers} layer(s): accuracy at unseen lengths (L > 16)",
              paper="Table 1: APE ~chance (1/m = 0.05)", where=UNSEEN & APE, per=("encoding", "n_layers"),
              measure=mean("accuracy"), op="<=", threshold=2, scale_by="chance", note=CONTROL, source=TABLE1_APE,
              setting="other", trained=True, revised=GATED),
]

TABLES = [
    Table("Accuracy by length (last query; chance 0.05)", by=("encoding", "n_layers", "K"), where=probe("length"),
          pivot=Pivot("length", "accuracy", "L={}")),
    Table("Retrieving head: its peak offset at each length, per seed", by=("encoding", "n_layers", "K", "seed"),
          where=probe("member"),
          intro="layer.head = the head with the most mean attention at -K over L ≤ 16 (the last query's); its peak "
                "offset (argmax of the mean attention over offsets) at each evaluation length; one offset at every "
                "length = invariant. Peak offsets of every layer's head, by length, in heads.csv.",
          columns=(Column("head", joined("head_name")), Column("peak offsets by length", joined("offsets")),
                   Column("invariant", joined("invariant")), Column("a* at L ≤ 16", "a_star_in"),
                   Column("a* at L = 48", "a_star_longest"))),
    Table("Peak offset of each layer's head at the unseen lengths (mean ± std over seeds; K = 2)",
          by=("encoding", "n_layers", "layer"), where=probe("head") & is_("K", 2) & above("length", 16),
          pivot=Pivot("length", "peak_offset", "L={}", digits=1)),
]
FIGURES = [Lines("accuracy.png", x="length", y="accuracy", series=("encoding",), panel="n_layers",
                 where=probe("length"), vline=16, hline=lambda rows: 2 * rows[0]["chance"], ylim=(-0.02, 1.02),
                 xlabel="evaluation length L", ylabel="accuracy (mean over K and seeds)")]


# Paper preset: Table 1's protocol (8 seeds, 4000 steps of batch 256, lengths U[8, 16], K in {1, 2, 3}, 4096
# sequences at each of 12 .. 48) on a causal transformer at 1, 2 and 4 layers. ``cpu``: 2 seeds, K = 2, 1200
# steps of batch 64, 1024 sequences (see docs/next-steps.md for its measured time).
BASE = StudyConfig(model_type="transformer", model=dict(d_model=64, n_heads=1, causal=True),
                   task_type="fixed_offset", task=dict(m=20),
                   grid={"encoding": ENCODINGS, "model.n_layers": DEPTHS, "task.K": (1, 2, 3)}, seeds=8,
                   train=TrainConfig(), eval=EvalConfig())
PRESETS = {"paper": {},
           "quick": {**QUICK, "train.steps": 40, "train.batch_size": 32, "eval.n_sequences": 64, "seeds": 1,
                     "grid": {"encoding": ENCODINGS, "model.n_layers": (1, 2), "task.K": (2,)}},
           "cpu": {"grid": {"encoding": ENCODINGS, "model.n_layers": DEPTHS, "task.K": (2,)}, "seeds": 2,
                   "train": TrainConfig(steps=1200, batch_size=64), "eval": EvalConfig(n_sequences=1024)}}


def evaluate(ctx) -> list[dict]:
    study, task, model = ctx.study, ctx.task, ctx.model
    Lmax, K = study.train.max_length, task.K
    lengths = sorted(study.eval.lengths)
    enc = dict(encoding=study.encoding, kind=encoding_class(study.encoding).kind)
    rows, heads, attn_by_length = [], [], {}
    for L in lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, attn = last_query(model, batch, study.eval.chunk)  # [layers, h, L]
        attn_by_length[L] = attn
        rows.append(dict(probe="length", length=L, in_range=L <= Lmax, accuracy=acc, chance=task.chance, **enc))
        heads += last_query_rows(attn, L, K, **enc)
    trained = [L for L in lengths if L <= Lmax] or lengths[:1]
    score = np.mean([attn_by_length[L][:, :, L - 1 - K] for L in trained], axis=0)  # a* over trained L, [layers, h]
    layer, head = (int(v) for v in np.unravel_index(int(score.argmax()), score.shape))
    for r in heads:
        r["retrieving"] = (r["layer"], r["head"]) == (layer, head)
    mine = [r for r in heads if r["retrieving"]]
    offsets = [r["peak_offset"] for r in mine]
    member = dict(probe="member", head_name=f"{layer}.{head}", layer=layer, head=head, **enc,
                  offsets=" ".join(str(o) for o in offsets), invariant=len(set(offsets)) == 1,
                  at_minus_K=all(o == -K for o in offsets), a_star_in=float(score[layer, head]),
                  a_star_longest=mine[-1]["a_star"])
    profile = [dict(probe="attention", length=L, layer=n, head=h, offset=t - (L - 1), weight=float(w), **enc)
               for L in (max(trained), lengths[-1]) for n in range(attn_by_length[L].shape[0])
               for h in range(attn_by_length[L].shape[1]) for t, w in enumerate(attn_by_length[L][n, h])]
    return rows + heads + [member] + profile


def profile_figure(rows: list[dict], out: Path) -> list[Path]:
    """Mean attention of the last query against offset (K = 2, or the smallest K): one panel per encoding x
    depth, one line per layer at the longest trained length (solid) and the longest length (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attn = select(rows, "attention")
    if not attn:
        return []
    K = 2 if any(r["K"] == 2 for r in attn) else min(r["K"] for r in attn)
    encs = [e for e in ENCODINGS if any(r["encoding"] == e for r in attn)]
    depths = sorted({r["n_layers"] for r in attn})
    lengths = sorted({r["length"] for r in attn})
    fig, axes = plt.subplots(len(encs), len(depths), figsize=(4.2 * len(depths), 2.8 * len(encs)), squeeze=False,
                             sharex=True)
    for i, e in enumerate(encs):
        for j, n in enumerate(depths):
            ax = axes[i][j]
            for layer in range(n):
                for L, style in zip(lengths, ("-", "--"), strict=False):
                    pts: dict[int, list[float]] = {}
                    for r in attn:
                        if (r["encoding"], r["n_layers"], r["K"], r["layer"], r["length"]) == (e, n, K, layer, L):
                            pts.setdefault(r["offset"], []).append(r["weight"])
                    xs = sorted(pts)
                    ax.plot(xs, [np.mean(pts[x]) for x in xs], ls=style, marker=".", ms=3,
                            color=f"C{layer}", label=f"layer {layer}, L={L}")
            ax.axvline(-K, color="grey", ls=":", lw=1)
            ax.set(title=f"{e}, {n} layer(s), K = {K}", xlabel="offset t - (L - 1)", ylabel="mean attention")
            ax.legend(fontsize=6)
    return [save(fig, out / "attention_by_offset.png")]


def flat_rows(rows: list[dict]) -> list[dict]:
    """Per (member, length, layer, head) of the ``attention`` rows: the weight at -K minus the mean weight
    over the earlier keys (offsets <= -1), ``abs_excess`` its size (0 for a head blind to position)."""
    cells: dict[tuple, dict[int, float]] = {}
    for r in select(rows, "attention"):
        key = (r["encoding"], r["n_layers"], r["K"], r["seed"], r["length"], r["layer"], r["head"])
        cells.setdefault(key, {})[r["offset"]] = r["weight"]
    out = []
    for (e, n, K, seed, L, layer, head), w in cells.items():
        excess = w[-K] - float(np.mean([v for d, v in w.items() if d <= -1]))
        out.append(dict(probe="flat", encoding=e, n_layers=n, K=K, seed=seed, length=L, layer=layer, head=head,
                        excess=excess, abs_excess=abs(excess)))
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    Lmax = study.train.max_length
    rows = rows + flat_rows(rows)
    intro = (f"Mean ± std over seeds 0..{study.seeds - 1}. A causal transformer, d_model = "
             f"{study.model.get('d_model')}, one head a layer, MLP and pre-LayerNorm, at n_layers in "
             f"{list(study.axis('model.n_layers'))}; fixed-offset retrieval over m = {study.task.get('m', 20)} tokens, "
             f"K in {list(study.axis('task.K'))}; {study.train.steps} steps of batch {study.train.batch_size} (Adam "
             f"{study.train.lr:g}), lengths U[{study.train.min_length}, {Lmax}] per {study.train.length_sampling}; "
             f"{study.eval.n_sequences} sequences per length. NoPE is the question; RoPE and the learned table "
             "(APE, rows N(0, 0.02²)) are controls at the same depths.")
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=judge_all(CLAIMS, rows, GATE), intro=intro,
                         tables=TABLES, figures=FIGURES, csv_rows=select(rows, "length"),
                         more_figures=profile_figure, csvs={"heads.csv": "head", "members.csv": "member"})


EXPERIMENT = Trained(name="nope-depth", title="Next step: NoPE at depth on fixed-offset retrieval (does the causal "
                                                 "mask give a length-invariant peak offset?)",
                        base=BASE, presets=PRESETS, evaluate=evaluate, report=report)
