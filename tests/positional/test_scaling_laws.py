"""RoPE scaling-law helpers (Liu et al. 2023) against hand computations."""

from __future__ import annotations

import math

import pytest

from poslab.errors import ConfigError
from poslab.positional.scaling_laws import (
    base_for_length,
    critical_dimension,
    extrapolation_bound,
    full_period_pairs,
    pair_with_periods,
)


def test_llama2_critical_dimension_is_the_papers_92():
    # d = 128, base 10000, T_train = 4096: 64 log_10000(4096 / 2 pi) = 45.03 -> 2 * 46
    assert critical_dimension(10000.0, 4096, 128) == 92


def test_small_model_by_hand():
    # d = 32, T = 64: 16 * ln(64 / 2 pi) / ln(10000) = 16 * 2.3211 / 9.2103 = 4.032 -> 2 * 5 = 10
    assert critical_dimension(10000.0, 64, 32) == 10
    # T_extra = 2 pi 10000^(10/32) = 2 pi * 17.783 = 111.73
    assert extrapolation_bound(10000.0, 64, 32) == pytest.approx(2 * math.pi * 10000 ** (10 / 32))
    assert extrapolation_bound(10000.0, 64, 32) == pytest.approx(111.73, abs=0.01)
    # periods 2 pi 10000^(2n/32): 6.28, 11.2, 19.9, 35.3, 62.8 | 111.7 -> 5 pairs fit in 64
    assert full_period_pairs(10000.0, 64, 32) == 5


def test_tuned_base_keeps_the_pretraining_critical_dimension():
    # LLaMA2 tuned with base 1e6: 2 pi (1e6)^(92/128)
    bound = extrapolation_bound(1e6, 4096, 128, pretrain_base=1e4)
    assert bound == pytest.approx(2 * math.pi * 1e6 ** (92 / 128))
    assert base_for_length(bound, 4096, 128) == pytest.approx(1e6, rel=1e-9)  # the inverse
    assert extrapolation_bound(1e5, 4096, 128, pretrain_base=1e4) < bound  # a larger base reaches further


def test_small_base_is_unbounded_and_bad_input():
    # base 5, T = 64, d = 32: the slowest period 2 pi 5^(30/32) = 28.4 <= 64 -> every angle seen
    assert extrapolation_bound(5.0, 64, 32) == math.inf
    assert critical_dimension(5.0, 64, 32) == 32
    with pytest.raises(ConfigError, match="head_dim"):
        critical_dimension(1e4, 64, 31)
    with pytest.raises(ConfigError, match="base"):
        critical_dimension(1.0, 64, 32)
    with pytest.raises(ConfigError, match="train_length"):
        extrapolation_bound(1e4, 0, 32)


def test_pair_with_periods_by_hand():
    # LLaMA2: d = 128, T = 4096, 10 periods: 64 log_10000(4096 / 20 pi) = 64 * 4.1767 / 9.2103 = 29.02 -> 29
    assert pair_with_periods(10000.0, 4096, 128, 10) == 29
    n = pair_with_periods(10000.0, 4096, 128, 10)
    assert 4096 / (2 * math.pi * 10000 ** (2 * n / 128)) >= 10 > 4096 / (2 * math.pi * 10000 ** (2 * (n + 1) / 128))
    # 1 period: the last full-period pair, one below the critical pair (92 / 2 = 46)
    assert pair_with_periods(10000.0, 4096, 128, 1) == full_period_pairs(10000.0, 4096, 128) - 1 == 45
    assert pair_with_periods(10000.0, 64, 32, 10) == 0  # 64 / 20 pi < 1: not even pair 0
    with pytest.raises(ConfigError, match="periods"):
        pair_with_periods(10000.0, 64, 32, 0)
