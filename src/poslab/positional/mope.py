"""Morlet positional encoding (MoPE; seed survey ``001``, "Morlet Positional Encoding").

Each pair f of channels carries a Morlet/Gabor atom: a learned frequency omega_f and a learned
locality bandwidth sigma_f. Two forms, two classes (registry names ``mope`` and ``mope_additive``):

relative (:class:`MoPERelative`), on the rotary pairs of queries and keys (d = d_head, F = d/2)::

    logit_ij = (1 / sqrt(d)) sum_f  [R(omega_f p_i) q_i^(f)]^T [R(omega_f p_j) k_j^(f)]  g_f(Delta)
             = (1 / sqrt(d)) sum_f  q_i^(f)T R(omega_f (p_j - p_i)) k_j^(f)  g_f(Delta),
    g_f(Delta) = exp(-Delta^2 / (2 sigma_f^2)),   Delta = p_i - p_j

i.e. RoPE whose pair-f score term is damped by a Gaussian in the offset: the phase is RoPE's
rotation angle, the amplitude a learned locality kernel. ``rotate_qk`` rotates q and k exactly as
RoPE does (with omega_f for theta_f), so attention's own q k^T / sqrt(d) is the undamped sum,
and ``score_bias`` adds sum_f P_f (g_f - 1) / sqrt(d), P_f the pair-f term of the rotated dot
product: the total is exact, and the probes' ``rot_q``/``rot_k`` are the rotated vectors.

additive (:class:`MoPEAdditive`), on the token stream (D = d_model, F = D/2)::

    z_t = x_t + PE[t],   PE[t, 2f] = e^(-t^2 / (2 sigma_f^2)) sin(omega_f t),
                         PE[t, 2f+1] = e^(-t^2 / (2 sigma_f^2)) cos(omega_f t)

As sigma_f -> infinity, g_f -> 1 and the envelope -> 1: the relative form is RoPE and the
additive form is the sinusoidal embedding, exactly (the survey's unification result).

Parametrization: omega_f = theta_f exp(w_f) and sigma_f = init_sigma exp(s_f), with w, s learned
and initialized at 0 and theta_f the fixed RoPE / sinusoid frequency base^(-2f/d). Both are
positive by construction, learned on a log scale (frequencies span four decades), and at
initialization equal theta_f and init_sigma bit for bit. ``init_sigma`` defaults to 1e4: the
encoding starts as RoPE / sinusoidal (damping exp(-(L/1e4)^2/2) > 0.995 for offsets L <= 1000)
and must learn its locality from data. That default makes locality dead for a short run: Adam
moves s_f by at most about lr per step, so over a 2000-step cosine schedule at lr 1e-3 (sum of lr
~1.1) sigma stays >= ~3300 and the damping at offset 64 >= 0.9998. Studies that ask what MoPE's
locality learns start init_sigma near the context (studies/mope.py: sigma0 = T, control: on the
boundary) and give w and s their own optimizer group (train.param_groups: a larger lr, no weight
decay; the per-head [h, F] log-scales are 2-D and AdamW would otherwise decay them).

Admissibility boundary (relative form, option ``admissibility``). A Morlet wavelet is admissible
(near-zero mean) when its frequency-bandwidth product is large enough; the MoPE abstract reports
that every learned pair converges to the boundary omega_f sigma_f = c. ``admissibility_c`` is c
(5 by default):

- ``"none"`` (default): omega and sigma are free, as above;
- ``"hard"``: a reparametrization that holds the boundary for any weights,
  sigma_f = c / omega_f + init_sigma exp(s_f), so omega_f sigma_f = c + omega_f init_sigma e^(s_f) > c;
  a pair on the boundary has its second term ~ 0 (sigma at init: c / theta_f + init_sigma);
- ``"penalty"``: sigma as in "none", and :meth:`MoPERelative.penalty` =
  penalty_weight * mean_f relu(log c - log(omega_f sigma_f))^2, which the model adds to its
  training loss (never to a validation loss).

``per_head=True`` learns one (omega, sigma) per head and pair ([h, F] instead of [F]): a model
of width D then has D/2 pairs in each layer's encoding, e.g. 128 at D = 256 (the abstract's
count), and ``rotary_frequencies()`` is the [h, F] table.

Notation: b batch, h head, i/j query/key index, p_i/p_j their positions, d head dim,
D model width, F pairs, f pair index, c the two channels of a pair.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError, check_choice
from poslab.positional.base import PositionalEncoding, relative_positions, require_even, require_positive
from poslab.positional.rope import LAYOUTS, rotate
from poslab.positional.rope_scaling import rope_frequencies

_REFERENCE = "Morlet Positional Encoding (seed survey 001)"
ADMISSIBILITY = ("none", "hard", "penalty")  # how omega_f sigma_f >= c is kept (module docstring)


def morlet_omega(theta: Tensor, log_omega_scale: Tensor) -> Tensor:
    """omega_f = theta_f exp(w_f), [F]."""
    return theta * log_omega_scale.exp()


def morlet_sigma(init_sigma: float, log_sigma_scale: Tensor) -> Tensor:
    """sigma_f = init_sigma exp(s_f), [F]."""
    return init_sigma * log_sigma_scale.exp()


class MoPERelative(PositionalEncoding):
    """Damped RoPE: rotate q and k by omega_f p, damp pair f's score term by g_f(Delta)."""

    kind = "rotary"
    extra_parameters = "2 x d_head/2: omega and sigma per pair"
    cost = "O(s d) rotation + O(i j d) damped pair terms per head"
    reference = _REFERENCE

    theta: Tensor  # buffer

    # max-args: keyword-only, one per encoding option, passed by name from the config (docs/complexity.md)
    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, base: float = 10000.0,  # noqa: PLR0913
                 init_sigma: float = 1e4, layout: str = "interleaved", admissibility: str = "none",
                 admissibility_c: float = 5.0, penalty_weight: float = 1.0, per_head: bool = False):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        check_choice("layout", layout, LAYOUTS)
        check_choice("admissibility", admissibility, ADMISSIBILITY)
        require_positive("base", base)
        require_positive("init_sigma", init_sigma)
        require_positive("admissibility_c", admissibility_c)
        require_positive("penalty_weight", penalty_weight)
        if not isinstance(per_head, bool):
            raise ConfigError("per_head", per_head, "true or false")
        require_even("d_head", d_head)
        self.layout, self.init_sigma = layout, float(init_sigma)
        self.admissibility, self.c, self.penalty_weight = admissibility, float(admissibility_c), float(penalty_weight)
        self.per_head = per_head
        theta, _ = rope_frequencies(d_head, base)  # the same table RoPE uses, [F]
        self.register_buffer("theta", theta, persistent=False)  # [F]
        shape = (n_heads, theta.numel()) if per_head else theta.shape  # [h, F] | [F]
        self.log_omega_scale = nn.Parameter(torch.zeros(shape))  # w_f
        self.log_sigma_scale = nn.Parameter(torch.zeros(shape))  # s_f

    @property
    def omega(self) -> Tensor:
        return morlet_omega(self.theta, self.log_omega_scale)  # [F] | [h, F]

    @property
    def sigma(self) -> Tensor:
        free = morlet_sigma(self.init_sigma, self.log_sigma_scale)  # [F] | [h, F]
        return self.c / self.omega + free if self.admissibility == "hard" else free

    def penalty(self) -> Tensor | None:
        """The admissibility penalty added to the training loss ("penalty" mode), else None."""
        if self.admissibility != "penalty":
            return None
        gap = math.log(self.c) - (self.omega * self.sigma).log()  # log c - log(omega sigma), [F] | [h, F]
        return self.penalty_weight * torch.relu(gap).square().mean()

    def rotary_frequencies(self) -> Tensor:
        return self.omega  # [F] | [h, F]

    def _per_head(self, x: Tensor) -> Tensor:
        """[F] -> [F]; [h, F] -> [h, 1, F], broadcasting against [..., h, s, F]."""
        return x[:, None, :] if self.per_head else x

    def rotate_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        omega = self._per_head(self.omega.to(q.dtype))  # [F] | [h, 1, F]
        return rotate(q, q_pos, omega, self.layout), rotate(k, k_pos, omega, self.layout)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # q, k arrive rotated (attention calls rotate_qk first)
        q_pairs, k_pairs = self._pairs(q), self._pairs(k)  # [b, h, i|j, F, 2]
        pair_terms = torch.einsum("bhifc,bhjfc->bhijf", q_pairs, k_pairs)  # P_f, [b, h, i, j, F]
        delta = relative_positions(q_pos, k_pos).to(q.dtype)[..., None]  # [1|b, 1, i, j, 1]
        sigma = self._per_head(self.sigma.to(q.dtype))[..., None, :]  # [F] | [h, 1, 1, F]
        damping = torch.expm1(-delta.square() / (2 * sigma.square()))  # g_f - 1, [.., h | 1, i, j, F]
        return (pair_terms * damping).sum(-1) / math.sqrt(q.shape[-1])  # [b, h, i, j]

    def _pairs(self, x: Tensor) -> Tensor:
        """[..., d] -> [..., F, 2]: the two channels of each rotary pair, in ``layout``'s pairing."""
        if self.layout == "interleaved":
            return x.unflatten(-1, (-1, 2))
        half = x.shape[-1] // 2
        return torch.stack((x[..., :half], x[..., half:]), dim=-1)


