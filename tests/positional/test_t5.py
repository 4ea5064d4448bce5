"""T5 buckets on a hand-computed table, and the bias as a table lookup."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.attention import attention
from poslab.errors import ConfigError
from poslab.positional import build_encoding, t5_relative_bucket

# relative position (key - query) -> bucket, for num_buckets=32, max_distance=128, worked by hand:
# bidirectional: 16 buckets a side, 8 exact, then 8 + floor(2 log2(a / 8)), capped at 15, +16 for n > 0;
# causal: 32 buckets on -n, 16 exact, then 16 + floor((16 / 3) log2(a / 16)), capped at 31.
BIDIRECTIONAL = {0: 0, -1: 1, 1: 17, -7: 7, 7: 23, -8: 8, 8: 24, -11: 8, -12: 9, 12: 25, -16: 10, -22: 10,
                 -23: 11, 23: 27, -32: 12, -45: 12, -46: 13, -64: 14, -90: 14, -91: 15, 91: 31, -128: 15,
                 -1000: 15, 1000: 31}
CAUSAL = {0: 0, -1: 1, -5: 5, -15: 15, -16: 16, -18: 16, -19: 17, -20: 17, -24: 19, -32: 21, -64: 26,
          -100: 30, -127: 31, -128: 31, -500: 31, 1: 0, 7: 0, 200: 0}


@pytest.mark.parametrize("bidirectional, table", [(True, BIDIRECTIONAL), (False, CAUSAL)])
def test_buckets_equal_the_hand_computed_table(bidirectional, table):
    n = torch.tensor(list(table))
    buckets = t5_relative_bucket(n, bidirectional=bidirectional, num_buckets=32, max_distance=128)
    assert buckets.tolist() == list(table.values())


def test_bias_is_a_lookup_by_key_minus_query():
    torch.manual_seed(0)
    h, d = 2, 4
    enc = build_encoding("t5", d_model=8, n_heads=h, d_head=d, max_len=64, num_buckets=8, max_distance=20)
    q, k = torch.randn(1, h, 4, d), torch.randn(1, h, 30, d)
    q_pos, k_pos = torch.tensor([29, 10, 3, 0]), torch.arange(30)
    scores = attention(q, k, k, enc, q_pos, k_pos, need_weights=True).attn_scores.detach()
    table = enc.relative_attention_bias.detach()
    for head in range(h):
        for i in range(4):
            for j in range(30):
                n = j - int(q_pos[i])
                a = max(-n, 0)  # causal: only keys at or before the query are told apart
                bucket = a if a < 4 else min(7, 4 + int(math.log(a / 4) / math.log(20 / 4) * 4))
                expected = float(q[0, head, i] @ k[0, head, j]) / 2 + float(table[bucket, head])
                assert float(scores[0, head, i, j]) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("options, field", [
    (dict(num_buckets=1), "num_buckets"),
    (dict(num_buckets=32, max_distance=8), "max_distance"),
    (dict(bidirectional="no"), "bidirectional"),
])
def test_bad_options(options, field):
    with pytest.raises(ConfigError) as err:
        build_encoding("t5", d_model=8, n_heads=2, d_head=4, max_len=8, **options)
    assert err.value.field == field


def test_zero_init_and_normal_init():
    torch.manual_seed(0)
    zero = build_encoding("t5", d_model=8, n_heads=2, d_head=4, max_len=8, init="zeros")
    assert torch.equal(zero.relative_attention_bias.detach(), torch.zeros(32, 2))
    torch.manual_seed(0)
    normal = build_encoding("t5", d_model=8, n_heads=2, d_head=4, max_len=8, init_std=0.5)
    torch.manual_seed(0)
    torch.testing.assert_close(normal.relative_attention_bias.detach(), 0.5 * torch.randn(32, 2))
    with pytest.raises(ConfigError) as err:
        build_encoding("t5", d_model=8, n_heads=2, d_head=4, max_len=8, init="xavier")
    assert err.value.field == "init" and "zeros" in err.value.allowed


@pytest.mark.parametrize("num_buckets, max_distance, expected", [
    (32, 128, 16 / 48),  # distances 0-15 own buckets 0-15; 16-47 fall in buckets 16-24, never trained
    (16, 16, 1.0),  # 8 exact, 8-15 in buckets 8-15, every distance >= 15 in bucket 15 (reached by 15)
    (8, 20, 1.0),
])
def test_bucket_coverage_against_the_hand_computed_buckets(num_buckets, max_distance, expected):
    from poslab.positional.t5 import bucket_coverage

    got = bucket_coverage(range(16), range(48), num_buckets=num_buckets, max_distance=max_distance)
    assert got == pytest.approx(expected)
    # naive: a distance is covered when some training distance shares its bucket (the CAUSAL table above)
    if (num_buckets, max_distance) == (32, 128):
        trained = {CAUSAL.get(-a, a if a < 16 else None) for a in range(16)}
        assert trained == set(range(16)) and CAUSAL[-16] == 16 not in trained
