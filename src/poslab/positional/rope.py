"""Rotary position embedding (Su et al., 2021, "RoFormer").

Each pair of channels (x1, x2) of a query or key at position p is rotated by the angle
p * theta_i:

    (x1, x2) -> (x1 cos(p theta_i) - x2 sin(p theta_i),  x1 sin(p theta_i) + x2 cos(p theta_i))

so q_n^T k_t = (W_Q x_n)^T R_{t-n} (W_K x_t) depends on positions only through the offset
t - n (the seed paper's Lemma 1). ``theta`` and the attention factor come from
:func:`poslab.positional.rope_frequencies`, so every context-extension schedule is RoPE with
another frequency table, never a subclass.

Pair layouts: ``interleaved`` pairs channels (2i, 2i+1) — the seed paper's 2x2 blocks;
``half`` pairs (i, i + r/2) — the Llama / Hugging Face convention (r = rotated width).
With ``rotary_fraction`` < 1 only the first r = fraction * d channels rotate, with frequencies over
the rotated width (theta_i = base^(-2i/r): GPT-NeoX / Pythia, Phi-2, GLM / ChatGLM); with
``scaling={"rope_type": "proportional"}`` the fraction is p-RoPE's p and the frequencies are over
the full width (theta_i = base^(-2i/d) for the first r/2 pairs, the rest not rotated), see
:mod:`poslab.positional.rope_scaling`. ``scaling={"resonance": True}`` (with any rope_type) rounds
every wavelength to an integer (Resonance RoPE).

Length-dependent schedules (``dynamic``, ``longrope``: see :data:`LENGTH_DEPENDENT`) choose
their frequencies from the sequence length L = (largest query or key position) + 1, taken per
sequence (per row of ``[b, s]`` positions; Hugging Face takes the batch maximum). To keep
``rotate_qk`` pure, a table of frequencies for every L in 0 .. max_len is built at construction
and indexed with tensor ops; lengths past ``max_len`` are refused by ``check_positions`` and
clamped to the last row in forward.

LongRoPE's ``n_hat`` (a poslab key of the longrope dict, see :mod:`poslab.positional.rope_scaling`):
positions m < n_hat are rotated by the original theta_i, the others by the rescaled table, chosen
per position of q and of k (so the logit no longer depends on the offset alone there).
``rotary_frequencies()`` returns the frequencies of positions m >= n_hat at L = max_len; it is
exact for offsets between two positions both >= n_hat, and :func:`poslab.probes.rotary_theta`
refuses an encoding with n_hat > 0 rather than describe it by one table.

Notation: b batch, h head, s position index, d head dim, r rotated channels, L sequence length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.errors import ConfigError, check_choice
from poslab.positional.base import PositionalEncoding, head_axis, require_even
from poslab.positional.rope_scaling import LENGTH_DEPENDENT, rope_frequencies, unscaled_positions

LAYOUTS = ("interleaved", "half")


def rotate(x: Tensor, pos: Tensor, inv_freq: Tensor, layout: str, factor: Tensor | float = 1.0) -> Tensor:
    """Rotate the first 2 * len(inv_freq) channels of x [..., h, s, d] by pos [s] | [b, s].

    ``inv_freq`` is [r/2] or anything that broadcasts against the angles [..., 1, s, r/2]
    (a length-dependent schedule passes one row per sequence, [b, 1, 1, r/2]). Each pair
    (x1, x2) is read as the complex number x1 + i x2 and multiplied by factor * e^{i p theta}:
    one complex product instead of strided pair slices, several times faster forward and back.
    """
    r = 2 * inv_freq.shape[-1]
    angles = head_axis(pos).to(inv_freq.dtype)[..., None] * inv_freq  # [..., 1, s, r/2]
    rotor = torch.polar(factor * torch.ones_like(angles), angles)  # factor * e^{i p theta}
    x_rot = x if r == x.shape[-1] else x[..., :r]
    if layout == "interleaved":
        z = torch.view_as_complex(x_rot.unflatten(-1, (r // 2, 2)).contiguous())  # [..., s, r/2]
        out = torch.view_as_real(z * rotor).flatten(-2)
    else:
        z = torch.complex(x_rot[..., : r // 2], x_rot[..., r // 2 :]) * rotor
        out = torch.cat((z.real, z.imag), dim=-1)
    return out if r == x.shape[-1] else torch.cat((out, x[..., r:].expand(*out.shape[:-1], -1)), dim=-1)


class RoPE(PositionalEncoding):
    kind = "rotary"
    extra_parameters = "none"
    cost = "O(s d) per layer (element-wise rotation of q and k)"
    reference = "Su et al. 2021, RoFormer"
    broadcasts_positions = True  # one rotor per position, shared by heads and tokens

    inv_freq: Tensor  # buffers (declared so nn.Module.__getattr__ types them)
    inv_freq_by_length: Tensor  # registered only for a length-dependent schedule
    inv_freq_original: Tensor  # registered only when n_hat > 0

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int,
                 base: float = 10000.0, rotary_fraction: float = 1.0, layout: str = "interleaved",
                 scaling: dict | None = None):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_even("d_head", d_head)
        check_choice("layout", layout, LAYOUTS)
        scaling = dict(scaling or {})
        full_width = scaling.get("rope_type", scaling.get("type")) == "proportional"  # p-RoPE: p = 0 is NoPE
        if not (0.0 <= rotary_fraction <= 1.0 if full_width else 0.0 < rotary_fraction <= 1.0):
            raise ConfigError("rotary_fraction", rotary_fraction, "a number in [0, 1]" if full_width
                              else "a number in (0, 1]")
        if rotary_fraction != 1.0:
            scaling.setdefault("partial_rotary_factor", rotary_fraction)
        self.layout, self.base, self.scaling = layout, base, scaling
        inv_freq, factor = rope_frequencies(d_head, base, scaling or None, seq_len=max_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # theta_i at L = max_len, [r/2]
        self.attention_factor = float(factor)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        self.length_dependent = rope_type in LENGTH_DEPENDENT
        if self.length_dependent:
            by_length, _ = rope_frequencies(d_head, base, scaling, seq_len=torch.arange(max_len + 1))
            self.register_buffer("inv_freq_by_length", by_length, persistent=False)  # [max_len + 1, r/2]
        self.n_hat = unscaled_positions(scaling)  # LongRoPE: positions m < n_hat keep the original theta
        if self.n_hat:
            plain = {k: scaling[k] for k in ("rope_theta", "partial_rotary_factor") if k in scaling}
            original, _ = rope_frequencies(d_head, base, plain)
            self.register_buffer("inv_freq_original", original, persistent=False)  # [r/2]

    @property
    def theta(self) -> Tensor:
        """Rotary frequencies, [r/2] (for a length-dependent schedule: those at L = max_len)."""
        return self.inv_freq

    def rotary_frequencies(self) -> Tensor:
        return self.inv_freq  # theta_i at L = max_len (of positions >= n_hat), [r/2]

    @property
    def kv_cache(self) -> bool:
        # a length-dependent schedule re-rotates every cached key when the sequence grows
        return not self.length_dependent

    def check_positions(self, max_position: int) -> None:
        if self.length_dependent and max_position + 1 > self.max_len:
            raise ConfigError(
                "length", max_position + 1,
                f"at most max_len={self.max_len} for the length-dependent rope_type "
                f"(one of {', '.join(LENGTH_DEPENDENT)}): build the encoding with a larger max_len")

    def rotate_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        f = self.attention_factor
        inv_freq = self.inv_freq
        if self.length_dependent:  # a Python flag fixed at construction, not a tensor value
            longest = torch.maximum(q_pos.amax(dim=-1), k_pos.amax(dim=-1))  # [] | [b]
            length = (longest.long() + 1).clamp(0, self.max_len)  # L = floor(max position) + 1
            inv_freq = self.inv_freq_by_length[length][..., None, None, :]  # [1, 1, r/2] | [b, 1, 1, r/2]
        return (rotate(q, q_pos, self._per_position(inv_freq, q_pos), self.layout, f),
                rotate(k, k_pos, self._per_position(inv_freq, k_pos), self.layout, f))

    def _per_position(self, inv_freq: Tensor, pos: Tensor) -> Tensor:
        """The original theta at positions < n_hat, ``inv_freq`` elsewhere: [..., 1, s, r/2] (n_hat = 0:
        ``inv_freq`` unchanged)."""
        if not self.n_hat:  # a Python int fixed at construction
            return inv_freq
        early = head_axis(pos)[..., None] < self.n_hat  # [1, s, 1] | [b, 1, s, 1]
        return torch.where(early, self.inv_freq_original, inv_freq)
