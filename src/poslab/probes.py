"""Probes of a trained one-layer retrieval head (the seed paper's probes (i)-(v) and Fig. 4 controls).

    (i)   accuracy          mean_b [argmax_y U o_b = y_b]                      (loss_mask respected)
    (ii)  peak              argmax_t mean_b a_{b,t};  peak offset = t - (L - 1), target -K
    (iii) carrier energy    ||mean_n X_n||^2 / mean_n ||X_n||^2,  X = W_Q z_n  or  W_K z_t (unrotated)
    (iv)  carrier profile   phi_c(delta) = m_Q^T R_delta m_K,  delta = t - n
    (v)   dilution fit      1 / a*(L) = c (L - 1) + b                             (least squares)
    Fig. 4  margin          mu = mean_b (l_{b,n-K} - max_{t != n-K} l_{b,t}),  bound 1 / (1 + (L-1) e^{-mu})
            rank            sigma_1^2 / sum_i sigma_i^2  of  W = W_Q^T W_K
            rotary kernel   g(s) = sum_j cos(s theta_j),  ratio max_{s >= 4} g(s) / g(0)
            pinning         absolute key position of the peak per (unseen) length, for APE

Every probe is a pure function of one model (never an ensemble: pick a member first) and an
evaluation :class:`~poslab.tasks.Batch`, returning plain floats, numpy arrays or small dicts.
Model probes run under ``torch.no_grad()`` in chunks of ``chunk`` sequences (4096 sequences of
length 48 never hold more than one chunk's intermediates) and read the intermediates the model
returns (``forward(..., return_intermediates=True)``), never hooks.

Conventions
-----------
- Offsets are key minus query position, ``delta = t - n`` with ``n = L - 1``: the fixed-offset
  target sits at ``delta = -K``. Positions are absolute key indices ``0 .. L - 1``.
- Per-head probes take ``head``: an index (default 0, the paper's single head), or ``None`` for
  the mean of the per-head scalars. ``mean_attention`` always returns every head, ``[h, L]``;
  pass one row (``mean_attention(...)[h]``) to :func:`peak` and friends.
- The RoPE logit between the query at n and the key at t is
  ``(R_n q) . (R_t k) / sqrt(d) = q . R_{t-n} k / sqrt(d)`` (R_p rotates each pair by p theta_i,
  counter-clockwise), hence ``phi_c(delta) = m_Q . R_delta m_K``, in the units of q . k: multiply
  by ``attention_factor^2 / (sqrt(d) tau)`` to read it as a mean logit.
- The untrained baseline of any probe is the same call on a freshly initialised model (same
  config, same seed). For the carrier energy that is not ~1/d: with token-only keys (RoPE, NoPE)
  the mean over data is the mean of the m random embedding directions, so the baseline is
  ~1/m (plus the data's finite-sample term).

Notation: b batch, h head, s padded sequence index, t key position, n = L - 1 query position,
d head dim, D d_model, L length, K target offset.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.models.intermediates import Intermediates
from poslab.models.retrieval_head import RetrievalHead
from poslab.positional import ENCODINGS, encoding_class
from poslab.positional.rope import RoPE, rotate
from poslab.tasks.base import Batch

CHUNK = 1024  # sequences per forward


# ----------------------------------------------------------------------------- plumbing

def _chunks(model: RetrievalHead, batch: Batch, chunk: int) -> Iterator[Batch]:
    """Consecutive slices of ``batch`` of at most ``chunk`` sequences, on the model's device."""
    if chunk < 1:
        raise ConfigError("chunk", chunk, "a positive integer")
    device = next(model.parameters()).device
    for i in range(0, batch.tokens.shape[0], chunk):
        j = i + chunk
        yield Batch(tokens=batch.tokens[i:j], targets=batch.targets[i:j], loss_mask=batch.loss_mask[i:j],
                    lengths=batch.lengths[i:j]).to(device)


def _forward(model: RetrievalHead, part: Batch) -> tuple[Tensor, Intermediates]:
    return model(part.tokens, part.lengths, return_intermediates=True)


def _one_length(batch: Batch) -> int:
    """The common length L of an evaluation batch; refuses mixed lengths (offsets would not align)."""
    lengths = batch.lengths
    L = int(lengths[0])
    if bool((lengths != L).any()):
        raise ConfigError("lengths", sorted(set(lengths.tolist())),
                          "one length per evaluation batch (use eval_batch(task, L, n, seed))")
    return L


