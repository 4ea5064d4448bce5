"""The leakage studies' rows, from the probes of :mod:`poslab.probes.leakage`: per head, per
intervention of :func:`interventions` and the closed-system check (:func:`leakage_rows`, one
trained model); per model and seed (:func:`model_rows`), per BOS swap (:func:`swap_change_rows`,
:func:`three_swaps`) and per key-0 ablation (:func:`pathway_rows`) derived from them; and the BOS
swap's claim as the abstract states it (:data:`SWAP`), decided only where the three replacements
agree (its ``agree=``, part of what judges it). Used by ``leakage`` and ``pretrained-leakage``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from poslab.experiments.outputs import select
from poslab.experiments.rows import frame, groups, pick
from poslab.experiments.spec import Agreement, ClaimSpec, derivation, is_, mean, probe, seed_states
from poslab.models.intervention import Intervention
from poslab.probes.common import CHUNK
from poslab.probes.leakage import bos_replacements, closed_system, leakage, log_z_fit
from poslab.tasks.base import Batch

PRESENT = 0.01  # the floor of a relative BOS-swap change: a change relative to noise-level (b) is noise
BOS_SWAP, BOS_SWAP_TOL = -0.40, 0.20  # the abstract's BOS swap (-40% of early (b)) and poslab's +-20 points

# what the leakage abstract states, the claims' sources in both leakage studies
ABSTRACT = "leakage abstract (seed 001): "
BOTH = seed_states(ABSTRACT + "both components appear in all three architectures we study", which="001")
BALANCE = seed_states(ABSTRACT + "NTK scaling suppresses the residual-stream component, sliding-window attention "
                      "allows it to accumulate with depth, and standard RoPE sits between", which="001")
SWAP_SOURCE = seed_states(ABSTRACT + "replacing the BOS embedding before the forward pass removes 40% of the "
                       "residual-stream component at early queries", which="001")
FINGERPRINT = seed_states(ABSTRACT + "attention sinks pass forward a deterministic fingerprint of the token at "
                          "position 0, constant across inputs when that token is the auto-prepended BOS and varying "
                          "with it otherwise", which="001")
SINK_READING = seed_states(ABSTRACT + "downstream attention reads this trajectory through sink-reading heads",
                           which="001")
MASK = derivation("under a causal mask query i sees i + 1 keys, so the relative fit's log-normaliser moves with i")
HEAD_KEYS = ("component_a", "component_b", "component_b_key", "component_b_interaction", "component_b_key0",
             "component_b_rest", "early_component_a", "early_component_b", "early_component_b_key0",
             "old_component_a", "old_component_b", "received_0")
IV_KEYS = ("component_b", "early_component_b", "component_b_key0", "early_component_b_key0")
ABLATIONS = {"drop_key0": "sink-reading heads", "drop_key0_all": "every head"}  # key 0 removed in


def interventions(model, batch: Batch, sink: np.ndarray) -> dict[str, Intervention]:
    """The leakage study's interventions on ``model`` and its evaluation ``batch``: the three BOS
    swaps of :func:`bos_replacements` with the most frequent token (``bos_token``, ``bos_random``,
    ``bos_mean``), the position-0 residual entering the middle layer patched in from another input
    whose position 0 holds a content token (``resid0_patch``), and key 0 removed for every query
    i >= 1 in the sink-reading heads (``drop_key0``, only where some head reads the sink) and in
    every head (``drop_key0_all``: no head reads position 0, whether or not it is a sink head)."""
    token = int(torch.bincount(batch.tokens.flatten().cpu()).argmax())  # the most frequent character
    out = {f"bos_{k}": Intervention(bos_embedding=v) for k, v in bos_replacements(model, token).items()}
    # Another input with a content token at position 0: the batch shifted by one sequence, its
    # first character in the BOS slot; its position-0 residual enters the middle layer here.
    other = batch.tokens.roll(1, dims=0)
    layer = model.cfg.n_layers // 2
    source = model.collect(replace(batch, tokens=other),
                           intervention=Intervention(bos_embedding=model.W_E[other[:, 0]].detach()))
    out["resid0_patch"] = Intervention(resid0=source.layers[layer].resid_pre[:, 0], resid0_layer=layer)
    if sink.any():
        out["drop_key0"] = Intervention(drop_key0=torch.as_tensor(sink, device=model.W_E.device))
    out["drop_key0_all"] = Intervention(drop_key0=torch.ones(sink.shape, dtype=torch.bool, device=model.W_E.device))
    return out


def leakage_rows(model, batch: Batch, *, early: int, chunk: int = CHUNK, intervene: bool = True) -> list[dict]:
    """The leakage study's rows of one trained model on ``batch``: per layer and head (probe
    ``head``) every number of :func:`leakage` with the fit of log Z_i on log(i + 1) and whether it
    reads the sink; with ``intervene``, per :func:`interventions` entry, layer and head (probe
    ``intervention``) (b), its key-0 part and both at early queries under it, and per layer (probe
    ``closed``) the :func:`closed_system` check."""
    base = leakage(model, batch, early=early, chunk=chunk)
    n_layers, n_heads = base["component_b"].shape
    rows = []
    for layer in range(n_layers):
        for h in range(n_heads):
            fit = log_z_fit(base["log_z"][layer, h])
            rows.append(dict(probe="head", layer=layer, head=h, **{k: float(base[k][layer, h]) for k in HEAD_KEYS},
                             sink=bool(base["sink"][layer, h]), log_z_slope=fit["slope"], log_z_r2=fit["r2"]))
    if not intervene:
        return rows
    for name, iv in interventions(model, batch, base["sink"]).items():
        out = leakage(model, batch, intervention=iv, early=early, chunk=chunk)
        rows += [dict(probe="intervention", intervention=name, layer=layer, head=h,
                      **{k: float(out[k][layer, h]) for k in IV_KEYS})
                 for layer in range(n_layers) for h in range(n_heads)]
    closed = closed_system(model, batch, chunk=chunk)
    rows += [dict(probe="closed", layer=layer, fixed_bos=float(closed["fixed_bos"][layer]),
                  content=float(closed["content"][layer])) for layer in range(n_layers + 1)]
    return rows


def _by(rows: list[dict], probe: str, by: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """The rows of kind ``probe`` grouped by the ``by`` columns, in order of each group's first row."""
    mine = select(rows, probe)
    return {key: pick(mine, part) for key, part in groups(frame(mine), by)}


