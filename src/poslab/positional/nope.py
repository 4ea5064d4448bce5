"""No positional encoding (NoPE; Haviv et al. 2022, Kazemnejad et al. 2023).

    logit_ij = q_i^T k_j / sqrt(d)          (no term depends on i or j)

Every hook is the identity. A causal decoder still learns position from the mask alone (the
per-query softmax denominator counts the visible keys), which is what NoPE measures.

Notation: i/j query/key position, d head dim.
"""

from __future__ import annotations

from poslab.positional.base import PositionalEncoding


class NoPE(PositionalEncoding):
    kind = "none"
    extra_parameters = "none"
    cost = "none"
    reference = "Haviv et al. 2022; Kazemnejad et al. 2023"
