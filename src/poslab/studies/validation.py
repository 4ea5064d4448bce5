"""Table 2 / Figs. 2-3 of the seed paper: the target-aligned carrier and dilution.

RoPE heads (K in {2, 3}, 5 seeds, the Table 1 protocol otherwise). Lemma 2: trained queries and
keys share a dominant direction — carrier energy ||mean||^2 / E||proj||^2 far above the
untrained baseline — pre-rotated to the target offset, so the carrier-only profile
phi_c(delta) = m_Q^T R_delta m_K peaks at delta = -K. Corollary 2: softmax over a growing
context dilutes the target weight a* inverse-linearly, so 1/a* is linear in L - 1.
The paper reports, under softmax at d = 64: carrier inner product cos(m_Q, R_-K m_K) ~ 0.83 and
key carrier fraction ~ 0.80 (untrained baseline 0.016); carrier fraction 0.72-0.86 across
settings; peak attention 0.69 at L = 48 for one head.

Two untrained baselines, each with its definition: the paper's 0.016 is 1/d, the share of the
keys' energy along a random direction (measured here on the trained keys, averaged over 64
random unit directions); the literal untrained value of probe (iii) (the same probe on the
member's initial weights) is about 1/m, since an untrained key's mean is the mean of m random
token directions. The carrier profile's argmax runs over the offsets the task has, delta <= 0.
The dilution fit is reported over every evaluation length and over the unseen ones only
(L > L_max), with its slope c; the paper gives no R^2 threshold, so R^2 is shown, not judged.
Training lengths are drawn per batch (the headline) and per sequence (control row), grid axis
``train.length_sampling``.
"""

from __future__ import annotations

from poslab.experiments.runner import Experiment

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from poslab import probes  # noqa: E402
from poslab.experiments.config import StudyConfig, quick  # noqa: E402
from poslab.studies.phenomenon import COLUMNS  # noqa: E402
from poslab.experiments.claims import Claim, claims_markdown, write_claims  # noqa: E402
from poslab.experiments.retrieval import (fmt, length_rows, markdown_table,  # noqa: E402
                                          save, select, write_csv)
from poslab.errors import ConfigError  # noqa: E402
from poslab.positional import ENCODINGS, rotary_encodings  # noqa: E402
from poslab.tasks import eval_batch  # noqa: E402

name = "validation"
title = "Table 2 / Figs. 2-3: target-aligned carrier and dilution"

PAPER = dict(carrier_k=0.80, carrier_cos=0.83, baseline=0.016, carrier_range=(0.72, 0.86), peak_at_48=0.69)
N_DIRECTIONS = 64  # random unit directions for the 1/d baseline


def study(preset: str) -> StudyConfig:
    cfg = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(m=20),
                      grid={"encoding": ("rope",), "task.K": (2, 3), "train.length_sampling": ("batch", "sequence")},
                      seeds=5)
    return quick(cfg) if preset == "quick" else cfg


def check(study: StudyConfig) -> None:
    """The carrier profile needs rotary frequencies: refuse other encodings before any work."""
    rotary = rotary_encodings()
    for name in study.axis("encoding"):
        if name in ENCODINGS and name not in rotary:
            raise ConfigError("encoding", name, f"rotary encodings: {', '.join(rotary)}")


def evaluate(ctx) -> list[dict]:
    rows = length_rows(ctx)
    study, model, K = ctx.study, ctx.model, ctx.task.K
    batch = eval_batch(ctx.task, study.train.max_length, study.eval.n_sequences, study.eval.seed, device=ctx.device)
    trained, base = probes.carrier(model, batch), probes.carrier(ctx.untrained, batch)
    offsets = np.arange(-(study.train.max_length - 1), 1)  # the offsets the task has: delta <= 0
    profile = probes.carrier_profile(model, batch, offsets)
    cos = probes.carrier_profile(model, batch, [-K], normalize=True)[0]
    rows.append(dict(probe="member", carrier_q=trained["carrier_q"], carrier_k=trained["carrier_k"],
                     baseline_q=base["carrier_q"], baseline_k=base["carrier_k"],
                     random_direction_q=random_direction(model, batch, "q"),
                     random_direction_k=random_direction(model, batch, "k"), carrier_cos=float(cos),
                     profile_peak=int(offsets[int(np.argmax(profile))]),
                     rank_concentration=probes.rank_concentration(model),
                     margin=probes.margin(model, batch, K)))
    rows += [dict(probe="profile", offset=int(d), phi=float(p)) for d, p in zip(offsets, profile)]
    return rows