def _check_head(n_heads: int, head: int | None) -> None:
    if head is not None and not 0 <= head < n_heads:
        raise ConfigError("head", head, f"an index in [0, {n_heads - 1}] or None (mean over heads)")


def _pick_head(values: np.ndarray, head: int | None) -> float:
    """values [h] -> values[head], or their mean for head=None."""
    _check_head(len(values), head)
    return float(values.mean() if head is None else values[head])


def _as_row(row: np.ndarray | Tensor, L: int | None = None) -> np.ndarray:
    """One head's mean attention as a 1-D float64 array ([1, L] is squeezed)."""
    row = np.asarray(row.detach().cpu() if isinstance(row, Tensor) else row, dtype=np.float64)
    if row.ndim == 2 and row.shape[0] == 1:
        row = row[0]
    if row.ndim != 1:
        raise ValueError(f"expected one head's row [L], got shape {row.shape}: index mean_attention(...)[h]")
    if L is not None:
        if row.shape[0] < L:
            raise ValueError(f"row has {row.shape[0]} positions, fewer than L={L}")
        row = row[:L]
    return row


# ----------------------------------------------------------------------------- (i) accuracy

def accuracy(model: RetrievalHead, batch: Batch, *, chunk: int = CHUNK) -> float:
    """Fraction of sequences (where ``loss_mask``) whose argmax logit is the target."""
    if batch.targets.ndim != 1:
        raise ValueError("accuracy expects one target per sequence (targets [b]), as the retrieval tasks give")
    correct = total = 0
    with torch.no_grad():
        for part in _chunks(model, batch, chunk):
            hit = (model(part.tokens, part.lengths).argmax(-1) == part.targets) & part.loss_mask
            correct += int(hit.sum())
            total += int(part.loss_mask.sum())
    return correct / total if total else math.nan


# ----------------------------------------------------------------------------- (ii) attention peak

def mean_attention(model: RetrievalHead, batch: Batch, *, chunk: int = CHUNK) -> np.ndarray:
    """Mean over sequences of the query's attention weights over key positions, ``[h, L]``.

    The query is the last position; every sequence of ``batch`` must have the same length L.
    For linear attention these are the unnormalised weights the model uses.
    """
    L = _one_length(batch)
    total = torch.zeros(model.cfg.n_heads, L, dtype=torch.float64)
    with torch.no_grad():
        for part in _chunks(model, batch, chunk):
            _, inter = _forward(model, part)
            pattern = inter.layers[0].pattern[:, :, 0, :L]  # [b, h, L]
            total += pattern.sum(0).double().cpu()
    return (total / batch.tokens.shape[0]).numpy()


def accuracy_and_attention(model: RetrievalHead, batch: Batch, *, chunk: int = CHUNK) -> tuple[float, np.ndarray]:
    """:func:`accuracy` and :func:`mean_attention` in one pass of the model's grid fast path.

    Every sequence of ``batch`` must have the same length L (as evaluation sets do), so the
    grid holds only the m queries at position L - 1.
    """
    L = _one_length(batch)
    total = torch.zeros(model.cfg.n_heads, L, dtype=torch.float64)
    correct = 0
    with torch.no_grad():
        for part in _chunks(model, batch, chunk):
            logits, weights = model.attend(part.tokens[:, :L], part.lengths, L - 1, 1)  # [b, m], [h, b, L]
            correct += int(((logits.argmax(-1) == part.targets) & part.loss_mask).sum())
            total += weights.sum(1).double().cpu()
    return correct / int(batch.loss_mask.sum()), (total / batch.tokens.shape[0]).numpy()


def peak(mean_attn_row: np.ndarray, L: int) -> dict:
    """The selected position of one head's mean attention row [L].

    ``peak_offset`` = key - query position (-K for the target), ``peak_position`` = absolute key
    position, ``peak_height`` = the maximum of the mean attention.
    """
    row = _as_row(mean_attn_row, L)
    t = int(row.argmax())
    return dict(peak_offset=t - (L - 1), peak_position=t, peak_height=float(row[t]))


def attention_at_offset(mean_attn_row: np.ndarray, L: int, offset: int) -> float:
    """Mean attention at key position ``L - 1 + offset``; with ``offset = -K`` this is a*."""
    row = _as_row(mean_attn_row, L)
    t = L - 1 + offset
    if not 0 <= t < L:
        raise ConfigError("offset", offset, f"an integer in [{-(L - 1)}, 0] at L={L}")
    return float(row[t])


