"""Probes per layer type of a hybrid model (issue 57): which layers rotate, what each attends to.

    kind of layer l      rotary or not, its sliding window w_l and its chunk c_l          (layer_kinds)
    key-0 mass           s_{l,h}   = mean_{i >= 1} abar_{l,h}(i, 0)                          sinks / position 0
    recency mass         r_{l,h}   = mean_{i >= 1} sum_{0 <= i - j < R} abar_{l,h}(i, j)      the last R keys
    mean distance        d_{l,h}   = mean_{i >= 1} sum_j (i - j) abar_{l,h}(i, j)
    carrier (rope l)     the seed's carrier energies ||m||^2 / E||x||^2 of layer l's projected q, k and
                         the peak offset of its carrier profile phi_c(delta) = m_Q^T R_delta m_K
    leakage (b)          :func:`poslab.probes.leakage.leakage` with each layer's own window; a chunked
                         layer's pairs are no band, which the leakage fits do not describe: no number

``abar`` is the mean attention pattern over sequences (:func:`poslab.probes.mean_pattern`); query 0
is left out of every mean (it sees key 0 alone). The model is poslab's ``Transformer`` (a layout's
layers: ``layer_encoding(l)``, each block's ``window`` and ``chunk``) or a pretrained adapter
(``layer_rope``, ``attended_windows``, ``layer_chunks``); both are read through ``collect``, so the
same numbers come from either (Yang et al. 2025's division of labour: rope layers recent, no-rope
layers retrieving; seed 001's (b) per architecture).

Notation: l layer, h head, i query and j key index (BOS, where a model has one, at 0), R recency span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from poslab.errors import ConfigError
from poslab.probes import leakage as lk
from poslab.probes.attention import mean_pattern
from poslab.probes.carriers import carrier_profile_of, collect_moments, rotary_theta
from poslab.tasks.base import Batch

RECENT = 4  # R: keys i - 3 .. i count as recent
CHUNKED_WHY = "a chunked layer: its pairs are no causal band, which the leakage fits assume"


@dataclass(frozen=True)
class LayerKind:
    """One layer's position handling: whether it rotates q and k, its window and its chunk."""

    layer: int
    rotary: bool
    window: int | None = None
    chunk: int | None = None

    @property
    def type(self) -> str:
        """``rope`` / ``nope``, then ``+window w`` or ``+chunk c`` where the layer has one."""
        name = "rope" if self.rotary else "nope"
        if self.chunk is not None:
            return f"{name}+chunk {self.chunk}"
        return name if self.window is None else f"{name}+window {self.window}"

    def row(self) -> dict:
        return dict(layer=self.layer, rotary=self.rotary, window=self.window, chunk=self.chunk, layer_type=self.type)


def layer_kinds(model: Any) -> list[LayerKind]:
    """Every layer's :class:`LayerKind`, from poslab's Transformer or a pretrained adapter."""
    if hasattr(model, "layer_rope"):  # a pretrained checkpoint's adapter (its architecture record's pattern)
        windows = list(model.attended_windows)
        return [LayerKind(i, bool(r), windows[i], c)
                for i, (r, c) in enumerate(zip(model.layer_rope, model.layer_chunks, strict=True))]
    if hasattr(model, "layer_encoding") and hasattr(model, "layers"):
        return [LayerKind(i, bool(model.layer_encoding(i).is_rotary), block.window, block.chunk)
                for i, block in enumerate(model.layers)]
    raise ConfigError("model", type(model).__name__,
                      "poslab's Transformer (layer_encoding, layers) or a pretrained adapter (layer_rope)")


