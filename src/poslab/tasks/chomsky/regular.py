"""The four regular tasks of the Chomsky benchmark (Delétang et al. 2023; Ruoss et al. 2023).

Each maps an input string of length n to one class, read off the single EMPTY slot after the
input (:mod:`poslab.tasks.chomsky.format`; the sources' ``output_length`` is 1):

    even_pairs          x in {0,1}^n -> #(01 or 10 pairs) mod 2            (= x_1 xor x_n)
    modular_arithmetic  d_1 o_1 d_2 ... d_k, d in Z_5, o in {+, -, *} -> its value mod 5,
                        * before + and -; an even task length L gives L - 1 tokens (n odd)
    parity_check        x in {0,1}^n -> #1s mod 2
    cycle_navigation    a in {0,1,2}^n (stay, right, left = a - 1 steps) -> final position on a
                        5-cycle starting at 0: sum(a_i - 1) mod 5

Read exactly: ``tasks/regular/{even_pairs,modular_arithmetic,parity_check,cycle_navigation}.py``,
``tasks/task.py``, ``experiments/{constants,utils,example,training,range_evaluation}.py`` of
google-deepmind/randomized_positional_encodings and the same files of
google-deepmind/neural_networks_chomsky_hierarchy (the task files differ only in formatting).
Sizes as there: input_size 2, 5 + 4, 2, 3; output_size 2, 5, 2, 5. modular_arithmetic's input
alphabet keeps the unused blank ``_`` (id modulus + 3) so its input_size is the source's;
its operators are drawn uniformly from ``operators`` (the source's default all three, ids
modulus + {0: +, 1: -, 2: *}), its numbers uniformly from Z_modulus. Scoring: every task
scores its one slot (the source's ``accuracy_mask`` is all ones).

Chosen here: token ids (PAD 0, EMPTY 1, source symbol k -> k + 2; format module), and the task
length L of a batch drawn per sequence when a range is asked (the sources draw one L per batch).
Lengths: trained on L ~ U{1, .., 40}, tested on L = 41..500, the papers' set-up (from their
experimental sections as recalled, not re-read for this module; the code confirms the training
curriculum, ``UniformCurriculum(range(1, 41))``, while the repositories' ``example.py`` evaluates
L = 1..100 and averages the accuracy over 41..100).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.tasks.chomsky.format import EncoderTask, Rows, uniform_inputs


def _one(inputs: Tensor, n: Tensor, value: Tensor) -> Rows:
    ones = torch.ones_like(n)
    return Rows(inputs, n, value[:, None], ones)


class _Uniform(EncoderTask):
    """A task over i.i.d. uniform input symbols: draw = uniform symbols, then the rule."""

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        return self.answer(uniform_inputs(generator, lengths, self.input_size), lengths)


@dataclass(frozen=True, kw_only=True)
class EvenPairs(_Uniform):
    """Is the number of unequal adjacent pairs (01 or 10) even? Class 0 if so, else 1.

    Worked examples (tokens: symbols 0 1, ``_`` the empty slot; ^ the scored slot)::

        0 0 1 1 1 0 _       one 01, one 10: even          -> class 0
                    ^
        0 1 0 1 0 0 1 _     three 01, two 10: five, odd   -> class 1
                      ^

    A sample (``manual_seed(0)``, batch 1, L = 6): ``0 1 1 0 1 1 _``: 01, 10, 01 -> class 1, the
    target at position 6, the only position in ``loss_mask``. Chance 1/2.
    """

    name: ClassVar[str] = "even_pairs"

    @property
    def input_size(self) -> int:
        return 2

    @property
    def output_size(self) -> int:
        return 2

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        pos = torch.arange(inputs.shape[1], device=inputs.device)
        pair = (inputs[:, 1:] != inputs[:, :-1]) & (pos[1:] < n[:, None])  # [b, s - 1] pair (i-1, i) in x
        return _one(inputs, n, pair.sum(-1) % 2)


@dataclass(frozen=True, kw_only=True)
class ParityCheck(_Uniform):
    """Is the number of 1s even? Class 0 if so, else 1.

    Worked examples::

        1 0 1 0 1 0 0 _     three 1s -> class 1
        0 1 1 1 1 _         four 1s  -> class 0

    A sample (``manual_seed(0)``, batch 1, L = 6): ``0 1 1 0 1 1 _``: four 1s -> class 0 at
    position 6 (the one scored slot). Chance 1/2.
    """

    name: ClassVar[str] = "parity_check"

    @property
    def input_size(self) -> int:
        return 2

    @property
    def output_size(self) -> int:
        return 2

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        return _one(inputs, n, inputs.sum(-1) % 2)  # zero past n


@dataclass(frozen=True, kw_only=True)
class CycleNavigation(_Uniform):
    """The final position on a 5-cycle after moving a_i - 1 steps for each action a_i, from 0.

    Input symbols are the source's action ids: it draws a in {0, 1, 2} and moves a - 1, so 0 is
    a step left, 1 stays, 2 is a step right; classes 0..4.

    Worked examples (the source's two, written in action ids)::

        2 0 1 0 0 _     +1 -1 0 -1 -1 = -2      -> class 3
        2 2 2 0 _       +1 +1 +1 -1 = 2         -> class 2

    A sample (``manual_seed(0)``, batch 1, L = 6): ``2 0 2 0 1 0 _``: +1 -1 +1 -1 0 -1 = -1 ->
    class 4 at position 6. Chance 1/5.
    """

    name: ClassVar[str] = "cycle_navigation"
    cycle_length: ClassVar[int] = 5  # the source's fixed cycle

    @property
    def input_size(self) -> int:
        return 3

    @property
    def output_size(self) -> int:
        return self.cycle_length

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        pos = torch.arange(inputs.shape[1], device=inputs.device)
        moves = torch.where(pos < n[:, None], inputs - 1, 0)  # [b, s]
        return _one(inputs, n, moves.sum(-1) % self.cycle_length)


OPERATORS = ("+", "-", "*", "_")  # the source's OP_BY_CHARACTER order: op c is id modulus + index


@dataclass(frozen=True, kw_only=True)
class ModularArithmetic(EncoderTask):
    """The value mod ``modulus`` of d_1 o_1 d_2 ... o_{k-1} d_k, multiplication first.

    Input ids: the numbers 0..modulus-1, then + - * _ as modulus + 0..3 (``_`` never drawn).
    The task length L gives n = L tokens if L is odd, else L - 1 (the source's rule), so L = 1
    and L = 2 are both one number.

    Worked examples (the source's, mod 5)::

        1 + 2 * 3 _             1 + 6 = 7           -> class 2
        1 - 1 - 1 _             -1                  -> class 4
        0 * 1 + 4 * 3 - 2 _     0 + 12 - 2 = 10     -> class 0

    A sample (``manual_seed(0)``, batch 1, L = 6, so n = 5): ``4 + 4 * 3 _``: 4 + 12 = 16 ->
    class 1 at position 5. Chance 1/modulus.
    """

    name: ClassVar[str] = "modular_arithmetic"

    modulus: int = 5  # the source's constants.py
    operators: tuple[str, ...] = ("+", "*", "-")  # drawn uniformly; the source's default set

    def __post_init__(self):
        if not isinstance(self.modulus, int) or isinstance(self.modulus, bool) or self.modulus < 2:
            raise ConfigError("modulus", self.modulus, "an integer >= 2")
        ops = self.operators
        if (not isinstance(ops, (tuple, list)) or not ops or len(set(ops)) != len(ops)
                or any(o not in OPERATORS[:3] for o in ops)):
            raise ConfigError("operators", ops, "a non-empty set of distinct operators among + - *")

    @property
    def input_size(self) -> int:
        return self.modulus + len(OPERATORS)

    @property
    def output_size(self) -> int:
        return self.modulus

    def input_length(self, length: int) -> int:
        return length if length % 2 else length - 1

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        device = generator.device
        n = torch.where(lengths % 2 == 1, lengths, lengths - 1)  # [b]
        hi, b = int(n.max()), len(n)
        numbers = torch.randint(0, self.modulus, (b, hi // 2 + 1), generator=generator, device=device)
        op_ids = torch.tensor([self.modulus + OPERATORS.index(o) for o in self.operators], device=device)
        ops = op_ids[torch.randint(0, len(op_ids), (b, max(hi // 2, 1)), generator=generator, device=device)]
        x = torch.zeros((b, hi), dtype=torch.long, device=device)
        x[:, 0::2] = numbers[:, : (hi + 1) // 2]
        x[:, 1::2] = ops[:, : hi // 2]
        x = x.masked_fill(torch.arange(hi, device=device) >= n[:, None], 0)
        return self.answer(x, n)

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        """Left to right over the k = (n + 1) / 2 numbers: a running sum of finished terms and the
        current term (a signed product), vectorised over the batch."""
        p, add, sub = self.modulus, self.modulus + OPERATORS.index("+"), self.modulus + OPERATORS.index("-")
        k = (n + 1) // 2  # [b] numbers per row
        total = torch.zeros_like(n)
        term = inputs[:, 0] % p if inputs.shape[1] else torch.zeros_like(n)
        for j in range(1, int(k.max()) if len(k) else 0):
            live = j < k  # [b]
            op, d = inputs[:, 2 * j - 1], inputs[:, 2 * j]
            new_term = (op == add) | (op == sub)
            total = torch.where(live & new_term, (total + term) % p, total)
            term = torch.where(live, torch.where(new_term, torch.where(op == sub, -d, d) % p, term * d % p), term)
        return _one(inputs, n, (total + term) % p)
