"""Position-wise loss of a causal Transformer LM on one window of up to 10^6 tokens, in bounded memory.

    loss_t = - log p(c_{t+1} | c_0 .. c_t),    t = 0 .. L - 1         (one window of L + 1 tokens)

exactly as the model's own forward computes it, but layer by layer and chunk by chunk, so that
nothing of size L x L (and, above ``memory_limit``, nothing of size L x D) is ever held:

    x = embed(W_E[c_t], t)                                 the residual stream, [n, D] (n = L, +1 with BOS)
    for each layer:
        pass A, per chunk of rows:  K_t, V_t = W_K a_t, W_V a_t  (a = LN_attn x), stored as [n, h d]
        pass B, per query chunk I:  stream the causal key chunks J <= I with an online softmax
            l_ij = (rot(q_i, i) . rot(k_j, j) / sqrt(d) + bias(i, j)) / tau       [h, |I|, |J|]
            M'   = max(M, max_j l_ij);  Z' = Z e^{M - M'} + sum_j e^{l_ij - M'}
            O'   = O e^{M - M'} + sum_j e^{l_ij - M'} V_j
            x_I  = x_I + W_O (O / Z);  x_I = x_I + MLP(LN_mlp x_I)               (written in place)
    loss_t = CE(U LN_final x_t, c_{t+1}), read out chunk by chunk into position buckets

Writing x_I in place is safe: pass A has already read every row's keys and values of this
layer, and pass B reads x only at its own query rows. The stream, K and V live in tensors on
``device`` when 3 n D floats fit ``memory_limit`` bytes, else in three files of a temporary
directory read and written with pread/pwrite (not memory-mapped: mapped pages would count as
resident memory), so resident memory is O(chunk^2 h + chunk D) whatever L is. The rotary and
bias hooks are called per (query chunk, key chunk) pair at absolute positions, and ``embed`` per
chunk, so the result is the model's own up to float rounding of the reordered sums.

Refused with one ConfigError before any work (:func:`check_streamable`): a non-causal model,
linear attention, encodings whose hooks read the sequence's length (``kv_cache`` False: dynamic
NTK / YaRN-style schedules, an interpolated or rescaled learned table) and value-bias encodings
(Shaw); a learned table shorter than the window fails the model's own ``check_length``. Supported:
BOS, sliding windows, energy-gated attention (the gate's running mean of e^2 is carried
across chunks in pass A) and per-layer layouts (each layer streams with its own encoding,
window, chunk, temperature and qk-norm, all read from the model: ``layer_encoding(l)`` and the
block's own fields; every layer's encoding is checked as above).

Cost: exact causal attention, ~ n_layers (2 n^2 D) multiply-adds for the scores and values plus
the per-token MLP, i.e. ~1e3 L^2 flops for the 4-layer width-128 LM: meant for a GPU at 10^6.

Notation: n internal positions, c chunk, h head, d head dim, D d_model, m vocab.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.errors import ConfigError, require_positive_int

CHUNK = 512  # query and key rows per block: memory ~ h chunk^2 floats for the scores (512: fastest on CPU)
MEMORY_LIMIT = 256 << 20  # bytes: the stream, K and V stay in tensors when 3 n D floats fit this


def check_streamable(cfg, encoding=None) -> None:
    """Raise one ConfigError if a Transformer of config ``cfg`` (whose built encoding, or list of
    every distinct encoding with a layout, may be given; else short ones are built from the config
    to ask) cannot be evaluated streamed."""
    from poslab.positional import build_encoding

    if not cfg.causal:
        raise ConfigError("causal", cfg.causal, "True (the streamed position-wise loss is for causal LMs)")
    if cfg.attention != "softmax":
        raise ConfigError("attention", cfg.attention, "softmax (the streamed position-wise loss)")
    if encoding is None:
        names = [(cfg.encoding, cfg.encoding_options)] + [(s.encoding, s.encoding_options) for s in cfg.layer_specs()]
        encoding = [build_encoding(name, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head,
                                   max_len=min(cfg.max_len, 1024), d_head_from="d_model", **options)
                    for name, options in [n for i, n in enumerate(names) if n not in names[:i]]]
    for enc in encoding if isinstance(encoding, list) else [encoding]:
        if enc.uses("value_bias") or not enc.kv_cache:
            field = "encoding" if cfg.layout is None else "layout"
            value = cfg.layout if cfg.layout is not None else (
                cfg.encoding if not cfg.encoding_options else f"{cfg.encoding} {cfg.encoding_options}")
            raise ConfigError(field, value,
                              "an encoding whose hooks see positions one at a time: no value bias (Shaw) and no "
                              "length-dependent schedule (dynamic NTK, interpolated learned table); streamed "
                              "position-wise loss")


# ----------------------------------------------------------------------------- buckets

def log_buckets(L: int) -> list[tuple[int, int]]:
    """[start, end) buckets 0, 1, [2, 4), [4, 8), ... out to L (the last one cut at L)."""
    out, lo = [(0, 1)], 1
    while lo < L:
        out.append((lo, min(2 * lo, L)))
        lo *= 2
    return out


def linear_buckets(L: int, width: int) -> list[tuple[int, int]]:
    """[start, end) buckets of ``width`` positions (e.g. width = L0 / 4)."""
    return [(lo, min(lo + width, L)) for lo in range(0, L, width)]


@dataclass
class PositionwiseLoss:
    """Per-bucket sums of the cross-entropy over one window (and, on request, every position's)."""

    length: int  # L, the number of predicted positions
    buckets: list[tuple[int, int]]  # [start, end) position ranges
    sums: np.ndarray  # [len(buckets)] float64
    counts: np.ndarray  # [len(buckets)] int64
    total: float  # sum over every position
    correct: int  # greedy next-token hits
    per_position: np.ndarray | None = None  # [L] float64, when asked for
    storage: str = "memory"  # "memory" | "disk"

    @property
    def loss(self) -> float:
        return self.total / self.length

    @property
    def accuracy(self) -> float:
        return self.correct / self.length

    def rows(self) -> list[dict]:
        return [dict(bucket_start=lo, bucket_end=hi - 1, loss=float(s / c), positions=int(c))
                for (lo, hi), s, c in zip(self.buckets, self.sums, self.counts, strict=False) if c]


# ----------------------------------------------------------------------------- storage

class _Rows:
    """An [n, w] float32 array as a tensor on ``device`` or a file read and written by row ranges."""

    data: Tensor | None  # the tensor, or None on disk
    fd: int | None  # the scratch file's descriptor, or None in memory

    def __init__(self, n: int, w: int, device, directory: str | None):
        self.w, self.device = w, device
        if directory is None:
            self.data, self.fd = torch.zeros(n, w, device=device), None
        else:
            fd, path = tempfile.mkstemp(dir=directory, suffix=".f32")
            os.unlink(path)  # the file lives until its descriptor is closed
            os.ftruncate(fd, n * w * 4)
            self.data, self.fd = None, fd

    def read(self, a: int, b: int) -> Tensor:  # [b - a, w]
        if self.fd is None:
            assert self.data is not None  # in memory
            return self.data[a:b]
        out = np.empty((b - a, self.w), dtype=np.float32)
        # an ndarray is a buffer; numpy's stubs declare __buffer__ only for Python >= 3.12
        if os.preadv(self.fd, [out], a * self.w * 4) != out.nbytes:  # type: ignore[list-item]
            raise OSError(f"short read from the streamed evaluation's scratch file at row {a}")
        return torch.from_numpy(out).to(self.device)

    def write(self, a: int, value: Tensor) -> None:
        if self.fd is None:
            assert self.data is not None  # in memory
            self.data[a:a + value.shape[0]] = value
        else:  # (an ndarray is a buffer, see read)
            os.pwrite(self.fd, value.detach().to("cpu", torch.float32).contiguous().numpy(),  # type: ignore[arg-type]
                      a * self.w * 4)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ----------------------------------------------------------------------------- the evaluation

@torch.no_grad()
def positionwise_loss(model, tokens: Tensor, *, chunk: int = CHUNK, key_chunk: int | None = None,
                      memory_limit: int = MEMORY_LIMIT, workdir: str | None = None, device=None,
                      buckets: list[tuple[int, int]] | None = None, per_position: bool = False) -> PositionwiseLoss:
    """Cross-entropy of ``model`` (a causal :class:`~poslab.models.transformer.Transformer`) at every
    position of one window: ``tokens`` [L + 1] (inputs tokens[:L], targets tokens[1:]).

    ``chunk`` query rows (and ``key_chunk`` key rows, default ``chunk``) per block; the stream and
    the keys/values go to files under ``workdir`` (default: the system's temporary directory) when
    3 n D float32 exceed ``memory_limit`` bytes (0: always files). ``buckets`` default to
    :func:`log_buckets`; ``per_position`` also returns every position's loss (O(L) memory).
    """
    cfg = model.cfg
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 1 or tokens.numel() < 2 or tokens.is_floating_point():
        raise ConfigError("tokens", tuple(tokens.shape), "a 1-D integer tensor of L + 1 >= 2 token ids")
    require_positive_int("chunk", chunk)
    key_chunk = key_chunk or chunk
    require_positive_int("key_chunk", key_chunk)
    check_streamable(cfg, model.encodings())
    L = tokens.numel() - 1
    model.check_length(L)
    device = torch.device(device or next(model.parameters()).device)
    buckets = buckets or log_buckets(L)
    bos = int(cfg.bos)
    n, D, h, d = L + bos, cfg.d_model, cfg.n_heads, cfg.d_head
    disk = 3 * n * D * 4 > memory_limit
    directory = tempfile.mkdtemp(prefix="poslab-lm-stream-", dir=workdir) if disk else None
    x, K, V = (_Rows(n, D, device, directory), _Rows(n, h * d, device, directory),
               _Rows(n, h * d, device, directory))
    G = _Rows(n, h, device, directory) if cfg.energy_gate and cfg.energy_gate.renormalize else None
    enc = model.encoding
    try:
        for a in range(0, n, chunk):  # the embedded stream: BOS at internal index 0, position 0
            b = min(n, a + chunk)
            ids = tokens[max(0, a - bos):b - bos].to(device)
            z = F.embedding(ids, model.W_E)[None]  # [1, c, D]
            if bos and a == 0:
                z = torch.cat((model.W_bos[None, None], z), 1)
            x.write(a, enc.embed(z, torch.arange(a, b, device=device))[0])
        for i, block in enumerate(model.layers):
            _layer(block, model.layer_encoding(i), x, K, V, G, n, chunk, key_chunk, device)
        return _readout(model, x, tokens, L, bos, chunk, buckets, per_position, device,
                        storage="disk" if disk else "memory")
    finally:
        for rows in (x, K, V, G):
            if rows is not None:
                rows.close()
        if directory is not None:
            os.rmdir(directory)


def _layer(block, enc, x: _Rows, K: _Rows, V: _Rows, G: _Rows | None, n: int, chunk: int, key_chunk: int,
           device) -> None:
    """One layer, in place on the stream ``x``; K, V (and G, log g with renormalized gating) are scratch.
    ``enc`` is this layer's encoding; its window, chunk and temperature are the block's."""
    _keys_values(block, x, K, V, G, n, key_chunk)
    # pass B: each query chunk against its causal (and windowed) key chunks, online softmax
    for i0 in range(0, n, chunk):
        i1 = min(n, i0 + chunk)
        resid = x.read(i0, i1)  # [c, D]
        out = _attend(block, enc, resid, (K, V, G), (i0, i1), key_chunk, device)  # [h, c, d]
        x.write(i0, block.mix(resid[None], out[None])[0])


def _keys_values(block, x: _Rows, K: _Rows, V: _Rows, G: _Rows | None, n: int, key_chunk: int) -> None:
    """Pass A: this layer's keys and values (and, with energy gating, each key's gate) for every row."""
    cfg = block.cfg
    h, d = cfg.n_heads, cfg.d_head
    carry = None  # running sum of e^2 over the rows so far, [1, h | 1]
    for a in range(0, n, key_chunk):
        b = min(n, a + key_chunk)
        ln = block.ln_attn(x.read(a, b))[None]  # [1, c, D]
        k, v = block.keys_values(ln)  # [1, h, c, d]
        if cfg.energy_gate:
            _, g, carry = block.gate(ln, start=a, carry=carry)  # [1, h, c]
            if G is not None:  # renormalized gating: log g joins the scores
                G.write(a, g[0].T.log())  # [c, h]
            else:
                v = v * g[..., None]
        K.write(a, k[0].transpose(0, 1).reshape(b - a, h * d))
        V.write(a, v[0].transpose(0, 1).reshape(b - a, h * d))


def _attend(block, enc, resid: Tensor, kvg: tuple[_Rows, _Rows, _Rows | None], rows: tuple[int, int],
            key_chunk: int, device) -> Tensor:
    """The attention output of query rows ``rows`` (i0, i1; ``resid`` their stream), [h, c, d]: an online
    softmax over their causal (windowed, chunked) key chunks of K, V (G: log gates)."""
    i0, i1 = rows
    h, d = block.cfg.n_heads, block.cfg.d_head
    q = block.queries(block.ln_attn(resid)[None])  # [1, h, c, d]
    qpos = torch.arange(i0, i1, device=device)
    M = torch.full((h, i1 - i0), -math.inf, device=device)  # running max, [h, c]
    Z = torch.zeros(h, i1 - i0, device=device)  # normaliser
    acc = torch.zeros(h, i1 - i0, d, device=device)  # value sum O
    for j0 in range(_first_key(block, i0, key_chunk), i1, key_chunk):
        j1 = min(j0 + key_chunk, i1)
        s, v = _block_scores(block, enc, q, qpos, kvg, (j0, j1), rows)
        M_new = torch.maximum(M, s.amax(-1))
        safe = torch.where(torch.isinf(M_new), torch.zeros_like(M_new), M_new)  # rows with no key yet
        p = s.sub_(safe[..., None]).exp_()  # [h, c, c'], in place: the block is the largest buffer
        rescale = torch.exp(M - safe)
        Z = Z * rescale + p.sum(-1)
        acc = acc * rescale[..., None] + p @ v
        M = M_new
    return acc / Z[..., None]


def _first_key(block, i0: int, key_chunk: int) -> int:
    """The first key row the query block from ``i0`` can see (its window's, its chunk's), down to a key chunk."""
    first = 0 if block.window is None else max(0, i0 - block.window + 1)
    if block.chunk is not None:
        first = max(first, i0 // block.chunk * block.chunk)  # the query block's first chunk starts there
    return first // key_chunk * key_chunk


def _block_scores(block, enc, q: Tensor, qpos: Tensor, kvg: tuple[_Rows, _Rows, _Rows | None],
                  keys: tuple[int, int], rows: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """The scores [h, c, c'] of the queries ``q`` on key rows ``keys`` (j0, j1), masked where the block
    crosses the causal, window or chunk edge, and those keys' values [h, c', d]."""
    (K, V, G), (j0, j1), (i0, i1) = kvg, keys, rows
    h, d = block.cfg.n_heads, block.cfg.d_head
    window, chunk_size = block.window, block.chunk
    k = K.read(j0, j1).view(-1, h, d).transpose(0, 1)[None]  # [1, h, c', d]
    v = V.read(j0, j1).view(-1, h, d).transpose(0, 1)  # [h, c', d]
    kpos = torch.arange(j0, j1, device=qpos.device)
    rq, rk = enc.rotate_qk(q, k, qpos, kpos)
    s = (rq / math.sqrt(d)) @ rk.transpose(-1, -2)  # [1, h, c, c']
    bias = enc.score_bias(rq, rk, qpos, kpos)
    if bias is not None:
        s += bias
    if block.temperature != 1:
        s /= block.temperature
    s = s[0]  # [h, c, c']
    if G is not None:
        s = s + G.read(j0, j1).T[:, None, :]  # + log g_hj
    if (j1 - 1 > i0 or (window is not None and i1 - 1 - j0 >= window)
            or (chunk_size is not None and j0 // chunk_size != (i1 - 1) // chunk_size)):  # a block on an edge
        s = s.masked_fill(~_keep(qpos, kpos, window, chunk_size), -math.inf)
    return s, v


def _keep(qpos: Tensor, kpos: Tensor, window: int | None, chunk_size: int | None) -> Tensor:
    """[c, c'] the keys each query sees: causal, within its window, in its chunk."""
    keep = kpos[None, :] <= qpos[:, None]  # [c, c']
    if window is not None:
        keep = keep & (qpos[:, None] - kpos[None, :] < window)
    if chunk_size is not None:
        keep = keep & (qpos[:, None] // chunk_size == kpos[None, :] // chunk_size)
    return keep


def _readout(model, x: _Rows, tokens: Tensor, L: int, bos: int, chunk: int, buckets, per_position: bool,
             device, storage: str) -> PositionwiseLoss:
    starts = np.array([lo for lo, _ in buckets])
    ends = np.array([hi for _, hi in buckets])
    sums, counts = np.zeros(len(buckets)), np.zeros(len(buckets), dtype=np.int64)
    every = np.zeros(L) if per_position else None
    total, correct = 0.0, 0
    for a in range(0, L, chunk):
        b = min(L, a + chunk)
        logits = model.ln_final(x.read(a + bos, b + bos)) @ model.U.T  # [c, m]
        target = tokens[a + 1:b + 1].to(device)
        ce = F.cross_entropy(logits, target, reduction="none").double().cpu().numpy()  # [c]
        total += float(ce.sum())
        correct += int((logits.argmax(-1) == target).sum())
        if every is not None:
            every[a:b] = ce
        csum = np.concatenate(([0.0], np.cumsum(ce)))
        lo, hi = np.clip(starts, a, b), np.clip(ends, a, b)  # each bucket's overlap with this chunk
        sums += csum[hi - a] - csum[lo - a]
        counts += hi - lo
    return PositionwiseLoss(length=L, buckets=list(buckets), sums=sums, counts=counts, total=total, correct=correct,
                            per_position=every, storage=storage)


# ----------------------------------------------------------------------------- the text

def text_window(corpus: str | None, L: int, field: str = "length") -> tuple[Tensor, str]:
    """The first L + 1 characters (L predicted positions) of the validation split of ``corpus``
    (None: TinyShakespeare) when it holds them, else of the whole corpus, whose start is training
    text: then the loss measures positional extrapolation, not held-out generalization.
    Returns the ids [L + 1] and where they come from. A corpus shorter than L + 1 characters is
    refused with one ConfigError naming it and its size."""
    from poslab.tasks.text import load_corpus

    require_positive_int(field, L)
    data = load_corpus(corpus)
    if L + 1 <= data.size("val"):
        return data.ids[data.bounds("val")][:L + 1], "validation split"
    if L + 1 <= len(data.text):
        return data.ids[:L + 1], "corpus start (includes training text)"
    raise ConfigError(field, L, f"at most {len(data.text) - 1}: one window of L + 1 characters of the corpus "
                                f"{data.where} ({len(data.text):,} characters)")