def attention_targets(pattern: np.ndarray, recent: int = RECENT) -> dict[str, np.ndarray]:
    """Key-0 mass, recency mass and mean distance per layer and head ([layers, h] each) of a mean
    pattern ``[layers, h, i, j]`` (NaN rows: no sequence had query i), over the queries i >= 1."""
    if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2] or pattern.shape[-1] < 2:
        raise ConfigError("pattern", list(pattern.shape), "a mean pattern [layers, h, n, n] with n >= 2")
    n = pattern.shape[-1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    a = np.nan_to_num(pattern[:, :, 1:, :])  # [l, h, i >= 1, j]
    live = ~np.isnan(pattern[:, :, 1:, 0])  # the queries some sequence had, [l, h, i]
    counts = np.maximum(live.sum(-1), 1)
    recent_keys = ((i - j >= 0) & (i - j < recent))[1:]  # [i, j]
    distance = np.clip(i - j, 0, None)[1:].astype(np.float64)
    return dict(key0=a[..., 0].sum(-1) / counts, recent=(a * recent_keys).sum((-1, -2)) / counts,
                distance=(a * distance).sum((-1, -2)) / counts)


def target_rows(model: Any, batch: Batch, *, chunk: int, recent: int = RECENT, **extra) -> list[dict]:
    """One ``probe="targets"`` row per layer and head: :func:`attention_targets` of the mean pattern
    over ``batch`` and the layer's kind, beside the same numbers of a content-blind head (``uniform_*``:
    uniform weights over the keys the layer's mask keeps), which the mask alone gives."""
    kinds = layer_kinds(model)
    got = attention_targets(mean_pattern(model, batch, chunk=chunk), recent)
    n = batch.tokens.shape[1] + _prefix(model)
    rows = []
    for layer, kind in enumerate(kinds):
        blind = attention_targets(uniform_pattern(n, kind)[None, None], recent)
        for h in range(got["key0"].shape[1]):
            rows.append(dict(probe="targets", **kind.row(), head=h,
                             **{k: float(v[layer, h]) for k, v in got.items()},
                             **{f"uniform_{k}": float(v[0, 0]) for k, v in blind.items()}, **extra))
    return rows


def _prefix(model: Any) -> int:
    return int(bool(getattr(getattr(model, "cfg", None), "bos", False)))


def uniform_pattern(n: int, kind: LayerKind) -> np.ndarray:
    """A content-blind head's pattern [n, n]: uniform over the keys layer ``kind`` keeps (j <= i, inside
    its window, inside its chunk)."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = j <= i
    if kind.window is not None:
        keep &= i - j < kind.window
    if kind.chunk is not None:
        keep &= j // kind.chunk == i // kind.chunk
    return keep / keep.sum(-1, keepdims=True)


def carrier_rows(model: Any, batch: Batch, offsets: np.ndarray, *, chunk: int, **extra) -> list[dict]:
    """One ``probe="carrier"`` row per rotary layer and head: the seed's carrier energies of the
    layer's projected queries (the last) and keys (every token) and the peak offset of its carrier
    profile over ``offsets``. Layers that do not rotate have no carrier profile and give no row."""
    rows = []
    for kind in layer_kinds(model):
        if not kind.rotary:
            continue
        mom = collect_moments(model, batch, layer=kind.layer, chunk=chunk)
        cq, ck = mom.carrier_energies()
        enc = model.layer_encoding(kind.layer)
        profile = carrier_profile_of(mom.m_Q, mom.m_K, rotary_theta(model, kind.layer), enc.layout, offsets)
        for h in range(profile.shape[0]):
            rows.append(dict(probe="carrier", **kind.row(), head=h, carrier_q=float(cq[h]), carrier_k=float(ck[h]),
                             carrier_peak=int(np.asarray(offsets)[int(profile[h].argmax())]), **extra))
    return rows


class _PerLayerWindows:
    """A model seen by the leakage probes with each layer's own window (``attended_windows``)."""

    def __init__(self, model: Any, kinds: list[LayerKind]):
        self.model, self.cfg = model, model.cfg
        self.attended_windows = [k.window for k in kinds]

    def collect(self, batch: Batch, intervention=None):
        return self.model.collect(batch) if intervention is None else self.model.collect(batch, intervention)

    def parameters(self):
        return self.model.parameters()


def leakage_rows(model: Any, batch: Batch, *, chunk: int, early: int | None = None, **extra) -> list[dict]:
    """One ``probe="layer_leakage"`` row per layer and head: seed 001's components (a) and (b), (b) at key 0,
    with each layer's own window; a chunked layer's row has no numbers and says why (``na``)."""
    kinds = layer_kinds(model)
    chosen = [k.layer for k in kinds if k.chunk is None]
    got = lk.leakage(_PerLayerWindows(model, kinds), batch, early=early, layers=chosen, chunk=chunk, old=False) \
        if chosen else {}
    columns = ("component_a", "component_b", "component_b_key0")
    rows = []
    for kind in kinds:
        heads = (got[columns[0]].shape[1] if got else getattr(model, "n_heads", None)) or model.cfg.n_heads
        for h in range(heads):
            row = dict(probe="layer_leakage", **kind.row(), head=h, **extra)
            if kind.chunk is None:
                slot = chosen.index(kind.layer)
                row.update({c: float(got[c][slot, h]) for c in columns})
            else:
                row.update({c: None for c in columns}, na=CHUNKED_WHY)
            rows.append(row)
    return rows


__all__ = ["RECENT", "LayerKind", "attention_targets", "carrier_rows", "layer_kinds", "leakage_rows",
           "target_rows", "uniform_pattern"]
