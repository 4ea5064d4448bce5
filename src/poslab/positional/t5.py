"""T5 relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning").

    logit_ij = q_i^T k_j / sqrt(d) + B[bucket(j - i), h]

One learned scalar per (bucket, head). ``bucket`` maps the relative position n = j - i
(key minus query, as T5 defines it) to one of ``num_buckets`` buckets:

- bidirectional: half the buckets for n > 0 (offset by num_buckets/2), half for n <= 0, on |n|;
  causal: only n <= 0 is distinguished, on -n (every later key shares bucket 0);
- with N the buckets left and e = N/2: a distance a < e gets its own bucket a; a larger one gets
  e + floor(ln(a/e) / ln(max_distance/e) * (N - e)), capped at N - 1, so buckets widen
  logarithmically and every distance >= max_distance shares the last one.

The table is initialised N(0, init_std^2) (``init="normal"``) or to zeros (``init="zeros"``): a
bucket no training distance reaches keeps its initial value, so with zeros an unseen distance
adds nothing rather than a random logit (:func:`bucket_coverage` counts such distances).

The arithmetic is done in float32 in the same order as the Mesh TensorFlow / Hugging Face
reference, so a distance on a bucket edge lands in the same bucket. Fractional relative
positions are rounded to the nearest integer first.

Notation: b batch, h head, i/j query/key position, d head dim, n = j - i, N buckets.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.positional.base import PositionalEncoding


def t5_relative_bucket(relative_position: Tensor, *, bidirectional: bool, num_buckets: int = 32,
                       max_distance: int = 128) -> Tensor:
    """Bucket index in [0, num_buckets) for each key-minus-query ``relative_position`` (long)."""
    n = relative_position.round().long() if relative_position.is_floating_point() else relative_position.long()
    bucket = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n > 0).long() * num_buckets
        distance = n.abs()
    else:
        distance = (-n).clamp(min=0)
    exact = num_buckets // 2
    # clamp only keeps log() finite for the small distances that torch.where discards
    scaled = (torch.log(distance.clamp(min=exact).float() / exact) / math.log(max_distance / exact)
              * (num_buckets - exact))
    large = (exact + scaled.long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, large)


def bucket_coverage(train_distances, eval_distances, *, bidirectional: bool = False, num_buckets: int = 32,
                    max_distance: int = 128) -> float:
    """Share of ``eval_distances`` (query minus key, >= 0) whose bucket some training distance reaches.

    A bucket that no training distance falls in never gets a gradient, so its bias stays at its
    initial value: those evaluation distances are the relative bias's untrained table rows."""
    def buckets(distances) -> Tensor:
        return t5_relative_bucket(-torch.as_tensor(list(distances)), bidirectional=bidirectional,
                                  num_buckets=num_buckets, max_distance=max_distance)

    reached = set(buckets(train_distances).tolist())
    seen = buckets(eval_distances).tolist()
    return sum(b in reached for b in seen) / len(seen)


INITS = ("normal", "zeros")


class T5Bias(PositionalEncoding):
    kind = "relative"
    extra_parameters = "num_buckets x n_heads"
    cost = "O(i j) lookups per head"
    reference = "Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5)"

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, bidirectional: bool = False,
                 num_buckets: int = 32, max_distance: int = 128, init_std: float = 1.0, init: str = "normal"):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        if not isinstance(bidirectional, bool):
            raise ConfigError("bidirectional", bidirectional, "True, False")
        smallest = 4 if bidirectional else 2
        if not (isinstance(num_buckets, int) and num_buckets >= smallest):
            raise ConfigError("num_buckets", num_buckets, f"an integer >= {smallest}")
        exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
        if not (isinstance(max_distance, int) and max_distance > exact):
            raise ConfigError("max_distance", max_distance, f"an integer > {exact} (the exact buckets)")
        if init not in INITS:
            raise ConfigError("init", init, INITS)
        self.bidirectional, self.num_buckets, self.max_distance = bidirectional, num_buckets, max_distance
        table = torch.randn(num_buckets, n_heads) * init_std if init == "normal" else torch.zeros(num_buckets, n_heads)
        self.relative_attention_bias = nn.Parameter(table)  # B, [N, h]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        n = k_pos[..., None, :] - q_pos[..., :, None]  # j - i, [i, j] | [b, i, j]
        bucket = t5_relative_bucket(n, bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                    max_distance=self.max_distance)
        bias = self.relative_attention_bias[bucket]  # [(b,) i, j, h]
        return bias.movedim(-1, -3).to(q.dtype)  # [(b,) h, i, j]
