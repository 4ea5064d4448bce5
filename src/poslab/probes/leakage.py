"""Positional leakage in RoPE models: where absolute position enters attention (seed 001, third abstract).

Positional leakage ΔR², per layer and head, over the causal pairs (i, j) a head attends (j <= i,
i - j < window), with y_bij one of: the logits l_bij (``attn_scores``), the log-weights
log a_bij = l_bij - log Z_bi, or the weights a_bij::

    relative  y_bij ~ f(i - j)                     one-hot offset features
    absolute  y_bij ~ f(i - j) + g(i) + h(j)       plus one-hot query index and one-hot key index
    ΔR²       = R²(absolute) - R²(relative)        both on held-out sequences

Both regressions are fitted on the even-numbered sequences of the batch and scored on the odd
ones, so ΔR² is what the absolute indices predict about unseen inputs, not what extra
parameters memorize. A head whose logits depend on positions only through i - j (RoPE's
promise) has ΔR² ≈ 0; one whose logits carry g(i) or h(j) has ΔR² > 0. Where y has no variance
on the held-out pairs (a constant head) there is nothing to explain: R² = 1 for both fits,
ΔR² = 0.

The two components of the abstract:

    (a) causal mask      ΔR²(log-weights) - ΔR²(logits): what the per-query softmax denominator
                         adds, with log Z_i = logsumexp_{j <= i} l_ij against log(i + 1)
                         (slope 1 for uniform causal attention, where Z_i = i + 1)
    (b) residual stream  ΔR²(logits): absolute position that reaches the logits themselves
                         (through the position-0 trajectory and the heads that read it), and how
                         it moves under interventions (models/intervention.py)

Sink-reading heads: ``received_j`` = the mean weight key j receives from the other queries that
can see it (i > j, inside the window), averaged over sequences; a head reads the sink when
``received_0`` >= 0.3.

Closed-system check: per layer, the mean pairwise cosine similarity of the position-0 residual
across inputs. With a fixed BOS it is 1 at every layer (position 0 sees only itself and starts
from the same vector); with a content token at position 0 it follows that token.

Notation: b batch, l layer, h head, i query and j key index on the internal sequence (BOS at 0),
n its length, C the number of kept pairs, F regression features, D d_model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from poslab.attention import build_mask
from poslab.errors import ConfigError
from poslab.models.intervention import Intervention, rows_of
from poslab.probes.common import CHUNK, model_device, split_batch
from poslab.tasks.base import Batch

SINK_THRESHOLD = 0.3  # a head reads the sink when key 0 receives at least this mean weight
QUANTITIES = ("logits", "log_weights", "weights")


# ----------------------------------------------------------------------------- pairs and features

def keep_mask(n: int, window: int | None = None) -> Tensor:
    """The pairs a causal (windowed) head attends: j <= i and i - j < window, [n, n] bool."""
    return build_mask(n, n, causal=True, window=window)


def pairs(keep: Tensor, queries: int | None = None) -> tuple[Tensor, Tensor]:
    """Query and key indices (i, j) of the kept pairs, each [C]; only queries i < ``queries``
    when it is given (early queries)."""
    keep = keep.clone()
    if queries is not None:
        keep[queries:] = False
    i, j = keep.nonzero(as_tuple=True)
    return i, j


def design(i: Tensor, j: Tensor, n: int, absolute: bool) -> Tensor:
    """One-hot features of each pair, [C, F]: the offset i - j (F = n), plus the query index and
    the key index (F = 3n) when ``absolute``."""
    blocks = [torch.nn.functional.one_hot(i - j, n)]
    if absolute:
        blocks += [torch.nn.functional.one_hot(i, n), torch.nn.functional.one_hot(j, n)]
    return torch.cat(blocks, dim=1).double()


# ----------------------------------------------------------------------------- sums over sequences

@dataclass
class PairSums:
    """Per-pair sums of y over the fitting and the held-out sequences, [..., n, n] each (float64).

    Every regression here uses one-hot features, so a least-squares fit depends on the fitting
    sequences only through the per-pair means, and a held-out R² only through per-pair sums of
    y and y²: sums accumulate chunk by chunk in bounded memory.
    """

    fit_sum: Tensor  # sum over fitting sequences of y_bij
    test_sum: Tensor  # sum over held-out sequences of y_bij
    test_sq: Tensor  # sum over held-out sequences of y_bij^2
    n_fit: int
    n_test: int

    def __add__(self, other: PairSums) -> PairSums:
        return PairSums(self.fit_sum + other.fit_sum, self.test_sum + other.test_sum, self.test_sq + other.test_sq,
                        self.n_fit + other.n_fit, self.n_test + other.n_test)


def pair_sums(y: Tensor, held_out: Tensor) -> PairSums:
    """y [b, ..., n, n] and held_out [b] bool -> per-pair sums (masked pairs may hold anything
    finite: they are never read)."""
    y = torch.nan_to_num(y.double(), nan=0.0, posinf=0.0, neginf=0.0)
    fit, test = y[~held_out], y[held_out]
    return PairSums(fit.sum(0), test.sum(0), test.square().sum(0), int(fit.shape[0]), int(test.shape[0]))


def held_out_sequences(b: int, first: int = 0) -> Tensor:
    """Sequence ``first + k`` is held out when its global index is odd, [b] bool."""
    return (torch.arange(first, first + b) % 2) == 1


# ----------------------------------------------------------------------------- ΔR²

def r_squared(sums: PairSums, i: Tensor, j: Tensor, absolute: bool) -> Tensor:
    """Held-out R² of the one-hot regression on pairs (i, j), for every leading index of the sums, [...]."""
    if sums.n_fit < 1 or sums.n_test < 1:
        raise ConfigError("sequences", sums.n_fit + sums.n_test, "at least 2 (one to fit, one held out)")
    n = sums.fit_sum.shape[-1]
    lead = sums.fit_sum.shape[:-2]
    X, X_pinv = _least_squares(n, absolute, i.numpy().tobytes(), j.numpy().tobytes())  # [C, F], [F, C]
    mean_fit = (sums.fit_sum[..., i, j] / sums.n_fit).reshape(-1, len(i)).T  # [C, lead]
    pred = (X @ (X_pinv @ mean_fit)).T.reshape(*lead, len(i))  # least-squares fit on the pairs, [..., C]
    s1, s2, N = sums.test_sum[..., i, j], sums.test_sq[..., i, j], sums.n_test
    sse = (s2 - 2 * pred * s1 + N * pred.square()).sum(-1)
    sst = s2.sum(-1) - s1.sum(-1).square() / (N * len(i))
    tiny = 1e-10 * s2.sum(-1).clamp_min(1e-300)
    constant = sst <= tiny  # nothing to explain: a perfect fit by definition
    return torch.where(constant, torch.ones_like(sst), 1 - sse / torch.where(constant, torch.ones_like(sst), sst))


@functools.lru_cache(maxsize=16)
def _least_squares(n: int, absolute: bool, i_bytes: bytes, j_bytes: bytes) -> tuple[Tensor, Tensor]:
    """The design of a pair set and its pseudo-inverse (minimum-norm least squares; the one-hot
    blocks are collinear), computed once per pair set and reused for every head, layer and run."""
    i, j = (torch.from_numpy(np.frombuffer(b, dtype=np.int64).copy()) for b in (i_bytes, j_bytes))
    X = design(i, j, n, absolute)
    return X, torch.linalg.pinv(X)


def delta_r2(sums: PairSums, i: Tensor, j: Tensor) -> dict[str, Tensor]:
    """R² relative, R² absolute and ΔR² = their difference, each [...]."""
    rel, ab = r_squared(sums, i, j, absolute=False), r_squared(sums, i, j, absolute=True)
    return dict(r2_relative=rel, r2_absolute=ab, delta=ab - rel)


# ----------------------------------------------------------------------------- softmax pieces

def log_partition(scores: Tensor, keep: Tensor) -> Tensor:
    """log Z_i = logsumexp over kept keys of the logits: scores [..., n, n] -> [..., n]."""
    return scores.masked_fill(~keep, -math.inf).logsumexp(-1)


def log_weights(scores: Tensor, keep: Tensor) -> Tensor:
    """log a_ij = l_ij - log Z_i on kept pairs (0 elsewhere), [..., n, n]."""
    return (scores - log_partition(scores, keep)[..., None]).masked_fill(~keep, 0.0)


def log_z_fit(log_z: np.ndarray) -> dict[str, float]:
    """Least squares of mean log Z_i on log(i + 1), i = 0 .. n-1: slope, intercept, R²."""
    x, y = np.log(np.arange(1, len(log_z) + 1)), np.asarray(log_z, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    sst = float(((y - y.mean()) ** 2).sum())
    return dict(slope=float(slope), intercept=float(intercept), r2=1 - float((resid ** 2).sum()) / sst if sst else 1.0)


def received_attention(pattern: Tensor, keep: Tensor) -> Tensor:
    """Mean weight each key receives from the other queries that can see it: pattern [b, ..., n, n]
    -> [..., n] (NaN for a key no other query sees)."""
    others = keep & ~torch.eye(keep.shape[-1], dtype=torch.bool, device=keep.device)  # [n, n]
    total = pattern.masked_fill(~others, 0.0).sum(-2).mean(0)  # [..., n]
    return total / others.sum(-2).to(pattern.dtype)


def sink_heads(received_0: Tensor | np.ndarray, threshold: float = SINK_THRESHOLD) -> np.ndarray:
    """Heads that read the sink: key 0 receives at least ``threshold``, bool [...]."""
    return np.asarray(received_0) >= threshold


def mean_cosine(x: Tensor) -> float:
    """Mean pairwise cosine similarity of the rows of x [b, D] (pairs b != b')."""
    b = x.shape[0]
    if b < 2:
        raise ConfigError("sequences", b, "at least 2 to compare the position-0 residual across inputs")
    u = torch.nn.functional.normalize(x.double(), dim=-1)
    gram = u @ u.T
    return float((gram.sum() - gram.diagonal().sum()) / (b * (b - 1)))


# ----------------------------------------------------------------------------- model-level drivers

def _check_model(model) -> None:
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "bos"):
        raise ConfigError("model", type(model).__name__, "a Transformer")
    if cfg.attention != "softmax" or cfg.energy_gate or not cfg.causal:
        raise ConfigError("model", dict(attention=cfg.attention, energy_gate=cfg.energy_gate, causal=cfg.causal),
                          "causal softmax attention without an energy gate (the leakage probes read softmax logits)")


