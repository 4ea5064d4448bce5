"""Per-head summaries of a multi-layer model on a full-sequence shift task (Section 5.2): accuracy
split at the training range, each head's target and pinning fractions and last-query peak at
every length, and the *retrieving head* with its equivariance, pinning, carrier and kernel numbers.

Inputs are mean attention patterns ``[layers, h, L, L]`` (:func:`poslab.probes.mean_pattern`) or
their last-query rows ``last[L]`` ``[layers, h, L]``; query i's target is key i - K. The
retrieving head is the (layer, head) with most mean attention at -K from the last query over the
trained lengths (L <= L_max); ``width`` is the shortest evaluation length, so offsets
-(width - 1) .. 0 exist at every length (:mod:`poslab.probes.equivariance`).
"""

from __future__ import annotations

import numpy as np

from poslab.probes.attention import SLOPE_MAX, peak, peak_slope
from poslab.probes.carriers import carrier_profile_of, collect_moments, rotary_kernel, rotary_theta
from poslab.probes.common import model_device, split_batch
from poslab.probes.equivariance import secondary_peak, total_variation, window_profile


def accuracy_split(model, batch, Lmax: int) -> tuple[float, float, float]:
    """Accuracy over all target positions, over positions t < Lmax and over t >= Lmax (NaN if none)."""
    import torch

    hits, total = np.zeros(2), np.zeros(2)
    with torch.no_grad():
        for part in split_batch(batch, 256, model_device(model)):
            logits = model(part.tokens, lengths=part.lengths)  # [b, s, m]
            ok = (logits.argmax(-1) == part.targets) & part.loss_mask  # [b, s]
            t = torch.arange(ok.shape[1], device=ok.device)
            for i, where in enumerate((t < Lmax, t >= Lmax)):
                hits[i] += float(ok[:, where].sum())
                total[i] += float(part.loss_mask[:, where].sum())
    ratio = [h / n if n else float("nan") for h, n in zip(hits, total, strict=True)]
    return float(hits.sum() / total.sum()), ratio[0], ratio[1]


def head_rows(pattern: np.ndarray, K: int, Lmax: int, width: int, **extra) -> list[dict]:
    """One ``probe="head"`` row per (layer, head) at L = pattern's length: the share of queries
    inside [K, Lmax) and past Lmax whose argmax key is the target, the share of queries past Lmax
    on the most common argmax key (pinning), a* and the window peak of the last query, its peak."""
    L = pattern.shape[-1]
    argmax, i = pattern.argmax(-1), np.arange(L)  # [layers, h, i]
    inside, beyond = (i >= K) & (i < Lmax), i >= Lmax
    rows = []
    for layer in range(pattern.shape[0]):
        for h in range(pattern.shape[1]):
            at_target = argmax[layer, h] == i - K
            pos_out = argmax[layer, h, beyond]
            last = pattern[layer, h, L - 1, :]
            rows.append(dict(probe="head", length=L, layer=layer, head=h, **extra,
                             target_frac_in=float(at_target[inside].mean()),
                             target_frac_out=float(at_target[beyond].mean()) if beyond.any() else None,
                             pinned_frac_out=float(np.bincount(pos_out).max() / len(pos_out)) if beyond.any()
                             else None,
                             a_star=float(last[L - 1 - K]),
                             window_peak=int(window_profile(last, L, width).argmax()) - (width - 1),
                             **peak(last, L)))
    return rows


def absolute_peak(lengths: list[int], positions: list[int], Lmax: int) -> dict:
    """Is the last query's peak absolute past the training range? ``slope``: :func:`peak_slope` over
    the unseen ``lengths``; ``absolute_peak``: every peak below ``Lmax`` and |slope| < SLOPE_MAX."""
    slope = peak_slope(lengths, positions)
    inside = bool(positions) and max(positions) < Lmax
    return dict(slope=slope, absolute_peak=int(inside and abs(slope) < SLOPE_MAX))