def pinned_position(mean_attn_rows_by_length: Mapping[int, np.ndarray], *, tolerance: int = 0,
                    train_max_len: int | None = None) -> dict:
    """Proposition 2's test: does the peak sit at one absolute position across lengths?

    Pass one head's mean attention rows at the (unseen) lengths to compare. Returns

    - ``positions``, ``offsets``, ``heights``: {L: peak key position / peak offset / peak height};
    - ``spread``: max - min of the peak positions; ``pinned``: spread <= ``tolerance``;
    - ``position``: the most common peak position (ties: the smallest);
    - ``relative``: one peak offset at every length; ``offset``: the most common offset;
    - ``in_range``: every peak position < ``train_max_len`` (None when it is not given).

    A RoPE head is relative and not pinned; the paper's APE head selects a position inside the
    training range at every unseen length (``in_range``; exactly one position: ``pinned``).
    """
    if not mean_attn_rows_by_length:
        raise ValueError("pinned_position needs at least one length")
    peaks = {int(L): peak(row, int(L)) for L, row in sorted(mean_attn_rows_by_length.items())}
    positions = {L: p["peak_position"] for L, p in peaks.items()}
    offsets = {L: p["peak_offset"] for L, p in peaks.items()}
    spread = max(positions.values()) - min(positions.values())
    in_range = None if train_max_len is None else all(t < train_max_len for t in positions.values())
    return dict(positions=positions, offsets=offsets, heights={L: p["peak_height"] for L, p in peaks.items()},
                spread=spread, pinned=spread <= tolerance, position=_mode(positions.values()),
                relative=len(set(offsets.values())) == 1, offset=_mode(offsets.values()), in_range=in_range)


def _mode(values) -> int:
    values = sorted(values)
    return max(values, key=values.count)  # first (smallest) of the most common


# ----------------------------------------------------------------------------- (iii) carrier energy

def carrier_energy(X: Tensor | np.ndarray) -> float:
    """||mean_n X_n||^2 / mean_n ||X_n||^2 of rows X [N, d]: 1 for identical rows, 0 for +-x rows."""
    X = torch.as_tensor(X).double()
    return float(X.mean(0).square().sum() / X.square().sum(-1).mean())


def _projection_moments(model: RetrievalHead, batch: Batch, chunk: int) -> dict[str, Tensor]:
    """Per head: mean projected query m_Q, key m_K [h, d] and mean squared norms [h], float64.

    Queries are q = W_Q z_n at each sequence's last position, keys k_t = W_K z_t at every real
    position t < L, both before ``rotate_qk`` (z is the embed-hook output, so APE keys include
    the position vector). Accumulated in sums so chunks need not hold the whole batch.
    """
    h, d = model.cfg.n_heads, model.cfg.head_dim
    acc = {name: torch.zeros(h, d, dtype=torch.float64) for name in ("sum_q", "sum_k")}
    acc |= {name: torch.zeros(h, dtype=torch.float64) for name in ("sq_q", "sq_k")}
    n_q = n_k = 0
    with torch.no_grad():
        for part in _chunks(model, batch, chunk):
            _, inter = _forward(model, part)
            z = inter.embed  # [b, s, D]
            b, s, D = z.shape
            z_n = z.gather(1, (part.lengths - 1).view(b, 1, 1).expand(b, 1, D))[:, 0]  # [b, D]
            q = (z_n @ model.W_Q.T).view(b, h, d).double()  # [b, h, d]
            k = (z @ model.W_K.T).view(b, s, h, d).double()  # [b, s, h, d]
            real = (torch.arange(s, device=z.device) < part.lengths[:, None])[..., None, None]  # [b, s, 1, 1]
            k = k * real
            acc["sum_q"] += q.sum(0).cpu()
            acc["sq_q"] += q.square().sum((0, 2)).cpu()
            acc["sum_k"] += k.sum((0, 1)).cpu()
            acc["sq_k"] += k.square().sum((0, 1, 3)).cpu()
            n_q += b
            n_k += int(part.lengths.sum())
    return dict(m_Q=acc["sum_q"] / n_q, m_K=acc["sum_k"] / n_k, sq_Q=acc["sq_q"] / n_q, sq_K=acc["sq_k"] / n_k)


