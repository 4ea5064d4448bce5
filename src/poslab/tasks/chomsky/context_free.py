"""The four (deterministic) context-free tasks of the Chomsky benchmark (Delétang et al. 2023;
Ruoss et al. 2023), in the encoder form of :mod:`poslab.tasks.chomsky.format`:

    stack_manipulation           a stack s in {0,1}^k (bottom to top), then n - k actions
                                 POP / PUSH 0 / PUSH 1 (ids 2 / 3 / 4) -> the final stack top to
                                 bottom, the termination class 2, then class 0 up to n + 1 slots
    reverse_string               x in {0,1}^n -> x_n .. x_1 (n slots)
    modular_arithmetic_brackets  a bracketed expression over Z_5 with + - * of exactly n
                                 characters -> its value (1 slot)
    solve_equation               a bracketed expression over Z_5 with + - in which one digit is
                                 replaced by x, then = and its value: n characters -> x (1 slot)

Read exactly: ``tasks/dcf/{stack_manipulation,reverse_string,modular_arithmetic_brackets,
solve_equation}.py``, ``tasks/cs/duplicate_string.py`` (reverse_string's parent), ``tasks/task.py``
and ``experiments/{constants,utils,example,training,range_evaluation}.py`` of
google-deepmind/randomized_positional_encodings and google-deepmind/neural_networks_chomsky_hierarchy
(same rules; the latter pins solve_equation to mult=False, which the former's SolveEquation also
uses). Options as the sources' ``constants.py``: reverse_string over 2 symbols,
modular_arithmetic_brackets modulus 5 with ``*``, solve_equation modulus 5 without ``*``.

What the sources do and this module reproduces:

- stack_manipulation: k ~ U{1, .., n - 1} (n = 1: the single bit is the stack), stack bits and
  actions uniform; POP on an empty stack is ignored. Output n + 1 slots; only the slots up to
  and including the termination class are scored (the source's ``accuracy_mask``). The source's
  loss is the cross-entropy over *all* n + 1 slots (its padding zeros are trained); poslab's
  ``loss_mask`` is the scored slots only, so training here ignores the padding slots: the one
  difference from the source, forced by a single mask for loss and score.
- modular_arithmetic_brackets: the sources' grammar of length n: n = 1 ``d``, 2 ``-d``,
  3 ``(d)``, 4 ``(-d)``; n >= 5 ``(A o B)`` with len(A) ~ U{1, .., n - 4}, len(B) = n - 3 - len(A),
  A then B generated first, then o uniform in + - * (ids: digits 0..4, + 5, - 6, * 7, ( 8, ) 9;
  the source's alphabet also names x 10 and = 11, never used; input_size 11).
- solve_equation: an expression of n - 2 characters without ``*``, a position drawn uniformly
  and moved right (cyclically) to the next digit, that digit replaced by x, then ``= value``
  (ids: digits 0..4, + 5, - 6, ( 7, ) 8, x 9, = 10; input_size 11). The answer is the replaced
  digit, the unique solution since x enters with coefficient +-1. For n < 3 the source returns
  an all-zero input (the digit 0 repeated) with answer 0; so does this module.

Chosen here: token ids (PAD 0, EMPTY 1, source symbol k -> k + 2); the sources' NumPy draws are
replaced by draws from the torch generator (one uniform block per batch, consumed in the same
order as the source's draws), so the distributions match, not the streams; task lengths drawn per
sequence when a range is asked. Lengths: as the regular tasks (:mod:`poslab.tasks.chomsky.regular`): L in [1, 40] for
training, 41..500 for the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.tasks.chomsky.format import AlphabetTask, EncoderTask, Rows

# ----------------------------------------------------------------------------- stack_manipulation

POP, PUSH_0, PUSH_1 = 2, 3, 4  # the source's action ids; stack symbols are 0 and 1
TERMINATION = 2  # the output class after the last stack symbol


@dataclass(frozen=True, kw_only=True)
class StackManipulation(EncoderTask):
    """Run the actions on the stack and read it top to bottom, then the termination class 2.

    Tokens: stack symbols ``0 1``, actions ``POP PUSH0 PUSH1`` (source ids 2 3 4), ``_`` the
    empty slots (n + 1 of them). Worked examples (the source's two; ^ scored)::

        0 1 1 0 PUSH1 POP POP _ _ _ _ _ _ _ _      stack 0 1 1 0 -> 0 1 1 0 1 -> 0 1 1 0 -> 0 1 1
                              1 1 0 2 0 0 0 0      targets: top to bottom, 2, padding
                              ^ ^ ^ ^
        1 1 0 POP POP POP _ _ _ _ _ _ _            the stack ends empty
                          2 0 0 0 0 0 0
                          ^

    A sample (``manual_seed(0)``, batch 1, L = 6): ``1 0 1 1 1 POP _ _ _ _ _ _ _``: the stack
    1 0 1 1 1, popped to 1 0 1 1 -> targets ``1 1 0 1 2 0 0`` at positions 6..12, positions
    6..10 scored.
    Chance 1/3 per slot.
    """

    name: ClassVar[str] = "stack_manipulation"

    @property
    def input_size(self) -> int:
        return 5

    @property
    def output_size(self) -> int:
        return 3

    def output_length(self, n: int) -> int:
        return n + 1

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        device, b, hi = generator.device, len(lengths), int(lengths.max())
        k = 1 + (torch.rand(b, generator=generator, device=device, dtype=torch.float64) * (lengths - 1)).long()  # [b]
        bits = torch.randint(0, 2, (b, hi), generator=generator, device=device)
        actions = torch.randint(POP, PUSH_1 + 1, (b, hi), generator=generator, device=device)
        pos = torch.arange(hi, device=device)
        x = torch.where(pos < k[:, None], bits, actions).masked_fill(pos >= lengths[:, None], 0)  # [b, s]
        return self.answer(x, lengths)

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        """Push every stack symbol and PUSH, pop at POP (not below empty), vectorised over the batch."""
        b, w = inputs.shape
        rows = torch.arange(b, device=inputs.device)
        stack = torch.zeros((b, w + 1), dtype=torch.long, device=inputs.device)  # [b, depth]
        top = torch.zeros_like(n)  # [b] stack height
        for j in range(w):
            t, live = inputs[:, j], j < n
            push, pop = live & (t != POP), live & (t == POP)
            value = torch.where(t >= PUSH_0, t - PUSH_0, t)  # 0 1 PUSH0 PUSH1 -> 0 1 0 1
            stack[rows, top] = torch.where(push, value, stack[rows, top])
            top = top + push.long() - (pop & (top > 0)).long()
        slot = torch.arange(w + 1, device=inputs.device)[None, :]  # [1, m_max]
        from_top = stack.gather(1, (top[:, None] - 1 - slot).clamp(min=0))  # [b, m_max]
        out = torch.where(slot < top[:, None], from_top, torch.where(slot == top[:, None], TERMINATION, 0))
        return Rows(inputs, n, out, n + 1, top + 1)


# ----------------------------------------------------------------------------- reverse_string

@dataclass(frozen=True, kw_only=True)
class ReverseString(AlphabetTask):
    """x_1 .. x_n -> x_n .. x_1, over ``m`` symbols (the paper's binary strings by default).

    Worked examples (the source's)::

        0 1 1 0 1 0 _ _ _ _ _ _        -> 0 1 0 1 1 0 at positions 6..11, all scored
        1 2 3 0 2 1 _ _ _ _ _ _        -> 1 2 0 3 2 1 (m = 4)

    A sample (``manual_seed(0)``, batch 1, L = 6): ``0 1 1 0 1 1 _ _ _ _ _ _`` -> targets
    ``1 1 0 1 1 0`` at positions 6..11. Chance 1/m per slot.
    """

    name: ClassVar[str] = "reverse_string"

    m: int = 2  # alphabet size (the source's vocab_size; 2 in its constants.py)

    def output_length(self, n: int) -> int:
        return n

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        j = torch.arange(inputs.shape[1], device=inputs.device)[None, :]
        return Rows(inputs, n, inputs.gather(1, (n[:, None] - 1 - j).clamp(min=0)), n)


# ----------------------------------------------------------------------------- bracketed expressions

def _check_modulus(modulus: object) -> None:
    if not isinstance(modulus, int) or isinstance(modulus, bool) or not 2 <= modulus <= 10:
        raise ConfigError("modulus", modulus, "an integer in [2, 10] (each value is one digit character)")


def _uniforms(generator: torch.Generator, lengths: Tensor) -> list[list[float]]:
    """One row of n uniforms in [0, 1) per sequence: enough for an expression of length n (its
    leaves take one draw, its inner nodes two, and an inner node covers three characters)."""
    u = torch.rand((len(lengths), int(lengths.max())), generator=generator, device=generator.device,
                   dtype=torch.float64)
    return u.cpu().tolist()


def _randint(u: Iterator[float], low: int, high: int) -> int:
    """Uniform in [low, high) from one uniform draw."""
    return low + int(next(u) * (high - low))


def _expression(n: int, u: Iterator[float], p: int, mult: bool) -> tuple[str, int]:
    """A bracketed expression of exactly n characters over Z_p and its value (the sources' grammar)."""
    if n <= 4:
        d = _randint(u, 0, p)
        return ("", f"{d}", f"-{d}", f"({d})", f"(-{d})")[n], (d if n in (1, 3) else -d) % p
    left = _randint(u, 1, n - 3)
    a, va = _expression(left, u, p, mult)
    b, vb = _expression(n - 3 - left, u, p, mult)
    op = "+-*"[_randint(u, 0, 3 if mult else 2)]
    value = va + vb if op == "+" else va - vb if op == "-" else va * vb
    return f"({a}{op}{b})", value % p


def _evaluate(text: str, p: int, x: int = 0) -> int:
    """The value mod p of a bracketed expression (``x`` stands for the digit x); the naive reading
    of the grammar, independent of the generator."""

    def term(i: int) -> tuple[int, int]:
        c = text[i]
        if c == "-":
            return -digit(text[i + 1]) % p, i + 2
        if c != "(":
            return digit(c), i + 1
        a, i = term(i + 1)
        if text[i] == ")":
            return a, i + 1
        op = text[i]
        b, i = term(i + 1)
        if text[i] != ")":
            raise ValueError(f"not an expression: {text!r}")
        return (a + b if op == "+" else a - b if op == "-" else a * b) % p, i + 1

    def digit(c: str) -> int:
        return x if c == "x" else int(c)

    value, end = term(0)
    if end != len(text):
        raise ValueError(f"not an expression: {text!r}")
    return value


class _Bracketed(EncoderTask):
    """What the two bracket tasks share: an alphabet (digits, then the source's symbols) and rows
    built per sequence from one block of uniforms."""

    modulus: int
    SYMBOLS: ClassVar[str]  # the characters after the digits, in the source's id order

    @property
    def input_size(self) -> int:
        return self.modulus + 6  # the sources' input_size

    @property
    def output_size(self) -> int:
        return self.modulus

    def symbols(self) -> list[str]:
        """The characters of the source's input ids 0, 1, ...."""
        return [str(d) for d in range(self.modulus)] + list(self.SYMBOLS)

    def _rows(self, texts: list[str], values: list[int]) -> Rows:
        ids = {c: i for i, c in enumerate(self.symbols())}
        n = torch.tensor([len(t) for t in texts], dtype=torch.long)
        x = torch.zeros((len(texts), int(n.max())), dtype=torch.long)
        for i, t in enumerate(texts):
            x[i, :len(t)] = torch.tensor([ids[c] for c in t])
        return Rows(x, n, torch.tensor(values, dtype=torch.long)[:, None], torch.ones_like(n))

    def _texts(self, inputs: Tensor, n: Tensor) -> list[str]:
        chars = self.symbols()
        return ["".join(chars[v] for v in row[:k]) for row, k in zip(inputs.tolist(), n.tolist(), strict=True)]

    def _placed(self, rows: Rows, device: torch.device) -> Rows:
        return Rows(*(t.to(device) for t in rows[:4]))


@dataclass(frozen=True, kw_only=True)
class ModularArithmeticBrackets(_Bracketed):
    """The value mod 5 of a bracketed expression of n characters over + - * (``mult``).

    Worked examples (^ the scored slot)::

        ((1+2)*(-3)) _       3 * -3 = -9       -> class 1
                     ^
        (-4) _               -4                -> class 1

    A sample (``manual_seed(0)``, batch 1, L = 9): ``((2-4)+3) _`` -> -2 + 3 = 1 -> class 1
    at position 9. Chance 1/modulus.
    """

    name: ClassVar[str] = "modular_arithmetic_brackets"
    SYMBOLS: ClassVar[str] = "+-*()x="

    modulus: int = 5  # the sources' constants.py
    mult: bool = True  # include *; the sources' constants.py sets it

    def __post_init__(self):
        _check_modulus(self.modulus)
        if not isinstance(self.mult, bool):
            raise ConfigError("mult", self.mult, "true or false")

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        texts, values = [], []
        for L, u in zip(lengths.tolist(), _uniforms(generator, lengths), strict=True):
            text, value = _expression(L, iter(u), self.modulus, self.mult)
            texts.append(text)
            values.append(value)
        return self._placed(self._rows(texts, values), lengths.device)

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        texts = self._texts(inputs, n)
        return self._placed(self._rows(texts, [_evaluate(t, self.modulus) for t in texts]), inputs.device)


@dataclass(frozen=True, kw_only=True)
class SolveEquation(_Bracketed):
    """Solve ``E(x) = v`` over Z_5 for x, E a bracketed expression over + - of n - 2 characters.

    Worked examples (^ the scored slot)::

        ((x+2)-(-3))=1 _     x + 5 = 1         -> class 1
                       ^
        (-x)=2 _             -x = 2            -> class 3
        0 0 _                n < 3: the source's all-zero input -> class 0

    A sample (``manual_seed(0)``, batch 1, L = 9): ``((3)-x)=1 _`` -> 3 - x = 1 -> x = 2,
    class 2 at position 9. Chance 1/modulus.
    """

    name: ClassVar[str] = "solve_equation"
    SYMBOLS: ClassVar[str] = "+-()x="

    modulus: int = 5  # the sources' constants.py

    def __post_init__(self):
        _check_modulus(self.modulus)

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        texts, values = [], []
        digits = set(self.symbols()[: self.modulus])
        for L, u in zip(lengths.tolist(), _uniforms(generator, lengths), strict=True):
            if L < 3:
                texts.append("0" * L)
                values.append(0)
                continue
            stream = iter(u)
            text, value = _expression(L - 2, stream, self.modulus, False)
            i = _randint(stream, 0, L - 2)
            while text[i] not in digits:
                i = (i + 1) % (L - 2)
            texts.append(f"{text[:i]}x{text[i + 1:]}={value}")
            values.append(int(text[i]))
        return self._placed(self._rows(texts, values), lengths.device)

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        texts, values = self._texts(inputs, n), []
        for text in texts:
            if len(text) < 3:
                values.append(0)
                continue
            lhs, rhs = text.split("=")
            values.append(next(x for x in range(self.modulus) if _evaluate(lhs, self.modulus, x) == int(rhs)))
        return self._placed(self._rows(texts, values), inputs.device)