def retrieving_head(model, untrained, batch, heads: list[dict], last: dict[int, np.ndarray], K: int, Lmax: int,
                    width: int, chunk: int) -> tuple[dict, list[dict]]:
    """The retrieving head's ``probe="member"`` row and its normalized carrier kernel rows.

    Sets each head row's ``window_tv`` (total variation of its window profile from the reference
    length, the longest trained one) on the way. ``batch`` is at that reference length; the
    member row holds the window peaks and their largest TV, the last query's peak offsets and
    positions past Lmax (``at_minus_K``, ``pinned``: one position < Lmax; ``slope`` and
    ``absolute_peak``: :func:`absolute_peak`), carrier energies of
    the head's queries and keys (trained and ``untrained``) and, for a rotary model, its carrier
    kernel phi_c over [-(L_longest - 1), 0] (argmax, single peak at -K, secondary peak) and the
    pure kernel g(s)'s highest ratio over s in [4, L_longest)."""
    lengths = sorted(last)
    seen = [L for L in lengths if L <= Lmax] or lengths[:1]
    _set_window_tv(heads, last, max(seen), width)
    a_in = np.mean([last[L][:, :, L - 1 - K] for L in seen], axis=0)  # [layers, h]
    layer, head = (int(v) for v in np.unravel_index(a_in.argmax(), a_in.shape))
    mine = sorted((r for r in heads if (r["layer"], r["head"]) == (layer, head)), key=lambda r: r["length"])
    out = dict(probe="member", layer=layer, head=head, head_name=f"{layer}.{head}", a_star_in=float(a_in[layer, head]),
               **_peak_columns(mine, K, Lmax))
    moments = {}
    for which, m in (("", model), ("_untrained", untrained)):
        moments[which] = collect_moments(m, batch, layer=layer, chunk=chunk)
        cq, ck = moments[which].carrier_energies()
        out[f"carrier_q{which}"], out[f"carrier_k{which}"] = float(cq[head]), float(ck[head])
    out["random_direction_head"] = 1 / model.cfg.d_head
    enc = model.layer_encoding(layer)  # the chosen head's layer's encoding (its own under a layout)
    if enc.rotary_frequencies() is None:
        return out, []
    return _carrier_kernel(out, model, enc, moments[""], (layer, head), max(lengths), K)


def _set_window_tv(heads: list[dict], last: dict[int, np.ndarray], ref: int, width: int) -> None:
    """Each head row's ``window_tv``: its window profile's total variation from that at length ``ref``."""
    for r in heads:
        p = (r["layer"], r["head"])
        r["window_tv"] = total_variation(window_profile(last[r["length"]][p], r["length"], width),
                                         window_profile(last[ref][p], ref, width))


def _peak_columns(mine: list[dict], K: int, Lmax: int) -> dict:
    """The member row's window peaks (every length of the head's rows ``mine``) and its last query's
    peaks past ``Lmax``."""
    unseen = [r for r in mine if r["length"] > Lmax]
    return dict(window_peaks=" ".join(str(r["window_peak"]) for r in mine),
                same_window_peak=int(len({r["window_peak"] for r in mine}) == 1),
                window_tv_max=max(r["window_tv"] for r in mine),
                offsets=" ".join(str(r["peak_offset"]) for r in unseen),
                positions=" ".join(str(r["peak_position"]) for r in unseen),
                at_minus_K=int(bool(unseen) and all(r["peak_offset"] == -K for r in unseen)),
                pinned=int(bool(unseen) and len({r["peak_position"] for r in unseen}) == 1
                           and unseen[0]["peak_position"] < Lmax),
                **absolute_peak([r["length"] for r in unseen], [r["peak_position"] for r in unseen], Lmax))


def _carrier_kernel(out: dict, model, enc, mom, where: tuple[int, int], longest: int,
                    K: int) -> tuple[dict, list[dict]]:
    """The member row ``out`` with a rotary head's carrier kernel columns (head ``where``: layer, head;
    ``mom`` its layer's moments), and the kernel's normalized rows over [-(longest - 1), 0]."""
    layer, head = where
    theta = rotary_theta(model, layer)
    deltas = np.arange(-(longest - 1), 1)
    phi = carrier_profile_of(mom.m_Q[head], mom.m_K[head], theta, enc.layout, deltas)[0]
    top = secondary_peak(phi, deltas)
    s = np.arange(4, longest)
    g = rotary_kernel(theta, s)
    out.update(kernel_argmax=top["argmax"], kernel_single_peak=int(top["argmax"] == -K and top["unique"]),
               kernel_second=f"{top['second']} ({top['ratio']:.2f})", kernel_ratio=top["ratio"],
               g_ratio=float(g.max() / rotary_kernel(theta, 0.0)), g_second=int(s[g.argmax()]))
    return out, [dict(probe="kernel", delta=int(d), phi_norm=float(v / np.abs(phi).max()))
                 for d, v in zip(deltas, phi, strict=True)]


__all__ = ["absolute_peak", "accuracy_split", "head_rows", "retrieving_head"]
