"""The rows every fixed-offset retrieval study evaluates per member (Table 1's protocol).

Rows are tidy dicts. ``probe="length"`` rows hold one (encoding, K, seed, length) cell;
``probe="member"`` rows hold per-member numbers (carrier energies, rank concentration);
``probe="profile"`` rows hold one offset of the carrier profile. Below them, what the
fixed-offset studies (phenomenon, validation, linear-control, bias-comparison) derive from
those rows or add to them: the in-range attention mass, the APE conditions and their pinning
per head, the dilution fit of 1/a* on L - 1, the carrier beside the untrained model's,
Section 7's score profile beside its min-norm interpolant, T5 bucket coverage, and the
attention-by-offset and interpolant figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from poslab import probes
from poslab.experiments import MemberContext
from poslab.experiments.outputs import group_stats, save, select
from poslab.experiments.spec import Extrapolation, is_, probe
from poslab.positional import encoding_class
from poslab.studies.kit.members import poslab_model, retrieval_head, task_offset
from poslab.tasks import eval_batch

# the length rows past the training range, and what a fixed-offset study measured there for the survey table
BEYOND = probe("length") & is_("in_range", False)
EXTRAPOLATION = Extrapolation("fixed_offset", BEYOND, "accuracy")


def length_rows(ctx: MemberContext) -> list[dict]:
    """Accuracy, selected peak offset/position/height and target weight a* at every length.

    The target offset is the task's ``K`` (a fixed-offset retrieval task)."""
    study, task = ctx.study, ctx.task
    rows = []
    for L in study.eval.lengths:
        if L > STREAM_ABOVE:  # keys stream in chunks (probes/streaming.py): no per-offset rows
            rows.append(dict(probe="length", length=L, in_range=False, chance=task.chance, streamed=True,
                             **stream_row(ctx, L)))
            continue
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, attn = probes.accuracy_and_attention(retrieval_head(ctx.model), batch, chunk=study.eval.chunk)
        attn = attn[0]  # head 0, [L]
        rows.append(dict(probe="length", length=L, in_range=L <= study.train.max_length,
                         accuracy=acc, **probes.peak(attn, L),
                         a_star=probes.attention_at_offset(attn, L, -task_offset(task)), chance=task.chance))
        rows += [dict(probe="attention", length=L, offset=t - (L - 1), weight=float(w)) for t, w in enumerate(attn)]
    return rows


STREAM_ABOVE = 4096  # longer evaluation lengths stream their keys in bounded memory


def stream_row(ctx: MemberContext, L: int) -> dict:
    """``length_rows``' numbers at a length too long to hold: uniform i.i.d. sequences drawn chunk by
    chunk (another draw than ``eval_batch``'s, from the same distribution)."""
    from poslab.probes.streaming import StreamedTokens, stream_length_row

    src = StreamedTokens(b=ctx.study.eval.n_sequences, m=ctx.task.vocab_size, L=L, seed=ctx.study.eval.seed)
    return stream_length_row(ctx.model, src, L, task_offset(ctx.task), device=ctx.device,
                             mass_below=ctx.study.train.max_length)


def tag(rows: list[dict], **columns) -> list[dict]:
    """Set ``columns`` on every row (e.g. ``length_sampling``, present whether or not it is a grid axis)."""
    for r in rows:
        r.update(columns)
    return rows


def add_in_range_mass(rows: list[dict], Lmax: int) -> list[dict]:
    """Give each ``length`` row ``in_range_mass``: its attention rows' weight on keys at positions < L_max."""
    by_length = {r["length"]: r for r in select(rows, "length")}
    for r in select(rows, "attention"):
        if r["offset"] + r["length"] - 1 < Lmax:
            by_length[r["length"]]["in_range_mass"] = by_length[r["length"]].get("in_range_mass", 0.0) + r["weight"]
    return rows