class MoPEAdditive(PositionalEncoding):
    """Gabor atoms added to the token stream: the sinusoidal embedding under a Gaussian envelope."""

    kind = "absolute"
    extra_parameters = "2 x d_model/2: omega and sigma per pair"
    cost = "O(s D) once, at the input"
    reference = _REFERENCE

    theta: Tensor  # buffer

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, base: float = 10000.0,
                 init_sigma: float = 1e4):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        require_positive("base", base)
        require_positive("init_sigma", init_sigma)
        require_even("d_model", d_model)
        self.init_sigma = float(init_sigma)
        # the same expression as base.sinusoid_table, so sigma -> inf matches it bit for bit
        theta = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        self.register_buffer("theta", theta, persistent=False)  # [F]
        self.log_omega_scale = nn.Parameter(torch.zeros_like(theta))  # w_f, [F]
        self.log_sigma_scale = nn.Parameter(torch.zeros_like(theta))  # s_f, [F]

    @property
    def omega(self) -> Tensor:
        return morlet_omega(self.theta, self.log_omega_scale)  # [F]

    @property
    def sigma(self) -> Tensor:
        return morlet_sigma(self.init_sigma, self.log_sigma_scale)  # [F]

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        p = pos.to(x.dtype)[..., None]  # [(b,) s, 1]
        angles = p * self.omega.to(x.dtype)  # [(b,) s, F]
        envelope = torch.exp(-p.square() / (2 * self.sigma.to(x.dtype).square()))  # [(b,) s, F]
        atoms = torch.stack((angles.sin() * envelope, angles.cos() * envelope), dim=-1)  # [(b,) s, F, 2]
        return x + atoms.flatten(-2)  # [b, s, D]
