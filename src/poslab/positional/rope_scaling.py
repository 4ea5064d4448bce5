"""Rotary frequency schedules for context extension, as pure functions.

    theta_i = base^(-2i / r),  i = 0 .. r/2 - 1          (Su et al. 2021; r = rotated width)

and every schedule below rewrites ``theta`` (and possibly an attention factor ``A`` by which
RoPE multiplies cos and sin, so the logits scale by ``A^2``)::

    rope_frequencies(head_dim, base=10000.0, scaling=None, *, max_position_embeddings=None,
                     seq_len=None) -> (inv_freq [r/2] | [..., r/2], attention_factor)

checks the dict and calls ``ROPE_SCHEDULES[rope_type]``, one small function per type (the shape
of Hugging Face's ``ROPE_INIT_FUNCTIONS``), so a new schedule is one function and one entry.

``scaling`` takes the keys and meanings of a Hugging Face ``rope_parameters`` /
``rope_scaling`` dict, so a config copied from a model card gives the model's own frequencies
and attention factor (re-derived from the formulas of ``transformers``' ``ROPE_INIT_FUNCTIONS``).
Notation: ``s`` = factor, ``L0`` = original_max_position_embeddings, ``L`` = seq_len,
``r`` = rotated width = int(head_dim * partial_rotary_factor), ``lambda_i = 2 pi / theta_i``
the wavelength of pair i.

=============  ==============================================================================
rope_type      theta'_i and A
=============  ==============================================================================
default        theta_i; A = 1
linear         theta_i / s  (position interpolation, Chen et al. 2023); A = 1
ntk            base' = base s^(r/(r-2)), theta'_i = base'^(-2i/r)  (NTK-aware, bloc97 2023); A = 1
dynamic        as ntk with s replaced by max(s L / L0 - (s - 1), 1), so the base only grows once
               L > L0 (Dynamic NTK, emozilla 2023). L0 here is ``max_position_embeddings`` as in
               Hugging Face, falling back to the dict's ``original_max_position_embeddings``; A = 1
ntk_by_parts   theta'_i = theta_i / s * gamma_i + theta_i * (1 - gamma_i) with the YaRN ramp
               gamma_i = clamp((i - lo) / (hi - lo), 0, 1),
               lo|hi = r ln(L0 / (2 pi beta_fast|beta_slow)) / (2 ln base)
               (floored|ceiled when ``truncate``, clipped to [0, r - 1]); A = 1
               (bloc97 2023; YaRN without the temperature)
yarn           ntk_by_parts frequencies; A = 0.1 ln s + 1 (or, given mscale and mscale_all_dim,
               (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1); or attention_factor)
               (Peng et al. 2023)
longrope       theta'_i = theta_i / f_i with f = long_factor when L > L0 else short_factor;
               A = sqrt(1 + ln s / ln L0) for s > 1, else 1 (Ding et al. 2024); with ``n_hat``
               (poslab's extension, below) positions m < n_hat keep theta_i
llama3         lambda_i < L0/high_freq_factor: theta_i;  lambda_i > L0/low_freq_factor: theta_i/s;
               between: (1 - a) theta_i / s + a theta_i,
               a = (L0 / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor); A = 1
proportional   p-RoPE (Barbero et al. 2025, "Round and Round We Go!"): with p = partial_rotary_factor
               and d = head_dim, theta_i = base^(-2i/d) / s for the first floor(p d / 2) pairs and
               0 (no rotation) for the other (1 - p) share, the lowest frequencies; the table
               always has d/2 entries. s = factor (default 1); A = 1. p = 0 is NoPE, p = 1 RoPE.
               This is also partial rotary in the full-width convention (frequencies over d, not
               over the rotated width r as every other type computes them)
=============  ==============================================================================

Partial rotary, the two conventions. Every type but ``proportional`` computes its frequencies
over the rotated width r = int(d * partial_rotary_factor): theta_i = base^(-2i/r), i < r/2,
applied to the first r channels. This is what transformers 5.25 does for GPT-NeoX / Pythia
(``rotary_pct`` 0.25), Phi / Phi-2 (0.4), Persimmon, StableLM, GPT-J (``rotary_dim``) and GLM /
ChatGLM (0.5, interleaved pairs): each ``modeling_*.py`` computes ``base ** (arange(0, dim, 2) / dim)``
with ``dim = int(head_dim * partial_rotary_factor)``. ``proportional`` (transformers'
``rope_type="proportional"``, used by Gemma 4's global layers) keeps the full-width frequencies
theta_i = base^(-2i/d) for the first r/2 pairs and zeros for the rest.

Resonance (Wang et al. 2024, "Resonance RoPE"), poslab's ``resonance`` key, applies after any
type: each wavelength lambda_i = 2 pi / theta'_i is rounded to the nearest integer,
theta~_i = 2 pi / round(lambda_i) (a zero frequency stays zero), so every pair's rotation
repeats on whole positions. With ``rope_type="yarn"`` it is the paper's Resonance-YaRN.

Conventions kept from Hugging Face: ``type`` is an old spelling of ``rope_type``; ``rope_theta``
in the dict overrides ``base``; ``beta_fast``/``beta_slow`` default to 32/1 (also when given as
0 or None); ``truncate`` defaults to True; a missing ``factor`` for yarn / ntk_by_parts / longrope
is ``max_position_embeddings / L0``; a missing ``L0`` for yarn / ntk_by_parts / longrope /
llama3 is ``max_position_embeddings``. One extension: ``short_factor``/``long_factor`` may be a
single number, meaning the same factor for every pair (so a registry default need not know
``head_dim``). Unknown keys are refused (a misspelt key would otherwise be silently ignored).

A second extension, ``n_hat`` (longrope only; Hugging Face has no such key): LongRoPE's n-hat
(Ding et al. 2024, section 3.2), the number of initial positions left unscaled. Position m is
rotated by the angle

    m theta_i          if m < n_hat   (the original RoPE, no interpolation)
    m theta_i / f_i    otherwise      (f = short or long factors, as chosen by L)

so the angle depends on the position itself, not only on L: :func:`rope_angles` is the complete
definition, and :func:`rope_frequencies` returns the frequencies of the positions m >= n_hat
(``n_hat`` = 0, the default, is the Hugging Face schedule exactly). The attention factor A
multiplies every position alike. With n_hat > 0 a logit q_n . k_t no longer depends on t - n
alone whenever n or t is below n_hat.

``dynamic`` and ``longrope`` depend on the sequence length. ``seq_len`` may be an int or an
integer tensor of lengths ``[n]``; for those two types the result is then ``[n, r/2]``, one row
per length, which is how :class:`poslab.positional.rope.RoPE` builds its per-length table.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Protocol, cast

import torch
from torch import Tensor

from poslab.errors import ConfigError, check_choice, require_int

KEYS = ("rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings",
        "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate",
        "short_factor", "long_factor", "low_freq_factor", "high_freq_factor", "partial_rotary_factor",
        "n_hat", "resonance")

_FIELD = "rope_scaling"


def rope_frequencies(head_dim: int, base: float = 10000.0, scaling: dict | None = None, *,
                     max_position_embeddings: int | None = None,
                     seq_len: int | Tensor | None = None) -> tuple[Tensor, float]:
    """Inverse frequencies ``theta'`` (float32) and the attention factor ``A`` of a schedule.

    ``inv_freq`` is ``[r/2]``, or ``[n, r/2]`` for a length-dependent type given ``seq_len [n]``.
    Raises ConfigError for an unknown ``rope_type``, an unknown key or a missing required key.
    """
    cfg: dict[str, Any] = dict(scaling or {})
    for key in cfg:
        check_choice(f"{_FIELD}.{key}", key, KEYS)
    rope_type = cfg.get("rope_type", cfg.get("type", "default"))
    check_choice(f"{_FIELD}.rope_type", rope_type, sorted(ROPE_SCHEDULES))
    base = float(cfg.get("rope_theta", base))
    _positive("rope_theta", base)
    fraction = cfg.get("partial_rotary_factor", 1.0)
    if rope_type == "proportional":  # frequencies over the full head width; p = 0 (NoPE) allowed
        if isinstance(fraction, bool) or not (isinstance(fraction, (int, float)) and 0 <= fraction <= 1):
            raise ConfigError(f"{_FIELD}.partial_rotary_factor", fraction, "a number in [0, 1]")
        dim = head_dim
    else:
        dim = int(head_dim * fraction)
        if dim < 2:
            raise ConfigError(f"{_FIELD}.partial_rotary_factor", fraction,
                              f"a fraction leaving at least 2 rotated channels of head_dim={head_dim}")
    unscaled_positions(cfg)
    resonance = cfg.get("resonance", False)
    if not isinstance(resonance, bool):
        raise ConfigError(f"{_FIELD}.resonance", resonance, "True, False")
    inv_freq, factor = ROPE_SCHEDULES[rope_type](dim, base, cfg, max_position_embeddings=max_position_embeddings,
                                                 seq_len=seq_len)
    return (resonant(inv_freq) if resonance else inv_freq), factor


def resonant(inv_freq: Tensor) -> Tensor:
    """Resonance RoPE: theta~_i = 2 pi / round(2 pi / theta_i) (0 stays 0), float32 like its input."""
    theta = inv_freq.double()
    wavelength = (2 * math.pi / theta.clamp(min=1e-300)).round().clamp(min=1)  # integer lambda_i >= 1
    return _f32(torch.where(theta > 0, 2 * math.pi / wavelength, torch.zeros_like(theta)))


def unscaled_positions(scaling: dict | None) -> int:
    """LongRoPE's n_hat of a scaling dict: the first positions that keep the original angles (0 if
    absent). Raises ConfigError for a value that is not a non-negative integer, or for the key on
    any rope_type but longrope."""
    cfg = scaling or {}
    value = cfg.get("n_hat")
    if value is None:
        return 0
    rope_type = cfg.get("rope_type", cfg.get("type", "default"))
    if rope_type != "longrope":
        raise ConfigError(f"{_FIELD}.n_hat", value, f"only with rope_type='longrope' (got {rope_type!r})")
    require_int(f"{_FIELD}.n_hat", value, 0, "a non-negative integer (positions left unscaled)")
    return value


def rope_angles(head_dim: int, base: float, scaling: dict | None, positions: Tensor, *,
                max_position_embeddings: int | None = None, seq_len: int | None = None) -> Tensor:
    """The rotation angles of positions [s] (float64) under a schedule, [s, r/2]: m theta'_i, with
    theta'_i the schedule's frequencies at ``seq_len`` for m >= n_hat and the original theta_i
    for m < n_hat (``n_hat``, longrope only, see the module docstring)."""
    inv_freq, _ = rope_frequencies(head_dim, base, scaling, max_position_embeddings=max_position_embeddings,
                                   seq_len=seq_len)
    cfg = dict(scaling or {})
    dim = 2 * inv_freq.shape[-1]
    theta = _f32(roformer_theta(dim, float(cfg.get("rope_theta", base))))  # [r/2]
    m = torch.as_tensor(positions, dtype=torch.float64)[:, None]  # [s, 1]
    freq = torch.where(m < unscaled_positions(cfg), theta.double(), inv_freq.double())  # [s, r/2]
    return m * freq


# ----------------------------------------------------------------------------- schedules

class Schedule(Protocol):
    """One rope_type: the rotated width r, the base (``rope_theta`` already applied), the
    scaling dict (keys already checked against KEYS) -> (inv_freq [r/2] | [n, r/2], A)."""

    def __call__(self, dim: int, base: float, cfg: dict, *, max_position_embeddings: int | None,
                 seq_len: int | Tensor | None) -> tuple[Tensor, float]: ...


def pair_exponent(dim: int) -> Tensor:
    """2i / r for each pair i, float64 [r/2]."""
    return torch.arange(0, dim, 2, dtype=torch.float64) / dim


def roformer_theta(dim: int, base: float) -> Tensor:
    """theta_i = base^(-2i/r), float64 [r/2]: the table every schedule rewrites."""
    return base ** -pair_exponent(dim)


def default_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    return _f32(roformer_theta(dim, base)), 1.0


def linear_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    return _f32(roformer_theta(dim, base) / _factor(cfg)), 1.0


def ntk_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    return _f32((base * _factor(cfg) ** (dim / (dim - 2))) ** -pair_exponent(dim)), 1.0


def dynamic_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    factor = _factor(cfg)
    ref = max_position_embeddings or cfg.get("original_max_position_embeddings")
    if ref is None:
        raise ConfigError(f"{_FIELD}.original_max_position_embeddings", None,
                          "a positive integer (or pass max_position_embeddings)")
    _positive("original_max_position_embeddings", ref)
    if seq_len is None:
        return _f32(roformer_theta(dim, base)), 1.0
    length = torch.as_tensor(seq_len, dtype=torch.float64).clamp(min=ref)  # [] | [n]
    scale = factor * length / ref - (factor - 1)  # 1 at L = L0
    new_base = base * scale ** (dim / (dim - 2))  # [] | [n]
    return _f32(new_base[..., None] ** -pair_exponent(dim)), 1.0  # [r/2] | [n, r/2]


def ntk_by_parts_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    orig = _original(cfg, max_position_embeddings)
    factor = _factor(cfg, max_position_embeddings, orig)
    inv_freq = _ramp(roformer_theta(dim, base), dim, base, factor, orig, cfg)
    return inv_freq, float(cfg.get("attention_factor") or 1.0)


def yarn_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    orig = _original(cfg, max_position_embeddings)
    factor = _factor(cfg, max_position_embeddings, orig)
    inv_freq = _ramp(roformer_theta(dim, base), dim, base, factor, orig, cfg)
    factor_a = cfg.get("attention_factor")
    if factor_a is None:
        mscale, mscale_all_dim = cfg.get("mscale"), cfg.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            factor_a = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            factor_a = _yarn_mscale(factor)
    return inv_freq, float(factor_a)


def longrope_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    orig = _original(cfg, max_position_embeddings)
    factor = _factor(cfg, max_position_embeddings, orig)
    theta = roformer_theta(dim, base)
    short = theta / _pair_factors(cfg, "short_factor", dim)  # [r/2]
    long = theta / _pair_factors(cfg, "long_factor", dim)
    factor_a = cfg.get("attention_factor")
    if factor_a is None:
        factor_a = math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1 else 1.0
    if seq_len is None:
        return _f32(short), float(factor_a)
    is_long = torch.as_tensor(seq_len) > orig  # [] | [n]
    return _f32(torch.where(is_long[..., None], long, short)), float(factor_a)


def llama3_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    factor = _factor(cfg)
    orig = _original(cfg, max_position_embeddings)
    low, high = _require(cfg, "low_freq_factor"), _require(cfg, "high_freq_factor")
    if not high > low:
        raise ConfigError(f"{_FIELD}.high_freq_factor", high, f"a number above low_freq_factor={low}")
    theta = roformer_theta(dim, base)
    wavelen = 2 * math.pi / theta  # lambda_i, [r/2]
    smooth = (orig / wavelen - low) / (high - low)  # a, [r/2]
    blended = (1 - smooth) * theta / factor + smooth * theta
    inv_freq = torch.where(wavelen > orig / low, theta / factor,
                           torch.where(wavelen < orig / high, theta, blended))
    return _f32(inv_freq), 1.0


def proportional_schedule(dim, base, cfg, *, max_position_embeddings, seq_len):
    # here dim is the head width d (rope_frequencies passes it whole for this type)
    p = cfg.get("partial_rotary_factor", 1.0)
    factor = cfg.get("factor")
    factor = 1.0 if factor is None else factor
    _positive("factor", factor)
    rotated = int(p * dim // 2)  # floor(p d / 2) pairs keep a frequency, as transformers counts them
    theta = roformer_theta(dim, base)  # base^(-2i/d), [d/2]
    keep = torch.arange(dim // 2) < rotated
    return _f32(torch.where(keep, theta, torch.zeros_like(theta)) / float(factor)), 1.0


ROPE_SCHEDULES: dict[str, Schedule] = {  # a new rope_type is one function and one entry
    "default": default_schedule,
    "linear": linear_schedule,
    "ntk": ntk_schedule,
    "dynamic": dynamic_schedule,
    "ntk_by_parts": ntk_by_parts_schedule,
    "yarn": yarn_schedule,
    "longrope": longrope_schedule,
    "llama3": llama3_schedule,
    "proportional": proportional_schedule,
}
ROPE_TYPES = tuple(ROPE_SCHEDULES)
LENGTH_DEPENDENT = ("dynamic", "longrope")  # frequencies change with the sequence length


# ----------------------------------------------------------------------------- helpers

def _ramp(theta: Tensor, dim: int, base: float, factor: float, orig: float, cfg: dict) -> Tensor:
    """YaRN's ramp between interpolated (theta/s) and extrapolated (theta) frequencies."""
    beta_fast = cfg.get("beta_fast") or 32
    beta_slow = cfg.get("beta_slow") or 1

    def pair_index(rotations: float) -> float:
        # the pair i whose wavelength fits ``rotations`` full turns into L0
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = pair_index(beta_fast), pair_index(beta_slow)
    if cfg.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001  # as Hugging Face: avoid a zero-width ramp
    # float32 as in the reference, so a pair that sits exactly on a ramp edge lands alike
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1).double()
    return _f32(theta / factor * ramp + theta * (1 - ramp))  # gamma_i = ramp


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _require(cfg: dict, key: str):
    if cfg.get(key) is None:
        rope_type = cfg.get("rope_type", cfg.get("type"))
        raise ConfigError(f"{_FIELD}.{key}", None, f"required for rope_type={rope_type!r}")
    return cfg[key]


