"""The context-sensitive tasks of the Chomsky benchmark (Delétang et al. 2023; Ruoss et al. 2023).

Seven string-to-string tasks whose rule needs more than a stack: a sequence of task length L is L
input symbols, and the answer is ``output_length(L)`` output classes::

    duplicate_string          x_1 .. x_L in {0, 1}      ->  x_1 .. x_L x_1 .. x_L         (2L)
    missing_duplicate_string  w w with one symbol 2      ->  the missing symbol             (1)
    odds_first                x_1 .. x_L in {0, 1}      ->  x_2 x_4 .. x_1 x_3 ..          (L)
    binary_addition           n 2 m, little-endian      ->  n + m, 2 (end), 0 ...          (L + 1)
    binary_multiplication     n 2 m, little-endian      ->  n * m, 2 (end), 0 ...          (L)
    compute_sqrt              n, big-endian, L bits     ->  floor(sqrt(n)), big-endian     (ceil(L / 2))
    bucket_sort               x_1 .. x_L in {0 .. 4}    ->  the symbols sorted             (L)

Every task is presented to a bidirectional encoder in the sources' form
(:mod:`poslab.tasks.chomsky.format`: the input, then one EMPTY token per output slot; targets
and ``loss_mask`` on the slots), and scored with :func:`poslab.tasks.scoring.sequence_scores`.
Each task is format.py's ``EncoderTask`` with two functions: ``draw`` (the input symbols at
given lengths, from the ``torch.Generator`` passed in) and ``answer`` (the output classes and
scored slots, computed from the input symbols alone), so ``label`` recomputes a batch's targets
from its tokens with the same answer that ``sample`` used. In the worked examples, inputs and
outputs are the sources' ids; token ids are format.py's (PAD 0, EMPTY 1, source symbol k ->
k + 2), and ``.`` marks a position whose target is not scored.

Sources read (google-deepmind/randomized_positional_encodings at e8c6474, whose ``tasks/cs/*.py``
equal google-deepmind/neural_networks_chomsky_hierarchy's at 2b8eb4b up to the package name):
``tasks/task.py``, ``tasks/cs/{duplicate_string, missing_duplicate_string, odds_first,
binary_addition, binary_multiplication, compute_sqrt, bucket_sort}.py``,
``experiments/{constants, example, training, range_evaluation, utils, curriculum}.py``. What
they fix and this module reproduces:

- Vocabularies (``input_size`` / ``output_size``): duplicate_string and odds_first 2 / 2
  (``constants.TASK_BUILDERS`` sets ``vocab_size=2``), missing_duplicate_string 4 / 2 (0, 1,
  the placeholder 2, the odd-length pad 3), binary_addition and binary_multiplication 3 / 3
  (0, 1, the operator or end token 2), compute_sqrt 2 / 2, bucket_sort 5 / 5
  (``vocab_size=5``). Chance is 1 / ``output_size``.
- Lengths: the task length is the input's token count (the sources' ``length``); training
  draws L uniform in 1..40 (``UniformCurriculum(range(1, 41))``); the papers test on 41..500
  (``example.py`` itself evaluates 1..100 and averages 41..100).
- Scoring: ``task.accuracy_mask``: every slot, except binary_addition and
  binary_multiplication, which score the result up to and including its end token 2. Their zero
  padding after it is trained by the sources (the loss sums over all ``output_length`` slots)
  but never scored; here ``loss_mask`` is the scored slots (format.py), so it is not trained
  either: a model sees the end token and nothing after it.
- Edge lengths: binary_addition at L <= 2 has no operator: the input is a number v drawn
  uniformly from [0, 2^L - 2] in L little-endian bits and the answer is v itself;
  binary_multiplication at L <= 2 answers 0^(L-1) then the end token whatever the input;
  missing_duplicate_string at L = 1 has input 1 and answer 1.

Choices made here:

- odds_first follows the sources' *code* (``s[1::2]`` then ``s[::2]``: the symbols at 0-based
  odd indices first). Its docstring (``s_1 s_3 s_5 ... s_2 s_4 ...``) and docstring examples
  (``00110101 -> 0100 0111``) put the 0-based even ones first; the code is what the papers
  trained and scored.
- Randomness: the sources use Python's ``random``, numpy and jax; here one ``torch.Generator``
  draws the same distributions (operand widths uniform in [1, L - 2], operands uniform in
  [1, 2^w - 1] by redrawing all-zero bit strings, compute_sqrt's number uniform in
  [1, 2^L - 1] alike, the missing index uniform in [0, 2 (L // 2)) as floor(u · 2 (L // 2))).
- A length pair (lo, hi) draws one L per sequence (the poslab protocol); the sources draw one
  per batch, which :func:`poslab.tasks.base.sample_steps` with ``per="batch"`` reproduces.
  Lengths are drawn only when lo < hi, so ``length=L`` and ``length=(L, L)`` give the same batch.
- The option named ``m`` is the sources' ``vocab_size`` (the alphabet), since ``vocab_size``
  is the model's vocabulary here (:func:`poslab.tasks.chomsky.format.encoder_vocab_size`).

Notation: b batch, s position in the padded sequence, L task length (= input tokens), o output
slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import require_positive_int
from poslab.tasks.chomsky.format import AlphabetTask, EncoderTask, Rows

END = 2  # the end (and operator) token of the binary arithmetic tasks
MISSING, ODD_PAD = 2, 3  # missing_duplicate_string's placeholder and its pad for odd lengths


# ----------------------------------------------------------------------------- string tasks


@dataclass(frozen=True, kw_only=True)
class DuplicateString(AlphabetTask):
    """Duplicate a string: x_1 .. x_L -> (x_1 .. x_L) repeated ``duplication`` times.

    Worked examples (m = 2; token ids: symbol k is k + 2, EMPTY 1; ``.`` not scored, target 0)::

        L = 3   input 1 0 1   ->  1 0 1 1 0 1
                tokens  3 2 3 1 1 1 1 1 1     lengths 9
                targets . . . 1 0 1 1 0 1     (all six slots scored)
        L = 1   input 0       ->  0 0
                tokens  2 1 1                 targets . 0 0

    Every slot is scored; chance 1/m per slot.
    """

    name: ClassVar[str] = "duplicate_string"

    m: int = 2  # alphabet size (the sources' vocab_size; 2 in the papers)
    duplication: int = 2  # copies of the string in the output

    def __post_init__(self):
        super().__post_init__()
        require_positive_int("duplication", self.duplication)

    def output_length(self, L: int) -> int:
        return self.duplication * L

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        o = torch.arange(self.duplication * inputs.shape[1], device=inputs.device)[None, :]  # [1, o]
        y = inputs.gather(1, (o % n.clamp(min=1)[:, None]).clamp(max=inputs.shape[1] - 1))  # [b, o]: x_{o mod L}
        return Rows(inputs, n, y, self.duplication * n)


@dataclass(frozen=True, kw_only=True)
class OddsFirst(AlphabetTask):
    """The symbols at odd 0-based indices first, then those at even ones: x[1::2] + x[::2].

    This is the sources' code; their docstring states the opposite order (module docstring).

    Worked examples (m = 2)::

        L = 8   input 0 0 1 1 0 1 0 1   ->  0 1 1 1 0 1 0 0   (x_1 x_3 x_5 x_7, then x_0 x_2 x_4 x_6)
        L = 3   input 1 1 0             ->  1 1 0
                tokens  3 3 2 1 1 1   targets . . . 1 1 0   (all three slots scored)

    Chance 1/m per slot.
    """

    name: ClassVar[str] = "odds_first"

    m: int = 2  # alphabet size (2 in the papers)

    def output_length(self, L: int) -> int:
        return L

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        o = torch.arange(inputs.shape[1], device=inputs.device)[None, :]  # [1, o]
        odd = (n // 2)[:, None]  # [b, 1] symbols at odd indices
        at = torch.where(o < odd, 2 * o + 1, 2 * (o - odd)).clamp(max=inputs.shape[1] - 1)  # [b, o]
        return Rows(inputs, n, inputs.gather(1, at), n)


@dataclass(frozen=True, kw_only=True)
class BucketSort(AlphabetTask):
    """Sort symbols from an alphabet of m: x_1 .. x_L -> the same symbols in increasing order.

    Worked examples (m = 5)::

        L = 8   input 1 0 2 0 4 1 1 2   ->  0 0 1 1 1 2 2 4
        L = 2   input 3 1               ->  1 3
                tokens  5 3 1 1   targets . . 1 3   (both slots scored)

    Chance 1/m per slot.
    """

    name: ClassVar[str] = "bucket_sort"

    m: int = 5  # alphabet size (5 in the papers)

    def output_length(self, L: int) -> int:
        return L

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        past = torch.arange(inputs.shape[1], device=inputs.device)[None, :] >= n[:, None]  # [b, s]
        return Rows(inputs, n, inputs.masked_fill(past, self.m).sort(dim=1).values, n)  # padding sorts last


@dataclass(frozen=True, kw_only=True)
class MissingDuplicateString(EncoderTask):
    """A binary string w of length L // 2 written twice, one symbol replaced by 2: which was it?

    Odd L ends with the pad symbol 3. The answer is one class in {0, 1}, read at one empty slot.

    Worked examples::

        L = 8   input 0 1 1 0 0 2 1 0    ->  1   (w = 0110; the second copy's w_1 is missing)
        L = 7   input 1 0 2 1 0 1 3      ->  1   (w = 101, odd length: pad 3 at the end)
                tokens  3 2 4 3 2 3 5 1   targets . . . . . . . 1   (the one slot scored)
        L = 1   input 1                  ->  1   (the sources' fixed case)

    Chance 1/2.
    """

    name: ClassVar[str] = "missing_duplicate_string"

    @property
    def input_size(self) -> int:
        return 4  # 0, 1, MISSING, ODD_PAD

    @property
    def output_size(self) -> int:
        return 2

    def output_length(self, L: int) -> int:
        return 1

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        b, hi, device = len(lengths), int(lengths.max()), lengths.device
        w = torch.randint(0, 2, (b, max(hi // 2, 1)), generator=generator, device=device)  # [b, h_max]
        half = lengths // 2  # [b]
        missing = (torch.rand(b, generator=generator, device=device) * 2 * half).long()  # [b] in [0, 2h)
        s = torch.arange(hi, device=device)[None, :]  # [1, s]
        x = w.gather(1, s % half.clamp(min=1)[:, None])  # [b, s]: w twice
        x = x.masked_fill(s == missing[:, None], MISSING).masked_fill(s == 2 * half[:, None], ODD_PAD)
        return self.answer(x.masked_fill(lengths[:, None] == 1, 1), lengths)

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        half = (n // 2).clamp(min=1)[:, None]  # [b, 1]
        missing = (inputs == MISSING).long().argmax(1, keepdim=True)  # [b, 1] (0 where there is none: L = 1)
        twin = ((missing + half) % (2 * half)).clamp(max=inputs.shape[1] - 1)  # that symbol of w in the other copy
        y = inputs.gather(1, twin).masked_fill(n[:, None] == 1, 1)  # [b, 1]
        return Rows(inputs, n, y, torch.ones_like(n))


# ----------------------------------------------------------------------------- binary arithmetic


def _nonzero_bits(generator: torch.Generator, shape: tuple[int, int], width: Tensor, need: Tensor) -> Tensor:
    """Bits [b, s] whose first ``width`` [b] bits are not all 0 where ``need`` [b]: all-zero rows are
    redrawn, so the number they write is uniform in [1, 2^width - 1] (the sources' random.randint)."""
    bits = torch.randint(0, 2, shape, generator=generator, device=generator.device)
    inside = torch.arange(shape[1], device=bits.device)[None, :] < width[:, None]  # [b, s]
    while True:
        zero = need & ~(bits.bool() & inside).any(1)  # [b]
        if not bool(zero.any()):
            return bits
        bits[zero] = torch.randint(0, 2, (int(zero.sum()), shape[1]), generator=generator, device=bits.device)


def _operands(generator: torch.Generator, L: Tensor) -> Tensor:
    """binary_addition's and binary_multiplication's inputs [b, max L] at task lengths L [b]: for L >= 3,
    n 2 m with n, m little-endian, widths w_n uniform in [1, L - 2] and w_m = L - 1 - w_n, values
    uniform in [1, 2^w - 1]; for L <= 2, a number uniform in [0, 2^L - 2] in L little-endian bits."""
    batch_size, hi, device = len(L), int(L.max()), L.device
    operator = L >= 3  # [b]
    w_n = 1 + (torch.rand(batch_size, generator=generator, device=device) * (L - 2).clamp(min=1)).long()  # [b]
    w_m = L - 1 - w_n
    n = _nonzero_bits(generator, (batch_size, hi), w_n, operator)  # [b, s]
    m = _nonzero_bits(generator, (batch_size, hi), w_m, operator)
    v = (torch.rand(batch_size, generator=generator, device=device) * (2 ** L.clamp(max=2) - 1)).long()  # [b]
    s = torch.arange(hi, device=device)[None, :]  # [1, s]
    after = (s - w_n[:, None] - 1).clamp(min=0)  # [b, s] index into m
    x = torch.where(s < w_n[:, None], n, torch.where(s == w_n[:, None], END, m.gather(1, after)))
    return torch.where(operator[:, None], x, (v[:, None] >> s.clamp(max=62)) & 1)


def _le(bits: list[int]) -> int:
    """Little-endian bits -> integer."""
    return int("".join(map(str, reversed(bits))) or "0", 2)


def _le_bits(v: int) -> list[int]:
    """Integer -> little-endian bits without leading zeros (0 -> [0], as the sources' f'{v:b}')."""
    return [int(c) for c in reversed(f"{v:b}")]


def _rows(rows: list[list[int]], width: int, device: torch.device) -> Tensor:
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device).view(-1, width)


class _Arithmetic(EncoderTask):
    """binary_addition and binary_multiplication: the input n 2 m, the result little-endian, the
    end token 2, then zeros up to ``output_length(L)`` slots; scored up to the end token."""

    @property
    def input_size(self) -> int:
        return 3  # 0, 1 and the operator 2

    @property
    def output_size(self) -> int:
        return 3  # 0, 1 and the end token 2

    def result(self, n: int, m: int) -> int:
        raise NotImplementedError

    def short(self, v: int, L: int) -> list[int]:
        """The result at L <= 2 (no operator in the input)."""
        raise NotImplementedError

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        return self.answer(_operands(generator, lengths), lengths)

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        lengths = n.tolist()
        results = []
        for row, L_i in zip(inputs.tolist(), lengths, strict=True):
            if L_i <= 2:
                results.append(self.short(_le(row[:L_i]), L_i))
            else:
                at = row.index(END)
                results.append(_le_bits(self.result(_le(row[:at]), _le(row[at + 1:L_i]))))
        out = [r + [END] + [0] * (self.output_length(L_i) - len(r) - 1)
               for r, L_i in zip(results, lengths, strict=True)]
        width = max((len(r) for r in out), default=0)
        device = inputs.device
        scored = torch.tensor([len(r) + 1 for r in results], dtype=torch.long, device=device)
        return Rows(inputs, n, _rows(out, width, device), torch.tensor([len(r) for r in out], device=device), scored)


@dataclass(frozen=True, kw_only=True)
class BinaryAddition(_Arithmetic):
    """Add two binary numbers: n 2 m (little-endian) -> n + m (little-endian), 2, zeros.

    The output has L + 1 slots; the sum's bits and the end token 2 are scored, the zeros after it
    are not.

    Worked examples (the sources' own)::

        L = 9   input 0 0 1 2 0 1 1 0 1     (4 + 22)  ->  0 1 0 1 1 2 0 0 0 0   (26; 6 slots scored)
        L = 11  input 1 0 0 1 2 0 0 0 0 0 1 (9 + 32)  ->  1 0 0 1 0 1 2 0 0 0 0 0   (41; 7 scored)
        L = 2   input 0 1                   (v = 2)   ->  0 1 2   (no operator at L <= 2; all scored)
                tokens  2 3 1 1 1   targets . . 0 1 2

    Chance 1/3 per slot.
    """

    name: ClassVar[str] = "binary_addition"

    def output_length(self, L: int) -> int:
        return L + 1

    def result(self, n: int, m: int) -> int:
        return n + m

    def short(self, v: int, L: int) -> list[int]:
        return _le_bits(v)


@dataclass(frozen=True, kw_only=True)
class BinaryMultiplication(_Arithmetic):
    """Multiply two binary numbers: n 2 m (little-endian) -> n * m (little-endian), 2, zeros.

    The output has L slots (the product has at most L - 1 bits); the product's bits and the end
    token 2 are scored.

    Worked examples (the sources' own)::

        L = 9   input 0 0 1 2 0 1 1 0 1     (4 * 22)  ->  0 0 0 1 1 0 1 2 0   (88; 8 slots scored)
        L = 11  input 1 0 0 1 2 0 0 0 0 0 1 (9 * 32)  ->  0 0 0 0 0 1 0 0 1 2 0   (288; 10 scored)
        L = 2   input 1 0                   (any)     ->  0 2   (the sources' fixed answer at L <= 2)
                tokens  3 2 1 1   targets . . 0 2

    Chance 1/3 per slot.
    """

    name: ClassVar[str] = "binary_multiplication"

    def output_length(self, L: int) -> int:
        return L

    def result(self, n: int, m: int) -> int:
        return n * m

    def short(self, v: int, L: int) -> list[int]:
        return [0] * (L - 1)


@dataclass(frozen=True, kw_only=True)
class ComputeSqrt(EncoderTask):
    """floor(sqrt(n)) of an L-bit number n, both big-endian; the output has ceil(L / 2) bits.

    Worked examples (the sources' own)::

        L = 6   input 1 0 0 1 0 1   (37)  ->  1 1 0   (6)
        L = 3   input 1 1 1         (7)   ->  1 0     (2)
                tokens  3 3 3 1 1   targets . . . 1 0   (both slots scored)

    n is uniform in [1, 2^L - 1], so the input may start with zeros; so may the output. Chance 1/2.
    """

    name: ClassVar[str] = "compute_sqrt"

    @property
    def input_size(self) -> int:
        return 2

    @property
    def output_size(self) -> int:
        return 2

    def output_length(self, L: int) -> int:
        return math.ceil(L / 2)

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        every = torch.ones_like(lengths, dtype=torch.bool)
        return self.answer(_nonzero_bits(generator, (len(lengths), int(lengths.max())), lengths, every), lengths)

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        lengths = n.tolist()
        out = []
        for row, L_i in zip(inputs.tolist(), lengths, strict=True):
            root = math.isqrt(int("".join(map(str, row[:L_i])), 2))
            out.append([int(c) for c in f"{root:b}".zfill(self.output_length(L_i))])
        return Rows(inputs, n, _rows(out, max((len(r) for r in out), default=0), inputs.device), (n + 1) // 2)