def carrier(model: RetrievalHead, batch: Batch, *, head: int | None = 0, chunk: int = CHUNK) -> dict:
    """Carrier energy of the projected (unrotated) queries and keys over the batch.

    ``carrier_q`` / ``carrier_k``: of head ``head`` (default 0; None = mean over heads).
    ``carrier_q_heads`` / ``carrier_k_heads``: every head, numpy [h]. Keys pool all real
    positions of all sequences; queries are the last positions. The untrained baseline is this
    call on a freshly initialised model with the same config and seed (see the module notes).
    """
    mom = _projection_moments(model, batch, chunk)
    cq = (mom["m_Q"].square().sum(-1) / mom["sq_Q"]).numpy()
    ck = (mom["m_K"].square().sum(-1) / mom["sq_K"]).numpy()
    return dict(carrier_q=_pick_head(cq, head), carrier_k=_pick_head(ck, head), carrier_q_heads=cq,
                carrier_k_heads=ck)


# ----------------------------------------------------------------------------- (iv) carrier profile

def rotary_theta(model: RetrievalHead) -> Tensor:
    """The model's rotary frequencies theta [d/2] (the encoding's ``inv_freq``); RoPE family only."""
    if not isinstance(model.encoding, RoPE):
        rotary = sorted(name for name in ENCODINGS if issubclass(encoding_class(name), RoPE))
        raise ConfigError("encoding", model.cfg.encoding, f"a rotary encoding: {', '.join(rotary)}")
    return model.encoding.inv_freq


def carrier_profile(model: RetrievalHead, batch: Batch, offsets: Sequence[int] | np.ndarray, *,
                    head: int | None = 0, normalize: bool = False, chunk: int = CHUNK) -> np.ndarray:
    """phi_c(delta) = m_Q^T R_delta m_K at each offset delta = t - n (peaks at -K when trained).

    m_Q, m_K are the head's mean projected (unrotated) query and key over ``batch``; R_delta is
    the encoding's rotation by delta (its ``inv_freq`` at max_len and its pair layout; the
    attention factor is left out). ``normalize=True`` gives cos(m_Q, R_delta m_K) instead
    (Section 7's carrier inner product at delta = -K). head=None averages the heads' profiles.
    Raises ConfigError (field ``encoding``) for a non-rotary encoding.
    """
    theta = rotary_theta(model).detach().double().cpu()
    _check_head(model.cfg.n_heads, head)
    mom = _projection_moments(model, batch, chunk)
    delta = torch.as_tensor(np.asarray(offsets), dtype=torch.float64).reshape(-1)  # [o]
    m_Q, m_K = mom["m_Q"], mom["m_K"]  # [h, d]
    # rotate reads x as [..., h, s, d] with positions [s]: one copy of m_K per offset
    rotated = rotate(m_K[:, None, :].expand(-1, len(delta), -1), delta, theta, model.encoding.layout)  # [h, o, d]
    profile = (rotated * m_Q[:, None, :]).sum(-1)  # [h, o]
    if normalize:
        profile = profile / (m_Q.norm(dim=-1) * m_K.norm(dim=-1))[:, None]
    profile = profile.numpy()
    return profile.mean(0) if head is None else profile[head]


# ----------------------------------------------------------------------------- (v) dilution

def dilution_fit(lengths: Sequence[int], a_star: Sequence[float]) -> dict:
    """Least squares of 1/a* on L - 1: ``slope`` (the dilution rate c), ``intercept``, ``r2``."""
    x = np.asarray(lengths, dtype=np.float64) - 1
    a = np.asarray(a_star, dtype=np.float64)
    if x.ndim != 1 or x.shape != a.shape or len(x) < 2:
        raise ValueError("dilution_fit needs two equal-length lists with at least two points")
    if not (a > 0).all():
        raise ValueError("every a* must be positive to take 1/a*")
    y = 1 / a
    slope, intercept = np.polyfit(x, y, 1)
    ss_res = float(np.square(y - (slope * x + intercept)).sum())
    ss_tot = float(np.square(y - y.mean()).sum())
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-24 else math.nan)
    return dict(slope=float(slope), intercept=float(intercept), r2=float(r2))


# ----------------------------------------------------------------------------- margin

