"""Sinusoidal APE against Vaswani et al.'s formula; NoPE is the identity at every site."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.errors import ConfigError
from poslab.positional import build_encoding


def test_embedding_against_the_formula():
    enc = build_encoding("sinusoidal", d_model=6, n_heads=1, d_head=6, max_len=8)
    x = torch.zeros(1, 4, 6)
    pos = torch.tensor([0, 1, 7, 100])
    pe = enc.embed(x, pos)
    for s, p in enumerate(pos.tolist()):
        for i in range(3):
            assert float(pe[0, s, 2 * i]) == pytest.approx(math.sin(p / 10000 ** (2 * i / 6)), abs=1e-5)
            assert float(pe[0, s, 2 * i + 1]) == pytest.approx(math.cos(p / 10000 ** (2 * i / 6)), abs=1e-5)


def test_odd_width_is_refused():
    with pytest.raises(ConfigError) as err:
        build_encoding("sinusoidal", d_model=7, n_heads=1, d_head=7, max_len=8)
    assert err.value.field == "d_model"


def test_nope_is_the_identity():
    enc = build_encoding("nope", d_model=8, n_heads=2, d_head=4, max_len=8)
    x, q, k = torch.randn(2, 5, 8), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    pos = torch.arange(5)
    assert enc.embed(x, pos) is x
    assert enc.rotate_qk(q, k, pos, pos) == (q, k)
    assert enc.score_bias(q, k, pos, pos) is None and enc.value_bias(q, pos, pos) is None
    assert enc.meta.sites == () and enc.meta.kind == "none"
