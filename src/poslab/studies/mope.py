"""MoPE with energy-gated attention on TinyShakespeare: the 2 x 2 ablation (seed survey ``001``,
"Morlet Positional Encoding"; arXiv 2606.01258, 2605.26355, 2605.21842).

{RoPE, MoPE} x {standard, energy-gated attention (EGA)} character-level language models, trained
on the same text with the same steps, batches and seeds (the members of one cell differ only by
seed and train as one ensemble). Per member, on windows of the validation split:

    val_loss                 mean next-character cross-entropy at the training length T
    positionwise             loss per position bucket at T and beyond it (eval.lengths)
    pair   (MoPE)            each learned (omega_f, sigma_f), omega sigma / c, within 5% of c
    gate   (EGA)             tau_h per layer and head; the fraction of gated-on tokens (g > 1/2)
                             and of tokens above average energy (E > 1)

The report's table gives each cell's validation loss and its improvement over standard attention
(RoPE, no gate: loss(standard) - loss(cell), positive = better, paired by seed) beside the
published +0.119 (MoPE + EGA), +0.092 (EGA alone) and -0.032 (MoPE alone); the published models
had at most about 6M parameters and one seed. MoPE is ``encoding="mope"`` with the admissibility
boundary omega sigma >= c held by reparametrization (``admissibility="hard"``, c = 5) and one
(omega, sigma) per head and pair (``per_head``: 128 pairs per model at width 256, the abstract's
count); EGA is the Transformer's ``energy_gate`` (models/transformer.py has both definitions;
neither method section is public).

Presets, built on the character LM's (experiments/lm.py, ``lm_study``): ``quick`` (seconds, for
tests); ``paper``: nanoGPT's shakespeare_char CPU recipe (4 layers, 4 heads, d_model 128,
context 64, batch 12, 2000 steps, AdamW lr 1e-3 cosine to 1e-4, no dropout), 2 seeds; ``gpu``:
near the published scale, 6 layers x 256 wide (8 heads), context 256, about 4.8M parameters,
the LM's GPU recipe (5000 steps of batch 64) without dropout.
"""

from __future__ import annotations

from poslab.experiments.runner import Experiment

import dataclasses
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from poslab.errors import ConfigError, check_choice  # noqa: E402
from poslab.experiments.claims import Claim, claims_markdown, markdown_table, write_claims  # noqa: E402
from poslab.experiments.config import StudyConfig  # noqa: E402
from poslab.studies.lm import lm_study, validation_loss  # noqa: E402
from poslab.experiments.retrieval import fmt, save, select, write_csv  # noqa: E402
from poslab.models.transformer import gate_parameter_count  # noqa: E402

name = "mope"
title = "MoPE x energy-gated attention on TinyShakespeare (2 x 2 ablation)"

# Improvement in validation loss over standard attention (RoPE, no gate), from the abstracts.
PAPER = {("mope", True): 0.119, ("rope", True): 0.092, ("mope", False): -0.032}
PAPER_GATE = dict(tau=0.35, above_average=0.36, parameters=12_480, share=0.0026)
RESOLUTION = 1e-3  # an improvement smaller than this (in nats) has no sign
NEAR = 0.05  # a pair is "on the boundary" when omega sigma is within 5% of c
BUCKETS = 4  # position buckets per training length T
FIXED = {"model.energy_gate": "the grid axis of the ablation",
         "task_type": "the character-level language model (text)"}
PRESETS = ("quick", "paper", "gpu")
CELLS = (("rope", False), ("rope", True), ("mope", False), ("mope", True))
LABELS = {("rope", False): "standard (RoPE)", ("rope", True): "EGA alone (RoPE + EGA)",
          ("mope", False): "MoPE alone", ("mope", True): "MoPE + EGA"}
MOPE_OPTIONS = dict(admissibility="hard", admissibility_c=5.0, per_head=True, init_sigma=1e4)


