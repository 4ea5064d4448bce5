"""Positional leakage in RoPE models: where absolute position enters attention (seed 001, third abstract).

Softmax attention sees a head's logits l_bij (``attn_scores``) only up to a shift per query:
adding any g_b(i) to every logit of query i leaves every weight a_bij unchanged. So absolute
position can reach the weights in two ways, and the two components measure them separately,
per layer and head, over the pairs a causal (windowed) head attends (j <= i, i - j < window)::

    centred logits   c_bij = l_bij - mean_{j' kept} l_bij'        what softmax can see of the logits
                            (= log a_bij - mean_{j' kept} log a_bij': the same for logits and log-weights)

    (b) residual stream   the share of c's variance that position explains beyond f(i - j) + g(i):
                          key position h(j) and query-key interactions, split into
          (b) key         what f(i-j) + g(i) + h(j) explains beyond f(i-j) + g(i)
          (b) inter.      what any function of (i, j) explains beyond f(i-j) + g(i) + h(j)
        and, across the other axis, into the pairs it sits on:
          (b) key 0       the part of (b)'s residual product on the pairs (i, 0): position 0
                          read by the queries (the abstract's residual-stream mechanism)
          (b) rest        (b) - (b) key 0, every other key
    (a) causal mask       Var_pairs Λ(i) / Var(log a_bij),   Λ(i) = log sum_{j kept} exp f^(i - j)
                          with f^ the offset profile of the fit c ~ f(i - j) + g(i): the
                          log-normaliser a purely relative head would have, which depends on the
                          absolute query position because query i sees i + 1 keys (a window of w
                          keys stops that at i = w - 1)

A query-only term g(i) (or a content-dependent g_b(i)) changes neither component: c removes it,
and the baseline of (b) contains g(i) anyway. A head whose logits are f(i - j) has (b) = 0 and,
under a causal mask, (a) > 0; one with a key-position term h(j) (a sink column) has (b) > 0.
"Any function of (i, j)" is the per-pair mean of c over sequences.

Every fit is on the even-numbered sequences of the batch and scored on the odd ones, so the
numbers are what positions predict about unseen inputs, not what extra parameters memorize.
(b) is the mean over pairs of the product of the two halves' per-pair residuals from the
baseline, over the held-out variance of c: the halves' content noise is independent, so it is
unbiased (0 on average when there is nothing beyond the baseline), where a held-out R² gain of
the per-pair means would pay for their C parameters and sit below 0. Where c has no variance
(a head that depends on the query only) there is nothing to explain: (b) = 0.

The earlier definitions are kept as ``old_component_a`` / ``old_component_b`` so a report can put
them beside the new ones: ``old (b)`` = ΔR² of the raw logits, f(i-j) + g(i) + h(j) against f(i-j),
``old (a)`` = ΔR²(log-weights) - ΔR²(logits). Both move with any query-only term: adding
2 log(1 + i) to every logit of a relative head leaves the weights unchanged (< 1e-6) yet gives old
(b) ≈ +0.4 and old (a) ≈ -0.4 (tests/probes/test_probes_leakage.py).

Any model's intermediates: :class:`LeakageSums` reads what ``collect(batch) -> Intermediates``
returns (``attn_scores`` and ``pattern`` per layer), chunk by chunk, for the chosen layers, and
:meth:`LeakageSums.result` gives every number per layer and head, over all queries and over
early queries i < ``early``. :func:`leakage` drives it for a model (poslab's Transformer, a
pretrained adapter, anything with ``collect``), checking on the first chunk that the weights are
the causal (windowed) softmax of the logits.

Sink-reading heads: ``received_j`` = the mean weight key j receives from the other queries that
can see it (i > j, inside the window), averaged over sequences; a head reads the sink when
``received_0`` >= 0.3.

Closed-system check: per layer, the mean pairwise cosine similarity of the position-0 residual
across inputs. With a fixed BOS it is 1 at every layer (position 0 sees only itself and starts
from the same vector); with a content token at position 0 it follows that token.

The leakage studies' rows built from these probes live beside the studies
(:mod:`poslab.studies.kit.leakage_rows`).

Notation: b batch, l layer, h head, i query and j key index on the internal sequence (BOS at 0),
n its length, C the number of kept pairs, F regression features, D d_model.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from poslab.attention import build_mask
from poslab.errors import ConfigError
from poslab.models.intermediates import Intermediates
from poslab.models.intervention import Intervention, rows_of
from poslab.probes.common import CHUNK, model_device, split_batch
from poslab.tasks.base import Batch

SINK_THRESHOLD = 0.3  # a head reads the sink when key 0 receives at least this mean weight
SOFTMAX_TOL = 1e-3  # largest |pattern - softmax(attn_scores)| accepted as softmax attention
FITS = {  # the position features of each regression (the saturated fit is the per-pair mean)
    "relative": ("offset",),  # f(i - j)
    "query": ("offset", "query"),  # f(i - j) + g(i): the baseline of (b)
    "key": ("offset", "query", "key"),  # f(i - j) + g(i) + h(j)
}
QUANTITIES = ("centred", "logits", "log_weights")  # what is summed per pair
SUMS = ("fit_sum", "test_sum", "test_sq")  # the sums of each quantity (PairSums)
# without the earlier definitions (LeakageSums(old=False)): no logits, and per query only what is read
# as a total over pairs (the centred logits' held-out squares, the log-weights' held-out sums)
LEAN = {"centred": ("test_sq",), "log_weights": SUMS}


# ----------------------------------------------------------------------------- pairs and features

def keep_mask(n: int, window: int | None = None) -> Tensor:
    """The pairs a causal (windowed) head attends: j <= i and i - j < window, [n, n] bool."""
    mask = build_mask(n, n, causal=True, window=window)
    assert mask is not None  # causal: always a mask
    return mask


def pairs(keep: Tensor, queries: int | None = None) -> tuple[Tensor, Tensor]:
    """Query and key indices (i, j) of the kept pairs, each [C]; only queries i < ``queries``
    when it is given (early queries)."""
    keep = keep.clone()
    if queries is not None:
        keep[queries:] = False
    i, j = keep.nonzero(as_tuple=True)
    return i, j


def design(i: Tensor, j: Tensor, n: int, fit: str) -> Tensor:
    """One-hot features of each pair for one of :data:`FITS`, [C, F]: offset i - j, query i, key j
    (the dense design; the fits use :class:`OneHotFit`, which never builds it)."""
    if fit not in FITS:
        raise ConfigError("fit", fit, ", ".join(FITS))
    column = dict(offset=i - j, query=i, key=j)
    return torch.cat([torch.nn.functional.one_hot(column[t], n) for t in FITS[fit]], dim=1).double()


class OneHotFit:
    """Minimum-norm least squares on a one-hot design X [C, F] without building X or its
    pseudo-inverse: X^T y is a sum per feature (index_add), X c a sum of gathered coefficients,
    and X^+ = (X^T X)^+ X^T with the Gram matrix X^T X [F, F] a table of pair counts. Memory is
    O(F^2) beside the data, where the dense X and X^+ of 512 positions take about 3 GiB."""

    def __init__(self, i: Tensor, j: Tensor, n: int, fit: str):
        if fit not in FITS:
            raise ConfigError("fit", fit, ", ".join(FITS))
        column = dict(offset=i - j, query=i, key=j)
        self.index = torch.stack([column[t] + n * k for k, t in enumerate(FITS[fit])])  # [blocks, C]
        self.F = n * len(FITS[fit])
        a, b = self.index[:, None, :], self.index[None, :, :]  # every pair of blocks
        counts = torch.bincount((a * self.F + b).reshape(-1), minlength=self.F * self.F)
        self.gram_pinv = torch.linalg.pinv(counts.reshape(self.F, self.F).double(), hermitian=True)

    def transposed(self, y: Tensor) -> Tensor:
        """X^T y for every row of y [lead, C] -> [lead, F]: a sum per feature."""
        xty = torch.zeros(y.shape[0], self.F, dtype=torch.float64)
        for idx in self.index:
            xty.index_add_(1, idx, y.double())
        return xty

    def coefficients(self, y: Tensor) -> Tensor:
        """X^+ y for every row of y [lead, C] -> [lead, F]."""
        return self.transposed(y) @ self.gram_pinv  # the Gram pseudo-inverse is symmetric

    def projected_dot(self, a: Tensor, *bs: Tensor) -> tuple[Tensor, ...]:
        """For each b: the sum over pairs of (X X^+ a) b, row by row, [lead, C] -> [lead], without
        the [lead, C] prediction: X X^+ is the orthogonal projector on X's columns, so the sum is
        (X^T a)^T (X^T X)^+ (X^T b); with b = a (the same tensor, not transposed again) it is the
        prediction's sum of squares. X^T a and its product with the pseudo-inverse are made once."""
        xa = self.transposed(a)
        u = xa @ self.gram_pinv
        return tuple((u * (xa if b is a else self.transposed(b))).sum(-1) for b in bs)

    def predict_at(self, y: Tensor, at: Tensor) -> Tensor:
        """X X^+ y on the pairs ``at`` [C0] only, [lead, C0]: the prediction where it is read."""
        coef = self.coefficients(y)
        out = coef[:, self.index[0, at]]
        for idx in self.index[1:]:
            out += coef[:, idx[at]]
        return out

    def predict(self, y: Tensor) -> Tensor:
        """X X^+ y, the least-squares prediction on every pair, [lead, C]."""
        coef = self.coefficients(y)
        out = coef[:, self.index[0]]
        for idx in self.index[1:]:  # block by block: no [blocks, lead, C] stack
            out += coef[:, idx]
        return out


