"""Character-level text: at every position, predict the next character of a real corpus.

The language-modelling task of the survey (nanoGPT's ``shakespeare_char``): a window of L
consecutive characters c_s .. c_{s+L-1} of the corpus is the input, and at every position t the
target is the character that follows it in the corpus,

    y_t = c_{s+t+1}

so, unlike the synthetic tasks, targets come from the text, not from a rule. Characters are
numbered by their rank among the sorted distinct characters of the whole corpus (TinyShakespeare:
65 of them, "\\n" -> 0, " " -> 1, ..., "z" -> 64). The first 90% of the characters are the
training split and the last 10% the validation split, as nanoGPT splits them.

The default corpus is TinyShakespeare (1,115,394 characters, from Karpathy's char-rnn), shipped
gzip-compressed inside poslab and checked against its sha256 when read; ``corpus=PATH`` takes any
UTF-8 text file. A corpus is read once per process (cached by path, size and modification time),
so building the task again is cheap, and the task holds only the path: it pickles to a worker
process as two short strings.

Notation: b batch, s sequence index (padded length), L a window's length, n a split's length.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.resources
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.errors import ConfigError, check_choice
from poslab.tasks.base import Batch, Length, _is_int, length_range

SPLITS = ("train", "val")
TRAIN_FRACTION = 0.9  # the first 90% of the characters train, the rest validate (nanoGPT)
TINYSHAKESPEARE = "tinyshakespeare.txt.gz"  # in poslab/data/
TINYSHAKESPEARE_CHARS = 1_115_394
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"

_ALLOWED = "a non-empty UTF-8 text file, or None for the packaged TinyShakespeare"


@dataclass(frozen=True, kw_only=True)
class CharText:
    """Next-character prediction over windows of a corpus: targets[t] = the character after t.

    Worked examples (TinyShakespeare, which opens with "First Citizen:"; "F" -> 18, "i" -> 47,
    "r" -> 56, "s" -> 57, "t" -> 58, " " -> 1, "C" -> 15)::

        L = 6, window at s = 0     text     F  i  r  s  t  ␣       (␣ = space)
                                   tokens  18 47 56 57 58  1
                                   targets 47 56 57 58  1 15      i r s t ␣ C; the last
                                                                  target is read past the window
        length (4, 6), s = 6,      text     C  i  t  i  .  .      (two pad slots, token 0)
        this sequence's L = 4      targets  i  t  i  z  .  .      (. = masked)
        windows(5) over a split    tokens   a b c d e | f g h i j
        "abcdefghijkl"             targets  b c d e f | g h i j k  (two windows; l is left over)

    ``sample`` draws windows at uniform random offsets of the split; ``windows`` tiles the split
    with consecutive non-overlapping ones, for a validation loss over all of it. Chance accuracy
    is 1 / vocab_size per position.
    """

    name: ClassVar[str] = "text"
    target_kind: ClassVar[str] = "sequence"

    corpus: str | None = None  # path of a UTF-8 text file; None: the packaged TinyShakespeare
    split: str = "train"  # "train": the first 90% of the characters; "val": the last 10%

    def __post_init__(self):
        check_choice("split", self.split, SPLITS)
        if isinstance(self.corpus, os.PathLike):
            object.__setattr__(self, "corpus", os.fspath(self.corpus))  # keep the config plain data
        if self.corpus is not None and (not isinstance(self.corpus, str) or not self.corpus):
            raise ConfigError("corpus", self.corpus, _ALLOWED)
        _ = self._data  # read and check the corpus now, before any work

    # -- the corpus --------------------------------------------------------------------------

    @property
    def _data(self) -> Corpus:
        return load_corpus(self.corpus)

    @property
    def vocab(self) -> str:
        """The sorted distinct characters of the whole corpus; a token is an index into it."""
        return self._data.vocab

    @property
    def vocab_size(self) -> int:
        return len(self._data.vocab)

    @property
    def chance(self) -> float:
        return 1.0 / self.vocab_size

    @property
    def text(self) -> str:
        """This split's characters."""
        data = self._data
        return data.text[data.bounds(self.split)]

    @property
    def ids(self) -> Tensor:
        """This split's characters as token ids, [n] int64."""
        data = self._data
        return data.ids[data.bounds(self.split)]

    def encode(self, text: str) -> Tensor:
        """Characters -> token ids [len(text)] int64; every character must be in the vocabulary."""
        index = self._data.index
        unknown = sorted(set(text) - index.keys())
        if unknown:
            raise ConfigError("text", "".join(unknown), f"characters of the corpus ({len(index)} distinct)")
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids: Tensor) -> str:
        """Token ids [n] -> the string of their characters."""
        ids = torch.as_tensor(ids)
        if ids.ndim != 1 or ids.is_floating_point():
            raise ValueError(f"ids: expected a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}")
        vocab = self._data.vocab
        if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < len(vocab)):
            raise ValueError(f"ids: every id must be in [0, {len(vocab) - 1}]")
        return "".join(vocab[i] for i in ids.tolist())

    # -- the Task protocol -------------------------------------------------------------------

    def validate(self, min_length: int) -> None:
        """Both splits must hold a window of ``min_length`` characters plus the one after it."""
        L = length_range(min_length)[0]
        data = self._data
        for split in SPLITS:
            n = data.size(split)
            if n < L + 1:
                raise ConfigError("corpus", data.where,
                                  f"a text whose {split} split holds a window of length {L} "
                                  f"(at least {L + 1} characters; it has {n}), or a shorter length")

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [b, s], lengths [b] -> targets [b, s] and loss mask [b, s], from the tokens alone.

        targets[t] = tokens[t + 1] for t < L - 1. The last position's target is the character
        after the window, which only the corpus knows, so it is masked here; ``sample`` and
        ``windows`` fill it in.
        """
        t = torch.arange(tokens.shape[1], device=tokens.device)
        loss_mask = t < lengths[:, None] - 1  # [b, s]
        targets = F.pad(tokens[:, 1:], (0, 1)).masked_fill(~loss_mask, 0)  # [b, s]
        return targets, loss_mask

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch:
        """``batch_size`` windows at uniform random offsets of the split (offsets, then lengths)."""
        lo, hi = length_range(length)
        self.validate(hi)
        ids = self.ids  # [n]
        device = generator.device
        # A window of hi tokens needs one more character for its last target: n - hi offsets.
        starts = torch.randint(0, ids.numel() - hi, (batch_size,), generator=generator, device=device)
        window = ids[starts.cpu()[:, None] + torch.arange(hi + 1)].to(device)  # [b, hi + 1]
        tokens, targets = window[:, :-1].contiguous(), window[:, 1:].contiguous()  # [b, hi] each
        if lo == hi:
            lengths = torch.full((batch_size,), hi, dtype=torch.long, device=device)
            return Batch(tokens=tokens, targets=targets, loss_mask=torch.ones_like(tokens, dtype=torch.bool),
                         lengths=lengths)
        lengths = torch.randint(lo, hi + 1, (batch_size,), generator=generator, device=device)
        loss_mask = torch.arange(hi, device=device) < lengths[:, None]  # [b, hi]
        return Batch(tokens=tokens.masked_fill(~loss_mask, 0), targets=targets.masked_fill(~loss_mask, 0),
                     loss_mask=loss_mask, lengths=lengths)

    def windows(self, length: int, batch_size: int = 64, limit: int | None = None) -> Iterator[Batch]:
        """The split as consecutive non-overlapping windows of ``length``, in order, in batches.

        Window k is characters k L .. k L + L - 1 of the split, with targets k L + 1 .. k L + L;
        there are (n - 1) // L of them (at most ``limit``), ``batch_size`` per batch (the last
        batch may be smaller). Every check runs here, before the first batch is built.
        """
        L, hi = length_range(length)
        if L != hi:
            raise ConfigError("length", length, "one length L: the windows tile the split")
        if not _is_int(batch_size) or batch_size < 1:
            raise ConfigError("batch_size", batch_size, "a positive integer")
        if limit is not None and (not _is_int(limit) or limit < 1):
            raise ConfigError("limit", limit, "a positive integer or None (the whole split)")
        self.validate(L)
        ids = self.ids
        count = (ids.numel() - 1) // L
        if limit is not None:
            count = min(count, limit)
        return _tile(ids, L, count, batch_size)


def _tile(ids: Tensor, L: int, count: int, batch_size: int) -> Iterator[Batch]:
    offsets = torch.arange(L + 1)
    for first in range(0, count, batch_size):
        k = torch.arange(first, min(first + batch_size, count))  # [b] window numbers
        window = ids[k[:, None] * L + offsets]  # [b, L + 1]
        tokens = window[:, :-1].contiguous()
        yield Batch(tokens=tokens, targets=window[:, 1:].contiguous(),
                    loss_mask=torch.ones_like(tokens, dtype=torch.bool),
                    lengths=torch.full((k.numel(),), L, dtype=torch.long))


# ----------------------------------------------------------------------------- reading a corpus

@dataclass(frozen=True, eq=False)
class Corpus:
    """A corpus read and numbered: the text, its vocabulary, and every character's token id."""

    where: str  # the file, for messages
    text: str
    vocab: str  # sorted distinct characters
    index: dict[str, int]  # character -> token id
    ids: Tensor  # [len(text)] int64
    n_train: int  # the first n_train characters are the training split

    @classmethod
    def from_text(cls, text: str, where: str) -> Corpus:
        n = len(text)
        n_train = int(n * TRAIN_FRACTION)
        if n_train < 2 or n - n_train < 2:
            raise ConfigError("corpus", where, f"{_ALLOWED} (it has {n} characters, {n_train} train and "
                                               f"{n - n_train} validation; each split needs at least 2, "
                                               f"one window of length 1)")
        # Code points, their sorted distinct values (the vocabulary), and each one's rank in it.
        codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        vocab_codes = np.unique(codes)
        ids = torch.from_numpy(np.searchsorted(vocab_codes, codes).astype(np.int64))
        vocab = "".join(map(chr, vocab_codes.tolist()))
        return cls(where=where, text=text, vocab=vocab, index={c: i for i, c in enumerate(vocab)}, ids=ids,
                   n_train=n_train)

    def bounds(self, split: str) -> slice:
        return slice(0, self.n_train) if split == "train" else slice(self.n_train, len(self.text))

    def size(self, split: str) -> int:
        return self.n_train if split == "train" else len(self.text) - self.n_train


