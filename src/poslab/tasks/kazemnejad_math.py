"""Kazemnejad et al. 2023's arithmetic tasks: addition, summation, parity, polynomial evaluation.

Sources, token mapping and length conventions as in :mod:`poslab.tasks.kazemnejad` (read from
McGill-NLP/length-generalization: make_{addition,sum,parity,poly}_dataset.py and the matching
``*_instance_processor.py``, no scratchpad). Numbers are written digit by digit as the source's
``number_to_string`` ("- 1 2" for -12), one token per digit and per minus sign. Every task trains
on L in 1..8 and tests on 9..16. Answers are computed with a loop over digit positions or items,
never over the batch.

Notation: b batch, K items (or digit positions) per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.tasks.kazemnejad import (
    DIGITS,
    DecoderTask,
    first,
    items,
    lengths_per_row,
    number_digits,
    pack,
    reverse_rows,
    separated,
)

ANSWER = ("The", "answer", "is")


def _check_modulo(modulo: object) -> None:
    if not isinstance(modulo, int) or isinstance(modulo, bool) or modulo < 2:
        raise ConfigError("modulo", modulo, "an integer >= 2 (the source's modulo_factor is 10)")


def _width(n: int) -> int:
    """Decimal digits of n >= 0."""
    return len(str(n))


@dataclass(frozen=True, kw_only=True)
class Addition(DecoderTask):
    """Add two integers (make_addition_dataset.py; S2SAdditionDataInstanceProcessor).

    Prompt "Compute a + b ?" and target "The answer is s." with digits spaced, no separator
    (the "?" ends the prompt). An operand of d digits is uniform in [10^(d-1), 10^d - 1]
    ([0, 9] for d = 1). The source draws the digit counts (d_a, d_b) uniformly over its length
    bins: training over [1, 8]^2, testing over the pairs in [1, 16]^2 with at least one count in
    9..16. Length L here is max(d_a, d_b) (the paper's per-length accuracy, e.g. test category
    "14-by-1" is length 14): a length range (lo, hi) draws (d_a, d_b) uniformly over the pairs
    in [1, hi]^2 with lo <= max <= hi, which is the source's training set for (1, 8) and its
    test set for (9, 16).

    Worked examples (``*`` marks the scored positions)::

        L = 2, 47 + 5    Compute 4 7 + 5 ?* The* answer* is* 5* 2* .* </s>
        L = 1, 0 + 9     Compute 0 + 9 ?* The* answer* is* 9* .* </s>

    Chance: 1/15 (ten digits, The, answer, is, ".", EOS).
    """

    name: ClassVar[str] = "addition"
    length_unit: ClassVar[str] = "digits of the longer operand"
    train_range: ClassVar[tuple[int, int]] = (1, 8)
    test_range: ClassVar[tuple[int, int]] = (9, 16)
    boundary: ClassVar[str] = "?"
    separator: ClassVar[bool] = False

    @property
    def words(self) -> tuple[str, ...]:
        return ("Compute", "+", "?") + ANSWER + (".",) + DIGITS

    @property
    def output_words(self) -> tuple[str, ...]:
        return ANSWER + (".", "</s>") + DIGITS

    def max_tokens(self, length: int) -> int:
        return (1 + length + 1 + length + 1) + (3 + length + 1 + 1) + 1

    def _draw(self, g, b, lo, hi):
        dev = g.device
        digits = torch.randint(0, 10, (b, 2, hi), generator=g, device=dev)  # [b, 2, K] least significant first
        lead = torch.randint(1, 10, (b, 2), generator=g, device=dev)
        counts = _digit_counts(g, b, lo, hi)  # [b, 2]
        k = torch.arange(hi, device=dev)
        digits = torch.where(k == (counts - 1)[..., None], torch.where(counts > 1, lead, digits[..., 0])[..., None],
                             digits)
        digits = digits.masked_fill(k >= counts[..., None], 0)
        total = torch.zeros(b, hi + 1, dtype=torch.long, device=dev)  # [b, K + 1] least significant first
        carry = torch.zeros(b, dtype=torch.long, device=dev)
        for i in range(hi):  # schoolbook addition over digit positions
            s = digits[:, 0, i] + digits[:, 1, i] + carry
            total[:, i], carry = s % 10, s // 10
        total[:, hi] = carry
        nonzero = total > 0
        n_total = torch.where(nonzero.any(1), (hi + 1) - nonzero.flip(1).long().argmax(1), 1)  # [b] digits of a + b
        a, c = (reverse_rows(digits[:, j], counts[:, j]) for j in (0, 1))  # most significant first
        s_digits = reverse_rows(total, n_total)
        prompt = [self.word("Compute", b, dev), (self.digit_ids(a), first(counts[:, 0], hi)), self.word("+", b, dev),
                  (self.digit_ids(c), first(counts[:, 1], hi)), self.word("?", b, dev)]
        output = [*self.phrase("The answer is", b, dev), (self.digit_ids(s_digits), first(n_total, hi + 1)),
                  self.word(".", b, dev)]
        return *pack(prompt), *pack(output)


def _digit_counts(g: torch.Generator, b: int, lo: int, hi: int) -> Tensor:
    """(d_a, d_b) [b, 2] uniform over the pairs in [1, hi]^2 whose max lies in [lo, hi]: the max M
    with weight 2M - 1 (the pairs having that max), then one of those pairs uniformly."""
    dev = g.device
    M = torch.arange(lo, hi + 1, device=dev)
    pick = torch.multinomial((2 * M - 1).double(), b, replacement=True, generator=g)
    M = M[pick]  # [b]
    u = (torch.rand(b, generator=g, device=dev, dtype=torch.float64) * (2 * M - 1)).long().clamp(max=2 * M - 2)
    # u < M: (M, u + 1); otherwise (u - M + 1, M): the 2M - 1 pairs with max M, each once
    return torch.where((u < M)[:, None], torch.stack([M, u + 1], 1), torch.stack([u - M + 1, M], 1))


@dataclass(frozen=True, kw_only=True)
class Summation(DecoderTask):
    """Sum of L integers, modulo 10 (make_sum_dataset.py; S2SSumDataInstanceProcessor with
    configs/data/s2s_sum.jsonnet's modulo_factor 10 and separator "[SEP] ").

    Values uniform in 1..9; prompt "Compute: v1 + .. + vL ." then SEP, target "The answer is
    s ." with s = (v1 + .. + vL) mod ``modulo``. Length L: summands, train 1..8, test 9..16.

    Worked examples (``*`` marks the scored positions)::

        L = 3   Compute: 7 + 4 + 9 . [SEP]* The* answer* is* 0* .* </s>
        L = 1   Compute: 6 . [SEP]* The* answer* is* 6* .* </s>

    Chance: 1/15 (ten digits, The, answer, is, ".", EOS).
    """

    name: ClassVar[str] = "summation"
    length_unit: ClassVar[str] = "summands"
    train_range: ClassVar[tuple[int, int]] = (1, 8)
    test_range: ClassVar[tuple[int, int]] = (9, 16)

    modulo: int = 10  # the answer is the sum modulo this (the source's modulo_factor)

    def __post_init__(self):
        _check_modulo(self.modulo)

    @property
    def words(self) -> tuple[str, ...]:
        return ("Compute:", "+") + ANSWER + (".",) + DIGITS

    @property
    def output_words(self) -> tuple[str, ...]:
        return ANSWER + (".", "</s>") + DIGITS

    def max_tokens(self, length: int) -> int:
        return (1 + 2 * length - 1 + 1) + 1 + (3 + _width(self.modulo - 1) + 1) + 1

    def _draw(self, g, b, lo, hi):
        dev = g.device
        v = torch.randint(1, 10, (b, hi), generator=g, device=dev)
        L = lengths_per_row(g, b, lo, hi)
        answer = (v * first(L, hi)).sum(1) % self.modulo
        d, ok = number_digits(answer, _width(self.modulo - 1))
        prompt = [self.word("Compute:", b, dev), separated(self.digit_ids(v)[..., None], first(L, hi)[..., None], L,
                                                          self.ids["+"]), self.word(".", b, dev)]
        output = [*self.phrase("The answer is", b, dev), (self.digit_ids(d), ok), self.word(".", b, dev)]
        return *pack(prompt), *pack(output)


@dataclass(frozen=True, kw_only=True)
class Parity(DecoderTask):
    """Is the number of ones even? (make_parity_dataset.py; S2SParityDataInstanceProcessor).

    L bits uniform in {0, 1}; prompt "Is the number of 1's even in the sequence [ b1, .., bL ] ?"
    and target "The answer is Yes." (an even count: the source maps answer 0 to Yes) or "No.",
    no separator. Length L: bits, train 1..8, test 9..16.

    Worked examples (``*`` marks the scored positions)::

        L = 3, 1 0 1   Is the number of 1's even in the sequence [ 1 , 0 , 1 ] ?* The* answer* is*
                       Yes* .* </s>
        L = 1, 1       Is the number of 1's even in the sequence [ 1 ] ?* The* answer* is* No* .* </s>

    Chance: 1/7 (The, answer, is, Yes, No, ".", EOS).
    """

    name: ClassVar[str] = "parity"
    length_unit: ClassVar[str] = "bits"
    train_range: ClassVar[tuple[int, int]] = (1, 8)
    test_range: ClassVar[tuple[int, int]] = (9, 16)
    boundary: ClassVar[str] = "?"
    separator: ClassVar[bool] = False
    QUESTION: ClassVar[str] = "Is the number of 1's even in the sequence ["

    @property
    def words(self) -> tuple[str, ...]:
        return ("Is", "the", "number", "of", "1's", "even", "in", "sequence", "[", "]", ",", "?") + ANSWER + (
            "Yes", "No", ".", "0", "1")

    @property
    def output_words(self) -> tuple[str, ...]:
        return ANSWER + ("Yes", "No", ".", "</s>")

    def max_tokens(self, length: int) -> int:
        return (len(self.QUESTION.split()) + 2 * length - 1 + 2) + 5 + 1

    def _draw(self, g, b, lo, hi):
        dev = g.device
        bits = torch.randint(0, 2, (b, hi), generator=g, device=dev)
        L = lengths_per_row(g, b, lo, hi)
        odd = (bits * first(L, hi)).sum(1) % 2
        verdict = torch.where(odd == 0, self.ids["Yes"], self.ids["No"])[:, None]
        prompt = [*self.phrase(self.QUESTION, b, dev),
                  separated((bits + self.ids["0"])[..., None], first(L, hi)[..., None], L, self.ids[","]),
                  *self.phrase("] ?", b, dev)]
        output = [*self.phrase("The answer is", b, dev), (verdict, torch.ones_like(verdict, dtype=torch.bool)),
                  self.word(".", b, dev)]
        return *pack(prompt), *pack(output)


@dataclass(frozen=True, kw_only=True)
class PolynomialEvaluation(DecoderTask):
    """Evaluate a polynomial at x, modulo 10 (make_poly_dataset.py; S2SPolynomialDataInstanceProcessor
    with configs/data/s2s_poly.jsonnet's modulo_factor 10, no separator).

    L terms c * x ** d with c uniform in -3..3 and d in 0..3, and x uniform in -2..2 (x ** 0 = 1,
    0 ** 0 included); prompt "Evaluate at x = x in c1 * x ** d1 + .. + cL * x ** dL ?" and target
    "The answer is r." with r = (sum of c * x^d) mod ``modulo`` in 0..modulo-1 (Python's %). A
    negative number is written "- 3". Length L: terms, train 1..8, test 9..16.

    Worked examples (``*`` marks the scored positions)::

        L = 2, x = -2   Evaluate at x = - 2 in 3 * x ** 2 + - 1 * x ** 3 ?* The* answer* is* 0* .* </s>
                        (12 + 8 = 20, 20 mod 10 = 0)
        L = 1, x = 1    Evaluate at x = 1 in - 3 * x ** 0 ?* The* answer* is* 7* .* </s>   (-3 mod 10)

    Chance: 1/15 (ten digits, The, answer, is, ".", EOS).
    """

    name: ClassVar[str] = "polynomial_evaluation"
    length_unit: ClassVar[str] = "terms"
    train_range: ClassVar[tuple[int, int]] = (1, 8)
    test_range: ClassVar[tuple[int, int]] = (9, 16)
    boundary: ClassVar[str] = "?"
    separator: ClassVar[bool] = False

    modulo: int = 10  # the answer is the value modulo this (the source's modulo_factor)

    def __post_init__(self):
        _check_modulo(self.modulo)

    @property
    def words(self) -> tuple[str, ...]:
        return ("Evaluate", "at", "x", "=", "in", "*", "**", "+", "-", "?") + ANSWER + (".",) + DIGITS

    @property
    def output_words(self) -> tuple[str, ...]:
        return ANSWER + (".", "</s>") + DIGITS

    def max_tokens(self, length: int) -> int:
        return (4 + 2 + 1 + 6 * length + length - 1 + 1) + (3 + _width(self.modulo - 1) + 1) + 1

    def _draw(self, g, b, lo, hi):
        dev, ids = g.device, self.ids
        coef = torch.randint(-3, 4, (b, hi), generator=g, device=dev)
        degree = torch.randint(0, 4, (b, hi), generator=g, device=dev)
        x = torch.randint(-2, 3, (b,), generator=g, device=dev)
        L = lengths_per_row(g, b, lo, hi)
        real = first(L, hi)
        value = (coef * x[:, None] ** degree * real).sum(1)  # x ** 0 = 1, also for x = 0
        d, ok = number_digits(torch.remainder(value, self.modulo), _width(self.modulo - 1))

        def const(word: str) -> Tensor:
            return torch.full((b, hi), ids[word], dtype=torch.long, device=dev)

        # one term: [-] |c| * x ** d, then "+" unless it is the last
        term = torch.stack([const("-"), self.digit_ids(coef.abs()), const("*"), const("x"), const("**"),
                            self.digit_ids(degree), const("+")], 2)  # [b, K, 7]
        ones = torch.ones_like(real)
        term_ok = torch.stack([coef < 0, ones, ones, ones, ones, ones,
                               torch.arange(hi, device=dev)[None, :] < (L - 1)[:, None]], 2) & real[..., None]
        x_sign = (torch.full((b, 1), ids["-"], dtype=torch.long, device=dev), (x < 0)[:, None])
        prompt = [*self.phrase("Evaluate at x =", b, dev), x_sign, (self.digit_ids(x.abs())[:, None], ones[:, :1]),
                  self.word("in", b, dev), items(term, term_ok), self.word("?", b, dev)]
        output = [*self.phrase("The answer is", b, dev), (self.digit_ids(d), ok), self.word(".", b, dev)]
        return *pack(prompt), *pack(output)