def _positive(key: str, value) -> None:
    if not (isinstance(value, Real) and cast(float, value) > 0):  # numbers.Real declares no __gt__
        raise ConfigError(f"{_FIELD}.{key}", value, "a positive number")


def _factor(cfg: dict, max_position_embeddings: int | None = None, orig: float | None = None) -> float:
    if cfg.get("factor") is None and max_position_embeddings and orig:
        return max_position_embeddings / orig
    factor = _require(cfg, "factor")
    _positive("factor", factor)
    return float(factor)


def _original(cfg: dict, max_position_embeddings: int | None) -> float:
    orig = cfg.get("original_max_position_embeddings") or max_position_embeddings
    if orig is None:
        _require(cfg, "original_max_position_embeddings")
    _positive("original_max_position_embeddings", orig)
    assert orig is not None  # _positive refused None
    return orig


def _pair_factors(cfg: dict, key: str, dim: int) -> Tensor:
    value = _require(cfg, key)
    factors = torch.as_tensor(value, dtype=torch.float64).flatten()
    if factors.numel() == 1:
        factors = factors.expand(dim // 2)
    if factors.numel() != dim // 2 or not bool((factors > 0).all()):
        raise ConfigError(f"{_FIELD}.{key}", value,
                          f"a positive number or a list of {dim // 2} positive numbers (one per pair)")
    return factors


def _f32(x: Tensor) -> Tensor:
    return x.to(torch.float32)
