"""RoPE in low precision: how far the rotation angle and the attention pattern move when positions,
angles or cos/sin are held in float32, bfloat16 or float16 instead of float64.

    angle_i(p) = p theta_i                       the exact angle (float64)
    (c, s)     = recipe(p, theta)                 cos and sin as an implementation computes them
    error      = |wrap(atan2(s, c) - p theta_i)|  radians, wrap to (-pi, pi]

A :class:`Recipe` says in which format each step is held: the positions (a position tensor in
the model's dtype), the angle product p * theta (and theta itself), the cos/sin handed to the
rotation, and, optionally, the rotation's multiply-add itself. The named :data:`RECIPES`:

    fp32            positions, theta, angles and cos/sin in float32: the Hugging Face rotary
                    (``position_ids.float() @ inv_freq.float()`` under autocast off), computed on the fly
    bf16_cos_sin    as fp32, cos/sin then cast to bfloat16 (Hugging Face's ``cos.to(x.dtype)`` in a bf16 model)
    bf16_rotation   as bf16_cos_sin, and q, k and the rotation's products in bfloat16 (the whole rotation)
    bf16_positions  positions rounded to bfloat16 first (position ids held in the model dtype), then fp32
    bf16_angles     every step in bfloat16 (positions, theta, angles, cos/sin)
    fp16_*          the same in float16 (positions past 65504 overflow to inf)
    table_fp32      a table precomputed once: angles and cos/sin in float64, stored in float32 and indexed
    table_bf16      the same table stored in bfloat16

The known bfloat16 failure is the positions themselves: bfloat16 keeps 8 significant bits, so
integers are exact only up to 256; in [256, 512) they round to even numbers, in [512, 1024) to
multiples of 4, ... (ties to even: bf16(257) = 256, bf16(259) = 260). Neighbouring positions then
share one value and the relative offset seen by RoPE is wrong (:func:`distinct_share`,
:func:`neighbour_collapse`, :func:`offset_error`).

The attention-pattern error (:func:`pattern_error`) takes real queries and keys before rotation,
places them at positions offset + (0 .. n-1), rotates them exactly (float64) and with a recipe, and
compares the causal softmax patterns: max |delta pattern| and KL(exact || recipe) per query.

Every function is pure. Notation: p position, i pair, h head, n/j query/key index, d head dim,
r rotated channels (2 x pairs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.errors import check_choice

F64 = torch.float64
LAYOUTS = ("half", "interleaved")


@dataclass(frozen=True)
class Recipe:
    """In which format each step of computing (cos, sin) is held (``rotation``: None = float64)."""

    positions: torch.dtype  # the position tensor
    angles: torch.dtype  # theta and the product p * theta, and cos/sin evaluated there
    cos_sin: torch.dtype  # cos/sin as handed to the rotation
    rotation: torch.dtype | None = None  # q, k and the rotation's products (None: exact, float64)


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
RECIPES: dict[str, Recipe] = {
    "fp32": Recipe(FP32, FP32, FP32),
    "bf16_cos_sin": Recipe(FP32, FP32, BF16),
    "bf16_rotation": Recipe(FP32, FP32, BF16, BF16),
    "bf16_positions": Recipe(BF16, FP32, FP32),
    "bf16_angles": Recipe(BF16, BF16, BF16),
    "fp16_cos_sin": Recipe(FP32, FP32, FP16),
    "fp16_rotation": Recipe(FP32, FP32, FP16, FP16),
    "fp16_positions": Recipe(FP16, FP32, FP32),
    "fp16_angles": Recipe(FP16, FP16, FP16),
    "table_fp32": Recipe(F64, F64, FP32),
    "table_bf16": Recipe(F64, F64, BF16),
}
FORMATS = {"bf16": BF16, "fp16": FP16, "fp32": FP32}


# ----------------------------------------------------------------------------- positions

def rounded(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x held in ``dtype`` and read back as float64 (round to nearest, ties to even; inf past the range)."""
    return x.to(F64).to(dtype).to(F64)


def distinct_share(positions: Tensor, dtype: torch.dtype) -> float:
    """Distinct values of ``positions`` after rounding to ``dtype``, over distinct values before
    (1: no two positions collapse; 0.5: every two share a value)."""
    before = torch.unique(positions.to(F64)).numel()
    return torch.unique(rounded(positions, dtype)).numel() / before


def neighbour_collapse(positions: Tensor, dtype: torch.dtype) -> float:
    """Share of p in ``positions`` whose neighbour p + 1 rounds to the same ``dtype`` value."""
    p = positions.to(F64)
    return float((rounded(p, dtype) == rounded(p + 1, dtype)).double().mean())