def study(preset: str) -> StudyConfig:
    """The LM study of ``preset`` (experiments/lm.py: same data, recipe and seeds) over the 2 x 2 grid.

    ``paper`` keeps the LM's CPU recipe and adds evaluation at 2 T and 4 T; ``gpu`` takes the
    LM's GPU recipe with the issue's 6 x 256 model (8 heads) and no dropout; ``quick`` is a
    one-layer model for a few steps."""
    check_choice("preset", preset, PRESETS)
    changes = dict(encoding_options={"mope": dict(MOPE_OPTIONS)}, seeds=2,
                   grid={"encoding": ("rope", "mope"), "model.energy_gate": (False, True)})
    if preset == "quick":
        T = 16
        changes.update(model=dict(d_model=16, n_layers=1, n_heads=2),
                       train=dict(steps=8, batch_size=8, warmup_steps=2, min_length=T, max_length=T),
                       eval=dict(lengths=(T, 2 * T), n_sequences=4, chunk=4))
    elif preset == "paper":
        T = 64
        changes.update(eval=dict(lengths=(T, 2 * T, 4 * T), n_sequences=256, chunk=64))
    else:
        T = 256
        changes.update(model=dict(d_model=256, n_layers=6, n_heads=8, dropout=0.0),
                       eval=dict(lengths=(T, 2 * T, 4 * T), n_sequences=256, chunk=32))
    return lm_study(preset, encodings=("rope", "mope"), **changes)


def check(study: StudyConfig) -> None:
    """Both encodings and both attentions (the improvements are over RoPE without a gate), a model
    that outputs every position, one training length, evaluation from it on."""
    if study.model_type != "transformer":
        raise ConfigError("model_type", study.model_type, "transformer")
    if set(study.axis("encoding")) != {"rope", "mope"}:
        raise ConfigError("grid.encoding", list(study.axis("encoding")), '["rope", "mope"]')
    if set(study.axis("model.energy_gate")) != {False, True}:
        raise ConfigError("grid.model.energy_gate", list(study.axis("model.energy_gate")), "[false, true]")
    T = study.train.max_length
    if study.train.min_length != T:
        raise ConfigError("train.min_length", study.train.min_length, f"train.max_length={T} (one training length)")
    if min(study.eval.lengths) != T:
        raise ConfigError("eval.lengths", list(study.eval.lengths), f"lengths whose smallest is the training length {T}")


# ----------------------------------------------------------------------------- per member

def evaluate(ctx) -> list[dict]:
    study, model = ctx.study, ctx.model
    T, n, chunk = study.train.max_length, study.eval.n_sequences, study.eval.chunk
    val = dataclasses.replace(ctx.task, split="val")
    loss = validation_loss(model, val, T, chunk=chunk, limit=n)
    n_params = sum(p.numel() for p in model.parameters())
    rows = [dict(probe="member", val_loss=loss["loss"], val_accuracy=loss["accuracy"], windows=loss["windows"],
                 parameters=n_params, gate_parameters=gate_parameter_count(model))]
    rows += positionwise(model, val, study.eval.lengths, T, n, chunk, ctx.device)
    if model.cfg.encoding == "mope":
        rows += pair_rows(model.encoding)
    if model.cfg.energy_gate:
        rows += gate_rows(model, list(val.windows(T, batch_size=chunk, limit=n)), ctx.device)
    return rows