def centred(scores: Tensor, keep: Tensor) -> Tensor:
    """c_ij = l_ij - mean over kept keys of l_ij on kept pairs (0 elsewhere), [..., n, n]: the
    logits without any per-query shift, which softmax cannot see."""
    x = scores.double().masked_fill(~keep, 0.0)
    row_mean = x.sum(-1, keepdim=True) / keep.sum(-1, keepdim=True).clamp_min(1)
    return (x - row_mean).masked_fill(~keep, 0.0)


# ----------------------------------------------------------------------------- sums over sequences

@dataclass
class PairSums:
    """Per-pair sums of y over the fitting and the held-out sequences, [..., n, n] each (float64).

    Every regression here uses one-hot features and every sequence has every pair, so a
    least-squares fit depends on the fitting sequences only through the per-pair means, and a
    held-out R² only through per-pair sums of y and y²: sums accumulate chunk by chunk in
    bounded memory.
    """

    fit_sum: Tensor  # sum over fitting sequences of y_bij
    test_sum: Tensor  # sum over held-out sequences of y_bij
    test_sq: Tensor  # sum over held-out sequences of y_bij^2
    n_fit: int
    n_test: int
    # sums held per query, [..., n] (the row sums over j): only their totals over a pair set are read,
    # and every pair set here is whole rows of kept pairs (pairs()), so a row sum is all they need
    per_query: tuple[str, ...] = ()
    # gathers of the three sums on a pair set, kept only inside ``reading()`` (the pair tensors alive)
    _gathered: dict | None = field(default=None, repr=False, compare=False)

    def on(self, i: Tensor, j: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(fit_sum, test_sum, test_sq) on pairs (i, j), [..., C] each (None for a per-query sum);
        gathered once per pair set while :meth:`reading` is open (a result reads each set a dozen
        times), else every call."""
        key = (id(i), id(j))
        if self._gathered is not None and key in self._gathered:
            return self._gathered[key]
        got = tuple(None if name in self.per_query else getattr(self, name)[..., i, j] for name in SUMS)
        if self._gathered is not None:
            self._gathered[key] = got
        return got  # type: ignore[return-value]

    def total(self, name: str, i: Tensor, j: Tensor) -> Tensor:
        """The sum ``name`` summed over the pairs (i, j), [...]: over the rows of i for a per-query
        sum (the pair set must then be whole rows of kept pairs, as every set of :func:`pairs` is)."""
        if name in self.per_query:
            return getattr(self, name)[..., torch.unique(i)].sum(-1)
        return self.on(i, j)[SUMS.index(name)].sum(-1)

    @contextlib.contextmanager
    def reading(self):
        """Keep :meth:`on`'s gathers until the block ends (the caller holds its pair tensors)."""
        self._gathered = {}
        try:
            yield self
        finally:
            self._gathered = None

    def __add__(self, other: PairSums) -> PairSums:
        return PairSums(self.fit_sum + other.fit_sum, self.test_sum + other.test_sum, self.test_sq + other.test_sq,
                        self.n_fit + other.n_fit, self.n_test + other.n_test, self.per_query)

    def block(self, lo: int, hi: int) -> PairSums:
        """The sums of leading slots lo .. hi - 1 (views, no copy)."""
        return PairSums(self.fit_sum[lo:hi], self.test_sum[lo:hi], self.test_sq[lo:hi], self.n_fit, self.n_test,
                        self.per_query)

    def add_(self, slot: int, other: PairSums) -> None:
        """Add one layer's sums into slot ``slot`` of the leading axis, in place (counts are the caller's)."""
        self.fit_sum[slot] += other.fit_sum
        self.test_sum[slot] += other.test_sum
        self.test_sq[slot] += other.test_sq

    def check(self) -> None:
        if self.n_fit < 1 or self.n_test < 1:
            raise ConfigError("sequences", self.n_fit + self.n_test, "at least 2 (one to fit, one held out)")


def pair_sums(y: Tensor, held_out: Tensor, per_query: tuple[str, ...] = ()) -> PairSums:
    """y [b, ..., n, n] and held_out [b] bool -> per-pair sums (masked pairs may hold anything
    finite: they are never read); the sums named in ``per_query`` summed over j too, [..., n]
    (y must then be 0 off the kept pairs, as centred logits and log-weights are)."""
    y = torch.nan_to_num(y.double(), nan=0.0, posinf=0.0, neginf=0.0)
    fit, test = y[~held_out], y[held_out]
    got = dict(fit_sum=fit.sum(0), test_sum=test.sum(0), test_sq=test.square().sum(0))
    got = {k: v.sum(-1) if k in per_query else v for k, v in got.items()}
    return PairSums(**got, n_fit=int(fit.shape[0]), n_test=int(test.shape[0]),  # type: ignore[arg-type]
                    per_query=per_query)  # (mypy reads **got as the optional cache field)


def held_out_sequences(b: int, first: int = 0) -> Tensor:
    """Sequence ``first + k`` is held out when its global index is odd, [b] bool."""
    return (torch.arange(first, first + b) % 2) == 1


# ----------------------------------------------------------------------------- fits and R²

def fit_means(sums: PairSums, i: Tensor, j: Tensor) -> Tensor:
    """Per-pair means of y over the fitting sequences, [lead, C] (lead = the flattened leading dims)."""
    sums.check()
    return (sums.on(i, j)[0] / sums.n_fit).reshape(-1, len(i))


def r_squared(sums: PairSums, i: Tensor, j: Tensor, fit: str) -> Tensor:
    """Held-out R² of a fit (:data:`FITS` or ``"pair"``: the per-pair mean of the fitting
    sequences, any function of (i, j)) on pairs (i, j), for every leading index, [...].

    The prediction p is a least-squares fit to the fitting means m, so its held-out squared error
    sum (y - p)^2 = S2 - 2 p.S1 + N p.p needs only p.S1 and p.p, which :meth:`OneHotFit.projected_dot`
    gives without building p."""
    lead = sums.fit_sum.shape[:-2]
    mean = fit_means(sums, i, j)  # [lead, C]
    test = sums.on(i, j)[1]
    s1, s2, N = test.reshape(-1, len(i)), sums.total("test_sq", i, j).reshape(-1), sums.n_test
    if fit == "pair":
        cross, power = (mean * s1).sum(-1), mean.square().sum(-1)
    else:
        model = _fit(sums.fit_sum.shape[-1], fit, i.numpy().tobytes(), j.numpy().tobytes())
        cross, power = model.projected_dot(mean, s1, mean)
    sse = s2 - 2 * cross + N * power
    sst = s2 - s1.sum(-1).square() / (N * len(i))
    tiny = 1e-10 * s2.clamp_min(1e-300)
    constant = sst <= tiny  # nothing to explain: a perfect fit by definition
    r2 = torch.where(constant, torch.ones_like(sst), 1 - sse / torch.where(constant, torch.ones_like(sst), sst))
    return r2.reshape(lead)


@functools.lru_cache(maxsize=32)
def _fit(n: int, fit: str, i_bytes: bytes, j_bytes: bytes) -> OneHotFit:
    """The fit of a pair set, computed once per pair set and reused for every head, layer and run."""
    i, j = (torch.from_numpy(np.frombuffer(b, dtype=np.int64).copy()) for b in (i_bytes, j_bytes))
    return OneHotFit(i, j, n, fit)


def delta_r2(sums: PairSums, i: Tensor, j: Tensor) -> dict[str, Tensor]:
    """The earlier ΔR²: R² of f(i-j) + g(i) + h(j) minus R² of f(i-j), with both R², each [...]."""
    rel, ab = r_squared(sums, i, j, "relative"), r_squared(sums, i, j, "key")
    return dict(r2_relative=rel, r2_absolute=ab, delta=ab - rel)


def component_b(sums: PairSums, i: Tensor, j: Tensor) -> dict[str, Tensor]:
    """(b) on the sums of the centred logits, and its split into key position and interactions,
    each [...]: the share of c's held-out variance V that the per-pair means keep beyond the
    baseline f(i - j) + g(i), mean_pairs (Q m_fit)(Q m_test) / V with Q the residual maker of the
    baseline (of f + g + h for the interactions). The fitting and held-out halves' noise is
    independent, so the product is unbiased for mean_pairs (Q mu)^2 / V: it is 0 on average for a
    head with nothing beyond the baseline, where a held-out R² of the saturated fit would pay
    for its parameters and come out below 0."""
    sums.check()
    lead = sums.fit_sum.shape[:-2]
    m_fit = fit_means(sums, i, j)  # [lead, C]
    test = sums.on(i, j)[1]
    m_test = (test / sums.n_test).reshape(-1, len(i))
    s1, s2, N = test.sum(-1), sums.total("test_sq", i, j), sums.n_test * len(i)
    var = (s2 / N - (s1 / N).square()).reshape(-1)  # V, [lead]
    out = {}
    both = (m_fit * m_test).sum(-1)
    for name, fit in (("component_b", "query"), ("component_b_interaction", "key")):
        model = _fit(sums.fit_sum.shape[-1], fit, i.numpy().tobytes(), j.numpy().tobytes())
        # (Q m_fit).(Q m_test) = m_fit.m_test - m_fit.(X X^+ m_test): Q = I - X X^+ is a projector
        out[name] = (both - model.projected_dot(m_test, m_fit)[0]) / len(i)
    small = var <= 1e-12 * s2.reshape(-1).div(N).clamp_min(1e-300)  # no variance: nothing to explain
    for name in out:
        out[name] = torch.where(small, torch.zeros_like(var), out[name] / torch.where(small, 1.0, var)).reshape(lead)
    out["component_b_key"] = out["component_b"] - out["component_b_interaction"]
    # the key-0 part: the same residual product summed over the pairs (i, 0) only, where the
    # abstract's mechanism (position 0 read by sink-reading heads) puts its position signal
    baseline = _fit(sums.fit_sum.shape[-1], "query", i.numpy().tobytes(), j.numpy().tobytes())
    at0 = (j == 0).nonzero(as_tuple=True)[0]  # [C0]
    residual = [m[:, at0] - baseline.predict_at(m, at0) for m in (m_fit, m_test)]  # [lead, C0] each
    key0 = (residual[0] * residual[1]).sum(-1) / len(i)
    out["component_b_key0"] = torch.where(small, torch.zeros_like(var), key0 / torch.where(small, 1.0, var)
                                          ).reshape(lead)
    out["component_b_rest"] = out["component_b"] - out["component_b_key0"]
    out["r2_baseline"] = r_squared(sums, i, j, "query")
    return out


def offset_profile(sums: PairSums, i: Tensor, j: Tensor) -> Tensor:
    """f^(d) of the fit c ~ f(i - j) + g(i) on the centred logits, [..., n] (NaN for offsets not
    among the pairs; defined up to a constant, which no log-normaliser variance sees)."""
    n = sums.fit_sum.shape[-1]
    lead = sums.fit_sum.shape[:-2]
    coef = _fit(n, "query", i.numpy().tobytes(), j.numpy().tobytes()).coefficients(fit_means(sums, i, j))  # [lead, 2n]
    f = coef[:, :n].clone()
    seen = torch.zeros(n, dtype=torch.bool)
    seen[i - j] = True
    f[:, ~seen] = math.nan
    return f.reshape(*lead, n)


def log_normaliser(f: Tensor, keep: Tensor) -> Tensor:
    """Λ(i) = log sum over kept keys j of exp f(i - j): f [..., n] -> [..., n] (NaN where a kept
    offset has no f)."""
    n = keep.shape[-1]
    band = band_width(keep)
    if band is not None:  # query i keeps offsets 0 .. min(i, w - 1): a running logsumexp over offsets, O(n)
        return f.logcumsumexp(-1)[..., torch.arange(n).clamp(max=band - 1)]
    offset = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).clamp(0, n - 1)  # [n, n]
    grid = f[..., offset].masked_fill(~keep, -math.inf)  # f(i - j) on kept pairs, [..., n, n]
    return grid.logsumexp(-1)


