"""Addition of two integers digit by digit, in the formats of the arithmetic length-generalization papers,
handing the per-token positions that position coupling and Abacus read.

A causal decoder reads one sequence per example and is scored on the sum's digits and the end token
(teacher forced, exact match over them). Operands are zero-padded to the width n of the longer one and
the sum to n + 1 digits, as position coupling's addition does (Cho et al. 2024, arXiv 2405.20671). An
operand of d digits is uniform over the d-digit numbers ([0, 9] for d = 1), as there.

Formats (``format``)::

    plain        a_{n-1} .. a_0 + b_{n-1} .. b_0 = s_n .. s_0 </s>            most significant digit first
    reversed     a_{n-1} .. a_0 + b_{n-1} .. b_0 = s_0 .. s_n </s>            the sum reversed (Cho et al.;
                                                                               Zhou et al.'s reversed format)
    index_hints  h_{n-1} a_{n-1} .. h_0 a_0 + h_{n-1} b_{n-1} .. h_0 b_0 = h_0 s_0 .. h_n s_n </s>
                 the reversed format with an index hint before every digit (Zhou et al. 2024,
                 arXiv 2402.09371): h_i marks significance i in both operands and the sum

Index hints h_i are the tokens ``h{c + i}`` of a vocabulary of ``n_hints`` hint symbols, c uniform in
0 .. n_hints - (n + 1) per sequence (drawn in evaluation too), so that every hint symbol is trained on
short operands and a longer addition at test reads none it never saw (the random-start index hints of
position coupling's baseline). The sum's hints are given, not scored: the loss and the score fall on the
sum's digits and the end token only.

Positions (``positions``), ``Batch.positions`` [b, s] (0 on padding):

- ``index``: none; the model uses its own 0 .. s - 1 (NoPE, RoPE, APE, ...);
- ``coupled`` (position coupling, with starting id 1): a digit (or its hint) of significance i in either
  operand or in the sum has id n + 1 - i; every other token (+, =, </s>) id n + 2;
- ``abacus`` (Abacus): a digit of significance i has id i + 1, its place counted from the number's
  least significant digit (the paper writes numbers least significant digit first, where this is the
  place from the number's start); every other token (hints too) 0.

Length L is the operands' digit count: a range (lo, hi) draws each operand's count uniformly and
independently in lo .. hi (position coupling's training set, 1 .. n); L alone makes both operands L digits
(its test sets).

Worked examples (``*`` marks the scored positions: the next token is a sum digit or </s>)::

    reversed, 653 + 49          6 5 3 + 0 4 9 =* 2* 0* 7* 0 </s>          (702 reversed and padded: 2 0 7 0)
      coupled positions          2 3 4 5 2 3 4 5  4  3  2 1  5
      abacus positions           3 2 1 0 3 2 1 0  1  2  3 4  0
    plain, 5 + 7                5 + 7 =* 1* 2 </s>
    index_hints, 47 + 5, c = 0  h1 4 h0 7 + h1 0 h0 5 = h0* 2 h1* 5 h2* 0 </s>

Chance: 1/11 (ten digits and </s>). Notation: b batch, s token index, n operand width, K hi.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError, check_choice
from poslab.tasks.base import Batch, Length, _is_int, length_range

FORMATS = ("plain", "reversed", "index_hints")
POSITIONS = ("index", "coupled", "abacus")
SPECIAL = ("<pad>", "+", "=", "</s>")  # PAD 0, then the operator, the equals sign and the end token
PLUS, EQ, EOS = 1, 2, 3
DIGIT0 = len(SPECIAL)  # digit d is token DIGIT0 + d
HINT0 = DIGIT0 + 10  # hint symbol j is token HINT0 + j


@dataclass(frozen=True, kw_only=True)
class DigitAddition:
    name: ClassVar[str] = "digit_addition"
    target_kind: ClassVar[str] = "sequence"
    model_form: ClassVar[str] = "decoder"
    length_unit: ClassVar[str] = "digits of each operand"

    format: str = "reversed"  # one of FORMATS
    positions: str = "index"  # one of POSITIONS: what Batch.positions holds
    n_hints: int = 32  # index-hint symbols: more than the widest sum (n + 1 digits) evaluated

    def __post_init__(self):
        check_choice("format", self.format, FORMATS)
        check_choice("positions", self.positions, POSITIONS)
        if not _is_int(self.n_hints) or self.n_hints < 2:
            raise ConfigError("n_hints", self.n_hints, "an integer >= 2")

    @cached_property
    def symbols(self) -> tuple[str, ...]:
        return SPECIAL + tuple("0123456789") + tuple(f"h{j}" for j in range(self.n_hints))

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    @property
    def chance(self) -> float:
        return 1.0 / 11

    def max_tokens(self, length: int) -> int:
        """Tokens of an addition of two ``length``-digit operands (the widest at that length)."""
        return int(self.max_tokens_of(torch.tensor([length]))[0])

    def validate(self, min_length: int) -> None:
        if not _is_int(min_length) or min_length < 1:
            raise ConfigError("length", min_length, "a positive integer (digits per operand)")
        if self.format == "index_hints" and min_length + 1 > self.n_hints:
            raise ConfigError("n_hints", self.n_hints, f"an integer >= {min_length + 1} (one hint symbol per "
                                                       f"significance of a {min_length + 1}-digit sum)")

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch:
        lo, hi = length_range(length)
        self.validate(lo)
        self.validate(hi)
        g, b, dev = generator, batch_size, generator.device
        raw = torch.randint(0, 10, (b, 2, hi), generator=g, device=dev)  # [b, 2, K] least significant first
        lead = torch.randint(1, 10, (b, 2), generator=g, device=dev)
        counts = (torch.full((b, 2), hi, dtype=torch.long, device=dev) if lo == hi
                  else torch.randint(lo, hi + 1, (b, 2), generator=g, device=dev))
        n = counts.amax(1)  # [b] operand width
        start = torch.zeros(b, dtype=torch.long, device=dev)
        if self.format == "index_hints":  # c uniform in 0 .. n_hints - (n + 1)
            start = (torch.rand(b, generator=g, device=dev) * (self.n_hints - n)).long().clamp(max=self.n_hints - n - 1)
        k = torch.arange(hi, device=dev)
        top = (k == (counts - 1)[..., None]) & (counts > 1)[..., None]  # the leading digit of a multi-digit operand
        digits = torch.where(top, lead[..., None], raw).masked_fill(k >= counts[..., None], 0)
        total = torch.zeros(b, hi + 1, dtype=torch.long, device=dev)  # [b, K + 1] least significant first
        carry = torch.zeros(b, dtype=torch.long, device=dev)
        for i in range(hi):  # schoolbook addition over the digit places
            s = digits[:, 0, i] + digits[:, 1, i] + carry
            total[:, i], carry = s % 10, s // 10
        total[:, hi] = carry
        return self._layout(digits, total, n, start)

    def _plan(self, n: Tensor, s: int) -> dict[str, Tensor]:
        """Where each of s token slots sits in a row of operand width n [b]: the pieces (``in_a``,
        ``in_b``, ``in_s``: bool [b, s]), ``is_hint``, the significance ``sig`` of a digit or hint slot (-1
        elsewhere) and the offsets of '+', '=' and the end token ([b, 1])."""
        w = 2 if self.format == "index_hints" else 1  # tokens per digit
        n = n[:, None]
        la, ls = w * n, w * (n + 1)  # an operand's tokens, the sum's tokens
        o_plus, o_b, o_eq, o_s = la, la + 1, 2 * la + 1, 2 * la + 2
        p = torch.arange(s, device=n.device)[None, :]
        in_a, in_b, in_s = p < o_plus, (p >= o_b) & (p < o_eq), (p >= o_s) & (p < o_s + ls)
        r = torch.where(in_a, p, torch.where(in_b, p - o_b, p - o_s))  # index within the piece
        j = torch.div(r, w, rounding_mode="floor")  # digit index within the piece
        inside = in_a | in_b | in_s
        is_hint = (r % w == 0) & inside if w == 2 else torch.zeros_like(in_a)
        sig = torch.where(in_a | in_b, n - 1 - j, n - j if self.format == "plain" else j)
        return dict(in_a=in_a, in_b=in_b, in_s=in_s, is_hint=is_hint, sig=torch.where(inside, sig, -1),
                    o_plus=o_plus, o_eq=o_eq, o_eos=o_s + ls)

    def _layout(self, digits: Tensor, total: Tensor, n: Tensor, start: Tensor) -> Batch:
        """Tokens, targets, mask and positions of each row from its operands' digits [b, 2, K] and sum
        [b, K + 1] (least significant first), width n [b] and first hint c [b]."""
        lengths = self.max_tokens_of(n)  # [b]
        plan = self._plan(n, int(lengths.max()))
        in_a, in_b, in_s, is_hint, sig = (plan[k] for k in ("in_a", "in_b", "in_s", "is_hint", "sig"))
        p = torch.arange(in_a.shape[1], device=n.device)[None, :]
        at = sig.clamp(min=0)
        K = digits.shape[2]
        at_op = at.clamp(max=K - 1)
        op_digit = torch.where(in_a, digits[:, 0].gather(1, at_op), digits[:, 1].gather(1, at_op))
        digit = torch.where(in_s, total.gather(1, at.clamp(max=K)), op_digit)
        tokens = torch.where(is_hint, HINT0 + start[:, None] + at, DIGIT0 + digit)
        tokens = torch.where(in_a | in_b | in_s, tokens, 0)
        for o, t in ((plan["o_plus"], PLUS), (plan["o_eq"], EQ), (plan["o_eos"], EOS)):
            tokens = tokens.masked_fill(p == o, t)
        scored_next = (in_s & ~is_hint) | (p == plan["o_eos"])  # a sum digit or the end token
        targets = torch.nn.functional.pad(tokens[:, 1:], (0, 1), value=0)
        loss_mask = torch.nn.functional.pad(scored_next[:, 1:], (0, 1), value=False)
        real = p < lengths[:, None]
        positions = None
        if self.positions == "coupled":
            positions = torch.where(sig >= 0, n[:, None] + 1 - sig, n[:, None] + 2).masked_fill(~real, 0)
        elif self.positions == "abacus":
            positions = torch.where((sig >= 0) & ~is_hint, sig + 1, 0)
        return Batch(tokens=tokens, targets=targets, loss_mask=loss_mask, lengths=lengths, positions=positions)

    def max_tokens_of(self, n: Tensor) -> Tensor:
        """Tokens of each row of operand width n [b]."""
        return (2 if self.format == "index_hints" else 1) * (3 * n + 1) + 3

    def places(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Each token's place, read from the tokens alone: (significance [b, s], -1 where the token is no
        digit; piece [b, s]: 1 a digit of the first operand, 2 of the second, 3 of the sum, 0 any other)."""
        w = 2 if self.format == "index_hints" else 1
        n = torch.div((tokens == PLUS).long().argmax(1), w, rounding_mode="floor")  # [b] '+' sits at w n
        plan = self._plan(n, tokens.shape[1])
        digit = ~plan["is_hint"] & (plan["sig"] >= 0)
        piece = torch.where(plan["in_a"], 1, torch.where(plan["in_b"], 2, 3)) * digit
        return torch.where(digit, plan["sig"], -1), piece

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Next-token targets; the mask where the next token is a sum digit (after '=') or the end token."""
        s = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
        after_eq = ((tokens == EQ).long().cumsum(1) > 0) & (tokens != EQ)
        nxt = torch.nn.functional.pad(tokens[:, 1:], (0, 1), value=0)
        nxt_after = torch.nn.functional.pad(after_eq[:, 1:], (0, 1), value=False)
        scored = ((nxt >= DIGIT0) & (nxt < HINT0) & nxt_after) | (nxt == EOS)
        return nxt, scored & (s < lengths[:, None] - 1)

    def render(self, batch: Batch, row: int) -> str:
        """One sequence as its symbols, space-separated (docs and tests)."""
        return " ".join(self.symbols[int(t)] for t in batch.tokens[row, :int(batch.lengths[row])])