def random_direction(model, batch, which: str, head: int = 0) -> float:
    """The 1/d baseline, measured: mean over random unit directions u of E[(u . x)^2] / E||x||^2
    for the trained projected queries or keys x (head 0, unrotated). Its expectation is 1/d."""
    g = torch.Generator().manual_seed(0)
    d = model.cfg.head_dim
    U = torch.randn(N_DIRECTIONS, d, generator=g, dtype=torch.float64)
    U = U / U.norm(dim=-1, keepdim=True)
    num = den = 0.0
    for _, inter in probes.over_chunks(model, batch):
        li = inter.layers[0]
        if which == "q":
            x = probes.at_last_query(li.q, inter)[:, head].double()  # [b, d]
        else:
            x = li.k[:, head].double()[probes.token_keys(inter)]  # [keys, d]
        num += float((x @ U.T).square().mean(-1).sum())
        den += float(x.square().sum())
    return num / den


def length_sampling(r: dict, study: StudyConfig) -> str:
    return r.get("length_sampling", study.train.length_sampling)


def fits(rows: list[dict], study: StudyConfig | None = None, unseen_only: bool = False) -> dict[tuple, dict]:
    """Dilution fit of 1/a* on L - 1 per (encoding, K, length sampling, seed), over the lengths with
    a* > 0 (every evaluation length, or with ``unseen_only`` those above L_max)."""
    out = {}
    cells = select(rows, "length")
    Lmax = study.train.max_length if study is not None else 0
    sampling = (lambda r: length_sampling(r, study)) if study is not None else (lambda r: r.get("length_sampling"))
    for key in sorted({(r["encoding"], r["K"], sampling(r), r["seed"]) for r in cells}, key=str):
        pts = [(r["length"], r["a_star"]) for r in cells
               if (r["encoding"], r["K"], sampling(r), r["seed"]) == key and r["a_star"] > 0
               and (not unseen_only or r["length"] > Lmax)]
        if len(pts) >= 2:
            out[key] = probes.dilution_fit(*zip(*pts))
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    cells = select(rows, "length")
    members = select(rows, "member")
    for r in cells + members:
        r["length_sampling"] = length_sampling(r, study)
    files = [write_csv(cells, out / "rows.csv", COLUMNS),
             write_csv(members, out / "members.csv"), write_csv(select(rows, "profile"), out / "profiles.csv")]
    fit, fit_unseen = fits(rows, study), fits(rows, study, unseen_only=True)
    Lmax, Lmax_eval = study.train.max_length, max(study.eval.lengths)
    all_L = sorted({r["length"] for r in cells})
    unseen_L = [L for L in all_L if L > Lmax]
    body, checks = [], []
    samplings = sorted({r["length_sampling"] for r in members}, key=lambda v: v != study.axis("train.length_sampling")[0])
    for enc in study.axis("encoding"):
        for K in study.axis("task.K"):
            for smp in samplings:
                mk = [r for r in members if r["encoding"] == enc and r["K"] == K and r["length_sampling"] == smp]
                if not mk:
                    continue
                st = {v: (np.mean([r[v] for r in mk]), np.std([r[v] for r in mk]))
                      for v in ("carrier_q", "carrier_k", "baseline_q", "baseline_k", "random_direction_q",
                                "random_direction_k", "carrier_cos", "rank_concentration", "margin")}
                fk = [f for (e, k, sm, _), f in fit.items() if (e, k, sm) == (enc, K, smp)]
                fu = [f for (e, k, sm, _), f in fit_unseen.items() if (e, k, sm) == (enc, K, smp)]
                ms = lambda fs, key: (np.mean([f[key] for f in fs]), np.std([f[key] for f in fs])) if fs else None  # noqa: E731
                peak48 = [r["peak_height"] for r in cells if r["encoding"] == enc and r["K"] == K
                          and r["length_sampling"] == smp and r["length"] == Lmax_eval]
                peaks = [r["profile_peak"] for r in mk]
                control = "" if smp == samplings[0] else " [control]"
                label = f"{enc}, K={K}, lengths per {smp}{control}"
                body.append([enc, K, smp + control, fmt(*st["carrier_q"]), fmt(*st["carrier_k"]),
                             f"{st['baseline_q'][0]:.3f} / {st['baseline_k'][0]:.3f}",
                             f"{st['random_direction_q'][0]:.4f} / {st['random_direction_k'][0]:.4f}",
                             fmt(*st["carrier_cos"]), f"{100 * np.mean([p == -K for p in peaks]):.0f}%",
                             fmt(*ms(fk, "slope")) if fk else "", fmt(*ms(fk, "r2")) if fk else "",
                             fmt(*ms(fu, "slope")) if fu else "", fmt(*ms(fu, "r2")) if fu else "",
                             fmt(np.mean(peak48), np.std(peak48)) if peak48 else "", fmt(*st["rank_concentration"])])
                n = f"{len(mk)} seeds ({', '.join(str(r['seed']) for r in mk)})"
                base_k = (f"untrained probe (iii) {st['baseline_k'][0]:.3f}; 1/d random-direction share "
                          f"{st['random_direction_k'][0]:.4f}")
                checks += [
                    Claim(name=f"{label}: key carrier energy ({base_k})",
                          paper=f"{PAPER['carrier_k']} (baseline {PAPER['baseline']} = 1/d)",
                          measured=fmt(*st["carrier_k"]), holds=bool(st["carrier_k"][0] > 5 * st["baseline_k"][0]),
                          criterion="> 5 x untrained probe (iii)", note=n),
                    Claim(name=f"{label}: query carrier energy (untrained probe (iii) {st['baseline_q'][0]:.3f}; "
                               f"1/d share {st['random_direction_q'][0]:.4f})",
                          paper=f"{PAPER['carrier_range'][0]}-{PAPER['carrier_range'][1]} (baseline {PAPER['baseline']})",
                          measured=fmt(*st["carrier_q"]), holds=bool(st["carrier_q"][0] > 5 * st["baseline_q"][0]),
                          criterion="> 5 x untrained probe (iii)", note=n),
                    Claim(name=f"{label}: cos(m_Q, R_-K m_K)", paper=f"{PAPER['carrier_cos']}",
                          measured=fmt(*st["carrier_cos"]), holds=bool(st["carrier_cos"][0] > 0.5), criterion="> 0.5",
                          note=n),
                    Claim(name=f"{label}: carrier profile argmax over delta <= 0 is -K", paper="yes",
                          measured=f"{100 * np.mean([p == -K for p in peaks]):.0f}% of seeds",
                          holds=all(p == -K for p in peaks), criterion="every seed", note=n),
                ]
                if fk:
                    checks.append(Claim(name=f"{label}: dilution slope c of 1/a* on L-1, all lengths {all_L}",
                                        paper="1/a* linear in L-1 (no c given)", measured=fmt(*ms(fk, "slope")),
                                        holds=None, note=f"R^2 {fmt(*ms(fk, 'r2'))} (shown, not judged); {n}"))
                if fu:
                    checks.append(Claim(name=f"{label}: dilution slope c, unseen lengths only {unseen_L}",
                                        paper="1/a* linear in L-1 (no c given)", measured=fmt(*ms(fu, "slope")),
                                        holds=None, note=f"R^2 {fmt(*ms(fu, 'r2'))} (shown, not judged); {n}"))
                if peak48:
                    checks.append(Claim(name=f"{label}: peak attention at L={Lmax_eval}",
                                        paper=f"{PAPER['peak_at_48']} (L=48, H=1)",
                                        measured=fmt(np.mean(peak48), np.std(peak48)), holds=None, note=n))
    header = ["encoding", "K", "lengths drawn per", "carrier q", "carrier k", "untrained (iii) q / k",
              "1/d share q / k", "cos(m_Q, R_-K m_K)", "profile argmax -K", "c (all L)", "R^2 (all L)",
              "c (unseen L)", "R^2 (unseen L)", f"peak height L={Lmax_eval}", "rank conc. of W"]
    text = [f"# {title}", "",
            f"Mean ± std over seeds 0..{study.seeds - 1}. Carrier energies on the projected (unrotated) queries and "
            f"keys at L = {Lmax}. Baselines: `untrained (iii)` is probe (iii) on the member's initial weights (about "
            f"1/m = {cells[0]['chance']:.3f}); `1/d share` is the "
            f"fraction of the trained keys' energy along a random unit direction ({N_DIRECTIONS} directions; the "
            f"paper's {PAPER['baseline']} = 1/d). Carrier profile argmax over delta in [-{Lmax - 1}, 0]. Dilution: "
            f"least squares of 1/a* on L - 1 over all evaluation lengths {all_L} and over the unseen ones {unseen_L}. "
            f"Training lengths uniform in [{study.train.min_length}, {Lmax}], drawn per batch (one length per step) "
            "or per sequence (one length per sequence); the first listed is the headline, the other a control.",
            "", markdown_table(header, body), "", "## The paper's claims beside this run", "",
            claims_markdown(checks), ""]
    (out / "table.md").write_text("\n".join(text))
    files += [out / "table.md", write_claims(checks, out / "claims.json")]
    return files + figures(rows, study, out, fit)