def _mean(rows: list[dict], column: str) -> float:
    return float(np.mean([r[column] for r in rows]))


def _depth_slope(heads: list[dict], column: str) -> float | None:
    """The least-squares slope of the layer means of ``column`` on the layer (None with one layer)."""
    layers = sorted({r["layer"] for r in heads})
    per_layer = [_mean([r for r in heads if r["layer"] == layer], column) for layer in layers]
    return float(np.polyfit(layers, per_layer, 1)[0]) if len(layers) > 1 else None


def model_rows(rows: list[dict]) -> list[dict]:
    """One row per model and seed (probe "model") from :func:`leakage_rows` labelled by ``model``:
    head-row means, the slope of the layer-mean (b) (and of its key-0 part) on the layer, the
    member's validation loss and sink-reading head count (from its ``member`` row)."""
    members = {key: part[0] for key, part in _by(rows, "member", ("model", "seed")).items()}
    out = []
    for (m, seed), heads in _by(rows, "head", ("model", "seed")).items():
        member = members.get((m, seed))
        out.append(dict(probe="model", model=m, encoding=heads[0]["encoding"], window=heads[0].get("window"),
                        variant=heads[0].get("variant"), seed=seed, **{k: _mean(heads, k) for k in HEAD_KEYS},
                        depth_slope=_depth_slope(heads, "component_b"),
                        depth_slope_key0=_depth_slope(heads, "component_b_key0"),
                        val_loss=None if member is None else member["val_loss"],
                        sink_heads=None if member is None else member["sink_heads"]))
    return out


def swap_change_rows(rows: list[dict], floor: float = PRESENT) -> list[dict]:
    """Per model, seed and intervention (probe "swap"): the relative change of the mean early (b);
    ``change`` is None where the trained early (b) is below ``floor``: a change relative to a
    component at noise level is noise over noise (the leakage study's quick preset: +3886%)."""
    base = {k: _mean(v, "early_component_b") for k, v in _by(rows, "head", ("model", "seed")).items()}
    out = []
    for (m, seed, iv), got in _by(rows, "intervention", ("model", "seed", "intervention")).items():
        b = base.get((m, seed))
        change = (_mean(got, "early_component_b") - b) / b if b is not None and b >= floor else None
        out.append(dict(probe="swap", model=m, encoding=got[0]["encoding"], window=got[0].get("window"), seed=seed,
                        intervention=iv, change=change, change_pct=None if change is None else 100 * change))
    return out


