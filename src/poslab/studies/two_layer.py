"""The seed paper's Section 5.2: a two-layer, four-head transformer (MLP, LayerNorm) on the
full-sequence shift task, RoPE against a learned absolute table (APE).

The paper states the architecture and the three findings, not the recipe. What it leaves open is
a config value here, set to the field's usual choice (all overridable with ``--set``):
K = 2 (``task.K``; the shift task's default, the smallest offset that needs a pre-rotated
carrier), m = 20, d_model = 64 (d = 16 per head), training lengths uniform in [8, 16] as in
Section 5.1 (``train.min_length``, ``train.max_length``), Adam at 1e-3, batch 64, 2000 steps
(``train.steps``), APE rows N(0, 0.02^2) (the encoding's default), 3 seeds.

Probes (every number from ``model.collect`` intermediates through :mod:`poslab.probes`):

- accuracy by length L, over every target position, and split into positions inside the
  training range (t < L_max) and beyond it (t >= L_max);
- per layer and head, from ``probes.mean_pattern`` (mean attention of every query row): the
  fraction of query rows whose peak key sits at offset -K, among rows t < L_max and rows
  t >= L_max; the last query's peak offset and absolute peak position at each length. A head is
  *offset-equivariant out of distribution* when its last query peaks at -K at every unseen length;
  it *pins* when its last query peaks at one absolute position < L_max at every unseen length
  (``probes.pinned_position``);
- the retrieving head: the (layer, head) with the largest mean attention a* at offset -K from the
  last query at L = L_max; its carrier energy of the projected (pre-rotation) queries and keys
  (``probes.collect_moments`` on that layer) beside the same probe on the untrained model and
  beside 1/d_model (the paper's "0.02" is 1/64 = 0.016 rounded: a random direction's share).
"""

from __future__ import annotations

from poslab.experiments.runner import Experiment

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from poslab import probes  # noqa: E402
from poslab.experiments.claims import Claim, claims_markdown, write_claims  # noqa: E402
from poslab.experiments.config import EvalConfig, StudyConfig, quick  # noqa: E402
from poslab.experiments.retrieval import fmt, group_stats, markdown_table, save, select, write_csv  # noqa: E402
from poslab.probes.common import model_device, split_batch  # noqa: E402
from poslab.tasks import eval_batch  # noqa: E402
from poslab.train import TrainConfig  # noqa: E402

name = "two-layer"
title = "Section 5.2: two layers, four heads, MLP and LayerNorm on the full-sequence shift task"

PAPER = dict(carrier=0.98, baseline=0.02)


def study(preset: str) -> StudyConfig:
    """Paper preset: 3 seeds x {rope, learned}, 2000 steps of batch 64 (the paper gives neither)."""
    cfg = StudyConfig(model_type="transformer", model=dict(d_model=64, n_layers=2, n_heads=4, layer_norm=True),
                      task_type="shift", task=dict(m=20, K=2), grid={"encoding": ("rope", "learned")}, seeds=3,
                      train=TrainConfig(steps=2000, batch_size=64, lr=1e-3),
                      eval=EvalConfig(lengths=(8, 12, 16, 20, 24, 32, 40, 48), n_sequences=512, chunk=256))
    return quick(cfg, steps=100, n_sequences=64) if preset == "quick" else cfg


def _accuracy_split(model, batch, Lmax: int) -> tuple[float, float, float]:
    """Accuracy over all target positions, over positions t < Lmax and over t >= Lmax (NaN if none)."""
    hits = np.zeros(2)
    total = np.zeros(2)
    with torch.no_grad():
        for part in split_batch(batch, 256, model_device(model)):
            logits = model(part.tokens, lengths=part.lengths)  # [b, s, m]
            ok = (logits.argmax(-1) == part.targets) & part.loss_mask  # [b, s]
            t = torch.arange(ok.shape[1], device=ok.device)
            for i, where in enumerate((t < Lmax, t >= Lmax)):
                hits[i] += float(ok[:, where].sum())
                total[i] += float(part.loss_mask[:, where].sum())
    ratio = [h / n if n else math.nan for h, n in zip(hits, total)]
    return float(hits.sum() / total.sum()), ratio[0], ratio[1]


