"""Passkey retrieval inside text: a digit string planted at a controlled depth, asked for at the end.

The retrieval protocol of the context-extension literature (Mohtashami & Jaggi 2023, "Landmark
Attention"; used by Position Interpolation, YaRN and LongRoPE), at character level. A window of
L characters of the corpus is the haystack; the needle ``"pass key NNNNN. "`` overwrites it at
depth ``delta`` in [0, 1], and the window ends with the question ``"pass key NNNNN"``:

    start of the needle   p = round(delta * (L + 1 - N - Q))
    window                c_0 .. c_{p-1} | pass key 40719.  | c .. | pass key 4071 | 9
                                                                            tokens | last target

(N = |needle|, Q = |question| with its digits; the window's L tokens and the target after them
are L + 1 characters, the question filling the last Q, so the answer's last digit is the last
target.)

The targets are next characters, as in :class:`poslab.tasks.text.CharText`, so the last
``digits`` targets are the answer: nothing but the needle predicts them (each digit is uniform,
chance 1/10 per digit), so a model that gets them right copied them from depth ``delta``.

A character model learns to copy only if its training data holds some of this, so the task mixes
a share of passkey windows into plain text: ``share`` = 0.1 means that each window, independently,
carries a needle (at a uniform depth) with probability 0.1 and is plain corpus text otherwise
(a window shorter than needle + question, N + Q, is always plain text; with ``share`` = 1 such
lengths are refused).
``score="answer"`` keeps only the answer's targets in the loss mask (the evaluation of a
passkey grid); ``score="all"`` trains on every character.

``answer_weight`` w counts each answer digit w times in the training loss (``Batch.loss_weight``;
the loss is sum(w ce) / sum(w)), every other character once. At a character-LM
extension study's scale (4 layers, width 128, 2000 steps) a plain share is not enough: with w = 1, shares 0.1 / 0.3 /
0.5 left the answer digits at chance after 2000 steps, and 0.2 / 0.5 after 6000, while w = 10 or
20 at share 0.1 copies every passkey within the training length (docs/context-extension.md).
w = 1 adds no weight tensor (the plain mean).

The reasoning mixture: ``reasoning`` names tasks of :mod:`poslab.tasks.reasoning` (multi-key and
multi-value needles, variable tracking, brackets, code) and ``reasoning_share`` the probability that
a window (when not a passkey one: share + reasoning_share <= 1) ends with an example of one of them,
drawn uniformly, in its compact form and ``CHAR_PARAMS`` (:func:`poslab.tasks.reasoning.fitted`):
corpus text, a line break, then the prompt and the answer, the answer's last character the last
target. A window too short for the drawn task's example stays plain text (at L = 32 only brackets
fits). The answer's characters, its leading space excluded, weigh ``reasoning_weight`` in the loss,
as ``answer_weight`` weighs a passkey's digits::

    L = 64, vartrack   tokens ", none we\nCBMRS = 51595. VAUCO = CBMRS. vars = 51595: CBMRS VAUC"
                       answer "CBMRS VAUCO" (weighted), its last character the last target
    (all five tasks, share 0.1, reasoning_share 0.5, generator seed 0: the sixth of 6 windows)

The vocabulary is the corpus's, with any needle character it lacks (TinyShakespeare has no digit
but "3") appended after it, so plain text has the same token ids as under ``CharText``; with
``reasoning`` non-empty (whichever tasks), the characters the reasoning generators can emit
(:func:`poslab.tasks.reasoning.characters`) that are still missing follow, so a passkey keeps its ids:

    TinyShakespeare: 65 corpus characters + "012456789" -> vocab_size 74; "0" -> 65, "3" -> 9
    with reasoning: 74 + "#()*+<=>[]_{}" -> vocab_size 87

Worked examples (``digits=5``, L = 40, N = 16, Q = 14, so p = round(11 delta); validation
split, generator seed 0; tokens shown, then the answer targets)::

    delta = 0     tokens "pass key 30397. --whate'er pass key 3039"    answer "30397"
    delta = 1     tokens "am to get apass key 30397. pass key 3039"    answer "30397"

Notation: b batch, s sequence index, L a window's length, N |needle|, Q |query| (digits included).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError, check_choice
from poslab.tasks import reasoning as rs
from poslab.tasks.base import Batch, Length, length_range
from poslab.tasks.text import SPLITS, load_corpus

NEEDLE = "pass key {}. "  # planted at depth delta
QUERY = "pass key {}"  # the question, at the end of the window; the answer digits end it
SCORES = ("all", "answer")


@dataclass(frozen=True, kw_only=True)
class PasskeyText:
    """Character-level text with a share of windows that plant a passkey and ask for it at the end."""

    name: ClassVar[str] = "passkey"
    target_kind: ClassVar[str] = "sequence"

    corpus: str | None = None  # path of a UTF-8 text file; None: the packaged TinyShakespeare
    split: str = "train"  # "train": the first 90% of the characters; "val": the last 10%
    share: float = 0.1  # probability that a window carries a passkey (1.0: every window)
    digits: int = 5  # length of the digit string
    depth: float | None = None  # needle depth delta in [0, 1]; None: uniform per window
    score: str = "all"  # "all": every next-character target; "answer": the answer digits only
    answer_weight: float = 1.0  # weight of an answer digit in the training loss (other targets: 1)
    reasoning: tuple[str, ...] = ()  # tasks of poslab.tasks.reasoning mixed in (their CHAR_PARAMS); (): none
    reasoning_share: float = 0.0  # probability that a window ends with a reasoning example instead
    reasoning_weight: float = 1.0  # weight of a reasoning answer character in the training loss

    def __post_init__(self):
        check_choice("split", self.split, SPLITS)
        check_choice("score", self.score, SCORES)
        if not (isinstance(self.share, (int, float)) and not isinstance(self.share, bool) and 0 <= self.share <= 1):
            raise ConfigError("share", self.share, "a number in [0, 1]")
        if not (isinstance(self.digits, int) and not isinstance(self.digits, bool) and 1 <= self.digits <= 16):
            raise ConfigError("digits", self.digits, "an integer in [1, 16]")
        if self.depth is not None and not (isinstance(self.depth, (int, float)) and 0 <= self.depth <= 1):
            raise ConfigError("depth", self.depth, "a number in [0, 1] or None (uniform)")
        if not (isinstance(self.answer_weight, (int, float)) and not isinstance(self.answer_weight, bool)
                and math.isfinite(self.answer_weight) and self.answer_weight > 0):
            raise ConfigError("answer_weight", self.answer_weight, "a finite number > 0")
        if self.score == "answer" and self.share != 1:
            raise ConfigError("share", self.share, "1.0 when score='answer' (only passkey windows have an answer)")
        self._check_reasoning()
        _vocab(self.corpus, bool(self.reasoning))  # read and check the corpus now, before any work

    def _check_reasoning(self) -> None:
        tasks = self.reasoning
        if isinstance(tasks, list):
            object.__setattr__(self, "reasoning", tuple(tasks))  # a --set list; frozen, hashable
        allowed = f"a list of distinct tasks among {', '.join(rs.TASKS)}"
        if not isinstance(self.reasoning, tuple) or len(set(self.reasoning)) != len(self.reasoning):
            raise ConfigError("reasoning", tasks, allowed)
        for task in self.reasoning:
            check_choice("reasoning", task, tuple(rs.TASKS))
        room = 1 - self.share if _is_number(self.share) else 1.0
        if not (_is_number(self.reasoning_share) and 0 <= self.reasoning_share <= room + 1e-12):
            raise ConfigError("reasoning_share", self.reasoning_share,
                              f"a number in [0, {room:g}] (share + reasoning_share <= 1)")
        if self.reasoning_share > 0 and not self.reasoning:
            raise ConfigError("reasoning", list(self.reasoning), f"{allowed}, non-empty when reasoning_share > 0")
        if not (_is_number(self.reasoning_weight) and math.isfinite(self.reasoning_weight)
                and self.reasoning_weight > 0):
            raise ConfigError("reasoning_weight", self.reasoning_weight, "a finite number > 0")

    # -- vocabulary ----------------------------------------------------------------------------

    @property
    def vocab(self) -> str:
        """The corpus's characters, then the needle characters it lacks, then (with ``reasoning``)
        the reasoning characters it still lacks; a token indexes it."""
        return _vocab(self.corpus, bool(self.reasoning))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def chance(self) -> float:
        return 0.1 if self.score == "answer" else 1.0 / self.vocab_size

    def encode(self, text: str) -> Tensor:
        index = {c: i for i, c in enumerate(self.vocab)}
        unknown = sorted(set(text) - index.keys())
        if unknown:
            raise ConfigError("text", "".join(unknown), f"characters of the vocabulary ({len(index)})")
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids: Tensor) -> str:
        vocab = self.vocab
        return "".join(vocab[i] for i in torch.as_tensor(ids).tolist())

    @property
    def needle_length(self) -> int:
        return len(NEEDLE.format("0" * self.digits))  # N

    @property
    def query_length(self) -> int:
        return len(QUERY.format("0" * self.digits))  # Q, the answer included

    # -- the Task protocol -----------------------------------------------------------------------

    def validate(self, min_length: int) -> None:
        L = length_range(min_length)[0]
        if self.share == 1 and L < self.needle_length + self.query_length:
            raise ConfigError("length", L, f"at least {self.needle_length + self.query_length} characters for a "
                                           f"{self.digits}-digit passkey (needle {self.needle_length} + question "
                                           f"{self.query_length}) in every window, or share < 1")
        data = load_corpus(self.corpus)
        n = data.size(self.split)
        if n < L + 1:
            raise ConfigError("corpus", data.where, f"a text whose {self.split} split holds a window of length {L} "
                                                    f"(at least {L + 1} characters; it has {n}), or a shorter length")

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """targets[t] = tokens[t + 1] for t < L - 1; the last target needs the corpus (masked)."""
        t = torch.arange(tokens.shape[1], device=tokens.device)
        loss_mask = t < lengths[:, None] - 1
        targets = torch.nn.functional.pad(tokens[:, 1:], (0, 1)).masked_fill(~loss_mask, 0)
        return targets, loss_mask

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch:
        """``batch_size`` windows (``share`` of them with a passkey) of L characters, or lengths
        uniform in (lo, hi) with the question ending each window."""
        batch, _ = self.sample_with_answers(generator, batch_size, length)
        return batch

    def sample_with_answers(self, generator: torch.Generator, batch_size: int,
                            length: Length) -> tuple[Batch, Tensor]:
        """The batch and the answer mask [b, s]: True at the targets that are answer digits (and
        the answer characters of reasoning windows).

        Draws, in order: window offsets [b], lengths [b] (only when lo < hi), one uniform u [b]
        (passkey if u < share, reasoning if share <= u < share + reasoning_share), digits
        [b, digits], depths [b] (only when ``depth`` is None); with reasoning_share > 0 then the
        reasoning task [b], example seed [b] and depth [b] (only when ``depth`` is None).
        """
        lo, hi = length_range(length)
        self.validate(lo)
        self.validate(hi)
        b, device = batch_size, generator.device
        data = load_corpus(self.corpus)
        ids = data.ids[data.bounds(self.split)]  # [n]
        starts = torch.randint(0, ids.numel() - hi, (b,), generator=generator, device=device).cpu()
        window = ids[starts[:, None] + torch.arange(hi + 1)]  # [b, hi + 1]: tokens, then one more target
        if lo == hi:
            lengths = torch.full((b,), hi, dtype=torch.long)
        else:
            lengths = torch.randint(lo, hi + 1, (b,), generator=generator, device=device).cpu()
        u = torch.rand(b, generator=generator, device=device).cpu()  # [b]
        planted = u < self.share
        mixed = (u >= self.share) & (u < self.share + self.reasoning_share)
        planted &= lengths >= self.needle_length + self.query_length  # a needle only where it fits
        digits = torch.randint(0, 10, (b, self.digits), generator=generator, device=device).cpu()
        if self.depth is None:
            depth = torch.rand(b, generator=generator, device=device, dtype=torch.float64).cpu()
        else:
            depth = torch.full((b,), float(self.depth), dtype=torch.float64)

        N, Q = self.needle_length, self.query_length
        needle, query = self._templates(digits)  # [b, N], [b, Q]
        # The window holds tokens c_0 .. c_{L-1} and the target after them, c_L: L + 1 characters,
        # the question occupying the last Q of them so that the answer's last digit is c_L.
        p = torch.round(depth * (lengths - N - Q + 1).clamp(min=0)).long()  # needle start [b]
        q = lengths + 1 - Q  # question start [b]
        cols = torch.arange(hi + 1)
        rows = torch.arange(b)[:, None]
        out = window.clone()
        if planted.any():
            n_pos = p[:, None] + torch.arange(N)  # [b, N]
            q_pos = q[:, None] + torch.arange(Q)  # [b, Q]
            out[rows.expand(-1, N)[planted], n_pos[planted]] = needle[planted]
            out[rows.expand(-1, Q)[planted], q_pos[planted]] = query[planted]
        answer_chars = torch.full((b,), self.digits)  # [b]: characters of the answer ending the window
        if self.reasoning_share > 0:
            mixed, answer_chars = self._plant_reasoning(generator, out, lengths, mixed, answer_chars)
        tokens, targets = out[:, :-1].contiguous(), out[:, 1:].contiguous()  # [b, hi] each
        real = cols[:-1] < lengths[:, None]  # [b, hi]
        # target t is character t + 1: the answer's a characters are characters L - a + 1 .. L
        ending = (cols[1:] >= (lengths + 1 - answer_chars)[:, None]) & real  # [b, hi]
        answer, reasoning = ending & planted[:, None], ending & mixed[:, None]
        loss_mask = answer if self.score == "answer" else real
        batch = Batch(tokens=tokens.masked_fill(~real, 0).to(device),
                      targets=targets.masked_fill(~real, 0).to(device), loss_mask=loss_mask.to(device),
                      lengths=lengths.to(device))
        if (self.answer_weight != 1 or self.reasoning_weight != 1) and self.score == "all":
            weight = torch.where(answer, float(self.answer_weight), 1.0)
            batch.loss_weight = torch.where(reasoning, float(self.reasoning_weight), weight).to(device)  # [b, hi]
        return batch, (answer | reasoning).to(device)

    def _plant_reasoning(self, generator: torch.Generator, out: Tensor, lengths: Tensor, mixed: Tensor,
                         answer_chars: Tensor) -> tuple[Tensor, Tensor]:
        """Overwrite the end of each ``mixed`` window (its L + 1 characters in ``out``) with a
        reasoning example, prompt then answer (``reasoning.fitted``); a window too short for it
        stays plain text. Returns the windows that got one and each window's answer length."""
        b, device = out.shape[0], generator.device
        which = torch.randint(0, len(self.reasoning), (b,), generator=generator, device=device).cpu()
        seeds = torch.randint(0, 2 ** 31 - 1, (b,), generator=generator, device=device).cpu()
        if self.depth is None:
            depth = torch.rand(b, generator=generator, device=device, dtype=torch.float64).cpu()
        else:
            depth = torch.full((b,), float(self.depth), dtype=torch.float64)
        mixed, answer_chars = mixed.clone(), answer_chars.clone()
        for i in mixed.nonzero().flatten().tolist():
            task = self.reasoning[int(which[i])]
            L = int(lengths[i])
            ex = rs.fitted(task, L, float(depth[i]), int(seeds[i]), **rs.CHAR_PARAMS[task])
            if ex is None:
                mixed[i] = False
                continue
            text = "\n" + ex.prompt + ex.answer  # a line break keeps a key from running on from corpus text
            out[i, L + 1 - len(text):L + 1] = self.encode(text)
            answer_chars[i] = len(ex.answer.lstrip())  # the leading space is not weighted
        return mixed, answer_chars

    def _templates(self, digits: Tensor) -> tuple[Tensor, Tensor]:
        """digits [b, k] -> needle ids [b, N] and question ids [b, Q] with those digits in place."""
        index = {c: i for i, c in enumerate(self.vocab)}
        digit_ids = torch.tensor([index[str(d)] for d in range(10)])[digits]  # [b, k]
        out = []
        for template in (NEEDLE, QUERY):
            text = template.format("#" * self.digits)
            ids = torch.tensor([index.get(c, 0) for c in text]).expand(digits.shape[0], -1).clone()
            slot = text.index("#")
            ids[:, slot:slot + self.digits] = digit_ids
            out.append(ids)
        return out[0], out[1]


@functools.lru_cache(maxsize=8)
def _vocab_cached(corpus: str | None, where: str, size: int, reasoning: bool) -> str:
    vocab = load_corpus(corpus).vocab
    vocab += "".join(sorted(set(NEEDLE.format("0123456789") + QUERY.format("")) - set(vocab)))
    if reasoning:  # after the needle's characters, so a passkey has the same ids with or without
        vocab += "".join(sorted(set(rs.characters()) - set(vocab)))
    return vocab


def _vocab(corpus: str | None, reasoning: bool = False) -> str:
    data = load_corpus(corpus)
    return _vocab_cached(corpus, data.where, len(data.text), reasoning)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