def positionwise(model, val, lengths, T: int, n: int, chunk: int, device) -> list[dict]:
    """Loss per position bucket (width T / BUCKETS) and overall, on validation windows of each length."""
    width = max(1, T // BUCKETS)
    rows = []
    for L in lengths:
        total, count = torch.zeros(L, dtype=torch.float64), 0
        for batch in val.windows(L, batch_size=chunk, limit=n):
            batch = batch.to(device)
            ce = F.cross_entropy(model(batch.tokens).transpose(1, 2), batch.targets, reduction="none")  # [b, L]
            total += ce.double().sum(0).cpu()
            count += batch.size
        per_position = total / count  # [L]
        rows.append(dict(probe="length", length=L, loss=float(per_position.mean()), windows=count))
        rows += [dict(probe="positionwise", length=L, bucket_start=lo, bucket_end=min(lo + width, L) - 1,
                      loss=float(per_position[lo:lo + width].mean()), windows=count) for lo in range(0, L, width)]
    return rows


def pair_rows(encoding) -> list[dict]:
    """Every learned (omega, sigma) pair, its product over c and whether it is within NEAR of c."""
    omega = encoding.omega.detach().cpu().double().reshape(-1, encoding.omega.shape[-1])  # [h | 1, F]
    sigma = encoding.sigma.detach().cpu().double().reshape(omega.shape)
    ratio = omega * sigma / encoding.c
    return [dict(probe="pair", head=h, pair=f, omega=float(omega[h, f]), sigma=float(sigma[h, f]),
                 ratio=float(ratio[h, f]), near=bool(abs(float(ratio[h, f]) - 1) <= NEAR), c=encoding.c)
            for h in range(omega.shape[0]) for f in range(omega.shape[1])]


def gate_rows(model, windows, device) -> list[dict]:
    """tau_h and, over the validation windows' tokens, the shares with g > 1/2 and with E > 1."""
    on, above, mean_g, count = {}, {}, {}, 0
    for batch in windows:
        _, inter = model(batch.tokens.to(device), return_intermediates=True)
        for l, (block, layer) in enumerate(zip(model.layers, inter.layers)):
            E, g = block.energy_gate(block.ln_attn(layer.resid_pre))  # [b, h, n]
            for key, value in ((on, (g > 0.5)), (above, (E > 1)), (mean_g, g)):
                key[l] = key.get(l, 0) + value.double().sum(dim=(0, 2)).cpu()  # [h]
        count += batch.tokens.numel()
    rows = []
    for l, block in enumerate(model.layers):
        tau = block.gate_tau.detach().cpu()
        rows += [dict(probe="gate", layer=l, head=h, tau=float(tau[h]), gated_on=float(on[l][h]) / count,
                      above_average=float(above[l][h]) / count, mean_gate=float(mean_g[l][h]) / count)
                 for h in range(tau.numel())]
    return rows


# ----------------------------------------------------------------------------- report

def _cell(r: dict) -> tuple:
    return (r["encoding"], bool(r["energy_gate"]))


def _mean_std(values) -> tuple[float, float]:
    values = np.asarray(list(values), dtype=float)
    return (float(values.mean()), float(values.std())) if values.size else (math.nan, math.nan)


def improvements(rows: list[dict]) -> dict[tuple, list[float]]:
    """Per cell, loss(standard) - loss(cell) for every seed both were trained with."""
    loss = {(_cell(r), r["seed"]): r["val_loss"] for r in select(rows, "member") if "variant" not in r}
    out = {}
    for cell in CELLS[1:]:
        out[cell] = [loss[(("rope", False), s)] - loss[(cell, s)] for (c, s) in loss if c == cell
                     and (("rope", False), s) in loss]
    return out


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    members = select(rows, "member")
    seeds = sorted({r["seed"] for r in members})
    T, steps = study.train.max_length, study.train.steps
    loss = {cell: _mean_std(r["val_loss"] for r in members if _cell(r) == cell) for cell in CELLS}
    params = {cell: next((r["parameters"] for r in members if _cell(r) == cell), None) for cell in CELLS}
    gate_params = next((r["gate_parameters"] for r in members if r["gate_parameters"]), 0)
    gains = improvements(rows)
    print(f"mope: energy gating adds {gate_params:,} parameters "
          f"({gate_params / max(1, params[('rope', False)] or 1):.2%} of the standard model)")

    body = []
    for cell in CELLS:
        gain = _mean_std(gains[cell]) if cell in gains else (0.0, 0.0)
        body.append([LABELS[cell], f"{params[cell]:,}" if params[cell] else "", fmt(*loss[cell]),
                     "—" if cell == ("rope", False) else f"{gain[0]:+.3f} ± {gain[1]:.3f}",
                     "—" if cell == ("rope", False) else f"{PAPER[cell]:+.3f}"])
    table = markdown_table(["model", "parameters", "val loss", "improvement (measured)", "improvement (paper)"], body)

    pairs = select(rows, "pair")
    near = float(np.mean([p["near"] for p in pairs])) if pairs else math.nan
    gates = select(rows, "gate")
    tau = _mean_std(g["tau"] for g in gates)
    gated_on = _mean_std(g["gated_on"] for g in gates)
    above = _mean_std(g["above_average"] for g in gates)
    models = len({(p["energy_gate"], p["seed"]) for p in pairs})
    claims = _claims(gains, near, len(pairs) // max(1, models), tau, gated_on, above, gate_params,
                     params[("rope", False)], seeds, steps, T, study)

    budget = (f"{len(seeds)} seeds ({', '.join(map(str, seeds))}), {steps} steps of batch {study.train.batch_size} "
              f"at context {T} ({steps * study.train.batch_size * T:,} training tokens per model), "
              f"validation loss on {members[0]['windows'] if members else 0} windows of the validation split")
    text = [f"# {title}", "", f"Budget: {budget}. Improvement = loss(standard) - loss(model), paired by seed, "
            "mean ± std over seeds (positive: better than standard attention). The paper reports one seed, "
            "models of at most ~6M parameters.", "", table, "",
            f"Energy gating adds {gate_params:,} parameters per model (paper: 12,480, < 0.26%).", "",
            "## Claims", "", claims_markdown(claims), "", _gate_table(gates), "", _length_table(rows, study)]
    files = [out / "table.md"]
    files[0].write_text("\n".join(text) + "\n")
    files.append(write_claims(claims, out / "claims.json"))
    files.append(write_csv(rows, out / "rows.csv"))
    files += figures(rows, study, out)
    return files


def _claims(gains, near, n_pairs, tau, gated_on, above, gate_params, standard_params, seeds, steps, T,
            study) -> list[Claim]:
    note = f"{len(seeds)} seeds, {steps} steps, context {T}"
    mean = {cell: _mean_std(v)[0] for cell, v in gains.items()}
    claims = []
    for cell, published in PAPER.items():
        direction = "> 0" if published > 0 else "< 0"
        seen = gains.get(cell, [])
        holds = None if not seen else all(math.copysign(1, v) == math.copysign(1, published) and abs(v) >= RESOLUTION
                                          for v in seen)
        claims.append(Claim(name=f"{LABELS[cell]}: improvement over standard attention", paper=f"{published:+.3f}",
                            measured=mean[cell], holds=holds,
                            criterion=f"every seed {direction} by at least {RESOLUTION}",
                            note=f"{note}; seeds {', '.join(f'{v:+.4f}' for v in seen)}; "
                                 f"gap to paper {mean[cell] - published:+.3f}"))
    order = [("mope", True), ("rope", True), ("mope", False)]
    values = [mean[c] for c in order]
    claims.append(Claim(name="ordering MoPE+EGA > EGA alone > MoPE alone", paper="+0.119 > +0.092 > -0.032",
                        measured=" > ".join(f"{v:+.3f}" for v in values) if all(map(math.isfinite, values)) else None,
                        holds=None if not all(map(math.isfinite, values)) else values[0] > values[1] > values[2],
                        criterion="strict order of means", note=note))
    claims.append(Claim(name="MoPE pairs within 5% of omega sigma = c", paper="128 / 128 (100%)", measured=near,
                        holds=None if math.isnan(near) else near == 1.0, criterion="fraction == 1",
                        note=f"{n_pairs} pairs per model, c = {study.encoding_options.get('mope', {}).get('admissibility_c', 5.0)}"))
    claims.append(Claim(name="learned tau (mean over layers, heads, models)", paper="~0.35", measured=tau[0],
                        holds=None if math.isnan(tau[0]) else abs(tau[0] - PAPER_GATE["tau"]) <= 0.1,
                        criterion="within 0.1", note=f"std {tau[1]:.3f}"))
    claims.append(Claim(name="tokens above average energy (E > 1)", paper="~36%", measured=above[0],
                        holds=None if math.isnan(above[0]) else abs(above[0] - PAPER_GATE["above_average"]) <= 0.1,
                        criterion="within 10 points",
                        note=f"gated on (g > 1/2): {gated_on[0]:.3f}; for Gaussian e, P(e^2 > mean e^2) = "
                             "P(chi2_1 > 1) = 0.317 before any training"))
    share = gate_params / standard_params if standard_params else math.nan
    claims.append(Claim(name="extra parameters of energy gating", paper="12,480 (< 0.26%)", measured=f"{gate_params:,} "
                        f"({share:.2%})", holds=None if math.isnan(share) else share < PAPER_GATE["share"],
                        criterion="share < 0.26%", note="h D + h per layer (W_gate, tau_h)"))
    return claims


def _gate_table(gates: list[dict]) -> str:
    if not gates:
        return ""
    by = {}
    for g in gates:
        by.setdefault((g["encoding"], g["layer"], g["head"]), []).append(g)
    body = [[enc, l, h, fmt(*_mean_std(x["tau"] for x in v)), fmt(*_mean_std(x["gated_on"] for x in v)),
             fmt(*_mean_std(x["above_average"] for x in v))] for (enc, l, h), v in sorted(by.items())]
    return "## Learned gate\n\n" + markdown_table(["encoding", "layer", "head", "tau", "gated on (g > 1/2)",
                                                   "above average (E > 1)"], body)


def _length_table(rows: list[dict], study: StudyConfig) -> str:
    body = []
    for cell in CELLS:
        line = [LABELS[cell]]
        for L in study.eval.lengths:
            line.append(fmt(*_mean_std(r["loss"] for r in select(rows, "length", length=L) if _cell(r) == cell)))
        body.append(line)
    return ("## Loss by evaluation length (training length "
            f"{study.train.max_length})\n\n" + markdown_table(["model", *map(str, study.eval.lengths)], body))


def figures(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    files = []
    pairs = select(rows, "pair")
    if pairs:
        fig, ax = plt.subplots(figsize=(5, 4))
        omega, sigma = np.array([p["omega"] for p in pairs]), np.array([p["sigma"] for p in pairs])
        near = np.array([p["near"] for p in pairs])
        ax.loglog(omega[~near], sigma[~near], "o", ms=3, label="learned pairs")
        ax.loglog(omega[near], sigma[near], "o", ms=3, color="C3", label="within 5% of the boundary")
        grid = np.geomspace(omega.min() / 2, omega.max() * 2, 100)
        ax.loglog(grid, pairs[0]["c"] / grid, "k--", label=f"omega sigma = {pairs[0]['c']:g}")
        ax.set_xlabel("omega"), ax.set_ylabel("sigma"), ax.legend(fontsize=7)
        ax.set_title("MoPE (omega, sigma) after training")
        files.append(save(fig, out / "pairs.png"))
    positions = select(rows, "positionwise")
    if positions:
        lengths = sorted({r["length"] for r in positions})
        fig, ax = plt.subplots(figsize=(6, 4))
        L = lengths[-1]
        for cell in CELLS:
            mine = [r for r in positions if r["length"] == L and _cell(r) == cell]
            starts = sorted({r["bucket_start"] for r in mine})
            ax.plot(starts, [np.mean([r["loss"] for r in mine if r["bucket_start"] == s]) for s in starts], "o-",
                    ms=3, label=LABELS[cell])
        ax.axvline(study.train.max_length, color="k", lw=0.8, ls=":", label="training length")
        ax.set_xlabel(f"position (bucket start, windows of {L})"), ax.set_ylabel("validation loss")
        ax.legend(fontsize=7)
        files.append(save(fig, out / "positionwise.png"))
    gates = select(rows, "gate")
    if gates:
        fig, ax = plt.subplots(figsize=(6, 3))
        for k, enc in enumerate(("rope", "mope")):
            mine = [g for g in gates if g["encoding"] == enc]
            keys = sorted({(g["layer"], g["head"]) for g in mine})
            ax.plot(range(len(keys)), [np.mean([g["tau"] for g in mine if (g["layer"], g["head"]) == key])
                                       for key in keys], "o", label=enc)
        ax.axhline(PAPER_GATE["tau"], color="k", ls="--", lw=0.8, label="paper ~0.35")
        ax.set_xlabel("layer x head"), ax.set_ylabel("learned tau"), ax.legend(fontsize=7)
        files.append(save(fig, out / "gate_tau.png"))
    return files


EXPERIMENT = Experiment(name=name, title=title, study=study, evaluate=evaluate, report=report, presets=PRESETS, fixed=FIXED, check=check)