def three_swaps(changes: dict[str, float | None], target: float = BOS_SWAP, tol: float = BOS_SWAP_TOL) -> dict:
    """The BOS swap judged on three replacements (the abstract names none): ``swap_min`` and
    ``swap_max`` of the changes, and ``swap_decisive``, the one that decides "within ``tol`` of
    ``target``" for all three: the farthest from the target where all three are within (a yes
    then holds for every one), the nearest where all three are outside (a no holds for every one),
    None where they disagree (or where one is missing): no replacement is the abstract's.
    ``swap_agree``: whether they agree (None where one is missing)."""
    got = [c for c in changes.values() if c is not None]
    out = dict(swap_min=min(got) if got else None, swap_max=max(got) if got else None, swap_decisive=None,
               swap_agree=None)
    if len(got) < len(changes) or not got:
        return out
    within = [abs(c - target) <= tol for c in got]
    out["swap_agree"] = all(within) or not any(within)
    if all(within):
        out["swap_decisive"] = max(got, key=lambda c: abs(c - target))
    elif not any(within):
        out["swap_decisive"] = min(got, key=lambda c: abs(c - target))
    return out


def pathway_rows(rows: list[dict]) -> list[dict]:
    """Per model, seed and key-0 ablation of :data:`ABLATIONS` (probe "pathway"): the key-0 part of
    (b) at layers >= 1 (mean over those heads) as trained, under the ablation, ``key0_drop`` the
    first less the second and ``key0_change`` the drop relative to the first (None where it is
    below PRESENT). Layer 0's logits come from the embeddings, which no ablation reaches. None
    throughout where the ablation was not run (``drop_key0``: no head reads the sink)."""
    base = {k: [r for r in v if r["layer"] >= 1] for k, v in _by(rows, "head", ("model", "seed")).items()}
    ablated = _by(rows, "intervention", ("model", "seed", "intervention"))
    out = []
    for (m, seed), heads in base.items():
        if not heads or not any(k[:2] == (m, seed) for k in ablated):  # an evaluate-only variant: no interventions
            continue
        trained = _mean(heads, "component_b_key0")
        for name, where in ABLATIONS.items():
            got = [r for r in ablated.get((m, seed, name), []) if r["layer"] >= 1]
            after = _mean(got, "component_b_key0") if got else None
            drop = None if after is None else trained - after
            out.append(dict(probe="pathway", model=m, encoding=heads[0]["encoding"], window=heads[0].get("window"),
                            seed=seed, ablation=where, key0_trained=trained, key0_ablated=after, key0_drop=drop,
                            key0_change=None if drop is None or trained < PRESENT else -drop / trained))
    return out


# ----------------------------------------------------------------------------- the BOS swap's claim

# the revision that brought the agreement rule into the spec (both leakage studies' swap claims)
AGREED = ("2026-12-07: the 'decided only where all three replacements agree' rule (f193f74) moved into the spec "
          "(agree=), where the fingerprint sees it; it was applied after judging, outside it; the same verdicts")
# the abstract's claim on trained RoPE models (pretrained-leakage: the same with its own where and role)
SWAP = ClaimSpec(
    name="standard RoPE: BOS swap changes early (b), all three replacements", paper="-40%",
    where=probe("swap3") & is_("model", "RoPE"),
    measure=mean("swap_decisive", "the deciding replacement's change (mean over seeds): farthest from -40% if all "
                                  "are within, nearest if all are outside"),
    op="~", threshold=BOS_SWAP, tol=BOS_SWAP_TOL, percent=True,
    agree=Agreement("swap_agree", "swap_min", "swap_max",
                    f"the three replacements disagree, {{lo}} to {{hi}}, some within {100 * BOS_SWAP_TOL:g} points of "
                    f"{100 * BOS_SWAP:g}% and some outside, and the abstract names none"),
    note="the abstract names no replacement: most frequent token, mean embedding, random vector of the BOS norm; "
         "decided only where all three agree; each a mean over the seeds whose early (b) is >= PRESENT = 0.01")
