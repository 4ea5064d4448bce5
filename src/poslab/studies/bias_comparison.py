"""Section 5.1 of the seed paper: the account is not RoPE-specific.

The Table 1 protocol (one layer, one head, d = 64, m = 20, fixed-offset retrieval, lengths
uniform in [8, 16], evaluated at L in {12, ..., 48}) with every family of the registry: the
relative biases the paper names (ALiBi, the T5 bucketed bias) and RoPE, plus NoPE, sinusoidal
(absolute), Shaw (relative vectors), Transformer-XL and MoPE (relative, rotary form). The paper
states no numbers for this comparison; its account predicts that relative schemes select the
offset -K at every length, absolute ones do not. Each row shows accuracy by length, the
selected offset and the peak height, and each encoding's kind decides which prediction applies.
"""

from __future__ import annotations

from poslab.experiments.runner import Experiment

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from poslab.experiments.claims import Claim, claims_markdown, write_claims  # noqa: E402
from poslab.experiments.config import StudyConfig, quick  # noqa: E402
from poslab.experiments.retrieval import (fmt, group_stats, length_rows, markdown_table, save,  # noqa: E402
                                          select, write_csv)
from poslab.positional import encoding_class  # noqa: E402

name = "bias-comparison"
title = "Section 5.1: ALiBi, T5 bias and RoPE (and the other families) under the Table 1 protocol"

ENCODINGS = ("alibi", "t5", "rope", "nope", "sinusoidal", "shaw", "transformer_xl", "mope")
COLUMNS = ["encoding", "kind", "K", "seed", "length", "in_range", "accuracy", "peak_offset", "peak_position",
           "peak_height", "a_star", "chance"]


def study(preset: str) -> StudyConfig:
    """Paper preset: K = 2 (the mechanism claim is stated for K >= 2), 3 seeds, 4000 steps."""
    cfg = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(m=20),
                      grid={"encoding": ENCODINGS, "task.K": (2,)}, seeds=3)
    return quick(cfg) if preset == "quick" else cfg


def evaluate(ctx) -> list[dict]:
    kind = encoding_class(ctx.study.encoding).kind
    return [{**r, "kind": kind} for r in length_rows(ctx)]


def claims(rows: list[dict], study: StudyConfig) -> list[Claim]:
    cells = select(rows, "length")
    Lmax, out = study.train.max_length, []
    for enc in study.axis("encoding"):
        for K in study.axis("task.K"):
            ck = [r for r in cells if r["encoding"] == enc and r["K"] == K]
            if not ck:
                continue
            kind = ck[0]["kind"]
            frac = float(np.mean([r["peak_offset"] == -K for r in ck]))
            unseen = [r["accuracy"] for r in ck if r["length"] > Lmax]
            n = f"{len({r['seed'] for r in ck})} seeds, {len(ck)} cells"
            relative = kind in ("relative", "rotary")
            out.append(Claim(name=f"{enc} ({kind}), K={K}: seed x length cells selecting offset -K",
                             paper="100% predicted for relative schemes" if relative else
                             "not predicted (no relative offset in the logit)",
                             measured=f"{100 * frac:.1f}%", holds=(frac == 1.0) if relative else None,
                             criterion="== 100%" if relative else "", note=n))
            if unseen:
                out.append(Claim(name=f"{enc} ({kind}), K={K}: mean accuracy at unseen lengths (> {Lmax})",
                                 paper="no number given", measured=fmt(np.mean(unseen), np.std(unseen)), holds=None,
                                 note=f"chance {ck[0]['chance']:.2f}; {n}"))
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    cells = select(rows, "length")
    files = [write_csv(cells, out / "rows.csv", COLUMNS)]
    acc = group_stats(cells, ("encoding", "K", "length"), "accuracy")
    lengths = sorted({r["length"] for r in cells})
    body = []
    for enc in study.axis("encoding"):
        for K in study.axis("task.K"):
            ck = [r for r in cells if r["encoding"] == enc and r["K"] == K]
            if not ck:
                continue
            offs = [r["peak_offset"] for r in ck]
            common = max(set(offs), key=offs.count)
            h48 = [r["peak_height"] for r in ck if r["length"] == max(lengths)]
            body.append([enc, ck[0]["kind"], K, *[fmt(*acc[(enc, K, L)][:2]) for L in lengths],
                         f"{100 * np.mean([o == -K for o in offs]):.0f}%", common,
                         fmt(np.mean(h48), np.std(h48))])
    found = claims(rows, study)
    text = [f"# {title}", "",
            f"Accuracy (mean ± std over seeds 0..{study.seeds - 1}) by evaluation length; training lengths uniform "
            f"in [{study.train.min_length}, {study.train.max_length}] drawn per {study.train.length_sampling}, "
            f"{study.train.steps} steps; chance {cells[0]['chance']:.2f}. `at -K`: seed x length cells whose mean "
            f"attention peaks at offset -K; `most common offset`: over all cells; peak height at L = {max(lengths)}.",
            "", markdown_table(["encoding", "kind", "K", *[f"L={L}" for L in lengths], "at -K", "most common offset",
                                f"peak height L={max(lengths)}"], body), "",
            "## The account's predictions beside this run", "", claims_markdown(found), ""]
    (out / "table.md").write_text("\n".join(text))
    files += [out / "table.md", write_claims(found, out / "claims.json")]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for enc in study.axis("encoding"):
        for K in study.axis("task.K"):
            pts = sorted((L, m) for (e, k, L), (m, _, _) in acc.items() if e == enc and k == K)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{enc} K={K}")
    ax.axvline(study.train.max_length, color="grey", ls="--", lw=1)
    ax.set(xlabel="evaluation length L", ylabel="accuracy", ylim=(-0.02, 1.02))
    ax.legend(fontsize=6, ncol=2)
    files.append(save(fig, out / "accuracy.png"))
    return files


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, in_run_all=True)
