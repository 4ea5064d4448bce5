"""MoPE with energy-gated attention on TinyShakespeare: the 2 x 2 ablation (seed survey ``001``,
"Morlet Positional Encoding"; arXiv 2606.01258, 2605.26355, 2605.21842).

{RoPE, MoPE, sinusoidal} x {standard, energy-gated attention (EGA)} character LMs trained alike (the LM
study's recipe, :func:`~poslab.studies.kit.charlm.lm_study`); improvement = loss(standard) - loss(cell),
paired by seed, in nats per character (assumed), over standard attention read as RoPE (the ablation's
own baseline) and as sinusoidal (the seed names both and says not which). MoPE's (omega, sigma) pairs
are read against a common boundary omega sigma = c' (the median per model, c not assumed) and against
the hard boundary c over training (:mod:`poslab.probes.mope`). The set-up (MoPE's options, sigma0, the
parameter group, the rows, the presets) is described in docs/mope.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from poslab.errors import ConfigError
from poslab.experiments import Trained
from poslab.experiments.config import StudyConfig
from poslab.experiments.outputs import Column, Lines, Pivot, Table, mean_std, save, select, write_outputs
from poslab.experiments.rows import RowKind, frame, groups, of_kind, pick, values
from poslab.experiments.spec import (
    ClaimSpec,
    Extrapolation,
    Source,
    above,
    cited,
    is_,
    judge_all,
    lower_bound,
    maximum,
    mean,
    minimum,
    probe,
    seed_states,
    share,
    undecidable,
)
from poslab.models.energy_gate import gate_parameter_count
from poslab.probes.mope import gate_rows, trajectory_rows
from poslab.studies.kit.charlm import RECIPES, context_loss_rows, lm_study, validation_loss
from poslab.train import group_names

name = "mope"
title = "MoPE x energy-gated attention on TinyShakespeare (2 x 2 ablation)"

FIXED = {"model.energy_gate": "the grid axis of the ablation",
         "task_type": "the character-level language model (text)"}
# Improvement in validation loss (nats per character, assumed) over standard attention: MoPE + EGA's is the
# seed's (001); the components' come from the companion abstracts (EXTERNAL)
PAPER = {("mope", True): 0.119, ("rope", True): 0.092, ("mope", False): -0.032}
SEED_CELL = ("mope", True)
LABELS = {("rope", False): "standard (RoPE)", ("rope", True): "EGA alone", ("mope", False): "MoPE alone",
          ("mope", True): "MoPE + EGA", ("sinusoidal", False): "standard (sinusoidal)",
          ("sinusoidal", True): "EGA on sinusoidal"}
ENCODINGS = ("rope", "mope", "sinusoidal")
# "standard attention": RoPE is the study's reading (MoPE's phase is RoPE's rotation, so RoPE is MoPE with locality
# off: the ablation's baseline); sinusoidal, the other standard encoding the MoPE abstract names, is the control
# what each claim is (its role follows: experiments/spec.role_of): the MoPE abstract (seed 001, second) states the
# ablation on TinyShakespeare (the seed's setting); "standard attention" read as RoPE is the usual choice where the
# seed is silent, read as sinusoidal another; c = 5 (the hard boundary's constant) is assumed, another setting
BASELINES = {"rope": "usual", "sinusoidal": "other"}
IMPROVEMENT = seed_states("MoPE abstract: MoPE combined with Energy-Gated Attention achieves +0.119 improvement over "
                          "standard attention on TinyShakespeare", which="001")
EITHER = seed_states("MoPE abstract: outperforming either component alone", which="001")
BOUNDARY = seed_states("MoPE abstract: all 128 frequency-bandwidth pairs converge to the wavelet admissibility "
                       "boundary", which="001")
COMPANION = cited("companion abstracts, arXiv 2605.26355 and 2605.21842")
COMPONENTS = {"EGA alone": ("rope", True), "MoPE alone": ("mope", False)}  # what MoPE + EGA must beat
EXTERNAL = ("companion abstracts (arXiv 2605.26355, 2605.21842), not seed 001: one seed, models of at most ~6M "
            "parameters; judged apart from the seeds")
RESOLUTION = 1e-3  # an improvement smaller than this (nats) has no sign
NEAR = 0.05  # a pair is on the boundary when omega sigma / c is within 5% of 1
BUCKETS = 4  # position buckets per training length T
C = 5.0  # the admissibility constant c
BOUNDARY_SIGMA0 = 0.01  # the control's free width: every pair starts at omega sigma / c <= 1 + 0.002
GROUP_LR = 1e-2  # omega's and sigma's own peak lr (10 x the LM's): Adam moves a log-scale ~lr per step
SNAPSHOTS = 10  # recorded points of the (omega, sigma) trajectories, evenly over training
MOPE_PARAMETERS = ["log_omega_scale", "log_sigma_scale"]


MOPE_OPTIONS = dict(admissibility="hard", admissibility_c=C, per_head=True)  # init_sigma: the context T


def _study() -> StudyConfig:
    """The LM study of the paper preset (the char LM's CPU recipe) over the 2 x 2 grid; MoPE's free width
    starts at the context T."""
    T, steps = RECIPES["paper"]["context"], RECIPES["paper"]["steps"]
    train = dict(param_groups=(dict(match=MOPE_PARAMETERS, lr=GROUP_LR, weight_decay=0.0),),
                 snapshot_steps=snapshot_steps(steps))
    return lm_study("paper", encodings=ENCODINGS, train=train, seeds=3,
                    grid={"encoding": ENCODINGS, "model.energy_gate": (False, True)},
                    eval=dict(lengths=(T, 2 * T, 4 * T), n_sequences=256, chunk=64),
                    encoding_options={"mope": dict(MOPE_OPTIONS, init_sigma=float(T))})


def snapshot_steps(steps: int) -> tuple[int, ...]:
    return tuple(sorted({max(1, round(steps * k / SNAPSHOTS)) for k in range(1, SNAPSHOTS)}))


def _sigma0(rows) -> str:
    return "boundary" if rows.get("init_sigma", 1.0) <= BOUNDARY_SIGMA0 else "context"


def _gain_claim(cell: tuple[str, bool], gain: float, baseline: str, source: Source, setting: str,
                note: str) -> ClaimSpec:
    """Every seed's improvement of ``cell`` over standard attention (``baseline``) has the sign of ``gain``."""
    return ClaimSpec(name=f"{LABELS[cell]}: improvement over standard attention ({baseline} baseline, nats)",
                     paper=f"{gain:+.3f}", source=source, setting=setting,
                     where=probe("gain") & is_("encoding", cell[0])
                     & is_("energy_gate", cell[1]) & is_("baseline", baseline),
                     measure=minimum("gain", "lowest seed") if gain > 0 else maximum("gain", "highest seed"),
                     op=">=" if gain > 0 else "<=", threshold=RESOLUTION if gain > 0 else -RESOLUTION,
                     note="{seeds} seeds; every seed must have the sign by at least 0.001" + note)


CLAIMS = [
    *(_gain_claim(SEED_CELL, PAPER[SEED_CELL], baseline, IMPROVEMENT, setting,
                  "; standard attention read as RoPE (MoPE with locality off; the seed does not say which)"
                  if setting == "usual" else "; standard attention read as sinusoidal (the seed does not say which)")
      for baseline, setting in BASELINES.items()),
    ClaimSpec(name="MoPE + EGA beats {component}: loss({component}) - loss(MoPE + EGA), paired by seed",
              paper="outperforming either component alone", where=probe("beats"), per=("component",),
              measure=lower_bound("diff"), op=">", threshold=0.0, source=EITHER, setting="seed",
              note="{seeds} seeds; per seed the pair's improvement minus the component's; the pair wins when the "
                   "seed mean less 2 standard errors is above 0"),
    ClaimSpec(name="MoPE pairs within 5% of their model's common omega sigma = c' after training ({sigma_init} "
                   "start)",
              paper="all 128 pairs converge to the admissibility boundary (c not given)",
              where=probe("move") & is_("sigma_init", "context"), per=("sigma_init",),
              measure=share("final_spread_gap", "<=", NEAR), op=">=", threshold=1.0, percent=True,
              source=BOUNDARY, setting="seed",
              note="{n} pairs over models and heads; c' = the median omega sigma of the model's pairs, so no c is "
                   "assumed; a common boundary puts every pair within 5% of it (the 5% of 'on the boundary' below)"),
    ClaimSpec(name="MoPE pairs within 5% of omega sigma = c after training ({sigma_init} start)",
              paper="128 / 128 (100%)", where=probe("move") & is_("sigma_init", "context"), per=("sigma_init",),
              measure=share("final_gap", "<=", NEAR), op=">=", threshold=1.0, percent=True, source=BOUNDARY,
              setting="other",
              note="{n} pairs over models and heads; sigma0 = T; c = 5 assumed: the hard boundary's constant"),
    ClaimSpec(name="MoPE pairs off omega sigma = c at initialization that reach it", paper="all pairs converge",
              where=probe("move") & above("initial_gap", NEAR), measure=share("final_gap", "<=", NEAR), op=">=",
              threshold=1.0, percent=True, source=BOUNDARY, setting="other",
              note="{n} pairs started more than 5% off; c = 5 assumed"),
    ClaimSpec(name="MoPE pairs within 5% of omega sigma = c after training ({sigma_init} start)",
              paper="128 / 128 (100%)", where=probe("move") & is_("sigma_init", "boundary"), per=("sigma_init",),
              measure=share("final_gap", "<=", NEAR), percent=True, source=BOUNDARY, setting="other",
              na=undecidable("every pair starts on the boundary (sigma0 = 0.01): staying there is not converging to "
                             "it, and leaving it would need no convergence either")),
    *(_gain_claim(cell, PAPER[cell], "rope", COMPANION, "other", "; " + EXTERNAL) for cell in COMPONENTS.values()),
    ClaimSpec(name="learned tau (mean over layers, heads, models)", paper="~0.35", where=probe("gate"),
              measure=mean("tau"), op="~", threshold=0.35, tol=0.1, source=COMPANION, setting="other", note=EXTERNAL),
    ClaimSpec(name="tokens above average energy (E > 1)", paper="~36%", where=probe("gate"),
              measure=mean("above_average"), op="~", threshold=0.36, tol=0.1, percent=True, source=COMPANION,
              setting="other",
              note=f"{EXTERNAL}; for Gaussian e, P(e^2 > mean e^2) = P(chi2_1 > 1) = 31.7% before any training"),
    ClaimSpec(name="extra parameters of energy gating (share of the standard model)", paper="12,480 (< 0.26%)",
              where=probe("gate_share"), measure=maximum("share"), op="<", threshold=0.0026, percent=True,
              source=COMPANION, setting="other", note=f"{EXTERNAL}; h D + h per layer (W_gate, tau_h)"),
]


def _fmt(values, scale=1.0) -> str:
    return mean_std([v * scale for v in values], signed=True, empty="—")


def _paper(group) -> str:
    cell = (group[0]["encoding"], bool(group[0]["energy_gate"]))
    return f"{PAPER[cell]:+.3f}" if cell in PAPER else "—"


def _by_model(group: list[dict]) -> dict[object, np.ndarray]:
    """ln(omega sigma) of the group's pairs, per seed (one model per seed in a group of one cell and step)."""
    out: dict[object, list[float]] = {}
    for r in group:
        out.setdefault(r["seed"], []).append(math.log(r["omega"] * r["sigma"]))
    return {seed: np.array(v) for seed, v in out.items()}


def _common_share(group: list[dict]) -> float:
    """The share of pairs within NEAR of their model's median omega sigma (c' = the common boundary)."""
    return float(np.mean([bool(abs(math.exp(v - np.median(logs)) - 1) <= NEAR)
                          for logs in _by_model(group).values() for v in logs]))


def _log_spread(group: list[dict]) -> float:
    """The std of ln(omega sigma) over a model's pairs, mean over models (0: every pair on one boundary)."""
    return float(np.mean([logs.std() for logs in _by_model(group).values()]))


TABLES = [
    Table("Validation loss and improvement over standard attention", by=("encoding", "energy_gate"),
          where=probe("member"), intro="Improvement = loss(standard) - loss(cell) per seed, mean ± std over "
          "seeds; nats per character (bits = nats / ln 2); standard = RoPE without a gate (the study's reading), "
          "and beside it sinusoidal without a gate. The paper reports one seed of models of at most ~6M "
          "parameters.",
          columns=(Column("parameters", lambda g: f"{g[0]['parameters']:,}"), Column("val loss", "val_loss"),
                   Column("improvement (nats)", lambda g: _fmt([r["gain"] for r in g if "gain" in r])),
                   Column("improvement (bits)", lambda g: _fmt([r["gain"] for r in g if "gain" in r], 1 / math.log(2))),
                   Column("over sinusoidal (nats)", lambda g: _fmt([r["gain_sinusoidal"] for r in g
                                                                     if "gain_sinusoidal" in r])),
                   Column("paper (nats, assumed)", _paper))),
    Table("Loss by evaluation length", by=("encoding", "energy_gate"), where=probe("loss"),
          pivot=Pivot("length", "loss", "L={}")),
    Table("MoPE (omega, sigma): distance to the boundary and locality", by=("energy_gate", "step"),
          where=probe("pair"), intro="gap = |omega sigma / c - 1| over all pairs, heads and seeds (c = 5, the hard "
          "boundary's); c' = the median omega sigma of a model's pairs (no c assumed), and the std of ln(omega "
          "sigma) over a model's pairs, mean over models; damping at offset T = exp(-T^2 / 2 sigma^2), the smallest "
          "over pairs (1 = no locality).",
          columns=(Column("pairs within 5% of c", share("gap", "<=", NEAR)), Column("gap", "gap"),
                   Column("pairs within 5% of c'", _common_share), Column("std ln(omega sigma)", _log_spread),
                   Column("median sigma", lambda g: float(np.median([r["sigma"] for r in g]))),
                   Column("min damping at T", lambda g: float(min(r["damping_T"] for r in g))))),
    Table("Learned gate", by=("encoding", "layer", "head"), where=probe("gate"),
          columns=(Column("tau", "tau"), Column("gated on (g > 1/2)", "gated_on"),
                   Column("above average (E > 1)", "above_average"))),
]
FIGURES = [
    Lines("positionwise.png", x="bucket_start", y="loss", series=("encoding", "energy_gate"), panel="length",
          where=probe("positionwise"), xlabel="position (bucket start)", ylabel="validation loss"),
    Lines("pair_trajectory.png", x="step", y="log10_ratio", series=("pair",), panel="energy_gate",
          where=probe("pair"), ylabel="log10(omega sigma / c) (0 = boundary)", hline=0.0),
]


def check(study: StudyConfig) -> None:
    """The three encodings and both attentions (the improvements are over RoPE, and over sinusoidal,
    without a gate), one training length, evaluation from it on, and parameter groups that name
    parameters of the model."""
    from poslab.experiments import members

    if study.model_type != "transformer":
        raise ConfigError("model_type", study.model_type, "transformer")
    if set(study.axis("encoding")) != set(ENCODINGS):
        raise ConfigError("grid.encoding", list(study.axis("encoding")), list(ENCODINGS))
    if set(study.axis("model.energy_gate")) != {False, True}:
        raise ConfigError("grid.model.energy_gate", list(study.axis("model.energy_gate")), "[false, true]")
    T = study.train.max_length
    if study.train.min_length != T:
        raise ConfigError("train.min_length", study.train.min_length, f"train.max_length={T} (one training length)")
    if min(study.eval.lengths) != T:
        raise ConfigError("eval.lengths", list(study.eval.lengths),
                          f"lengths whose smallest is the training length {T}")
    mope = next(m for m in members(name, study) if m.study.encoding == "mope")
    with torch.device("meta"):
        model = mope.make_model()()
    group_names([n for n, _ in model.named_parameters()], study.train, strict=True)


# ----------------------------------------------------------------------------- per member

def evaluate(ctx) -> list[dict]:
    study, model = ctx.study, ctx.model
    T, n, chunk = study.train.max_length, study.eval.n_sequences, study.eval.chunk
    val = dataclasses.replace(ctx.task, split="val")
    loss = validation_loss(model, val, T, chunk=chunk, limit=n)
    rows = [dict(probe="member", val_loss=loss["loss"], val_accuracy=loss["accuracy"], windows=loss["windows"],
                 parameters=sum(p.numel() for p in model.parameters()), gate_parameters=gate_parameter_count(model))]
    rows += context_loss_rows(lambda L: model, val, study.eval.lengths, T, n=n, chunk=chunk, device=ctx.device,
                              buckets=BUCKETS)
    if model.cfg.encoding == "mope":
        rows += trajectory_rows(model, ctx.untrained, ctx.snapshots, study.train.steps, T)
    if model.cfg.energy_gate:
        rows += gate_rows(model, list(val.windows(T, batch_size=chunk, limit=n)), ctx.device)
    return rows


# ----------------------------------------------------------------------------- derived rows and report

GAIN = RowKind("gain", {"encoding": str, "energy_gate": bool, "seed": int, "baseline": str, "gain": float})
GATE_SHARE = RowKind("gate_share", {"encoding": str, "seed": int, "share": float})
BEATS = RowKind("beats", {"component": str, "seed": int, "diff": float})
MOVE = RowKind("move", {"energy_gate": bool, "seed": int, "head": int, "pair": int, "sigma_init": str,
                        "initial_gap": float, "final_gap": float, "initial_spread_gap": float,
                        "final_spread_gap": float, "log_sigma_change": float, "log_omega_change": float})


def derived_rows(rows: list[dict]) -> list[dict]:
    """``gain`` (per cell, seed and ``baseline`` of BASELINES: loss(baseline without a gate) - loss(cell)),
    ``beats`` (per component of COMPONENTS and seed: loss(component) - loss(MoPE + EGA)), ``move`` (per
    model, head and pair: initial and final gap to the boundary, with the run's sigma0 start),
    ``gate_share`` (gate parameters / the same encoding's standard model's)."""
    loss = {(r["encoding"], bool(r["energy_gate"]), r["seed"]): r for r in select(rows, "member")}  # keyed per cell
    out = []
    for (enc, gate, seed), r in loss.items():
        for baseline in BASELINES:
            base = loss.get((baseline, False, seed))
            if base is not None and (enc, gate) != (baseline, False):
                out.append(GAIN(encoding=enc, energy_gate=gate, seed=seed, baseline=baseline,
                                gain=base["val_loss"] - r["val_loss"]))
        base = loss.get((enc, False, seed))
        if base is not None and r["gate_parameters"]:
            out.append(GATE_SHARE(encoding=enc, seed=seed, share=r["gate_parameters"] / base["parameters"]))
        if (enc, gate) == SEED_CELL:
            out += [BEATS(component=label, seed=seed, diff=loss[(*cell, seed)]["val_loss"] - r["val_loss"])
                    for label, cell in COMPONENTS.items() if (*cell, seed) in loss]
    return out + move_rows(rows, _sigma0)


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    derived = derived_rows(rows)
    gains = {(g["encoding"], g["energy_gate"], g["seed"], g["baseline"]): g["gain"] for g in select(derived, "gain")}

    def with_gains(r: dict) -> dict:
        key = (r["encoding"], bool(r["energy_gate"]), r["seed"])
        return {**r, **{"gain" if b == "rope" else f"gain_{b}": gains[(*key, b)] for b in BASELINES
                        if (*key, b) in gains}}

    shown = [with_gains(r) if r.get("probe") == "member" else r for r in rows]
    seeds = sorted({r["seed"] for r in select(rows, "member")})
    tr = study.train
    mope = study.encoding_options.get("mope", {})
    intro = (f"Budget: {len(seeds)} seeds ({', '.join(map(str, seeds))}), {tr.steps} steps of batch {tr.batch_size} at "
             f"context {tr.max_length} ({tr.steps * tr.batch_size * tr.max_length:,} training tokens per model). "
             f"MoPE: admissibility {mope.get('admissibility')}, c = {mope.get('admissibility_c')}, "
             f"sigma0 = {mope.get('init_sigma')} ({_sigma0(mope)} start), omega and sigma in their own group "
             f"{list(tr.param_groups)}; trajectories at steps {list(tr.snapshot_steps)}.")
    return write_outputs(out, title=title, rows=shown, claims=judge_all(CLAIMS, rows + derived), intro=intro,
                         tables=TABLES, figures=FIGURES, csv_rows=rows + derived,
                         more_figures=partial(pairs_figure, near=NEAR))


def move_rows(rows: list[dict], start: Callable[[dict], str]) -> list[dict]:
    """One ``move`` row per model, head and pair of the ``pair`` rows: its gap to omega sigma = c and
    its ``spread_gap`` to the model's median omega sigma c' (the common boundary, no c assumed) at
    the first and last recorded step, the log-changes of sigma and omega, and ``sigma_init`` =
    ``start(first row)``."""
    pairs = of_kind(frame(rows), "pair")
    if pairs.empty:
        return []
    pairs = pairs.assign(product=pairs["omega"] * pairs["sigma"])  # omega sigma of each pair
    common = {key: float(np.median(values(part, "product")))  # the model's median omega sigma at each step
              for key, part in groups(pairs, ("energy_gate", "seed", "step"))}

    def spread_gap(p: dict) -> float:
        return abs(p["omega"] * p["sigma"] / common[(p["energy_gate"], p["seed"], p["step"])] - 1)

    out = []
    for (gate, seed, head, pair), part in groups(pairs, ("energy_gate", "seed", "head", "pair")):
        track = sorted(pick(rows, part), key=lambda p: p["step"])
        first, last = track[0], track[-1]
        out.append(MOVE(energy_gate=gate, seed=seed, head=head, pair=pair, sigma_init=start(first),
                        initial_gap=first["gap"], final_gap=last["gap"], initial_spread_gap=spread_gap(first),
                        final_spread_gap=spread_gap(last), log_sigma_change=math.log(last["sigma"] / first["sigma"]),
                        log_omega_change=math.log(last["omega"] / first["omega"])))
    return out


def pairs_figure(rows: list[dict], out: Path, near: float = 0.05) -> list[Path]:
    """pairs.png: (omega, sigma) of every pair at initialization and after training, against
    sigma = c / omega and (1 + ``near``) c / omega, a panel per energy-gate setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = select(rows, "pair")
    if not pairs:
        return []
    last = max(p["step"] for p in pairs)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), squeeze=False, sharey=True)
    for ax, gate in zip(axes[0], (False, True), strict=False):
        mine = [p for p in pairs if bool(p["energy_gate"]) == gate]
        for step, style in ((0, dict(mfc="none", color="grey", label="initial")),
                            (last, dict(color="C3", label=f"after {last} steps"))):
            sel = [p for p in mine if p["step"] == step]
            ax.loglog([p["omega"] for p in sel], [p["sigma"] for p in sel], "o", ms=3, **style)
        omega = np.array([p["omega"] for p in pairs])
        grid = np.geomspace(omega.min() / 2, omega.max() * 2, 100)
        c = pairs[0]["c"]
        ax.loglog(grid, c / grid, "k--", lw=1, label=f"omega sigma = {c:g}")
        ax.loglog(grid, (1 + near) * c / grid, "k:", lw=0.8, label=f"+{near:.0%}")
        ax.set(xlabel="omega", title=f"MoPE, energy gate {'on' if gate else 'off'}")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("sigma")
    return [save(fig, out / "pairs.png")]


# the char LM's CPU recipe with MoPE's changes (_study); each other preset the settings it changes
BASE = _study()
GPU = RECIPES["gpu"]  # nanoGPT's GPU recipe: ~5M parameters at the published scale (d_model 256 here), dropout 0.2
PRESETS = {
    "paper": {},
    "quick": {"model": dict(d_model=16, n_layers=1, n_heads=2, bias=False, dropout=0.0), "seeds": 2,
              "encoding_options": {"mope": dict(MOPE_OPTIONS, init_sigma=16.0)},
              "train.steps": 8, "train.batch_size": 8, "train.warmup_steps": 2, "train.min_length": 16,
              "train.max_length": 16, "train.snapshot_steps": snapshot_steps(8),
              "eval.lengths": (16, 32), "eval.n_sequences": 4, "eval.chunk": 4},
    "gpu": {"model": dict(d_model=256, n_layers=6, n_heads=8, bias=False, dropout=0.2),
            "encoding_options": {"mope": dict(MOPE_OPTIONS, init_sigma=float(GPU["context"]))},
            "train.steps": GPU["steps"], "train.batch_size": GPU["batch_size"], "train.min_length": GPU["context"],
            "train.max_length": GPU["context"], "train.snapshot_steps": snapshot_steps(GPU["steps"]),
            "eval.lengths": tuple(k * GPU["context"] for k in (1, 2, 4)), "eval.chunk": 32},
}


EXPERIMENT = Trained(name=name, title=title, base=BASE, evaluate=evaluate, report=report, presets=PRESETS,
                        fixed=FIXED, check=check,
                        extrapolation=Extrapolation("lm", probe("loss") & is_("energy_gate", False), "loss",
                                                    "by_ratio"))
