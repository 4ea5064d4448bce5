"""Probes of a trained retrieval head (the seed paper's probes (iii)-(v) and Fig. 4 controls).

    (iii) carrier energy    ||mean_n X_n||^2 / mean_n ||X_n||^2,  X = W_Q z_n  or  W_K z_t (unrotated)
    (iv)  carrier profile   phi_c(delta) = m_Q^T R_delta m_K,  delta = t - n
          carrier cosine    cos(m_Q, R_delta m_K)                  (Section 7, at delta = -K)
    (v)   dilution fit      1 / a*(L) = c (L - 1) + b                             (least squares)
          dilution exponent 1 / a*(L) - 1 = c (L - 1)^gamma   (log-log least squares, t-interval on gamma)
    Fig. 4  margin          mu = mean_b (l_{b,n-K} - max_{t != n-K} l_{b,t}),  bound 1 / (1 + (L-1) e^{-mu})
            rank            sigma_1^2 / sum_i sigma_i^2  of  W = W_Q^T W_K
            rotary kernel   g(s) = sum_j cos(s theta_j),  ratio max_{s >= 4} g(s) / g(0)

(i) accuracy is in :mod:`poslab.probes.common`, (ii) the attention peak and pinning in
:mod:`poslab.probes.attention`.

Each probe is a pure function of intermediates (``model.collect(batch)``: the ``q``/``k``
before ``rotate_qk`` for the carrier, ``attn_scores`` for the margin), of sums accumulated from
them (:class:`Moments`), or of what is passed in explicitly (rotary frequencies ``theta`` and
pair ``layout`` for the profile, ``W_Q``/``W_K`` for the rank). The ``model, batch`` functions
of the original API wrap them: one layer's probes read layer 0, the query is each sequence's
last real token.

Conventions
-----------
- Offsets are key minus query position, ``delta = t - n`` with ``n = L - 1``: the fixed-offset
  target sits at ``delta = -K``. Positions are absolute key indices ``0 .. L - 1``.
- Per-head probes take ``head``: an index (default 0, the paper's single head), or ``None`` for
  the mean of the per-head scalars.
- The RoPE logit between the query at n and the key at t is
  ``(R_n q) . (R_t k) / sqrt(d) = q . R_{t-n} k / sqrt(d)`` (R_p rotates each pair by p theta_i,
  counter-clockwise), hence ``phi_c(delta) = m_Q . R_delta m_K``, in the units of q . k: multiply
  by ``attention_factor^2 / (sqrt(d) tau)`` to read it as a mean logit.
- Rotary-ness comes from the encoding: ``theta = enc.rotary_frequencies()`` (RoPE: its
  ``inv_freq``; MoPE's relative form: its learned omega), None for every other encoding.
- The untrained baseline of any probe is the same call on a freshly initialised model (same
  config, same seed). For the carrier energy that is not ~1/d: with token-only keys (RoPE, NoPE)
  the mean over data is the mean of the m random embedding directions, so the baseline is
  ~1/m (plus the data's finite-sample term).

Notation: b batch, h head, s sequence index, t key position, n = L - 1 query position,
d head dim, D d_model, L length, K target offset, o offsets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.models.intermediates import Intermediates
from poslab.positional import rotary_encodings
from poslab.positional.rope import rotate
from poslab.probes.common import (
    CHUNK,
    Collects,
    PoslabModel,
    at_last_query,
    check_head,
    last_index,
    model_device,
    one_length,
    over_chunks,
    pick_head,
    real_keys,
    real_lengths,
    split_batch,
)
from poslab.tasks.base import Batch

if TYPE_CHECKING:
    from poslab.models.retrieval_head import RetrievalHead

# ----------------------------------------------------------------------------- (i) + (ii) fast path

def accuracy_and_attention(model: RetrievalHead, batch: Batch, *, chunk: int = CHUNK) -> tuple[float, np.ndarray]:
    """:func:`~poslab.probes.common.accuracy` and :func:`~poslab.probes.attention.mean_attention`
    in one pass of the ``RetrievalHead``'s grid fast path (``model.attend``), the evaluation
    Table 1 uses.

    Every sequence of ``batch`` must have the same length L (as evaluation sets do), so the
    grid holds only the m queries at position L - 1.
    """
    L = one_length(batch)
    total = torch.zeros(model.cfg.n_heads, L, dtype=torch.float64)
    correct = 0
    with torch.no_grad():
        for part in split_batch(batch, chunk, model_device(model)):
            logits, weights = model.attend(part.tokens[:, :L], part.lengths, L - 1, 1)  # [b, m], [h, b, L]
            correct += int(((logits.argmax(-1) == part.targets) & part.loss_mask).sum())
            total += weights.sum(1).double().cpu()
    return correct / int(batch.loss_mask.sum()), (total / batch.tokens.shape[0]).numpy()


# ----------------------------------------------------------------------------- (iii) carrier energy

def carrier_energy(X: Tensor | np.ndarray) -> float:
    """||mean_n X_n||^2 / mean_n ||X_n||^2 of rows X [N, d]: 1 for identical rows, 0 for +-x rows."""
    X = torch.as_tensor(X).double()
    return float(X.mean(0).square().sum() / X.square().sum(-1).mean())


@dataclass(frozen=True)
class Moments:
    """First and second moments of projected queries and keys, as float64 sums (chunks add up).

    Queries are each sequence's last real query, keys every real token (BOS excluded), both
    before ``rotate_qk``.
    """

    sum_q: Tensor  # sum of q, [h, d]
    sq_q: Tensor  # sum of ||q||^2, [h]
    n_q: int  # queries summed
    sum_k: Tensor  # sum of k, [h, d]
    sq_k: Tensor  # sum of ||k||^2, [h]
    n_k: int  # keys summed

    def __add__(self, other: Moments) -> Moments:
        return Moments(self.sum_q + other.sum_q, self.sq_q + other.sq_q, self.n_q + other.n_q,
                       self.sum_k + other.sum_k, self.sq_k + other.sq_k, self.n_k + other.n_k)

    @property
    def m_Q(self) -> Tensor:
        """Mean projected query, [h, d]."""
        return self.sum_q / self.n_q

    @property
    def m_K(self) -> Tensor:
        """Mean projected key, [h, d]."""
        return self.sum_k / self.n_k

    def carrier_energies(self) -> tuple[np.ndarray, np.ndarray]:
        """Carrier energy of queries and of keys per head, ([h], [h])."""
        cq = self.m_Q.square().sum(-1) / (self.sq_q / self.n_q)
        ck = self.m_K.square().sum(-1) / (self.sq_k / self.n_k)
        return cq.numpy(), ck.numpy()


def token_keys(inter: Intermediates) -> Tensor:
    """Key j is a real token (not BOS, not padding) of sequence b, [b, s] bool."""
    j = torch.arange(inter.embed.shape[1], device=inter.embed.device)
    return real_keys(inter) & (j >= inter.prefix)


def projection_moments(inter: Intermediates, layer: int = 0) -> Moments:
    """:class:`Moments` of one chunk's unrotated queries (``q`` at the last query) and keys
    (``k`` at every real token)."""
    li = inter.layers[layer]
    q = at_last_query(li.q, inter).double()  # [b, h, d]
    k = li.k.transpose(1, 2).double()  # [b, s, h, d]
    keep = token_keys(inter)  # [b, s]
    k = k * keep[..., None, None]
    return Moments(sum_q=q.sum(0).cpu(), sq_q=q.square().sum((0, 2)).cpu(), n_q=q.shape[0],
                   sum_k=k.sum((0, 1)).cpu(), sq_k=k.square().sum((0, 1, 3)).cpu(), n_k=int(keep.sum()))


def collect_moments(model: Collects, batch: Batch, *, layer: int = 0, chunk: int = CHUNK) -> Moments:
    """:func:`projection_moments` summed over ``batch`` in chunks."""
    total: Moments | None = None
    for _, inter in over_chunks(model, batch, chunk):
        part = projection_moments(inter, layer)
        total = part if total is None else total + part
    assert total is not None  # one chunk at least
    return total


def carrier(model: Collects, batch: Batch, *, head: int | None = 0, chunk: int = CHUNK) -> dict:
    """Carrier energy of the projected (unrotated) queries and keys over the batch (layer 0).

    ``carrier_q`` / ``carrier_k``: of head ``head`` (default 0; None = mean over heads).
    ``carrier_q_heads`` / ``carrier_k_heads``: every head, numpy [h]. Keys pool all real
    positions of all sequences; queries are the last positions. The untrained baseline is this
    call on a freshly initialised model with the same config and seed (see the module notes).
    """
    cq, ck = collect_moments(model, batch, chunk=chunk).carrier_energies()
    return dict(carrier_q=pick_head(cq, head), carrier_k=pick_head(ck, head), carrier_q_heads=cq,
                carrier_k_heads=ck)


# ----------------------------------------------------------------------------- (iv) carrier profile

def rotary_theta(model: PoslabModel, layer: int = 0) -> Tensor:
    """Layer ``layer``'s rotary frequencies theta [d/2] (``layer_encoding(layer).rotary_frequencies()``:
    the model's encoding, or that layer's under a Transformer's ``layout``).

    Raises ConfigError (field ``encoding``, or ``layout`` with one) for an encoding that does not
    rotate q and k, and for LongRoPE with n_hat > 0 (positions below n_hat rotate by other
    frequencies: no single theta).
    """
    enc = model.layer_encoding(layer)
    theta = enc.rotary_frequencies()
    if theta is None:
        layout = getattr(model.cfg, "layout", None)
        raise ConfigError("encoding" if layout is None else "layout", model.cfg.encoding if layout is None else layout,
                          f"a rotary encoding in layer {layer}: {', '.join(rotary_encodings())}")
    if getattr(enc, "n_hat", 0):
        raise ConfigError("encoding_options.scaling.n_hat", enc.n_hat,
                          "0: a rotary probe reads one frequency table for every position")
    return theta


def carrier_profile_of(m_Q: Tensor, m_K: Tensor, theta: Tensor | np.ndarray, layout: str,
                       offsets: Sequence[int] | np.ndarray, *, normalize: bool = False) -> np.ndarray:
    """phi_c(delta) = m_Q^T R_delta m_K per head and offset, [h, o] (m_Q, m_K [h, d] or [d]).

    R_delta rotates each pair (in ``layout``) by delta theta_i. ``normalize=True`` divides by
    ||m_Q|| ||m_K||: the carrier cosine.
    """
    theta = torch.as_tensor(theta.detach() if isinstance(theta, Tensor) else theta).double().cpu()
    m_Q, m_K = torch.atleast_2d(torch.as_tensor(m_Q).double()), torch.atleast_2d(torch.as_tensor(m_K).double())
    delta = torch.as_tensor(np.asarray(offsets), dtype=torch.float64).reshape(-1)  # [o]
    # rotate reads x as [..., h, s, d] with positions [s]: one copy of m_K per offset
    rotated = rotate(m_K[:, None, :].expand(-1, len(delta), -1), delta, theta, layout)  # [h, o, d]
    profile = (rotated * m_Q[:, None, :]).sum(-1)  # [h, o]
    if normalize:
        profile = profile / (m_Q.norm(dim=-1) * m_K.norm(dim=-1))[:, None]
    return profile.numpy()


def carrier_cosine(m_Q: Tensor, m_K: Tensor, theta: Tensor | np.ndarray, layout: str,
                   offsets: Sequence[int] | np.ndarray) -> np.ndarray:
    """cos(m_Q, R_delta m_K) per head and offset, [h, o]."""
    return carrier_profile_of(m_Q, m_K, theta, layout, offsets, normalize=True)


def carrier_profile(model: PoslabModel, batch: Batch, offsets: Sequence[int] | np.ndarray, *,
                    head: int | None = 0, normalize: bool = False, chunk: int = CHUNK) -> np.ndarray:
    """phi_c(delta) = m_Q^T R_delta m_K at each offset delta = t - n (peaks at -K when trained).

    m_Q, m_K are the head's mean projected (unrotated) query and key over ``batch``; R_delta is
    the encoding's rotation by delta (its ``rotary_frequencies()`` and its pair layout; the
    attention factor is left out). ``normalize=True`` gives cos(m_Q, R_delta m_K) instead
    (Section 7's carrier inner product at delta = -K). head=None averages the heads' profiles.
    Raises ConfigError (field ``encoding``) for a non-rotary encoding, before any work.
    """
    theta = rotary_theta(model)  # layer 0's, whose moments these are
    check_head(model.cfg.n_heads, head)
    mom = collect_moments(model, batch, chunk=chunk)
    layout = cast(str, model.layer_encoding(0).layout)  # a rotary encoding (rotary_theta checked): RoPE's or MoPE's
    profile = carrier_profile_of(mom.m_Q, mom.m_K, theta, layout, offsets, normalize=normalize)
    return profile.mean(0) if head is None else profile[head]


# ----------------------------------------------------------------------------- (v) dilution

def dilution_fit(lengths: Sequence[int] | np.ndarray, a_star: Sequence[float] | np.ndarray) -> dict:
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


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (0.5 < p < 1): bisection on
    0.5 + the Simpson integral of the density from 0 (scipy is not a dependency)."""
    if not (0.5 < p < 1 and df >= 1):
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t: float) -> float:
        s = np.linspace(0.0, t, 4001)
        f = np.exp(log_norm - (df + 1) / 2 * np.log1p(s * s / df))
        return 0.5 + (s[1] - s[0]) / 3 * float(f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def dilution_exponent(lengths: Sequence[int], a_star, *, offset: float = 1.0, level: float = 0.95) -> dict | None:
    """The exponent gamma of 1/a* - offset = c (L - 1)^gamma: least squares of log(1/a* - offset) on
    log(L - 1), with a ``level`` t-interval on gamma from the fit's residuals over lengths (n - 2 dof).

    ``offset=1`` is Corollary 2's form (1/a* = 1 + c (L - 1): the target's weight is 1 at L = 1), so
    inverse-linear dilution is gamma = 1; ``offset=0`` fits 1/a* itself. ``a_star`` is [L] or [seeds, L]:
    with seeds, log(1/a* - offset) is averaged over seeds per length first, so gamma is the mean of the
    per-seed exponents and the interval reads how far the seed-mean curve is from a power law. Lengths
    where some a* leaves nothing above ``offset`` are dropped; None with fewer than three lengths left.
    Returns ``gamma``, ``gamma_lo``, ``gamma_hi``, ``lengths`` (those kept) and ``r2`` (of the log-log fit).
    """
    x = np.asarray(lengths, dtype=np.float64) - 1
    a = np.atleast_2d(np.asarray(a_star, dtype=np.float64))
    if x.ndim != 1 or a.shape[1] != x.shape[0]:
        raise ValueError("dilution_exponent needs a* of shape [L] or [seeds, L] matching the lengths")
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = 1 / a - offset
    keep = (excess > 0).all(axis=0) & np.isfinite(excess).all(axis=0) & (x > 0)
    if keep.sum() < 3:
        return None
    lx, ly = np.log(x[keep]), np.log(excess[:, keep]).mean(axis=0)
    n = len(lx)
    gamma, log_c = np.polyfit(lx, ly, 1)
    resid = ly - (gamma * lx + log_c)
    sxx = float(np.square(lx - lx.mean()).sum())
    se = math.sqrt(float(np.square(resid).sum()) / (n - 2) / sxx)
    half = t_quantile(0.5 + level / 2, n - 2) * se
    ss_tot = float(np.square(ly - ly.mean()).sum())
    r2 = 1 - float(np.square(resid).sum()) / ss_tot if ss_tot > 0 else 1.0
    return dict(gamma=float(gamma), gamma_lo=float(gamma - half), gamma_hi=float(gamma + half),
                lengths=[int(v) for v in x[keep] + 1], r2=float(r2))


# ----------------------------------------------------------------------------- margin

def check_offset(K: int, shortest: int) -> None:
    if shortest <= K:
        raise ConfigError("K", K, f"smaller than the shortest length {shortest}")


def margins(inter: Intermediates, K: int, layer: int = 0, against: str = "max") -> Tensor:
    """mu_{b,h} = l_{b, n-K} - max_{t real, t != n-K} l_{b,t} at each sequence's last query, [b, h] float64.

    l are the logits the softmax sees (``attn_scores``: q.k / sqrt(d) plus any score bias,
    divided by the temperature); competitors are every real key (BOS included). A sliding
    window's masked keys are not known to the intermediates and still compete. ``against="mean"``
    takes the competitors' mean instead of their max: the target's lead over a typical key, which
    does not shrink as more i.i.d. competitors enter (their max grows with L even at a fixed kernel).
    """
    if against not in ("max", "mean"):
        raise ConfigError("against", against, ("max", "mean"))
    check_offset(K, int((real_lengths(inter) - inter.prefix).min()))
    scores = at_last_query(inter.layers[layer].attn_scores, inter).double()  # [b, h, s]
    b, h, s = scores.shape
    target = (last_index(inter) - K).view(b, 1, 1).expand(b, h, 1)  # [b, h, 1]
    t = torch.arange(s, device=scores.device)
    other = real_keys(inter) & (t != target[:, 0])  # [b, s]
    if against == "max":
        rival = scores.masked_fill(~other[:, None, :], -math.inf).amax(-1)  # [b, h]
    else:
        rival = (scores * other[:, None, :]).sum(-1) / other.sum(-1, keepdim=True)  # [b, h]
    return scores.gather(-1, target)[..., 0] - rival


def margin(model: PoslabModel, batch: Batch, K: int, *, head: int | None = 0, reduce: str = "mean",
           chunk: int = CHUNK, against: str = "max") -> float | np.ndarray:
    """mu: the target's lead in the query's attention logits (layer 0), see :func:`margins`.

    ``reduce``: "mean" (the default, the paper's measured mu), "min" or "none" (the array [b]).
    Because every competitor trails by at least mu_b, the target weight of that sequence is
    >= margin_bound(mu_b, L); the bound at the mean mu is the paper's "valid but loose"
    comparison with the measured a*. head=None averages over heads.
    """
    if reduce not in ("mean", "min", "none"):
        raise ConfigError("reduce", reduce, ("mean", "min", "none"))
    check_head(model.cfg.n_heads, head)
    check_offset(K, int(batch.lengths.min()))
    mu = torch.cat([margins(inter, K, against=against).cpu()
                    for _, inter in over_chunks(model, batch, chunk)]).numpy()  # [b, h]
    if reduce == "none":
        return mu.mean(1) if head is None else mu[:, head]
    per_head = mu.mean(0) if reduce == "mean" else mu.min(0)
    return pick_head(per_head, head)


def mean_logit_profile(model: PoslabModel, batch: Batch, *, head: int = 0, chunk: int = CHUNK) -> np.ndarray:
    """E_b l_{b,t}: the last query's mean attention logit at every key position (layer 0), [s]
    float64 in internal key order; ``batch`` has one length."""
    check_head(model.cfg.n_heads, head)
    one_length(batch)
    total, n = None, 0
    for _, inter in over_chunks(model, batch, chunk):
        scores = at_last_query(inter.layers[0].attn_scores, inter)[:, head].double()  # [b, s]
        total = scores.sum(0) if total is None else total + scores.sum(0)
        n += scores.shape[0]
    assert total is not None  # one_length: the batch has sequences
    return (total / n).cpu().numpy()


def profile_margin(model: PoslabModel, batch: Batch, K: int, *, head: int = 0, chunk: int = CHUNK) -> float:
    """The kernel's margin: f(n-K) - max_{t != n-K} f(t) of the mean logit profile f
    (:func:`mean_logit_profile`). Content is averaged out before the max, so on i.i.d. tokens this
    is the positional margin of Corollary 2, where :func:`margin`'s per-sequence max also carries
    the extreme value of L - 1 content-noisy competitors. Competitors are every real key, as there;
    ``batch`` has one length."""
    check_offset(K, one_length(batch))
    f = mean_logit_profile(model, batch, head=head, chunk=chunk)
    last = len(f) - 1  # one length: every key up to the last query is real
    return float(f[last - K] - np.delete(f, last - K).max())


def margin_bound(mu: float | np.ndarray, L: int | np.ndarray) -> float | np.ndarray:
    """1 / (1 + (L - 1) e^{-mu}): the least target weight a margin mu allows among L keys."""
    with np.errstate(over="ignore"):
        bound = 1 / (1 + (np.asarray(L, dtype=np.float64) - 1) * np.exp(-np.asarray(mu, dtype=np.float64)))
    return float(bound) if bound.ndim == 0 else bound


# ----------------------------------------------------------------------------- rank concentration

def rank_concentrations(W_Q: Tensor, W_K: Tensor, n_heads: int) -> np.ndarray:
    """sigma_1^2 / sum_i sigma_i^2 of each head's W = W_Q^T W_K [D, D], [h] (1 for rank one).

    W_Q, W_K [h d, D] as the models store them (y = W x; head r owns rows r d .. (r + 1) d).
    """
    with torch.no_grad():
        W_Q = W_Q.detach().double().view(n_heads, W_Q.shape[0] // n_heads, -1)  # [h, d, D]
        W_K = W_K.detach().double().view(n_heads, W_K.shape[0] // n_heads, -1)
        sigma2 = torch.linalg.svdvals(W_Q.transpose(1, 2) @ W_K).square()  # [h, D]
        return (sigma2[:, 0] / sigma2.sum(-1)).cpu().numpy()


def rank_concentration(model: RetrievalHead, *, head: int | None = 0) -> float:
    """:func:`rank_concentrations` of the head's ``W_Q``, ``W_K``; head=None averages the heads."""
    return pick_head(rank_concentrations(model.W_Q, model.W_K, model.cfg.n_heads), head)


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


__all__ = ["Moments", "accuracy_and_attention", "carrier", "carrier_cosine", "carrier_energy", "carrier_profile",
           "carrier_profile_of", "collect_moments", "dilution_exponent", "dilution_fit", "kernel_ratio", "margin",
           "margin_bound", "margins", "projection_moments", "rank_concentration", "rank_concentrations",
           "rotary_kernel", "rotary_theta", "t_quantile", "token_keys"]
