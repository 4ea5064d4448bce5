"""RoPE scaling laws of extrapolation (Liu et al. 2023, "Scaling Laws of RoPE-based Extrapolation",
arXiv:2310.05209).

RoPE rotates pair n of a head of width d at frequency theta_n = beta^(-2n/d), period
T_n = 2 pi / theta_n = 2 pi beta^(2n/d). A model trained on T_train positions sees every angle
of pair n only if T_n <= T_train; the pairs past that point never complete a period in training
and their unseen angles are what breaks extrapolation. The first such pair gives the **critical
dimension for extrapolation** (their Eq. "d_extra", Section 3.3):

    d_extra = 2 ceil( (d / 2) log_beta(T_train / (2 pi)) )                       (critical dim.)

(LLaMA2: d = 128, beta = 10000, T_train = 4096 -> d_extra = 92, the paper's number.) Channels
below d_extra see full periods; the d - d_extra above it do not.

**Extrapolation bound for a tuned base** (their Theorem 2, larger bases): a model pre-trained
with base beta_0 on T_train positions and fine-tuned with base beta > beta_0 keeps its critical
dimension (fixed by pre-training), and extrapolates until the critical pair's period under the
new base is used up:

    T_extra = 2 pi beta^(d_extra / d)                                          (bound, beta >= beta_0)

and, inverted, the base needed to reach a target length T: beta = (T / 2 pi)^(d / d_extra).
For a model that was *trained* (not only tuned) with base beta, beta_0 = beta and the bound is
the period of its own critical pair, 2 pi beta^(d_extra/d) >= T_train.

**Smaller bases** (their Theorem 1): when beta is so small that even the slowest pair completes
a period within the tuning length, 2 pi beta^((d-2)/d) <= T_tune, every angle has been seen and
the bound is unlimited (returned as ``math.inf``). The paper states Theorem 1 through
thresholds on beta relative to T_tune; here its limiting case is written directly as that
condition on the slowest pair.

All functions are plain math on Python numbers, so the report can show them for any trained model.
"""

from __future__ import annotations

import math

from poslab.errors import ConfigError


def critical_dimension(base: float, train_length: int, head_dim: int) -> int:
    """d_extra = 2 ceil((d/2) log_base(T_train / 2 pi)), clipped to [0, d] (rotated channels)."""
    _check(base, train_length, head_dim)
    raw = 2 * math.ceil(head_dim / 2 * math.log(train_length / (2 * math.pi)) / math.log(base))
    return min(max(raw, 0), head_dim)


def full_period_pairs(base: float, train_length: int, head_dim: int) -> int:
    """How many pairs n complete a period within T_train (T_n = 2 pi base^(2n/d) <= T_train)."""
    _check(base, train_length, head_dim)
    return sum(2 * math.pi * base ** (2 * n / head_dim) <= train_length for n in range(head_dim // 2))


def pair_with_periods(base: float, train_length: int, head_dim: int, periods: float) -> int:
    """The last pair n that still completes ``periods`` full periods within T_train
    (T_n = 2 pi base^(2n/d) <= T_train / periods), 0 when even pair 0 does not.

    LongRoPE2 (Shang et al. 2025) searches the real critical dimension between this pair (about
    10 periods) and the theoretical one, ``critical_dimension / 2``."""
    _check(base, train_length, head_dim)
    if not (isinstance(periods, (int, float)) and periods > 0):
        raise ConfigError("periods", periods, "a positive number")
    raw = math.floor(head_dim / 2 * math.log(train_length / (2 * math.pi * periods)) / math.log(base))
    return min(max(raw, 0), head_dim // 2 - 1)


def extrapolation_bound(base: float, train_length: int, head_dim: int, *, pretrain_base: float | None = None,
                        pretrain_length: int | None = None) -> float:
    """T_extra = 2 pi base^(d_extra / d), with d_extra from pre-training (Theorem 2).

    ``pretrain_base`` / ``pretrain_length`` default to ``base`` / ``train_length`` (a model trained
    with this base). Returns ``math.inf`` when every pair completes a period within
    ``train_length`` under ``base`` (Theorem 1, small bases).
    """
    _check(base, train_length, head_dim)
    if 2 * math.pi * base ** ((head_dim - 2) / head_dim) <= train_length:
        return math.inf
    d_extra = critical_dimension(pretrain_base or base, pretrain_length or train_length, head_dim)
    return 2 * math.pi * base ** (d_extra / head_dim)


def base_for_length(target_length: float, train_length: int, head_dim: int, *, pretrain_base: float = 10000.0) -> float:
    """The base whose Theorem 2 bound is ``target_length``: (T / 2 pi)^(d / d_extra)."""
    _check(pretrain_base, train_length, head_dim)
    if not target_length > 2 * math.pi:
        raise ConfigError("target_length", target_length, "a length above 2 pi")
    d_extra = critical_dimension(pretrain_base, train_length, head_dim)
    if d_extra == 0:
        raise ConfigError("train_length", train_length, f"a length above 2 pi base^0 for head_dim={head_dim}")
    return (target_length / (2 * math.pi)) ** (head_dim / d_extra)


def _check(base: float, train_length: int, head_dim: int) -> None:
    if not (isinstance(base, (int, float)) and base > 1):
        raise ConfigError("base", base, "a number above 1")
    if not (isinstance(train_length, int) and train_length >= 1):
        raise ConfigError("train_length", train_length, "a positive integer")
    if not (isinstance(head_dim, int) and head_dim >= 2 and head_dim % 2 == 0):
        raise ConfigError("head_dim", head_dim, "an even integer >= 2")