def load_corpus(path: str | None = None) -> Corpus:
    """The corpus at ``path`` (None: the packaged TinyShakespeare), read once per process.

    A missing file, a directory, an unreadable, empty or non-UTF-8 file, or one too short to
    split raises ConfigError naming the file and the problem.
    """
    if path is None:
        return _packaged()
    where = os.path.abspath(path)
    try:
        st = os.stat(where)
    except OSError as e:
        raise ConfigError("corpus", where, f"{_ALLOWED} ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError("corpus", where, f"{_ALLOWED} (it is a directory)")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("corpus", where, f"{_ALLOWED} (it is not a regular file)")
    # Size and mtime in the key: a file rewritten in place is read again.
    return _read(where, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read(where: str, size: int, mtime_ns: int) -> Corpus:
    try:
        with open(where, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError("corpus", where, f"{_ALLOWED} ({e.strerror})") from None
    return Corpus.from_text(_decode(data, where), where)


@functools.lru_cache(maxsize=1)
def _packaged() -> Corpus:
    resource = importlib.resources.files("poslab") / "data" / TINYSHAKESPEARE
    where = str(resource)
    damaged = "the TinyShakespeare shipped with poslab ({}; reinstall poslab)"
    try:
        data = gzip.decompress(resource.read_bytes())
    except (OSError, EOFError) as e:  # missing (installed without package data), or not gzip
        raise ConfigError("corpus", where, damaged.format(e)) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != TINYSHAKESPEARE_SHA256:
        raise ConfigError("corpus", where, damaged.format(f"sha256 {digest}, expected {TINYSHAKESPEARE_SHA256}"))
    return Corpus.from_text(_decode(data, where), where)


def _decode(data: bytes, where: str) -> str:
    if not data:
        raise ConfigError("corpus", where, f"{_ALLOWED} (it is empty)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError("corpus", where, f"{_ALLOWED} (it is not UTF-8: byte {data[e.start]:#04x} at offset "
                                           f"{e.start})") from None