def figures(rows: list[dict], study: StudyConfig, out: Path, fit: dict) -> list[Path]:
    paths = []
    prof = select(rows, "profile")
    Ks = study.axis("task.K")
    fig, axes = plt.subplots(1, len(Ks), figsize=(4 * len(Ks), 3.2), squeeze=False)
    for ax, K in zip(axes[0], Ks):
        for seed in sorted({r["seed"] for r in prof if r["K"] == K}):
            pts = sorted((r["offset"], r["phi"]) for r in prof if r["K"] == K and r["seed"] == seed)
            if pts:
                d, p = zip(*pts)
                ax.plot(d, np.array(p) / max(abs(np.array(p)).max(), 1e-12), lw=1, alpha=0.8, label=f"seed {seed}")
        ax.axvline(-K, color="grey", ls="--", lw=1)
        ax.set(title=f"carrier profile, K = {K}", xlabel="offset delta", ylabel="phi_c(delta) / max |phi_c|")
        ax.legend(fontsize=6)
    paths.append(save(fig, out / "fig2_carrier_profile.png"))

    cells = select(rows, "length")
    Ks = study.axis("task.K")
    fig, axes = plt.subplots(1, len(Ks), figsize=(4 * len(Ks), 3.2), squeeze=False)
    for ax, K in zip(axes[0], Ks):
        for (enc, k, smp, seed), f in fit.items():
            if k != K:
                continue
            pts = sorted((r["length"] - 1, 1 / r["a_star"]) for r in cells
                         if (r["encoding"], r["K"], length_sampling(r, study), r["seed"]) == (enc, k, smp, seed)
                         and r["a_star"] > 0)
            x, y = map(np.array, zip(*pts))
            line = ax.plot(x, y, "o", ms=3)[0]
            ax.plot(x, f["slope"] * x + f["intercept"], "-", lw=1, color=line.get_color(),
                    label=f"{smp}, seed {seed}: c={f['slope']:.3f}, R²={f['r2']:.2f}")
        ax.set(title=f"dilution, K = {K}", xlabel="L - 1", ylabel="1 / a*")
        ax.legend(fontsize=6)
    paths.append(save(fig, out / "fig3_dilution.png"))
    return paths


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, check=check, in_run_all=True)