def head_pinning(cells: list[dict], Lmax: int) -> list[dict]:
    """Per (condition, K, seed) head over its unseen lengths L > L_max (Proposition 2's pinning):
    one peak position at every unseen length and below L_max (``pinned``), the least-squares
    slope of the peak position against L (~0 absolute, ~1 relative) and the mean attention mass
    inside [0, L_max) (``mass``) beside a uniform head's L_max / L (``uniform_mass``)."""
    heads: dict[tuple, list[dict]] = {}
    for r in cells:
        if r["length"] > Lmax:
            heads.setdefault((r["condition"], r["K"], r["seed"]), []).append(r)
    out = []
    for (cond, K, seed), rs in sorted(heads.items()):
        rs = sorted(rs, key=lambda r: r["length"])
        L = np.array([r["length"] for r in rs], dtype=float)
        pos = np.array([r["peak_position"] for r in rs], dtype=float)
        slope = probes.peak_slope(L, pos)
        one = len(set(pos)) == 1
        mass, uniform = float(np.mean([r["in_range_mass"] for r in rs])), float(np.mean(Lmax / L))
        out.append(dict(probe="head", condition=cond, kind=rs[0].get("kind"), role=rs[0].get("role"), K=K, seed=seed,
                        pinned=bool(one and pos[0] < Lmax), position=int(pos[0]) if one else None,
                        below_Lmax_minus_1_minus_K=bool(one and pos[0] == Lmax - 1 - K), slope=slope, mass=mass,
                        uniform_mass=uniform, mass_excess=mass - uniform,
                        positions=" ".join(str(int(p)) for p in pos)))
    return out


def dilution_fit_rows(rows: list[dict], Lmax: int, key: tuple[str, ...]) -> list[dict]:
    """Derived rows (probe "fit"): the dilution fit of 1/a* on L - 1 per member (the ``key``
    columns), over every evaluation length with a* > 0 (span "all") and over those above L_max
    (span "unseen"), with the largest absolute residual relative to the mean 1/a*."""
    cells = select(rows, "length")
    out = []
    for k in sorted({tuple(r[c] for c in key) for r in cells}, key=str):
        mine = sorted((r["length"], r["a_star"]) for r in cells
                      if tuple(r[c] for c in key) == k and r.get("a_star", 0) > 0)
        for span, pts in (("all", mine), ("unseen", [p for p in mine if p[0] > Lmax])):
            if len(pts) < 2:
                continue
            L, a = map(np.array, zip(*pts, strict=False))
            fit = probes.dilution_fit(L, a)
            resid = 1 / a - (fit["slope"] * (L - 1) + fit["intercept"])
            out.append(dict(probe="fit", **dict(zip(key, k, strict=True)), span=span,
                            lengths=str([int(v) for v in L]), **fit,
                            max_rel_residual=float(np.abs(resid).max() / np.mean(1 / a))))
    return out