def evaluate(ctx) -> list[dict]:
    study, task, model = ctx.study, ctx.task, ctx.model
    K, Lmax = task.K, study.train.max_length
    rows = []
    for L in study.eval.lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, acc_in, acc_out = _accuracy_split(model, batch, Lmax)
        rows.append(dict(probe="length", length=L, in_range=L <= Lmax, accuracy=acc, accuracy_in=acc_in,
                         accuracy_out=acc_out, chance=task.chance))
        pattern = probes.mean_pattern(model, batch, chunk=study.eval.chunk)  # [layers, h, L, L]
        argmax = pattern.argmax(-1)  # [layers, h, i]
        i = np.arange(L)
        at_target = argmax == (i - K)  # [layers, h, i]
        for layer in range(pattern.shape[0]):
            for h in range(pattern.shape[1]):
                inside, beyond = (i >= K) & (i < Lmax), i >= Lmax
                last = probes.peak(pattern[layer, h, L - 1], L)
                pos_out = argmax[layer, h, beyond]
                rows.append(dict(probe="head", length=L, layer=layer, head=h,
                                 target_frac_in=float(at_target[layer, h, inside].mean()),
                                 target_frac_out=float(at_target[layer, h, beyond].mean()) if beyond.any() else None,
                                 pinned_frac_out=float(np.bincount(pos_out).max() / len(pos_out)) if beyond.any()
                                 else None,
                                 a_star=float(pattern[layer, h, L - 1, L - 1 - K]), **last))
    # the retrieving head at L = Lmax, and its carrier energy (trained and untrained)
    at_lmax = [r for r in rows if r["probe"] == "head" and r["length"] == Lmax] or \
        [r for r in rows if r["probe"] == "head" and r["length"] == max(study.eval.lengths)]
    best = max(at_lmax, key=lambda r: r["a_star"])
    batch = eval_batch(task, Lmax, study.eval.n_sequences, study.eval.seed, device=ctx.device)
    for which, m in (("trained", model), ("untrained", ctx.untrained)):
        cq, ck = probes.collect_moments(m, batch, layer=best["layer"], chunk=study.eval.chunk).carrier_energies()
        rows.append(dict(probe="carrier", model=which, layer=best["layer"], head=best["head"],
                         carrier_q=float(cq[best["head"]]), carrier_k=float(ck[best["head"]]),
                         random_direction=1 / model.cfg.d_model, random_direction_head=1 / model.cfg.d_head,
                         a_star=best["a_star"]))
    return rows


