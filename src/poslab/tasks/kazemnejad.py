"""Kazemnejad et al. 2023's decoder-only tasks: copy, reverse and sort (arithmetic in kazemnejad_math).

"The Impact of Positional Encoding on Length Generalization in Transformers" (NeurIPS 2023)
trains a causal Transformer on ``prompt SEP target EOS`` and scores the target (the shared
presentation is :mod:`poslab.tasks.decoder_format`). Read from McGill-NLP/length-generalization
(commit 40f8a44): ``scripts/dataset_builders/make_{copy,reverse,sort,addition,sum,parity,poly}_dataset.py``
(what is drawn), ``src/data/data_instance_processor/*_instance_processor.py`` (the prompt and
target strings, no scratchpad), ``configs/data/s2s_*.jsonnet`` (the separator per task: "[SEP] "
for copy, reverse and sum, "" for the others; modulo_factor 10 for sum and poly),
``src/data/s2s_dl_factory.py`` (decoder form: prompt + sep + target + EOS, loss on target and EOS),
``src/common/wandb_utils.py`` (the splits' names in the paper) and ``results/*.jsonl`` (which
lengths the paper's runs were validated and tested on).

Tokens. Their models read T5-tokenized strings; here each whitespace-separated word of the
source's string is one token id, a "," or "." glued to a word is a token of its own (as T5
splits them), PAD = 0, SEP = 1 ("[SEP]"), EOS = 2 ("</s>"), then the task's words. Copy, reverse
and single-token sort draw from the first m single-token T5 words in the source; here they are
abstract symbols ``t0 .. t{m-1}`` (sort: ordered by index, as the source sorts token indices).

Lengths (``train_range`` / ``test_range``): the builders draw one length bin per example,
training bins L_min..L and test bins L+1..2L (``test_min`` defaults to ``train_max + 1``). Copy
and reverse use L = 20; the paper's copy and reverse runs (``results/sanity_check.jsonl``) report
validation accuracies at lengths 2..20 and test accuracies at 21..40, so training is 2..20 here
(an older set of runs, ``results/len_gen_experiments.csv``, validated copy at 1..20). The
arithmetic tasks use L = 8, test 9..16, from 1 (addition's test categories include 1-digit
operands, e.g. "14-by-1").

Notation: b batch, K items per sequence, w slots per item.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError, check_choice
from poslab.tasks.base import Batch, Length, _is_int, length_range
from poslab.tasks.decoder_format import decoder_batch, decoder_label

SPECIAL = ("<pad>", "[SEP]", "</s>")  # PAD 0, SEP 1, EOS 2: poslab.tasks.decoder_format's layout
SEP, EOS = 1, 2
DIGITS = tuple("0123456789")


class DecoderTask:
    """What the Kazemnejad et al. tasks share: a vocabulary of named symbols, the decoder
    presentation, and sampling by (prompt, output) pieces. A task defines ``words`` (its
    vocabulary after SPECIAL), ``output_words`` (what its output can hold, EOS included),
    ``boundary`` (the token whose first occurrence ends the prompt), ``separator`` (SEP or
    None, as the source's config), ``max_tokens`` and ``_draw``."""

    target_kind: ClassVar[str] = "sequence"
    model_form: ClassVar[str] = "decoder"
    benchmark: ClassVar[str] = "kazemnejad"
    boundary: ClassVar[str] = "[SEP]"
    separator: ClassVar[bool] = True  # the source's separator "[SEP] "; False: "" (the prompt's end marks it)

    @property
    def words(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def output_words(self) -> tuple[str, ...]:
        raise NotImplementedError

    def max_tokens(self, length: int) -> int:
        raise NotImplementedError

    def _draw(self, g: torch.Generator, b: int, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(prompt [b, n], prompt lengths [b], output [b, m], output lengths [b])."""
        raise NotImplementedError

    @cached_property
    def symbols(self) -> tuple[str, ...]:
        """Every token's symbol, by id."""
        return SPECIAL + self.words

    @cached_property
    def ids(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.symbols)}

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    @property
    def chance(self) -> float:
        """A uniform guess over the symbols an output position can hold (EOS included)."""
        return 1.0 / len(set(self.output_words))

    def validate(self, min_length: int) -> None:
        if not _is_int(min_length) or min_length < 1:
            raise ConfigError("length", min_length, "a positive integer")

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Next-token targets; the loss mask from the first boundary token to the last output token."""
        return decoder_label(tokens, lengths, self.ids[self.boundary])

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch:
        lo, hi = length_range(length)
        self.validate(lo)
        x, n, y, m = self._draw(generator, batch_size, lo, hi)
        return decoder_batch(x, n, y, m, sep=SEP if self.separator else None, eos=EOS)

    # ------------------------------------------------------------------ building blocks

    def word(self, w: str, b: int, device) -> tuple[Tensor, Tensor]:
        """One constant word as a piece: tokens [b, 1], valid [b, 1]."""
        return (torch.full((b, 1), self.ids[w], dtype=torch.long, device=device),
                torch.ones(b, 1, dtype=torch.bool, device=device))

    def phrase(self, text: str, b: int, device) -> list[tuple[Tensor, Tensor]]:
        return [self.word(w, b, device) for w in text.split()]

    def digit_ids(self, digits: Tensor) -> Tensor:
        return digits + self.ids["0"]


def lengths_per_row(g: torch.Generator, b: int, lo: int, hi: int) -> Tensor:
    """One length per sequence, uniform in [lo, hi] (drawn only when lo < hi)."""
    if lo == hi:
        return torch.full((b,), hi, dtype=torch.long, device=g.device)
    return torch.randint(lo, hi + 1, (b,), generator=g, device=g.device)


def pack(pieces: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Concatenate pieces (tokens [b, w_k], valid [b, w_k]) keeping only the valid slots, left
    aligned: tokens [b, total] (0 past each row's length) and lengths [b]."""
    tokens = torch.cat([p[0] for p in pieces], 1)  # [b, W]
    valid = torch.cat([p[1] for p in pieces], 1)
    b, W = tokens.shape
    at = torch.where(valid, valid.long().cumsum(1) - 1, W)  # [b, W] target slot, W = discard
    out = torch.zeros(b, W + 1, dtype=torch.long, device=tokens.device)
    out.scatter_(1, at, torch.where(valid, tokens, 0))
    lengths = valid.sum(1)
    width = max(int(lengths.max()), 1) if b else 1
    return out[:, :width], lengths


def items(tokens: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Items [b, K, w] with their valid slots flattened to one piece [b, K * w]."""
    return tokens.flatten(1), valid.flatten(1)


def separated(tokens: Tensor, valid: Tensor, count: Tensor, sep_id: int) -> tuple[Tensor, Tensor]:
    """K items [b, K, w] of which the first ``count`` [b] are real, joined by the token sep_id
    ("a , b , c"): one piece [b, K * (w + 1)]."""
    b, K, _ = tokens.shape
    k = torch.arange(K, device=tokens.device)
    real = k[None, :] < count[:, None]  # [b, K]
    sep = torch.full((b, K, 1), sep_id, dtype=torch.long, device=tokens.device)
    sep_valid = (k[None, :] < count[:, None] - 1)[..., None]  # after every real item but the last
    return items(torch.cat([tokens, sep], 2), torch.cat([valid & real[..., None], sep_valid], 2))


def number_digits(values: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Nonnegative integers [...] as their decimal digits, most significant first, left aligned:
    digits [..., width] and valid [..., width] ("0" is one digit)."""
    powers = 10 ** torch.arange(width - 1, -1, -1, device=values.device)  # [width]
    raw = (values[..., None] // powers) % 10  # right aligned, leading zeros
    count = torch.ones_like(values)
    for k in range(1, width):
        count = torch.where(values >= 10 ** k, k + 1, count)
    shift = (width - count)[..., None]  # move the count real digits to the front
    idx = (torch.arange(width, device=values.device) + shift).clamp(max=width - 1)
    valid = torch.arange(width, device=values.device) < count[..., None]
    return raw.gather(-1, idx), valid


def reverse_rows(tokens: Tensor, lengths: Tensor) -> Tensor:
    """Each row's first lengths[i] tokens reversed (the rest unspecified)."""
    s = torch.arange(tokens.shape[1], device=tokens.device)
    return tokens.gather(1, (lengths[:, None] - 1 - s).clamp(min=0))


def first(lengths: Tensor, width: int) -> Tensor:
    """valid [b, width]: True at the first lengths[i] slots."""
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def alphabet(m: int) -> tuple[str, ...]:
    return tuple(f"t{i}" for i in range(m))


def check_alphabet(field: str, m: object, least: int = 1) -> None:
    if not isinstance(m, int) or isinstance(m, bool) or m < least:
        raise ConfigError(field, m, f"an integer >= {least}")


# ----------------------------------------------------------------------------- copy and reverse

COPY_VARIANTS = {  # poslab name: (the source's copy_task_type, its split prefix, its name in the paper)
    "copy": ("copy_multi_char", "cmc", "Copy"),
    "copy_2x": ("copy_multi_char_2x", "cmc2x", "Copy (2x)"),
    "repeat": ("repeat_single_char", "rsc", "Copy (Repeat)"),
    "repeat_2x": ("repeat_single_2x_char", "rsc2x", "Copy (Repeat 2x)"),
    "repeat_change": ("repeat_double_char", "rdc", "Copy (Repeat+Change)"),
}


@dataclass(frozen=True, kw_only=True)
class Copy(DecoderTask):
    """Copy the input (make_copy_dataset.py; S2SCopyDataInstanceProcessor). ``variant``:

    - ``copy`` (cmc): L uniform symbols, output them again.
    - ``copy_2x`` (cmc2x): output them, ``[NEXT]``, and them again.
    - ``repeat`` (rsc): one symbol repeated L times, output the same.
    - ``repeat_2x`` (rsc2x): one symbol L times, output it 2L times.
    - ``repeat_change`` (rdc): prompt "Replace a with b in a .. a", output b L times (a != b).

    Length L: input symbols, train 2..20, test 21..40 (module docstring). Symbols are
    ``t0 .. t{m-1}``; the source draws copy from 100 T5 single-token words, and the repeat
    variants from as many words as a length bin has examples (rdc: every ordered pair of about
    26); here every variant draws uniformly from m (a choice, option ``m``).

    Worked examples (decoded; ``*`` marks the scored positions, whose targets are the next
    tokens: the output and EOS)::

        copy, L = 3           Copy: t7 t0 t7 [SEP]* t7* t0* t7* </s>
        copy_2x, L = 2        Copy: t4 t9 [SEP]* t4* t9* [NEXT]* t4* t9* </s>
        repeat_change, L = 2  Replace t3 with t8 in t3 t3 [SEP]* t8* t8* </s>

    Chance: 1 / (m + 1) (a symbol or EOS; copy_2x also [NEXT]).
    """

    name: ClassVar[str] = "copy"
    length_unit: ClassVar[str] = "input symbols"
    train_range: ClassVar[tuple[int, int]] = (2, 20)
    test_range: ClassVar[tuple[int, int]] = (21, 40)

    variant: str = "copy"  # one of COPY_VARIANTS
    m: int = 100  # alphabet size (the source's first 100 single-token T5 words)

    def __post_init__(self):
        check_choice("variant", self.variant, COPY_VARIANTS)
        check_alphabet("m", self.m, 2 if self.variant == "repeat_change" else 1)

    @property
    def words(self) -> tuple[str, ...]:
        return ("Copy:", "Replace", "with", "in", "[NEXT]") + alphabet(self.m)

    @property
    def output_words(self) -> tuple[str, ...]:
        return alphabet(self.m) + ("</s>",) + (("[NEXT]",) if self.variant == "copy_2x" else ())

    def max_tokens(self, length: int) -> int:
        prompt = length + (5 if self.variant == "repeat_change" else 1)
        output = {"copy": length, "copy_2x": 2 * length + 1, "repeat": length, "repeat_2x": 2 * length,
                  "repeat_change": length}[self.variant]
        return prompt + 1 + output + 1

    def _draw(self, g, b, lo, hi):
        dev, base = g.device, self.ids["t0"]
        if self.variant in ("copy", "copy_2x"):
            seq = torch.randint(0, self.m, (b, hi), generator=g, device=dev) + base  # [b, hi]
        else:
            a = torch.randint(0, self.m, (b, 1), generator=g, device=dev)
            seq = (a + base).expand(b, hi)
        if self.variant == "repeat_change":  # a second symbol, different from the first
            c = (a + 1 + torch.randint(0, self.m - 1, (b, 1), generator=g, device=dev)) % self.m + base
        L = lengths_per_row(g, b, lo, hi)
        real = (seq, first(L, hi))
        prompt, output = [self.word("Copy:", b, dev), real], [real]
        if self.variant == "copy_2x":
            output = [real, self.word("[NEXT]", b, dev), real]
        elif self.variant == "repeat_2x":
            output = [real, real]
        elif self.variant == "repeat_change":
            one = real[1][:, :1]  # L >= 1: the first slot is always real
            prompt = [self.word("Replace", b, dev), (seq[:, :1], one), self.word("with", b, dev), (c, one),
                      self.word("in", b, dev), real]
            output = [(c.expand(b, hi), real[1])]
        return *pack(prompt), *pack(output)


REVERSE_VARIANTS = {  # poslab name: (the source's task_type, its split prefix, its name in the paper)
    "reverse": ("multi_char", "mc", "Reverse"),
    "reverse_2x": ("multi_char_2x", "mc2x", "Reverse (2x)"),
    "reverse_copy": ("multi_char_rev_cop", "mcrv", "Reverse+Copy"),
}


@dataclass(frozen=True, kw_only=True)
class Reverse(DecoderTask):
    """Reverse the input (make_reverse_dataset.py; S2SReverseDataInstanceProcessor): L uniform
    symbols from m = 100, output them in reverse order. ``variant``: ``reverse`` (mc, the
    paper's Reverse), ``reverse_2x`` (mc2x: reversed, [NEXT], reversed), ``reverse_copy``
    (mcrv: reversed, [NEXT], as given). Length L: input symbols, train 2..20, test 21..40.

    Worked examples (``*`` marks the scored positions)::

        reverse, L = 3        Reverse: t5 t1 t8 [SEP]* t8* t1* t5* </s>
        reverse_copy, L = 2   Reverse: t5 t1 [SEP]* t1* t5* [NEXT]* t5* t1* </s>

    Chance: 1 / (m + 1) (the 2x variants also [NEXT]).
    """

    name: ClassVar[str] = "reverse"
    length_unit: ClassVar[str] = "input symbols"
    train_range: ClassVar[tuple[int, int]] = (2, 20)
    test_range: ClassVar[tuple[int, int]] = (21, 40)

    variant: str = "reverse"  # one of REVERSE_VARIANTS
    m: int = 100  # alphabet size (the source's first 100 single-token T5 words)

    def __post_init__(self):
        check_choice("variant", self.variant, REVERSE_VARIANTS)
        check_alphabet("m", self.m)

    @property
    def words(self) -> tuple[str, ...]:
        return ("Reverse:", "[NEXT]") + alphabet(self.m)

    @property
    def output_words(self) -> tuple[str, ...]:
        return alphabet(self.m) + ("</s>",) + (("[NEXT]",) if self.variant != "reverse" else ())

    def max_tokens(self, length: int) -> int:
        return 1 + length + 1 + (length if self.variant == "reverse" else 2 * length + 1) + 1

    def _draw(self, g, b, lo, hi):
        dev = g.device
        seq = torch.randint(0, self.m, (b, hi), generator=g, device=dev) + self.ids["t0"]
        L = lengths_per_row(g, b, lo, hi)
        real, rev = (seq, first(L, hi)), (reverse_rows(seq, L), first(L, hi))
        nxt = self.word("[NEXT]", b, dev)
        output = {"reverse": [rev], "reverse_2x": [rev, nxt, rev], "reverse_copy": [rev, nxt, real]}[self.variant]
        return *pack([self.word("Reverse:", b, dev), real]), *pack(output)


# ----------------------------------------------------------------------------- sort

SORT_VARIANTS = {  # poslab name: (the source's split, its name in the paper)
    "multi_digit": ("len_mltd_tr8_ts16", "Sort (Multi Digit)"),
    "single_token": ("len_sngd_tr8_ts16", "Sort (Single Token)"),
}
SORT_LOW, SORT_HIGH = 10, 9999  # multi_digit draws integers in [10, 9999] (np.random.randint(10, 10000))


@dataclass(frozen=True, kw_only=True)
class Sort(DecoderTask):
    """Sort a list ascending (make_sort_dataset.py; S2SSort{MultiDigit,}DataInstanceProcessor).

    ``multi_digit``: L integers uniform in [10, 9999], each written digit by digit.
    ``single_token``: L symbols uniform over m = 50 (the source's first 50 single-token T5
    words), sorted by index. Prompt "Sort the following list [ a, b ]." and target "The sorted
    list is [ .. ]." with no separator (the prompt's "." ends it). Length L: list items, train
    1..8, test 9..16.

    Worked examples (``*`` marks the scored positions)::

        multi_digit, L = 2   Sort the following list [ 4 0 7 , 1 2 ] .* The* sorted* list* is* [*
                             1* 2* ,* 4* 0* 7* ]* .* </s>
        single_token, L = 3  Sort the following list [ t9 , t2 , t9 ] .* The* sorted* list* is* [*
                             t2* ,* t9* ,* t9* ]* .* </s>

    Chance: 1 / |output symbols| (the target's words, digits or symbols, ",", "[", "]", ".", EOS).
    """

    name: ClassVar[str] = "sort"
    length_unit: ClassVar[str] = "list items"
    train_range: ClassVar[tuple[int, int]] = (1, 8)
    test_range: ClassVar[tuple[int, int]] = (9, 16)
    boundary: ClassVar[str] = "."
    separator: ClassVar[bool] = False

    variant: str = "multi_digit"  # one of SORT_VARIANTS
    m: int = 50  # single_token: alphabet size (the source's 50)

    def __post_init__(self):
        check_choice("variant", self.variant, SORT_VARIANTS)
        check_alphabet("m", self.m)

    @property
    def values(self) -> tuple[str, ...]:
        return DIGITS if self.variant == "multi_digit" else alphabet(self.m)

    @property
    def words(self) -> tuple[str, ...]:
        return ("Sort", "the", "following", "list", "The", "sorted", "is", "[", "]", ",", ".") + self.values

    @property
    def output_words(self) -> tuple[str, ...]:
        return ("The", "sorted", "list", "is", "[", "]", ",", ".", "</s>") + self.values

    def max_tokens(self, length: int) -> int:
        item = 4 if self.variant == "multi_digit" else 1
        listed = length * item + length - 1  # items and the commas between them
        return (4 + 1 + listed + 2) + (5 + listed + 2) + 1

    def _draw(self, g, b, lo, hi):
        dev = g.device
        if self.variant == "multi_digit":
            v = torch.randint(SORT_LOW, SORT_HIGH + 1, (b, hi), generator=g, device=dev)
        else:
            v = torch.randint(0, self.m, (b, hi), generator=g, device=dev)
        L = lengths_per_row(g, b, lo, hi)
        big = torch.iinfo(torch.long).max
        ordered = v.masked_fill(~first(L, hi), big).sort(1).values.masked_fill(~first(L, hi), 0)  # [b, hi]

        def listed(values: Tensor) -> tuple[Tensor, Tensor]:
            if self.variant == "multi_digit":
                d, ok = number_digits(values, 4)  # [b, hi, 4]
                return separated(self.digit_ids(d), ok, L, self.ids[","])
            sym = (values + self.ids["t0"])[..., None]
            return separated(sym, torch.ones_like(sym, dtype=torch.bool), L, self.ids[","])

        prompt = [*self.phrase("Sort the following list [", b, dev), listed(v), *self.phrase("] .", b, dev)]
        output = [*self.phrase("The sorted list is [", b, dev), listed(ordered), *self.phrase("] .", b, dev)]
        return *pack(prompt), *pack(output)