def attention_figure(rows: list[dict], lengths: set[int], path: Path, by: str = "condition") -> Path:
    """Mean attention (``attention`` rows, over seeds) against offset at each of ``lengths`` that
    the rows have, one panel per value of ``by`` x K, the target offset -K marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attn = select(rows, "attention")
    conds = sorted({r[by] for r in attn})
    Ks = sorted({r["K"] for r in attn})
    show = sorted(set(lengths) & {r["length"] for r in attn})
    fig, axes = plt.subplots(len(conds), len(Ks), figsize=(4 * len(Ks), 2.8 * len(conds)), squeeze=False,
                             sharex=True)
    for i, cond in enumerate(conds):
        for j, K in enumerate(Ks):
            ax = axes[i][j]
            for L in show:
                stats = group_stats([r for r in attn if r[by] == cond and r["K"] == K and r["length"] == L],
                                    ("offset",), "weight")
                if stats:
                    ax.plot([d for d, in stats], [v[0] for v in stats.values()], marker=".", label=f"L={L}")
            ax.axvline(-K, color="grey", ls="--", lw=1)
            ax.set(title=f"{cond}, K = {K}", xlabel="offset t - n", ylabel="mean attention")
            ax.legend(fontsize=7)
    return save(fig, path)


def untrained_attention(ctx: MemberContext, L: int, offsets: np.ndarray) -> np.ndarray:
    """The untrained model's mean attention of head 0 (linear attention: its logits) at ``offsets`` at length L."""
    study = ctx.study
    batch = eval_batch(ctx.task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
    untrained = retrieval_head(ctx.untrained)
    attn = probes.accuracy_and_attention(untrained, batch, chunk=study.eval.chunk)[1][0]  # head 0, [L]
    return np.array([float(attn[L - 1 + int(d)]) for d in offsets])


def interpolant_figure(rows: list[dict], panel: str, Lmax: int, title: str, path: Path) -> Path:
    """Measured score profiles f (``score`` rows: offset, f, interpolant) beside their min-norm
    interpolants, one line pair per seed and one panel per value of ``panel`` (``title`` formatted
    with it), the training offsets [-(L_max - 1), -1] shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted({r[panel] for r in rows}) or [0]
    fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 3.4), squeeze=False)
    for ax, d in zip(axes[0], widths, strict=False):
        for seed in sorted({r["seed"] for r in rows if r[panel] == d}):
            pts = sorted((r["offset"], r["f"], r["interpolant"]) for r in rows if r["seed"] == seed and r[panel] == d)
            x, f, g = map(np.array, zip(*pts, strict=False))
            line = ax.plot(x, f, marker=".", lw=1, label=f"measured f, seed {seed}")[0]
            ax.plot(x, g, ls="--", lw=1, color=line.get_color(), label=f"min-norm interpolant, seed {seed}")
        ax.axvspan(-(Lmax - 1), -1, color="grey", alpha=0.15)
        ax.set(xlabel="offset delta", ylabel="mean linear score", title=title.format(d))
        ax.legend(fontsize=6)
    return save(fig, path)


def ape_conditions(rows: list[dict], Lmax: int, headline_init: float) -> list[dict]:
    """Length and attention rows with their condition (the encoding, or for an absolute one
    "<encoding> <init_std>[ clamp]"), encoding kind, role (APE only: "headline" for the
    ``headline_init`` table without the clamp variant, else "control"), ``clamp`` (APE only: the
    evaluate-only clamp-to-last variant) and L_max; relative
    encodings keep only the headline init_std copy (the APE table's initialisation does not touch them)."""
    out = []
    for r in rows:
        if r.get("probe") not in ("length", "attention"):
            continue
        k = encoding_class(r["encoding"]).kind
        init = r.get("init_std", headline_init)
        if k != "absolute" and init != headline_init:
            continue
        cond, role, clamp = r["encoding"], None, None
        if k == "absolute":
            clamp = r.get("variant") == "clamp"
            cond += f" {init}" + (" clamp" if clamp else "")
            role = "headline" if init == headline_init and not clamp else "control"
        out.append({**r, "condition": cond, "kind": k, "role": role, "clamp": clamp, "max_length": Lmax})
    return out


def score_profile_fits(ctx: MemberContext, rows: list[dict], rcond: float) -> tuple[dict, list[dict]]:
    """Section 7's probe of a rotary head at the longest evaluation length: the measured profile f
    (the ``attention`` rows there; linear attention: its logits) beside the min-norm interpolant in
    the model's rotary frequencies (:func:`poslab.probes.interpolant.interpolant_fits`, cutoff
    ``rcond``, from the untrained profile for the nearest-interpolant control). Returns the fits
    and one ``score`` row per offset (f, interpolant, on_support)."""
    from poslab.probes.interpolant import interpolant_fits

    longest = max(ctx.study.eval.lengths)
    attn = {r["offset"]: r["weight"] for r in select(rows, "attention", length=longest)}
    offsets = np.array(sorted(attn))
    f = np.array([attn[d] for d in offsets])
    theta = probes.rotary_theta(poslab_model(ctx.model)).detach().cpu().numpy()
    fits, g, support = interpolant_fits(theta, offsets, f, untrained_attention(ctx, longest, offsets),
                                        ctx.study.train.max_length, task_offset(ctx.task), rcond)
    return fits, [dict(probe="score", offset=int(d), f=float(v), interpolant=float(w), on_support=bool(s))
                  for d, v, w, s in zip(offsets, f, g, support, strict=False)]


def carrier_vs_untrained(ctx: MemberContext, batch) -> dict:
    """Carrier energies (probe (iii), head 0) of the trained queries and keys, of the member's
    untrained model (``baseline_q``, ``baseline_k``) and their ratios."""
    trained, base = probes.carrier(poslab_model(ctx.model), batch), probes.carrier(poslab_model(ctx.untrained), batch)
    return dict(carrier_q=trained["carrier_q"], carrier_k=trained["carrier_k"], baseline_q=base["carrier_q"],
                baseline_k=base["carrier_k"], carrier_q_ratio=trained["carrier_q"] / base["carrier_q"],
                carrier_k_ratio=trained["carrier_k"] / base["carrier_k"])


def bucket_coverage_at(enc, Lmax: int, L: int) -> float:
    """Share of the evaluation offsets 0..L-1 whose T5 bucket (of the encoding ``enc``) some
    training distance 0..L_max-1 reaches."""
    from poslab.positional.t5 import bucket_coverage

    return bucket_coverage(range(Lmax), range(L), bidirectional=enc.bidirectional, num_buckets=enc.num_buckets,
                           max_distance=enc.max_distance)
