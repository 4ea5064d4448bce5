"""RoPE in low precision: hand-computed cases of the formats, the recipes and the pattern error."""

import math

import torch

from poslab.probes import precision as pr

BF16, FP16, F64 = torch.bfloat16, torch.float16, torch.float64


def test_bf16_keeps_integers_to_256_then_rounds_to_even():
    got = pr.rounded(torch.tensor([255.0, 256.0, 257.0, 258.0, 259.0, 260.0, 261.0]), BF16).tolist()
    assert got == [255.0, 256.0, 256.0, 258.0, 260.0, 260.0, 260.0]  # ties to even: 257 -> 256, 259 -> 260
    assert pr.rounded(torch.tensor([65504.0, 70000.0]), FP16).tolist() == [65504.0, math.inf]


def test_distinct_share_neighbours_and_offset_error():
    low = torch.arange(0.0, 256.0)
    assert pr.distinct_share(low, BF16) == 1.0 and pr.neighbour_collapse(low[:-1], BF16) == 0.0
    window = torch.arange(256.0, 512.0)
    assert pr.distinct_share(window, BF16) == 129 / 256  # 256, 258, ..., 510 and 511 -> 512
    assert pr.neighbour_collapse(window, BF16) == 0.5  # (256, 257) yes, (257, 258) no, (258, 259) no, (259, 260) yes
    assert pr.offset_error(window, 1, BF16) == (1.0, 1.0)  # p + 1 - p reads 0 or 2, never 1
    assert pr.offset_error(torch.arange(0.0, 256.0), 1, BF16) == (0.0, 0.0)


def test_angle_error_of_rounded_positions_is_the_position_error():
    theta = torch.tensor([1.0], dtype=F64)
    err = pr.angle_error(torch.tensor([257.0]), theta, pr.RECIPES["bf16_positions"])
    assert abs(err["max"] - 1.0) < 1e-6  # bf16(257) = 256: one radian at theta = 1
    exact = pr.Recipe(F64, F64, F64)
    assert pr.angle_error(torch.arange(0.0, 10.0) + 1e6, theta, exact)["max"] < 1e-9
    fp16 = pr.angle_error(torch.tensor([1e5]), theta, pr.RECIPES["fp16_positions"])
    assert fp16 == dict(max=None, mean=None, nonfinite=1.0)  # 1e5 overflows float16


def test_a_float32_table_beats_float32_angles_at_large_positions():
    theta = 10000.0 ** (-torch.arange(0, 64, 2, dtype=F64) / 64)
    pos = torch.arange(0.0, 64.0) + 1e6
    table = pr.angle_error(pos, theta, pr.RECIPES["table_fp32"])["max"]
    on_the_fly = pr.angle_error(pos, theta, pr.RECIPES["fp32"])["max"]
    assert table < 1e-6 < 1e-3 < on_the_fly  # float32 p * theta at 10^6: ulp(10^6) = 0.0625


def test_rotate_is_the_complex_product_in_both_layouts():
    x = torch.randn(3, 8, dtype=F64)
    angles = torch.randn(3, 4, dtype=F64)
    c, s = angles.cos(), angles.sin()
    half = pr.rotate(x, c, s, "half")
    z = torch.complex(x[:, :4], x[:, 4:]) * torch.polar(torch.ones_like(angles), angles)
    assert torch.allclose(half, torch.cat((z.real, z.imag), -1))
    inter = pr.rotate(x, c, s, "interleaved")
    z = torch.complex(x[:, 0::2], x[:, 1::2]) * torch.polar(torch.ones_like(angles), angles)
    assert torch.allclose(inter, torch.stack((z.real, z.imag), -1).flatten(-2))


def test_pattern_error_is_zero_for_the_exact_recipe_and_grows_with_bf16_positions():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 12, 16, generator=g, dtype=F64), torch.randn(2, 12, 16, generator=g, dtype=F64)
    theta = 10000.0 ** (-torch.arange(0, 16, 2, dtype=F64) / 16)
    exact = pr.pattern_error(q, k, theta, 10**6, pr.Recipe(F64, F64, F64), scale=0.25)
    assert exact["max_delta"] < 1e-12 and exact["kl_mean"] < 1e-12
    at_0 = pr.pattern_error(q, k, theta, 0, pr.RECIPES["bf16_positions"], scale=0.25)
    far = pr.pattern_error(q, k, theta, 10**4, pr.RECIPES["bf16_positions"], scale=0.25)
    assert at_0["max_delta"] < 1e-6 < far["max_delta"]  # positions below 256 are exact in bf16
    overflow = pr.pattern_error(q, k, theta, 10**5, pr.RECIPES["fp16_positions"], scale=0.25)
    assert overflow["nonfinite"] and overflow["max_delta"] is None
