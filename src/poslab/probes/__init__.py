"""Probes: pure functions from a model's intermediates to numbers (the seed paper's (i)-(v) and Fig. 4).

    (i)   accuracy          mean_{b(,s)} [argmax_y logits = target]          (loss_mask respected)
    (ii)  peak              argmax_t mean_b a_{b,t};  peak offset = t - (L - 1), target -K
    (iii) carrier energy    ||mean_n X_n||^2 / mean_n ||X_n||^2,  X = W_Q z_n  or  W_K z_t (unrotated)
    (iv)  carrier profile   phi_c(delta) = m_Q^T R_delta m_K,  delta = t - n
    (v)   dilution fit      1 / a*(L) = c (L - 1) + b                             (least squares)
    Fig. 4  margin          mu = mean_b (l_{b,n-K} - max_{t != n-K} l_{b,t}),  bound 1 / (1 + (L-1) e^{-mu})
            rank            sigma_1^2 / sum_i sigma_i^2  of  W = W_Q^T W_K
            rotary kernel   g(s) = sum_j cos(s theta_j),  ratio max_{s >= 4} g(s) / g(0)
            pinning         absolute key position of the peak per (unseen) length, for APE

Every model has ``collect(batch) -> Intermediates`` (per layer and head: ``attn_scores``,
``pattern``, ``q``/``k`` before and ``rot_q``/``rot_k`` after ``rotate_qk``, the residual
stream; plus ``logits`` and ``lengths``). A probe is a pure function of those intermediates, of
sums accumulated from them chunk by chunk, or of what it is given explicitly (the encoding's
rotary frequencies, weight matrices); :func:`over_chunks` runs the model in bounded memory.

The ``model, batch`` functions (``accuracy``, ``mean_attention``, ``carrier``, ``margin``, ...)
are thin drivers over ``collect`` and the pure functions, with the signatures and numbers the
experiments have always used. They take one model (never an ensemble: pick a member first).

Modules:

    common.py      chunked collection, where each sequence's query sits, head selection, accuracy
    attention.py   mean attention per layer and head, peak, attention at an offset, pinning
    carriers.py    carrier energy and profile, dilution fit, margin, rank, rotary kernel, fast path
"""

from __future__ import annotations

from poslab.probes.attention import (
    as_row,
    attention_at_offset,
    attention_sum,
    last_query_attention,
    mean_attention,
    mean_attention_by_layer,
    mean_pattern,
    pattern_sum,
    peak,
    peak_slope,
    pinned_position,
)
from poslab.probes.carriers import (
    Moments,
    accuracy_and_attention,
    carrier,
    carrier_cosine,
    carrier_energy,
    carrier_profile,
    carrier_profile_of,
    collect_moments,
    dilution_fit,
    kernel_ratio,
    margin,
    margin_bound,
    margins,
    mean_logit_profile,
    profile_margin,
    projection_moments,
    rank_concentration,
    rank_concentrations,
    rotary_kernel,
    rotary_theta,
    token_keys,
)
from poslab.probes.common import (
    CHUNK,
    accuracy,
    accuracy_of,
    at_last_query,
    correct,
    last_index,
    one_length,
    over_chunks,
    real_keys,
    split_batch,
)

__all__ = [
    # the original model-level API
    "accuracy", "accuracy_and_attention", "attention_at_offset", "carrier", "carrier_energy", "carrier_profile",
    "dilution_fit", "kernel_ratio", "margin", "margin_bound", "mean_attention", "mean_logit_profile", "peak",
    "peak_slope", "pinned_position", "profile_margin", "rank_concentration", "rotary_kernel", "rotary_theta",
    # drivers over every layer
    "mean_attention_by_layer", "mean_pattern", "collect_moments",
    # chunking and indexing
    "CHUNK", "at_last_query", "last_index", "one_length", "over_chunks", "real_keys", "split_batch", "token_keys",
    # pure functions of intermediates, sums or explicit inputs
    "Moments", "accuracy_of", "as_row", "attention_sum", "carrier_cosine", "carrier_profile_of", "correct",
    "last_query_attention", "margins", "pattern_sum", "projection_moments", "rank_concentrations",
]
