"""Section 7's reading of a linear-attention score profile: the minimum-norm interpolant.

A linear head's score profile f(delta) = sum_j A_j cos(delta theta_j + psi_j) is constrained
only at the training offsets; off support, gradient descent leaves the interpolant nearest its
start. :func:`min_norm_interpolant` fits the trigonometric polynomial in the model's rotary
frequencies, :func:`interpolant_fits` compares it with the measured f off support.
"""

from __future__ import annotations

import numpy as np


def min_norm_interpolant(theta: np.ndarray, support: np.ndarray, values: np.ndarray, offsets: np.ndarray,
                         rcond: float = 1e-15) -> np.ndarray:
    """The minimum-norm trigonometric polynomial sum_j a_j cos(delta theta_j) + b_j sin(delta theta_j)
    through ``values`` at the ``support`` offsets (least squares when over-determined), at ``offsets``.

    ``rcond``: singular values of the support's basis below rcond x the largest are dropped
    (numpy's pinv; the default keeps all). At d = 64 on 15 offsets the basis spans 11 decades
    (the low frequencies are nearly collinear there), so the exact interpolant of a measured,
    noisy f is dominated by its smallest directions; read it with a cutoff (e.g. 1e-6)."""
    basis = lambda d: np.concatenate([np.cos(np.outer(d, theta)), np.sin(np.outer(d, theta))], axis=1)  # noqa: E731
    coef = np.linalg.pinv(basis(np.asarray(support, dtype=float)), rcond=rcond) @ np.asarray(values, dtype=float)
    return basis(np.asarray(offsets, dtype=float)) @ coef


def off_support(f: np.ndarray, g: np.ndarray, outside: np.ndarray) -> float:
    """Correlation of f and g over the ``outside`` offsets (NaN with fewer than two)."""
    return float(np.corrcoef(f[outside], g[outside])[0, 1]) if outside.sum() > 1 else float("nan")


def interpolant_fits(theta: np.ndarray, offsets: np.ndarray, f: np.ndarray, f0: np.ndarray, Lmax: int, K: int,
                     rcond: float) -> tuple[dict, np.ndarray, np.ndarray]:
    """The measured profile f at ``offsets`` beside the min-norm interpolant (cutoff ``rcond``) of
    its values on the training offsets delta in [-(L_max - 1), -1] (delta = 0 left out: there the
    query and key share a token). Returns the off-support correlations (``off_support_corr``; with
    delta = 0 in the support; the exact pinv; and the interpolant nearest the untrained profile
    f0, where gradient descent on least squares ends: f0 plus the min-norm change that fits the
    support), ``off_support_scale`` (mean |f| off support / |f(-K)|), the interpolant and the
    support mask."""
    support = (offsets >= -(Lmax - 1)) & (offsets < 0)
    outside = offsets < -(Lmax - 1)
    g = min_norm_interpolant(theta, offsets[support], f[support], offsets, rcond=rcond)
    exact = min_norm_interpolant(theta, offsets[support], f[support], offsets)
    with_self = min_norm_interpolant(theta, offsets[support | (offsets == 0)], f[support | (offsets == 0)], offsets,
                                     rcond=rcond)
    from_init = f0 + min_norm_interpolant(theta, offsets[support], (f - f0)[support], offsets, rcond=rcond)
    fits = dict(off_support_corr=off_support(f, g, outside),
                off_support_corr_with_self=off_support(f, with_self, outside),
                off_support_corr_exact=off_support(f, exact, outside),
                off_support_corr_from_init=off_support(f, from_init, outside),
                off_support_scale=float(np.abs(f[outside]).mean() / max(abs(f[offsets == -K][0]), 1e-12))
                if outside.any() else float("nan"))
    return fits, g, support