def margin(model: RetrievalHead, batch: Batch, K: int, *, head: int | None = 0, reduce: str = "mean",
           chunk: int = CHUNK) -> float | np.ndarray:
    """mu: the target's lead in the query's attention logits.

    Per sequence, mu_b = l_{b, n-K} - max_{t < L, t != n-K} l_{b,t}, with l the logits the
    softmax sees (``attn_scores``: q.k / sqrt(d) plus any score bias, divided by the
    temperature), n = L - 1. ``reduce``: "mean" (the default, the paper's measured mu), "min"
    or "none" (the array [b]). Because every competitor trails by at least mu_b, the target
    weight of that sequence is >= margin_bound(mu_b, L); the bound at the mean mu is the
    paper's "valid but loose" comparison with the measured a*. head=None averages over heads.
    """
    if reduce not in ("mean", "min", "none"):
        raise ConfigError("reduce", reduce, ("mean", "min", "none"))
    _check_head(model.cfg.n_heads, head)
    if batch.lengths.min() <= K:
        raise ConfigError("K", K, f"smaller than the shortest length {int(batch.lengths.min())}")
    out = []
    with torch.no_grad():
        for part in _chunks(model, batch, chunk):
            _, inter = _forward(model, part)
            scores = inter.layers[0].attn_scores[:, :, 0, :].double()  # [b, h, s]
            b, h, s = scores.shape
            target = (part.lengths - 1 - K).view(b, 1, 1).expand(b, h, 1)  # [b, h, 1]
            t = torch.arange(s, device=scores.device)
            other = (t < part.lengths[:, None]) & (t != target[:, 0])  # [b, s]
            best_other = scores.masked_fill(~other[:, None, :], -math.inf).amax(-1)  # [b, h]
            out.append((scores.gather(-1, target)[..., 0] - best_other).cpu())
    mu = torch.cat(out).numpy()  # [b, h]
    if reduce == "none":
        return mu.mean(1) if head is None else mu[:, head]
    per_head = mu.mean(0) if reduce == "mean" else mu.min(0)
    return _pick_head(per_head, head)


def margin_bound(mu: float | np.ndarray, L: int | np.ndarray) -> float | np.ndarray:
    """1 / (1 + (L - 1) e^{-mu}): the least target weight a margin mu allows among L keys."""
    with np.errstate(over="ignore"):
        bound = 1 / (1 + (np.asarray(L, dtype=np.float64) - 1) * np.exp(-np.asarray(mu, dtype=np.float64)))
    return float(bound) if bound.ndim == 0 else bound


# ----------------------------------------------------------------------------- rank concentration

def rank_concentration(model: RetrievalHead, *, head: int | None = 0) -> float:
    """sigma_1^2 / sum_i sigma_i^2 of the head's W = W_Q^T W_K [D, D] (1 for rank one).

    head=None averages the per-head values.
    """
    h, d = model.cfg.n_heads, model.cfg.head_dim
    with torch.no_grad():
        W_Q = model.W_Q.detach().double().view(h, d, -1)  # [h, d, D]
        W_K = model.W_K.detach().double().view(h, d, -1)
        sigma2 = torch.linalg.svdvals(W_Q.transpose(1, 2) @ W_K).square()  # [h, D]
        energy = (sigma2[:, 0] / sigma2.sum(-1)).cpu().numpy()
    return _pick_head(energy, head)


# ----------------------------------------------------------------------------- rotary kernel

def rotary_kernel(theta: Tensor | np.ndarray, s: Sequence[float] | np.ndarray | float) -> np.ndarray:
    """g(s) = sum_j cos(s theta_j), the logit profile of a carrier with equal energy per pair.

    theta [d/2]; s any shape; returns float64 of s's shape. g(0) = d/2.
    """
    theta = np.asarray(theta.detach().cpu() if isinstance(theta, Tensor) else theta, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    return np.cos(s[..., None] * theta).sum(-1)


def kernel_ratio(theta: Tensor | np.ndarray, s_min: int = 4, s_max: int = 47) -> float:
    """max over integers s in [s_min, s_max] of g(s) / g(0) (Lemma 2's uniqueness margin).

    The default s_max = 47 is the largest offset at the paper's longest evaluation length, 48.
    """
    if s_min < 1:
        raise ConfigError("s_min", s_min, "an integer >= 1")
    if s_max < s_min:
        raise ConfigError("s_max", s_max, f"an integer >= s_min={s_min}")
    g = rotary_kernel(theta, np.arange(s_min, s_max + 1))
    return float(g.max() / rotary_kernel(theta, 0.0))


__all__ = ["accuracy", "attention_at_offset", "carrier", "carrier_energy", "carrier_profile", "dilution_fit",
           "kernel_ratio", "margin", "margin_bound", "mean_attention", "peak", "pinned_position",
           "rank_concentration", "rotary_kernel", "rotary_theta"]