def head_verdicts(heads: list[dict], Lmax: int, K: int) -> list[dict]:
    """Per (encoding, seed, layer, head): is the last query's peak at -K at every unseen length
    (equivariant), and at one absolute position < L_max at every unseen length (pinned)?"""
    out = []
    keys = sorted({(r["encoding"], r["seed"], r["layer"], r["head"]) for r in heads})
    for enc, seed, layer, h in keys:
        mine = [r for r in heads if (r["encoding"], r["seed"], r["layer"], r["head"]) == (enc, seed, layer, h)]
        unseen = {r["length"]: r for r in mine if r["length"] > Lmax}
        seen = [r for r in mine if r["length"] <= Lmax]
        if not unseen:
            continue
        offsets = {L: r["peak_offset"] for L, r in unseen.items()}
        positions = {L: r["peak_position"] for L, r in unseen.items()}
        out.append(dict(encoding=enc, seed=seed, layer=layer, head=h,
                        a_star_in=float(np.mean([r["a_star"] for r in seen])) if seen else math.nan,
                        target_frac_in=float(np.mean([r["target_frac_in"] for r in mine])),
                        target_frac_out=float(np.mean([r["target_frac_out"] for r in unseen.values()])),
                        equivariant=all(o == -K for o in offsets.values()),
                        pinned=len(set(positions.values())) == 1 and max(positions.values()) < Lmax,
                        in_range=max(positions.values()) < Lmax,
                        positions=" ".join(str(positions[L]) for L in sorted(positions)),
                        offsets=" ".join(str(offsets[L]) for L in sorted(offsets))))
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    cells, heads, carrier = select(rows, "length"), select(rows, "head"), select(rows, "carrier")
    Lmax, K = study.train.max_length, study.task.get("K", 2)
    verdicts = head_verdicts(heads, Lmax, K)
    files = [write_csv(cells, out / "rows.csv"), write_csv(heads, out / "heads.csv"),
             write_csv(verdicts, out / "head_verdicts.csv"), write_csv(carrier, out / "carrier.csv")]
    lengths = sorted({r["length"] for r in cells})
    encs = [e for e in study.axis("encoding") if any(r["encoding"] == e for r in cells)]
    acc = group_stats(cells, ("encoding", "length"), "accuracy")
    acc_out = group_stats([r for r in cells if r.get("accuracy_out") is not None and not math.isnan(r["accuracy_out"])],
                          ("encoding", "length"), "accuracy_out")
    body = [[e, *[fmt(*acc[(e, L)][:2]) if (e, L) in acc else "" for L in lengths]] for e in encs]
    body += [[f"{e} (positions >= {Lmax})", *[fmt(*acc_out[(e, L)][:2]) if (e, L) in acc_out else "-"
                                              for L in lengths]] for e in encs]
    seeds = f"seeds 0..{study.seeds - 1}"
    found = []
    ood = [L for L in lengths if L > Lmax]
    for e in encs:
        ind = [r["accuracy"] for r in cells if r["encoding"] == e and r["length"] <= Lmax]
        far = [r["accuracy"] for r in cells if r["encoding"] == e and r["length"] == max(lengths)]
        found.append(Claim(name=f"{e}: accuracy at trained lengths (<= {Lmax})", paper="solved",
                           measured=fmt(np.mean(ind), np.std(ind)), holds=bool(np.mean(ind) >= 0.95),
                           criterion=">= 0.95", note=seeds))
        found.append(Claim(name=f"{e}: accuracy at L = {max(lengths)}",
                           paper="RoPE generalizes" if e == "rope" else "APE degrades out of range",
                           measured=fmt(np.mean(far), np.std(far)),
                           holds=bool(np.mean(far) >= 0.9) if e == "rope" else bool(np.mean(far) < 0.5),
                           criterion=">= 0.9" if e == "rope" else "< 0.5", note=seeds))
    hrows = []
    for e in encs:
        mine = [v for v in verdicts if v["encoding"] == e]
        if not mine:
            continue
        # the retrieving head of each seed: most attention at -K in distribution
        best = [max([v for v in mine if v["seed"] == s], key=lambda v: v["a_star_in"])
                for s in sorted({v["seed"] for v in mine})]
        for v in mine:
            hrows.append([e, v["seed"], v["layer"], v["head"], f"{v['a_star_in']:.3f}", f"{v['target_frac_in']:.2f}",
                          f"{v['target_frac_out']:.2f}", v["offsets"], v["positions"], "yes" if v["equivariant"]
                          else "no", "yes" if v["pinned"] else "no"])
        if e == "rope":
            found.append(Claim(name="rope: retrieving head (per seed) peaks at -K at every unseen length (last query)",
                               paper="offset-equivariant out of distribution",
                               measured=f"{sum(v['equivariant'] for v in best)}/{len(best)} seeds; "
                                        f"all heads {sum(v['equivariant'] for v in mine)}/{len(mine)}",
                               holds=all(v["equivariant"] for v in best), criterion="every seed", note=seeds))
        else:
            found.append(Claim(name=f"{e}: retrieving head (per seed) peaks at one absolute position < L_max at "
                                    "every unseen length (last query)", paper="the APE head pins",
                               measured=f"{sum(v['pinned'] for v in best)}/{len(best)} seeds pinned, "
                                        f"{sum(v['in_range'] for v in best)}/{len(best)} inside [0, L_max); "
                                        f"equivariant {sum(v['equivariant'] for v in best)}/{len(best)}",
                               holds=all(v["pinned"] for v in best), criterion="every seed", note=seeds))
    for e in encs:
        tr = [r for r in carrier if r["encoding"] == e and r["model"] == "trained"]
        un = [r for r in carrier if r["encoding"] == e and r["model"] == "untrained"]
        if not tr:
            continue
        ck = [r["carrier_k"] for r in tr]
        cq = [r["carrier_q"] for r in tr]
        found.append(Claim(name=f"{e}: retrieving head's key carrier energy (L = {Lmax})",
                           paper=f"{PAPER['carrier']} (rope)" if e == "rope" else "-", measured=fmt(np.mean(ck),
                                                                                                np.std(ck)),
                           holds=bool(abs(np.mean(ck) - PAPER["carrier"]) <= 0.05) if e == "rope" else None,
                           criterion="within 0.05" if e == "rope" else "",
                           note=f"query carrier {fmt(np.mean(cq), np.std(cq))}; {seeds}"))
        found.append(Claim(name=f"{e}: baseline of that probe", paper=f"{PAPER['baseline']}",
                           measured=f"1/d_model = {tr[0]['random_direction']:.3f}, 1/d_head = "
                                    f"{tr[0]['random_direction_head']:.3f} (random direction); untrained model "
                                    f"keys {fmt(np.mean([r['carrier_k'] for r in un]), np.std([r['carrier_k'] for r in un]))}",
                           holds=None, note="the paper's 0.02 matches 1/d_model; the untrained probe is ~1/m for "
                                            "token-only keys (rope), higher with position rows added (learned)"))
    text = [f"# {title}", "",
            f"Mean ± std over {seeds}. Two layers, four heads (d = {study.model.get('d_model', 64)} // 4 per head), "
            f"MLP and pre-LayerNorm; shift by K = {K} over m = {study.task.get('m', 20)} tokens; "
            f"{study.train.steps} steps of batch {study.train.batch_size}, lengths in [{study.train.min_length}, {Lmax}] "
            f"per {study.train.length_sampling}; {study.eval.n_sequences} sequences per length. "
            "(The paper gives none of the recipe: these are this study's config values.)", "",
            "## Accuracy by length (all target positions; then only positions beyond the training range)", "",
            markdown_table(["encoding", *[f"L={L}" for L in lengths]], body), "",
            f"## Every head: a* at -K (last query, L <= {Lmax}), share of query rows peaking at -K inside / beyond "
            f"L_max, last-query peak offsets and positions at unseen lengths {ood}", "",
            markdown_table(["encoding", "seed", "layer", "head", "a* in", "at -K in", "at -K out", "offsets",
                            "positions", "equivariant", "pinned"], hrows), "",
            "## The paper's claims beside this run", "", claims_markdown(found), ""]
    (out / "table.md").write_text("\n".join(text))
    files += [out / "table.md", write_claims(found, out / "claims.json")]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for e in encs:
        pts = [(L, *acc[(e, L)][:2]) for L in lengths if (e, L) in acc]
        x, m, s = map(np.array, zip(*pts))
        ax.errorbar(x, m, yerr=s, marker="o", capsize=3, label=e)
    ax.axvline(Lmax, color="grey", ls=":")
    ax.set(xlabel="length L", ylabel="accuracy (all positions)", ylim=(0, 1.05))
    ax.legend()
    files.append(save(fig, out / "accuracy.png"))
    return files


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, in_run_all=True)
