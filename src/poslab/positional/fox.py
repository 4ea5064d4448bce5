"""Data-dependent ALiBi: the Forgetting Transformer's forget gate (FoX; Lin et al. 2025,
"Forgetting Transformer: Softmax Attention with a Forget Gate", arXiv 2503.02130).

Each token t sets a forget gate per head from the layer's input x_t, and a key's logit is
decayed by the product of the gates between it and the query:

    f_ht = sigmoid(w_h . x_t + b_h)                       in (0, 1)
    logit_ij = q_i^T k_j / sqrt(d) + sum_{t = j+1 .. i} log f_ht      (= log prod f, <= 0)

With a constant gate f_h = e^{-m_h} this is ALiBi's -m_h (i - j); here the slope depends on the
data. It is computed with one cumulative sum c_t = sum_{t' <= t} log f_t' over the keys:
bias_ij = c_(i) - c_j, where c_(i) is the sum up to the last key at or before the query's
position (keys in increasing position order; a key after the query gets -(c_j - c_(i)), the sum
from i + 1 to j, a symmetric extension only a bidirectional model would read, and FoX is
``causal_only``).

x_t is the attention layer's input (the Transformer's normalized residual stream, the retrieval
head's embedded tokens): the encoding ``reads_stream``, so attention hands it to ``score_bias`` as
``x=``. w_h, b_h are this encoding's parameters; one encoding module serves every layer of a
Transformer (poslab's rule), so the layers share the gate projection where FoX has one per layer.
Initialization (ours): w ~ U(-1/sqrt(D), 1/sqrt(D)) as a linear layer, b_h = ``bias_init`` (0).

Notation: b batch, h head, i/j/t query/key/key index, D d_model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.positional.base import PositionalEncoding


class ForgetGate(PositionalEncoding):
    kind = "relative"
    extra_parameters = "n_heads x (d_model + 1) (gate projection and bias)"
    cost = "O(j D) per head (the gates) + O(i j) (one bias per logit)"
    reference = "Lin et al. 2025, Forgetting Transformer: Softmax Attention with a Forget Gate, arXiv 2503.02130"
    reads_stream = True
    contextual = True
    causal_only = True

    def __init__(self, *, d_model: int, n_heads: int, d_head: int, max_len: int, bias_init: float = 0.0):
        super().__init__(d_model=d_model, n_heads=n_heads, d_head=d_head, max_len=max_len)
        if isinstance(bias_init, bool) or not isinstance(bias_init, (int, float)) or not math.isfinite(bias_init):
            raise ConfigError("bias_init", bias_init, "a finite number")
        bound = 1.0 / math.sqrt(d_model)
        self.W_f = nn.Parameter(torch.empty(n_heads, d_model).uniform_(-bound, bound))  # w_h, [h, D]
        self.b_f = nn.Parameter(torch.full((n_heads,), float(bias_init)))  # b_h, [h]

    def log_forget(self, x: Tensor) -> Tensor:
        """log f_ht for the layer input x [b, t, D] -> [b, h, t]."""
        return F.logsigmoid(x @ self.W_f.T + self.b_f).transpose(-1, -2)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, x: Tensor | None = None) -> Tensor:
        if x is None:
            raise ConfigError("x", None, "the layer's input at the key positions: the forget gate reads the "
                                         "token stream (pass attention(..., stream=x))")
        log_f = self.log_forget(x.to(q.dtype))  # [b, h, j]
        c = torch.cat((torch.zeros_like(log_f[..., :1]), log_f.cumsum(-1)), dim=-1)  # c_{j-1}: [b, h, 1 + j]
        # number of keys at or before each query's position: c_(i) = c[count]
        count = (k_pos[..., None, :] <= q_pos[..., :, None]).sum(-1)  # [i] | [b, i]
        count = count.unsqueeze(-2).expand(*c.shape[:-1], -1) if count.dim() == 1 else \
            count[:, None, :].expand(*c.shape[:-1], -1)  # [b, h, i]
        c_query = c.gather(-1, count)  # [b, h, i]
        c_key = c[..., 1:]  # c_j, [b, h, j]
        return -(c_query[..., :, None] - c_key[..., None, :]).abs()  # [b, h, i, j]
