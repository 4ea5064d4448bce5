"""The seed paper's model: one attention layer, query from the last position, linear readout.

    z_t = embed(W_E[s_t], t)                     (APE: z_t = x_t + W_pos[t]; RoPE: z_t = x_t)
    q   = W_Q z_n,  k_t = W_K z_t,  v_t = W_V z_t,    n = L - 1
    l_t = (rot(q, n) . rot(k_t, t) / sqrt(d) + bias(n, t)) / tau
    o   = sum_t softmax(l)_t v_t        (or sum_t l_t v_t: linear attention, Section 7)
    y^  = U o

No MLP, no LayerNorm. With ``n_heads`` > 1 the head outputs are concatenated before ``U``.

Two forwards compute the same function:

- :meth:`RetrievalHead.forward` is the direct one, and returns intermediates for probes;
- :meth:`RetrievalHead.attend` (and :meth:`forward_table`, :meth:`loss` on top of it) is the
  trainer's and the evaluator's fast path. In one layer the projected queries, keys and values
  are functions of (token, position) only, so it scores the m x T grid of all (token,
  position) pairs once, through the same four hooks with explicit positions, and gathers each
  sequence's logits from that table; since ``embed`` adds a position vector, values split into
  a token part and a position part. Nothing of size [batch, length, d] is ever built.

Notation: b batch, h head, s/t position, n query position, d head dim, D d_model, m vocab,
T grid length, g grid entries (m * T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.attention import KINDS, attention, attention_weights, build_mask
from poslab.errors import ConfigError, check_choice, require_positive_int
from poslab.models.intermediates import Intermediates, LayerIntermediates
from poslab.models.loss import masked_cross_entropy
from poslab.positional import PositionalEncoding, build_encoding
from poslab.tasks.base import Batch


@dataclass(frozen=True, kw_only=True)
class RetrievalHeadConfig:
    vocab_size: int = 20  # m
    d_model: int = 64  # d
    n_heads: int = 1
    d_head: int | None = None  # per-head width; None: d_model // n_heads (filled in when it divides)
    encoding: str = "rope"  # key of poslab.positional.ENCODINGS
    encoding_options: dict = field(default_factory=dict)
    max_len: int = 48  # longest sequence any table must hold
    attention: str = "softmax"  # "softmax" | "linear" (Section 7 control)
    temperature: float = 1.0

    def __post_init__(self):
        whole = all(isinstance(v, int) and v > 0 for v in (self.d_model, self.n_heads))
        if self.d_head is None and whole and self.d_model % self.n_heads == 0:
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)


class RetrievalHead(nn.Module):
    def __init__(self, cfg: RetrievalHeadConfig):
        super().__init__()
        check_choice("attention", cfg.attention, KINDS)
        for name in ("vocab_size", "d_model", "n_heads", "max_len"):
            require_positive_int(name, getattr(cfg, name))
        if cfg.d_head is None:
            raise ConfigError("n_heads", cfg.n_heads, f"a divisor of d_model={cfg.d_model} (or set d_head)")
        require_positive_int("d_head", cfg.d_head)
        self.cfg = cfg
        self.d_head: int = cfg.d_head  # resolved (the config's field is Optional)
        h, d, D, m = cfg.n_heads, self.d_head, cfg.d_model, cfg.vocab_size
        self.encoding = build_encoding(cfg.encoding, d_model=D, n_heads=h, d_head=d, max_len=cfg.max_len,
                                       d_head_from="d_model" if d * h == D else "d_head", **cfg.encoding_options)
        if self.encoding.task_positions:  # the head reads its own 0 .. L - 1, never a task's positions
            raise ConfigError("encoding", cfg.encoding, "an encoding on the model's own positions (the retrieval "
                                                        "head takes no task positions; see registered())")
        self.W_E = nn.Parameter(torch.randn(m, D))
        bound = 1 / math.sqrt(D)
        self.W_Q = nn.Parameter(torch.empty(h * d, D).uniform_(-bound, bound))
        self.W_K = nn.Parameter(torch.empty(h * d, D).uniform_(-bound, bound))
        self.W_V = nn.Parameter(torch.empty(h * d, D).uniform_(-bound, bound))
        self.U = nn.Parameter(torch.empty(m, h * d).uniform_(-1 / math.sqrt(h * d), 1 / math.sqrt(h * d)))

    def layer_encoding(self, layer: int = 0) -> PositionalEncoding:
        """The encoding of layer ``layer``: the one layer's, as a Transformer's is per layer."""
        if layer != 0:
            raise ConfigError("layer", layer, "0 (the retrieval head has one layer)")
        return self.encoding

    def check_length(self, L: int) -> None:
        """Raise ConfigError before any work if length L cannot be encoded."""
        if L > self.cfg.max_len:
            raise ConfigError("length", L, f"at most max_len={self.cfg.max_len}")
        self.encoding.check_positions(L - 1)

    def _heads(self, x: Tensor, W: Tensor) -> Tensor:
        """[b, s, D] -> [b, h, s, d]."""
        b, s, _ = x.shape
        return (x @ W.T).view(b, s, self.cfg.n_heads, self.d_head).transpose(1, 2)

    def forward(self, tokens: Tensor, lengths: Tensor | None = None, positions: Tensor | None = None,
                return_intermediates: bool = False):
        """tokens [b, s] (right-padded past ``lengths`` [b]) -> logits [b, m]."""
        b, s = tokens.shape
        if positions is None:
            positions = torch.arange(s, device=tokens.device)
        if lengths is None:
            lengths = torch.full((b,), s, device=tokens.device)
        query = (lengths - 1)[:, None]  # [b, 1]
        z = self.encoding.embed(F.embedding(tokens, self.W_E), positions)  # [b, s, D]
        z_q = z.gather(1, query[..., None].expand(b, 1, z.shape[-1]))  # [b, 1, D]
        pos = positions.expand(b, s)
        q_pos = pos.gather(1, query)  # [b, 1]
        q, k, v = self._heads(z_q, self.W_Q), self._heads(z, self.W_K), self._heads(z, self.W_V)
        mask = build_mask(1, s, key_padding=torch.arange(s, device=tokens.device) < lengths[:, None])
        att = attention(q, k, v, self.encoding, q_pos, positions, mask=mask, kind=self.cfg.attention,
                        temperature=self.cfg.temperature, need_weights=return_intermediates, stream=z)
        o = att.out.reshape(b, -1)  # [b, h d]
        logits = o @ self.U.T  # [b, m]
        if not return_intermediates:
            return logits
        # need_weights: attention took the explicit path, which returns all four
        assert att.attn_scores is not None and att.pattern is not None
        assert att.rot_q is not None and att.rot_k is not None
        layer = LayerIntermediates(attn_scores=att.attn_scores, pattern=att.pattern, q=q, k=k, rot_q=att.rot_q,
                                   rot_k=att.rot_k, v=v, resid_pre=z, resid_post=o[:, None, :])
        return logits, Intermediates(embed=z, positions=positions, layers=[layer])

    # ------------------------------------------------------------------ fast path for training

    def grid_tables(self, T: int, q_start: Tensor, n_query: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Scores and values of every (token, position) pair with key positions 0 .. T-1.

        ``embed`` adds a position vector p_t, so z(a, t) = W_E[a] + p_t and each projection
        splits into a token part and a position part; only ``rotate_qk`` and ``score_bias`` see
        the (token, position) grid, of m * T keys and m * n_query queries (positions
        q_start .. q_start + n_query - 1; ``q_start`` is a tensor so it may differ per member).

        Returns scores [h, m * n_query, m * T] before the temperature (query (a, n) at row
        a * n_query + n - q_start, key (c, t) at column c * T + t), the values of tokens
        [h, m, d] and the values of positions [h, T, d] (None when ``embed`` adds nothing).
        """
        m, D, dev = self.cfg.vocab_size, self.cfg.d_model, self.W_E.device
        h, d = self.cfg.n_heads, self.d_head
        t = torch.arange(T, device=dev)
        n = q_start + torch.arange(n_query, device=dev)  # [P] query positions
        x = self.W_E[None]  # [1, m, D]
        k = self._heads(x, self.W_K)[..., None, :]  # [1, h, m, 1, d]
        q = self._heads(x, self.W_Q)[..., None, :]
        k_pos, q_pos = t.repeat(m), n.repeat(m)  # [g], [gq]
        v_pos = None
        if self.encoding.uses("embed"):  # otherwise p_t = 0 and three projections drop out
            p_k = self.encoding.embed(torch.zeros(1, T, D, device=dev), t)  # [1, T, D]
            p_q = self.encoding.embed(torch.zeros(1, n_query, D, device=dev), n)  # [1, P, D]
            k = k + self._heads(p_k, self.W_K)[:, :, None]  # [1, h, m, T, d]
            q = q + self._heads(p_q, self.W_Q)[:, :, None]  # [1, h, m, P, d]
            v_pos = self._heads(p_k, self.W_V)[0]
        if self.encoding.broadcasts_positions and not self.encoding.uses("embed"):
            # each token's q and k meet the P | T rotors by broadcasting: no [m, T, d] copy first
            q, k = self.encoding.rotate_qk(q, k, n, t)  # [1, h, m, P | T, d]
            q, k = q.reshape(1, h, -1, d), k.reshape(1, h, -1, d)
        else:
            q, k = (q.expand(-1, -1, -1, n_query, -1).reshape(1, h, -1, d),
                    k.expand(-1, -1, -1, T, -1).reshape(1, h, -1, d))
            q, k = self.encoding.rotate_qk(q, k, q_pos, k_pos)  # [1, h, g., d]
        scores = (q / math.sqrt(self.d_head)) @ k.transpose(-1, -2)  # [1, h, gq, g]
        bias = self.encoding.score_bias(q, k, q_pos, k_pos)
        if bias is not None:
            scores = scores + bias
        return scores[0], self._heads(x, self.W_V)[0], v_pos

    def loss(self, batch: Batch) -> Tensor:
        """Mean cross-entropy over the loss mask, by the grid fast path: the trainer's objective.

        The batch's query hint (``first_query``, ``n_queries``) bounds the query positions the
        grid must hold: one length per batch needs only the m queries at L - 1.
        """
        q_start = 0 if batch.first_query is None else batch.first_query
        return masked_cross_entropy(self.forward_table(batch.tokens, batch.lengths, q_start, batch.n_queries), batch)

    def forward_table(self, tokens: Tensor, lengths: Tensor, q_start: Tensor | int = 0,
                      n_query: int | None = None) -> Tensor:
        """The same logits as :meth:`forward` (default positions), via grid tables.

        tokens [b, T] right-padded; lengths [b], every L - 1 in q_start .. q_start + n_query - 1
        (by default every position). Training with one length per batch passes
        ``q_start = L - 1, n_query = 1`` and the grid holds only m queries.
        """
        return self.attend(tokens, lengths, q_start, n_query)[0]

    def attend(self, tokens: Tensor, lengths: Tensor, q_start: Tensor | int = 0,
               n_query: int | None = None) -> tuple[Tensor, Tensor]:
        """Logits [b, m] and the query's attention weights [h, b, T], by the grid fast path.

        Encodings with a value bias (Shaw), and contextual ones (CoPE, the forget gate: a pair's bias
        depends on the tokens between query and key, which no (token, position) grid holds), fall
        back to the direct forward.
        """
        if self.encoding.uses("value_bias") or self.encoding.contextual:
            logits, inter = self.forward(tokens, lengths, return_intermediates=True)
            return logits, inter.layers[0].pattern[:, :, 0, :].transpose(0, 1)
        b, T = tokens.shape
        h, m = self.cfg.n_heads, self.cfg.vocab_size
        # (a tensor q_start gives a 0-dim tensor here, which serves wherever an int count does)
        n_query = cast(int, T - q_start) if n_query is None else n_query
        q_start = torch.as_tensor(q_start, device=tokens.device)
        scores, v_tok, v_pos = self.grid_tables(T, q_start, n_query)  # [h, gq, g], [h, m, d], [h, T, d]
        t = torch.arange(T, device=tokens.device)
        last = (lengths - 1)[:, None]  # [b, 1]
        q_row = tokens.gather(1, last) * n_query + last - q_start  # [b, 1]
        pair = q_row * (m * T) + tokens * T + t  # [b, T] flat index into scores[h]
        logits = scores.flatten(1).gather(1, pair.flatten().expand(h, -1)).view(h, b, T)
        keep = t < lengths[:, None]  # [b, T]
        weights = attention_weights(logits / self.cfg.temperature, keep, self.cfg.attention)  # [h, b, T]
        by_token = torch.zeros(h, b, m, dtype=weights.dtype, device=weights.device)
        by_token = by_token.scatter_add(2, tokens.expand(h, b, T), weights)  # [h, b, m]
        # U o = sum_h U_h (by_token_h v_tok_h + w_h v_pos_h): read values out through U first,
        # so the batch meets [m, m] and [T, m] tables instead of [m, d] and [T, d].
        U = self.U.view(m, h, -1).transpose(0, 1)  # [h, m, d]
        out = by_token @ (v_tok @ U.transpose(1, 2))  # [h, b, m] via [h, m, m]
        if v_pos is not None:
            out = out + weights @ (v_pos @ U.transpose(1, 2))  # via [h, T, m]
        return out.sum(0), weights  # [b, m], [h, b, T]

    # ------------------------------------------------------------------ probes

    def collect(self, batch: Batch) -> Intermediates:
        """What the probes read about ``batch``: the direct forward's intermediates under no_grad,
        with its ``logits`` [b, m] and the batch's ``lengths`` (the query of sequence b is at
        ``lengths[b] - 1``; one query row, ``i = 1``)."""
        with torch.no_grad():
            logits, inter = self.forward(batch.tokens, batch.lengths, return_intermediates=True)
        inter.logits, inter.lengths = logits, batch.lengths
        return inter
