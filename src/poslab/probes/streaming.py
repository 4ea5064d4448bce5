"""Million-token evaluation of a trained retrieval head in bounded memory.

The query sits at n = L - 1 and attends to keys t = 0 .. L - 1. Keys stream in chunks of
``key_chunk`` positions and an online softmax (running maximum M, normaliser Z, value sum O)
folds each chunk in:

    l_t   = (rot(q, n) . rot(k_t, t) / sqrt(d) + bias(n, t)) / tau          (one chunk of t)
    M'    = max(M, max_t l_t)
    Z'    = Z e^{M - M'} + sum_t e^{l_t - M'}
    O'    = O e^{M - M'} + sum_t e^{l_t - M'} (U_h v_t)                      (values read out through U)
    logits = sum_h O_h / Z_h,   log Z = M + log Z   (the log-normaliser)

A second pass recomputes each chunk's l_t and reads the exact weights a_t = e^{l_t - log Z}: their
mean over sequences gives the peak (height, position, offset) and a* = a_{n-K} chunk by chunk.
Sequences are drawn chunk by chunk too (:class:`StreamedTokens`), so nothing of size L x batch
or L x d is ever held: memory is O(batch x key_chunk x d), whatever L is.

Exact against the unchunked forward wherever both fit (same tokens: :class:`TensorTokens`), up to
float rounding of the reordered sums. Encodings whose rotation of one position depends on the
other positions in the call (length-dependent RoPE schedules) and value-bias encodings (Shaw) are
refused. Notation: b batch, h head, c chunk, d head dim, D d_model, m vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.errors import ConfigError

KEY_CHUNK = 4096


class TensorTokens:
    """Token source over a materialised [b, L] tensor (for exactness tests at small L)."""

    def __init__(self, tokens: Tensor):
        self.tokens = tokens

    def __call__(self, start: int, stop: int) -> Tensor:
        return self.tokens[:, start:stop]


@dataclass(frozen=True)
class StreamedTokens:
    """b i.i.d. uniform sequences over m tokens, drawn chunk by chunk and reproducibly: chunk j of
    key positions [j c, (j+1) c) comes from its own generator seeded by (seed, L, j)."""

    b: int
    m: int
    L: int
    seed: int = 0
    chunk: int = KEY_CHUNK

    def _chunk(self, j: int) -> Tensor:
        g = torch.Generator().manual_seed(hash((self.seed, self.L, j)) & (2**62 - 1))
        size = min(self.chunk, self.L - j * self.chunk)
        return torch.randint(self.m, (self.b, size), generator=g)

    def __call__(self, start: int, stop: int) -> Tensor:
        first, last = start // self.chunk, (stop - 1) // self.chunk
        parts = torch.cat([self._chunk(j) for j in range(first, last + 1)], 1)
        return parts[:, start - first * self.chunk: stop - first * self.chunk]


def _check(model, L: int) -> None:
    enc = model.encoding
    enc.check_positions(L - 1)  # a learned table too short: its own ConfigError
    if enc.uses("value_bias") or getattr(enc, "length_dependent", False):
        raise ConfigError("encoding", model.cfg.encoding, "an encoding without value bias and whose rotation does "
                                                          "not depend on the sequence length (streamed evaluation)")
    if model.cfg.attention != "softmax":
        raise ConfigError("attention", model.cfg.attention, "softmax (streamed evaluation)")


def _query(model, tokens, L: int, device) -> Tensor:
    """The projected query at n = L - 1, [b, h, 1, d] (before rotation)."""
    n = torch.tensor([L - 1], device=device)
    z = model.encoding.embed(F.embedding(tokens(L - 1, L).to(device), model.W_E), n)  # [b, 1, D]
    return model._heads(z, model.W_Q)


def _chunk_logits(model, q: Tensor, tok: Tensor, start: int, L: int) -> tuple[Tensor, Tensor]:
    """Logits l_t [h, b, c] of one key chunk and its values read out through U, [h, b, c, m]."""
    dev = q.device
    t = torch.arange(start, start + tok.shape[1], device=dev)
    h, m = model.cfg.n_heads, model.cfg.vocab_size
    U = model.U.view(m, h, -1).transpose(0, 1)  # [h, m, d]
    tok = tok.to(dev)
    if not model.encoding.uses("embed"):  # z_t = W_E[s_t]: keys and values are token tables, gathered
        x = model.W_E[None]  # [1, m, D]
        k = model._heads(x, model.W_K)[0][:, tok].transpose(0, 1)  # [b, h, c, d]
        vU = (model._heads(x, model.W_V)[0] @ U.transpose(1, 2))[:, tok]  # [h, b, c, m]
    else:
        z = model.encoding.embed(F.embedding(tok, model.W_E), t)  # [b, c, D]
        k, v = model._heads(z, model.W_K), model._heads(z, model.W_V)  # [b, h, c, d]
        vU = v.transpose(0, 1) @ U.transpose(1, 2)[:, None]  # [h, b, c, m]
    n = torch.tensor([L - 1], device=dev)
    rq, rk = model.encoding.rotate_qk(q, k, n, t)
    scores = rq @ rk.transpose(-1, -2) / math.sqrt(model.cfg.d_head)  # [b, h, 1, c]
    bias = model.encoding.score_bias(rq, rk, n, t)
    if bias is not None:
        scores = scores + bias
    logits = (scores / model.cfg.temperature)[:, :, 0].transpose(0, 1)  # [h, b, c]
    return logits, vU


@torch.no_grad()
def stream_attend(model, tokens, L: int, *, key_chunk: int = KEY_CHUNK, device="cpu") -> tuple[Tensor, Tensor]:
    """Pass 1: logits [b, m] and the log-normaliser log Z [h, b] of the query at L - 1."""
    _check(model, L)
    q = _query(model, tokens, L, device)
    h = model.cfg.n_heads
    M = Z = acc = None
    for start in range(0, L, key_chunk):
        logit, vU = _chunk_logits(model, q, tokens(start, min(L, start + key_chunk)), start, L)
        top = logit.amax(-1)  # [h, b]
        M_new = top if M is None else torch.maximum(M, top)
        e = torch.exp(logit - M_new[..., None])  # [h, b, c]
        Zc, Oc = e.sum(-1), (e[..., None] * vU).sum(-2)  # [h, b], [h, b, m]
        if M is None:
            Z, acc = Zc, Oc
        else:
            assert Z is not None and acc is not None  # set with M
            scale = torch.exp(M - M_new)
            Z, acc = Z * scale + Zc, acc * scale[..., None] + Oc
        M = M_new
    assert M is not None and Z is not None and acc is not None  # L >= 1: one key chunk at least
    logits = (acc / Z[..., None]).sum(0)  # [b, m]
    assert logits.shape[0] == q.shape[0] and M.shape[0] == h
    return logits, M + torch.log(Z)


@torch.no_grad()
def stream_length_row(model, tokens, L: int, K: int, *, key_chunk: int = KEY_CHUNK, device="cpu",
                      head: int = 0, mass_below: int | None = None) -> dict:
    """Accuracy (target = the token K before the query), peak offset/position/height and a* of
    ``head``'s mean attention, at length L in O(b x key_chunk x d) memory (two passes); with
    ``mass_below`` = P also ``in_range_mass``, the mean attention on keys t < P."""
    if not 0 < K < L:
        raise ConfigError("K", K, f"an integer in [1, {L - 1}] at L={L}")
    logits, lse = stream_attend(model, tokens, L, key_chunk=key_chunk, device=device)
    target = tokens(L - 1 - K, L - K)[:, 0].to(device)
    accuracy = float((logits.argmax(-1) == target).double().mean())
    q = _query(model, tokens, L, device)
    best, where, a_star, mass = -1.0, 0, float("nan"), 0.0
    for start in range(0, L, key_chunk):
        logit, _ = _chunk_logits(model, q, tokens(start, min(L, start + key_chunk)), start, L)
        mean = torch.exp(logit[head] - lse[head][:, None]).double().mean(0)  # [c]
        i = int(mean.argmax())
        if float(mean[i]) > best:
            best, where = float(mean[i]), start + i
        if mass_below is not None:
            mass += float(mean[: max(0, mass_below - start)].sum())
        if start <= L - 1 - K < start + mean.shape[0]:
            a_star = float(mean[L - 1 - K - start])
    return dict(accuracy=accuracy, peak_offset=where - (L - 1), peak_position=where, peak_height=best,
                a_star=a_star, **({} if mass_below is None else dict(in_range_mass=mass)))