def offset_error(positions: Tensor, K: int, dtype: torch.dtype) -> tuple[float, float]:
    """(mean, max) over p of |(r(p + K) - r(p)) - K|, r = rounding to ``dtype``: the error of the
    relative offset K that RoPE sees when positions are held in ``dtype`` (inf past its range)."""
    p = positions.to(F64)
    err = ((rounded(p + K, dtype) - rounded(p, dtype)) - K).abs()
    return float(err.mean()), float(err.max())


# ----------------------------------------------------------------------------- angles

def exact_angles(positions: Tensor, theta: Tensor) -> Tensor:
    """p theta_i in float64, [p, r/2]."""
    return positions.to(F64)[:, None] * theta.to(F64)[None]


def cos_sin(positions: Tensor, theta: Tensor, recipe: Recipe) -> tuple[Tensor, Tensor]:
    """(cos, sin) [p, r/2] as ``recipe`` computes them, returned in float64 (values as held)."""
    p = positions.to(F64).to(recipe.positions).to(recipe.angles)  # rounded where it is first held
    angles = p[:, None] * theta.to(F64).to(recipe.angles)[None]  # the product rounded to recipe.angles
    return torch.cos(angles).to(recipe.cos_sin).to(F64), torch.sin(angles).to(recipe.cos_sin).to(F64)


def wrap(x: Tensor) -> Tensor:
    """x mod 2 pi in (-pi, pi]."""
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def angle_error(positions: Tensor, theta: Tensor, recipe: Recipe) -> dict:
    """The rotation angle ``recipe`` realises against the exact one, over positions x pairs:
    ``max`` and ``mean`` |error| in radians over the finite entries (None if none is finite),
    ``nonfinite`` the share of entries that are inf or nan (float16 past 65504)."""
    c, s = cos_sin(positions, theta, recipe)
    err = wrap(torch.atan2(s, c) - exact_angles(positions, theta)).abs()
    ok = torch.isfinite(err)
    got = err[ok]
    return dict(max=float(got.max()) if got.numel() else None, mean=float(got.mean()) if got.numel() else None,
                nonfinite=float((~ok).double().mean()))


# ----------------------------------------------------------------------------- rotation and patterns

def rotate(x: Tensor, c: Tensor, s: Tensor, layout: str = "half", dtype: torch.dtype | None = None) -> Tensor:
    """Rotate the first r channels of x [..., n, d] by (c, s) [n, r/2]: pairs (i, i + r/2) (``half``)
    or (2i, 2i + 1) (``interleaved``); products in ``dtype`` (None: float64). Returns float64."""
    check_choice("layout", layout, LAYOUTS)
    dt = dtype or F64
    r = 2 * c.shape[-1]
    x = x.to(F64).to(dt)
    c, s = c.to(dt), s.to(dt)
    head = x[..., :r]
    if layout == "half":
        x1, x2 = head[..., : r // 2], head[..., r // 2:]
        out = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    else:
        x1, x2 = head[..., 0::2], head[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    return torch.cat((out, x[..., r:]), dim=-1).to(F64)


def causal_pattern(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """softmax over keys j <= n of q_n . k_j * scale, float64: q, k [..., n, d] -> [..., n, n]."""
    n = q.shape[-2]
    scores = (q.to(F64) @ k.to(F64).transpose(-1, -2)) * scale
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1)


def pattern_error(q: Tensor, k: Tensor, theta: Tensor, offset: int, recipe: Recipe, *, scale: float,
                  layout: str = "half") -> dict:
    """q, k [h, n, d] before rotation, placed at positions offset + (0 .. n-1): the causal pattern
    with the exact rotation against the one with ``recipe``'s. ``max_delta``: max |delta pattern|;
    ``kl_mean`` / ``kl_max``: KL(exact || recipe) over (h, query); None where the recipe's pattern
    is not finite (``nonfinite``: True)."""
    n = q.shape[-2]
    pos = torch.arange(n, dtype=F64) + offset
    ce, se = torch.cos(exact_angles(pos, theta)), torch.sin(exact_angles(pos, theta))
    exact = causal_pattern(rotate(q, ce, se, layout), rotate(k, ce, se, layout), scale)
    c, s = cos_sin(pos, theta, recipe)
    low = causal_pattern(rotate(q, c, s, layout, recipe.rotation), rotate(k, c, s, layout, recipe.rotation), scale)
    if not bool(torch.isfinite(low).all()):
        return dict(max_delta=None, kl_mean=None, kl_max=None, nonfinite=True)
    kl = torch.where(exact > 0, exact * (exact.log() - low.clamp(min=1e-300).log()), torch.zeros_like(exact))
    kl = kl.sum(-1).clamp(min=0.0)  # >= 0; a rounding residue below 0 is 0
    return dict(max_delta=float((exact - low).abs().max()), kl_mean=float(kl.mean()), kl_max=float(kl.max()),
                nonfinite=False)