def _check_batch(batch: Batch) -> None:
    if bool((batch.lengths != batch.tokens.shape[1]).any()):
        raise ConfigError("lengths", sorted(set(batch.lengths.tolist())), "full windows of one length (no padding)")
    if batch.tokens.shape[0] < 2:
        raise ConfigError("sequences", batch.tokens.shape[0], "at least 2 (one to fit, one held out)")


def leakage(model, batch: Batch, *, intervention: Intervention | None = None, early: int | None = None,
            chunk: int = CHUNK) -> dict[str, np.ndarray]:
    """Every leakage number of one ``Transformer`` on ``batch``, per layer and head ([l, h] arrays).

    Keys: ``{q}_delta``, ``{q}_r2_relative``, ``{q}_r2_absolute`` for q in logits, log_weights,
    weights over all kept pairs, and ``early_{q}_...`` over queries i < ``early`` when it is
    given; ``component_a`` = log_weights_delta - logits_delta; ``component_b`` = logits_delta
    (``early_component_*`` likewise); ``log_z`` [l, h, n] mean log Z_i; ``received`` [l, h, n];
    ``received_0`` [l, h]; ``sink`` [l, h] bool.

    Log-weights are log_softmax of the logits over the model's own causal/window mask; under an
    intervention that removes key 0 they are those of the unmodified mask (read the logits then).
    """
    _check_model(model)
    _check_batch(batch)
    cfg = model.cfg
    n = batch.tokens.shape[1] + int(cfg.bos)
    if early is not None and (not isinstance(early, int) or not 1 <= early <= n):
        raise ConfigError("early", early, f"an integer in [1, {n}] (queries i < early), or None")
    keep = keep_mask(n, cfg.window)  # [n, n]
    sums: dict[str, PairSums] = {}
    log_z = received = None
    first = 0
    for part in split_batch(batch, chunk, model_device(model)):
        inter = model.collect(part, intervention=rows_of(intervention, first, first + part.tokens.shape[0],
                                                         batch.tokens.shape[0]))
        held = held_out_sequences(part.tokens.shape[0], first)
        first += part.tokens.shape[0]
        scores = torch.stack([layer.attn_scores for layer in inter.layers], 1).cpu()  # [b, l, h, n, n]
        pattern = torch.stack([layer.pattern for layer in inter.layers], 1).cpu()
        ys = dict(logits=scores, log_weights=log_weights(scores, keep), weights=pattern)
        for q, y in ys.items():
            s = pair_sums(y, held)
            sums[q] = s if q not in sums else sums[q] + s
        lz = log_partition(scores.double(), keep).sum(0)  # [l, h, n]
        rc = received_attention(pattern.double(), keep) * part.tokens.shape[0]
        log_z = lz if log_z is None else log_z + lz
        received = rc if received is None else received + rc
    b = batch.tokens.shape[0]
    out: dict[str, np.ndarray] = {}
    sets = {"": pairs(keep)}
    if early is not None:
        sets["early_"] = pairs(keep, early)
    for prefix, (i, j) in sets.items():
        for q in QUANTITIES:
            for key, value in delta_r2(sums[q], i, j).items():
                out[f"{prefix}{q}_{key}"] = value.numpy()
        out[f"{prefix}component_a"] = out[f"{prefix}log_weights_delta"] - out[f"{prefix}logits_delta"]
        out[f"{prefix}component_b"] = out[f"{prefix}logits_delta"]
    out["log_z"] = (log_z / b).numpy()
    out["received"] = (received / b).numpy()
    out["received_0"] = out["received"][..., 0]
    out["sink"] = sink_heads(out["received_0"])
    return out


