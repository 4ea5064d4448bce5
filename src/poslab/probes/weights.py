"""Probes that read weights and encodings only (no batch): a learned table's row norms, the
token x token content logit table of a head, and the pure rotary kernel of a width and base.

    row norms           ||W_pos[rows]|| at the end of training / at initialisation (Frobenius)
    content covariance  (mean diag G - mean off-diag G) / std(G),  G_ab = (W_Q x_a) . (W_K x_b) / sqrt(d)
    rotary kernel       g(s) = sum_j cos(s theta_j) of a fresh RoPE encoding, see probes.rotary_kernel
"""

from __future__ import annotations

import math

import numpy as np

from poslab.probes.carriers import kernel_ratio, rotary_kernel


def table_row_norms(model, untrained, Lmax: int) -> dict:
    """A learned table's rows at end / at init (Frobenius norms): rows >= L_max (never in a training
    sequence: only weight decay moves them) and rows < L_max; None without such rows."""
    W, W0 = (getattr(m.encoding, "W_pos", None) for m in (model, untrained))
    if W is None or W0 is None or W.shape[0] <= Lmax:
        return dict(unseen_row_norm_ratio=None, seen_row_norm_ratio=None)
    W, W0 = W.detach(), W0.detach()
    return dict(unseen_row_norm_ratio=float(W[Lmax:].norm() / W0[Lmax:].norm()),
                seen_row_norm_ratio=float(W[:Lmax].norm() / W0[:Lmax].norm()))


def content_covariance(model) -> float:
    """(mean diag G - mean off-diag G) / std(G), G_ab = (W_Q x_a) . (W_K x_b) / sqrt(d), head 0:
    negative when the content term suppresses the self-logit (a key equal to the query token)."""
    d = model.cfg.d_head
    x = model.W_E  # [m, D]: token embeddings (RoPE adds nothing at the input)
    G = ((x @ model.W_Q[:d].T) @ (x @ model.W_K[:d].T).T / math.sqrt(d)).double().cpu().numpy()  # [m, m]
    off = ~np.eye(len(G), dtype=bool)
    return float((np.diag(G).mean() - G[off].mean()) / G.std())


def rotary_kernel_rows(widths, bases, s_max: int = 47) -> list[dict]:
    """g(s) for each rotary base and head width: the unique integer maximum at s = 0 over
    0 < |s| <= s_max, and max_{4 <= s <= s_max} g(s) / g(0)."""
    from poslab.positional import build_encoding

    out = []
    for d in widths:
        for base in bases:
            theta = build_encoding("rope", d_model=d, n_heads=1, d_head=d, max_len=s_max + 1,
                                   base=base).rotary_frequencies()
            assert theta is not None  # a RoPE encoding has rotary frequencies
            g = rotary_kernel(theta, np.arange(1, s_max + 1))
            g0 = float(rotary_kernel(theta, 0.0))
            out.append(dict(d=d, base=base, g0=g0, max_g_ratio_s_ge_1=float(g.max() / g0),
                            unique_max_at_0=bool((g < g0 - 1e-9).all()), ratio=kernel_ratio(theta, 4, s_max)))
    return out


__all__ = ["content_covariance", "rotary_kernel_rows", "table_row_norms"]