def band_width(keep: Tensor) -> int | None:
    """w when ``keep`` [n, n] is exactly the causal band 0 <= i - j < w (:func:`keep_mask`), else None."""
    n = keep.shape[-1]
    w = int(keep[-1].sum())
    return w if w >= 1 and torch.equal(keep, keep_mask(n, None if w == n else w)) else None


def component_a(log_w: PairSums, lam: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """(a) = Var over the pairs of Λ(i) / Var of the held-out log-weights on them, [...]; 0 where
    the log-weights do not vary (one key per query)."""
    log_w.check()
    li = lam[..., i]  # [..., C]
    var_lam = li.square().mean(-1) - li.mean(-1).square()
    s1, s2, N = log_w.total("test_sum", i, j), log_w.total("test_sq", i, j), log_w.n_test * len(i)
    var_w = s2 / N - (s1 / N).square()
    small = var_w <= 1e-12
    return torch.where(small, torch.zeros_like(var_w), var_lam.clamp_min(0) / torch.where(small, 1.0, var_w))


# ----------------------------------------------------------------------------- softmax pieces

def log_partition(scores: Tensor, keep: Tensor) -> Tensor:
    """log Z_i = logsumexp over kept keys of the logits: scores [..., n, n] -> [..., n]."""
    return scores.masked_fill(~keep, -math.inf).logsumexp(-1)


def log_weights(scores: Tensor, keep: Tensor, log_z: Tensor | None = None) -> Tensor:
    """log a_ij = l_ij - log Z_i on kept pairs (0 elsewhere), [..., n, n] (``log_z``: log Z_i
    of these scores where the caller has it already)."""
    log_z = log_partition(scores, keep) if log_z is None else log_z
    return (scores - log_z[..., None]).masked_fill(~keep, 0.0)


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


# ----------------------------------------------------------------------------- any model's intermediates

def leakage_bytes(n: int, layers: int, heads: int, batch: int = 2, old: bool = True) -> int:
    """Bytes :func:`leakage` holds at its peak on windows of n internal positions (an estimate):
    the per-pair sums (3 quantities x 3 arrays x layers x heads x n^2 float64), one chunk's
    intermediates from ``collect`` (float32 scores and pattern of every layer), one layer's float64
    copies and derived logits (about 8 x batch x heads x n^2), and the fits' gathered sums and
    per-pair means (at most 8 x layers x heads x C float64, C = n (n + 1) / 2 causal pairs; the
    fits no longer build predictions or residuals, so this part is an upper bound) with the one-hot
    fit's Gram matrix and its pseudo-inverse (3 x (3n)^2).

    Without ``old`` (:class:`LeakageSums`), on a model that streams its layers: 2 [l, h, n, n]
    arrays of sums, one layer's float32 scores and pattern, and the fits one layer at a time."""
    pairs_ = n * (n + 1) // 2
    if not old:
        return 8 * (2 * layers * heads * n * n + batch * heads * n * n + 8 * batch * heads * n * n
                    + 8 * heads * pairs_ + 3 * (3 * n) ** 2)
    return 8 * (9 * layers * heads * n * n + batch * layers * heads * n * n + 8 * batch * heads * n * n
                + 8 * layers * heads * pairs_ + 3 * (3 * n) ** 2)


@dataclass
class LeakageSums:
    """Leakage sums of any model's intermediates, added chunk by chunk (or layer by layer as a
    forward passes them: :meth:`start`, :meth:`add_layer`, :meth:`finish`).

    ``window``: the heads' sliding window (None: full causal), one for every layer or a sequence
    with one per model layer (Gemma's sliding and full layers); ``layers``: which layers to read
    (None: all), so a large model's layers can be taken a few at a time; ``check_softmax``: the
    first chunk's weights must be the kept-key softmax of its logits (ConfigError otherwise;
    switch it off for an intervention that changes the mask); ``old``: keep what the earlier
    definitions (``old_component_a`` / ``old_component_b``) need; without them the logits are not
    summed and the sums read only as totals are kept per query (:data:`LEAN`): 2 [l, h, n, n]
    float64 arrays instead of 9, and :meth:`result` works one layer at a time.
    """

    window: int | None | Sequence[int | None] = None
    layers: Sequence[int] | None = None
    check_softmax: bool = True
    # zeroed buffers to reuse, by shape (:func:`leakage`'s ``scratch``): a large model's sums are
    # gigabytes, and a fresh allocation's page faults cost ten times a pass over warm memory
    scratch: dict | None = None
    old: bool = True
    sums: dict[str, PairSums] = field(default_factory=dict)
    log_z: Tensor | None = None  # sum over sequences of log Z_i, [l, h, n]
    received: Tensor | None = None  # sum over sequences of the weight received, [l, h, n]
    to_key0: Tensor | None = None  # sum over sequences of each query's weight on key 0, [l, h, n]
    seen: int = 0  # sequences added
    keep: Tensor | None = None  # [n, n], the first chosen layer's
    keeps: list[Tensor] = field(default_factory=list)  # per chosen layer, [n, n] each
    slot_windows: list[int | None] = field(default_factory=list)  # per chosen layer
    _slots: dict[int, int] = field(default_factory=dict)  # model layer -> slot
    _chunk: tuple | None = None  # (b, held) of the chunk being added

    def add(self, inter: Intermediates) -> None:
        """Add one chunk's intermediates (sequences ``seen`` .. ``seen + b``, full windows)."""
        chosen = range(len(inter.layers)) if self.layers is None else self.layers
        if not chosen or any(not 0 <= k < len(inter.layers) for k in chosen):
            raise ConfigError("layers", list(chosen), f"layer indices in [0, {len(inter.layers) - 1}]")
        first = inter.layers[chosen[0]].attn_scores
        self.start(len(inter.layers), *first.shape[:2], first.shape[-1])  # type: ignore[call-arg]  # shape[:2]: b, h
        for k in chosen:
            self.add_layer(k, inter.layers[k].attn_scores, inter.layers[k].pattern)
        self.finish()

    def start(self, n_layers: int, b: int, h: int, n: int) -> None:
        """Begin a chunk of b sequences of n positions of a model with ``n_layers`` layers of h heads."""
        chosen = list(range(n_layers) if self.layers is None else self.layers)
        if not chosen or any(not 0 <= k < n_layers for k in chosen):
            raise ConfigError("layers", chosen, f"layer indices in [0, {n_layers - 1}]")
        if self.keep is None:
            self._set_masks(chosen, n_layers, n)
        if not self.sums:
            self._allocate(chosen, h, n)
        self._chunk = (b, held_out_sequences(b, self.seen))

    def _set_masks(self, chosen: list[int], n_layers: int, n: int) -> None:
        """Each chosen layer's slot, window and [n, n] mask of kept keys (one mask per window)."""
        windows = (list(self.window) if isinstance(self.window, Sequence) else [self.window] * n_layers)
        if len(windows) != n_layers:
            raise ConfigError("window", windows, f"one window (or None) per layer, {n_layers} of them")
        masks: dict = {}
        self._slots = {k: slot for slot, k in enumerate(chosen)}
        self.slot_windows = [windows[k] for k in chosen]
        self.keeps = [masks.setdefault(w, keep_mask(n, w)) for w in self.slot_windows]
        self.keep = self.keeps[0]

    def _allocate(self, chosen: list[int], h: int, n: int) -> None:
        """Per-pair sums over every chosen layer, added to in place layer by layer (zeroed tensors of
        ``scratch`` where it holds some of the shape), and the per-query sums."""
        shapes = {(q, name): (len(chosen), h, n) + (() if name in self._per_query(q) else (n,))
                  for q in self._quantities() for name in SUMS}
        made = self._zeros(shapes)
        self.sums = {q: PairSums(*(made[q, name] for name in SUMS), 0, 0,  # type: ignore[arg-type,misc,call-arg]
                                 per_query=self._per_query(q))  # (mypy cannot count a starred generator)
                     for q in self._quantities()}
        if self.scratch is not None:
            for shape in set(shapes.values()):
                self.scratch[shape] = [made[key] for key, s in shapes.items() if s == shape]
        self.log_z, self.received, self.to_key0 = (torch.zeros(len(chosen), h, n, dtype=torch.float64)
                                                   for _ in range(3))

    def _zeros(self, shapes: dict) -> dict:
        """A zeroed float64 tensor per key of ``shapes``: one of ``scratch``'s where it has one left, else new."""
        kept = {shape: list(self.scratch.get(shape, ())) for shape in set(shapes.values())} \
            if self.scratch is not None else {}

        def zeros(shape) -> Tensor:
            return kept[shape].pop().zero_() if kept.get(shape) else torch.zeros(shape, dtype=torch.float64)

        return {key: zeros(shape) for key, shape in shapes.items()}

    def _quantities(self) -> tuple[str, ...]:
        return QUANTITIES if self.old else tuple(LEAN)

    def _per_query(self, q: str) -> tuple[str, ...]:
        return () if self.old else LEAN[q]

    def add_layer(self, k: int, scores: Tensor, pattern: Tensor) -> None:
        """Add model layer k's logits and weights of the current chunk, [b, h, n, n] each (a layer
        not chosen is skipped)."""
        if k not in self._slots:
            return
        assert self._chunk is not None and self.log_z is not None and self.received is not None \
            and self.to_key0 is not None  # set by start()
        slot, (b, held) = self._slots[k], self._chunk
        keep = self.keeps[slot]
        scores, pattern = scores.double().cpu(), pattern.double().cpu()  # [b, h, n, n]: one layer's copies only
        log_z = log_partition(scores, keep)  # [b, h, n]
        log_w = log_weights(scores, keep, log_z)
        if self.check_softmax and self.seen == 0:  # the kept-key softmax is exp(log a) there, 0 elsewhere
            got = (pattern - log_w.exp().masked_fill(~keep, 0.0)).abs().max()
            if not bool(got <= SOFTMAX_TOL):
                raise ConfigError("model", f"weights off the causal softmax of the logits by {float(got):.2g}",
                                  f"causal softmax attention (window {self.slot_windows[slot]}) whose pattern is "
                                  "the softmax of attn_scores over the kept keys")
        ys = dict(centred=centred(scores, keep), logits=scores, log_weights=log_w)
        for q in self._quantities():
            self.sums[q].add_(slot, pair_sums(ys[q], held, self._per_query(q)))
        self.log_z[slot] += log_z.sum(0)  # [h, n]
        self.received[slot] += received_attention(pattern, keep) * b
        self.to_key0[slot] += pattern[..., 0].sum(0)

    def finish(self) -> None:
        """End the chunk begun by :meth:`start`."""
        assert self._chunk is not None
        b, held = self._chunk
        for q in self._quantities():
            self.sums[q].n_fit += int((~held).sum())
            self.sums[q].n_test += int(held.sum())
        self.seen += b
        self._chunk = None

    def result(self, early: int | None = None) -> dict[str, np.ndarray]:
        """Every number per layer and head ([l, h] arrays; ``early_`` keys over queries i < ``early``).

        ``component_a``, ``component_b``, ``component_b_key``, ``component_b_interaction``,
        ``component_b_key0``, ``component_b_rest``,
        ``r2_baseline``; the earlier definitions ``old_component_a``, ``old_component_b`` (with
        ``old``); ``log_z`` [l, h, n] mean log Z_i; ``received`` [l, h, n]; ``received_0``; ``sink``
        bool; ``to_key0`` [l, h, n] each query's mean weight on key 0.

        Layers of one window are fitted together (one pair set); without ``old``, one layer at a
        time, so the gathers of a pair set are [h, C] and not [l, h, C].
        """
        if self.keep is None:
            raise ConfigError("sequences", 0, "at least 2 (one to fit, one held out)")
        n = self.keep.shape[0]
        if early is not None and (not isinstance(early, int) or not 1 <= early <= n):
            raise ConfigError("early", early, f"an integer in [1, {n}] (queries i < early), or None")
        slots = len(self.keeps)
        # (lo, hi) of consecutive slots with one window, cut to one layer without ``old``
        runs: list[tuple[int, int]] = []
        for slot in range(slots):
            if runs and self.old and self.slot_windows[slot] == self.slot_windows[runs[-1][0]]:
                runs[-1] = (runs[-1][0], slot + 1)
            else:
                runs.append((slot, slot + 1))
        out: dict[str, np.ndarray] = {}
        for lo, hi in runs:
            for key, value in self._block_result(lo, hi, early).items():
                if key not in out:
                    out[key] = np.zeros((slots,) + value.shape[1:], dtype=value.dtype)
                out[key][lo:hi] = value
        assert self.log_z is not None and self.received is not None and self.to_key0 is not None  # set by add()
        out["log_z"] = (self.log_z / self.seen).numpy()
        out["to_key0"] = (self.to_key0 / self.seen).numpy()
        out["received"] = (self.received / self.seen).numpy()
        out["received_0"] = out["received"][..., 0]
        out["sink"] = sink_heads(out["received_0"])
        return out

    def _block_result(self, lo: int, hi: int, early: int | None) -> dict[str, np.ndarray]:
        """:meth:`result`'s fitted numbers of slots lo .. hi - 1, which share one window."""
        keep = self.keeps[lo]
        sets = {"": pairs(keep)}
        if early is not None:
            sets["early_"] = pairs(keep, early)
        sums = {q: s.block(lo, hi) for q, s in self.sums.items()}
        out: dict[str, np.ndarray] = {}
        for prefix, (i, j) in sets.items():  # one quantity's gathers at a time (each [l, h, C] x 3)
            with sums["centred"].reading() as centred_:
                for key, value in component_b(centred_, i, j).items():
                    out[prefix + key] = value.numpy()
                lam = log_normaliser(offset_profile(centred_, i, j), keep)
            with sums["log_weights"].reading() as log_w:
                out[prefix + "component_a"] = component_a(log_w, lam, i, j).numpy()
            if not self.old:
                continue
            with sums["logits"].reading() as logits:
                old_b = delta_r2(logits, i, j)["delta"]
            out[prefix + "old_component_b"] = old_b.numpy()
            with sums["log_weights"].reading() as log_w:
                out[prefix + "old_component_a"] = (delta_r2(log_w, i, j)["delta"] - old_b).numpy()
        return out


def leakage_of(intermediates: Iterable[Intermediates], *, window: int | None = None, early: int | None = None,
               layers: Sequence[int] | None = None, check_softmax: bool = True) -> dict[str, np.ndarray]:
    """:meth:`LeakageSums.result` of a stream of intermediates (consecutive chunks of one batch)."""
    acc = LeakageSums(window=window, layers=layers, check_softmax=check_softmax)
    for inter in intermediates:
        acc.add(inter)
    return acc.result(early)


# ----------------------------------------------------------------------------- model-level drivers

def _check_model(model) -> None:
    if not callable(getattr(model, "collect", None)):
        raise ConfigError("model", type(model).__name__, "a model with collect(batch) -> Intermediates")
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return  # checked on the first chunk: the weights must be the causal softmax of the logits
    attention, gate, causal = (getattr(cfg, k, d) for k, d in (("attention", "softmax"), ("energy_gate", False),
                                                                  ("causal", True)))
    if attention != "softmax" or gate or not causal:
        raise ConfigError("model", dict(attention=attention, energy_gate=gate, causal=causal),
                          "causal softmax attention without an energy gate (the leakage probes read softmax logits)")


def _check_batch(batch: Batch) -> None:
    if bool((batch.lengths != batch.tokens.shape[1]).any()):
        raise ConfigError("lengths", sorted(set(batch.lengths.tolist())), "full windows of one length (no padding)")
    if batch.tokens.shape[0] < 2:
        raise ConfigError("sequences", batch.tokens.shape[0], "at least 2 (one to fit, one held out)")


def leakage(model, batch: Batch, *, intervention: Intervention | None = None, early: int | None = None,
            layers: Sequence[int] | None = None, window: int | None = None,
            chunk: int = CHUNK, scratch: dict | None = None, old: bool = True) -> dict[str, np.ndarray]:
    """Every leakage number of a model on ``batch``, per layer and head ([l, h] arrays; see
    :meth:`LeakageSums.result`). The window is per layer, ``model.attended_windows``, for a model
    that has them (a pretrained checkpoint: Gemma's sliding and full layers), else
    ``model.cfg.window`` when the model has one, else ``window``; early queries are internal
    positions i < ``early`` (BOS included). ``old``: the earlier definitions too (see
    :class:`LeakageSums`).

    A model with ``stream(batch, on_layer, intervention)`` (a pretrained checkpoint) hands each
    layer's logits and weights over as its forward passes them, reduced to the sums at once;
    any other is read through ``collect``.

    Log-weights are log_softmax of the logits over the unmodified causal/window mask; under an
    intervention that removes key 0 the weights differ from them, so the softmax check is off
    under any intervention (read the centred logits then).

    ``scratch``: a dict the caller keeps across calls (one at a time) to reuse the per-pair sums'
    memory; nothing returned refers to it.
    """
    _check_model(model)
    _check_batch(batch)
    n = batch.tokens.shape[1] + int(getattr(getattr(model, "cfg", None), "bos", False))
    if early is not None and (not isinstance(early, int) or not 1 <= early <= n):
        raise ConfigError("early", early, f"an integer in [1, {n}] (queries i < early), or None")
    cfg: Any = getattr(model, "cfg", None)
    per_layer = getattr(model, "attended_windows", None)
    acc = LeakageSums(window=per_layer if per_layer is not None else cfg.window if hasattr(cfg, "window") else window,
                      layers=layers, check_softmax=intervention is None, scratch=scratch, old=old)
    b = batch.tokens.shape[0]
    for part in split_batch(batch, chunk, model_device(model)):
        rows = None if intervention is None else rows_of(intervention, acc.seen, acc.seen + part.tokens.shape[0], b)
        if callable(getattr(model, "stream", None)):
            acc.start(model.n_layers, part.tokens.shape[0], model.n_heads, n)
            model.stream(part, acc.add_layer, intervention=rows)
            acc.finish()
        else:
            acc.add(model.collect(part) if rows is None else model.collect(part, intervention=rows))
    return acc.result(early)


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
        per_layer = [torch.cat([r[k] for r in rows]).cpu() for k in range(len(rows[0]))]  # each [b, D]
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