def closed_system(model, batch: Batch, *, chunk: int = CHUNK) -> dict[str, np.ndarray]:
    """Mean pairwise cosine of the position-0 residual across the batch's inputs, per layer
    (index 0: the embedding, l: leaving layer l), [n_layers + 1] each:

    ``fixed_bos``: the model as trained (BOS at 0); ``content``: position 0 holds each input's
    first token's embedding instead (``Intervention(bos_embedding=W_E[tokens[:, 0]])``).
    """
    _check_model(model)
    if not model.cfg.bos:
        raise ConfigError("model.bos", False, "True (the check compares a fixed BOS with content at position 0)")
    out = {}
    for name in ("fixed_bos", "content"):
        rows: list[list[Tensor]] = []
        for part in split_batch(batch, chunk, model_device(model)):
            iv = None if name == "fixed_bos" else Intervention(bos_embedding=model.W_E[part.tokens[:, 0]].detach())
            inter = model.collect(part, intervention=iv)
            rows.append([inter.embed[:, 0]] + [layer.resid_post[:, 0] for layer in inter.layers])
        per_layer = [torch.cat([r[l] for r in rows]).cpu() for l in range(len(rows[0]))]  # each [b, D]
        out[name] = np.array([mean_cosine(x) for x in per_layer])
    return out


# ----------------------------------------------------------------------------- BOS replacements

def bos_replacements(model, token: int, seed: int = 0) -> dict[str, Tensor]:
    """The three BOS swaps, each [D]: another token's embedding ``W_E[token]``, a random vector
    of norm ||W_bos|| (from ``seed``), and the mean token embedding."""
    _check_model(model)
    if not model.cfg.bos:
        raise ConfigError("model.bos", False, "True (there is no BOS to replace)")
    m = model.W_E.shape[0]
    if not isinstance(token, int) or not 0 <= token < m:
        raise ConfigError("token", token, f"a token id in [0, {m - 1}]")
    W_bos = model.W_bos.detach()
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(W_bos.shape, generator=g, dtype=W_bos.dtype).to(W_bos.device)
    return dict(token=model.W_E[token].detach().clone(), random=r * W_bos.norm() / r.norm(),
                mean=model.W_E.detach().mean(0))
