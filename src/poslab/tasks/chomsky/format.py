"""The encoder presentation of the Chomsky-hierarchy tasks (Delétang et al. 2023; Ruoss et al. 2023).

A bidirectional, non-autoregressive encoder reads the input followed by one *empty* token per
output slot, and predicts the output class at each slot::

    tokens   x_1 .. x_n  E .. E  pad ...        (m empty slots E, then padding 0)
    targets  0 .. 0      y_1 .. y_m  0 ...
    mask     True at p = n .. n + k - 1          (k <= m scored slots; k = m for all tasks but one)

This is ``make_model_with_empty_targets`` of the sources' ``experiments/utils.py``
(google-deepmind/neural_networks_chomsky_hierarchy and google-deepmind/randomized_positional_encodings,
identical there): the input tape of one-hot symbols gets ``task.output_length(n)`` extra cells
all holding the one symbol ``input_size`` (the "empty" output token; with no computation tape,
``OUTPUT_EMPTY_TOKEN - 1``), the encoder runs over the whole tape without a causal mask, and its
last ``output_length`` outputs are the logits of the output classes. Their accuracy is the mean
of ``argmax == target`` over ``task.accuracy_mask`` (all slots, except stack_manipulation, which
scores up to and including its termination token): ``k`` here, so that ``loss_mask`` is exactly
the scored slots (:func:`poslab.tasks.scoring.sequence_scores`).

Token ids. The sources feed one-hot vectors, so ids are only names; here they are shifted so
that 0 is never a real symbol:

    PAD = 0        padding past ``lengths`` (never inside a sequence)
    EMPTY = 1      the empty output slot (the sources' id ``input_size``)
    symbol k -> k + 2   the source's input symbol k in [0, input_size)

Targets are the source's output classes unchanged, in [0, output_size); they are never fed back
to an encoder, so they need not be disjoint from the token ids. A model's vocabulary must cover
both: :func:`encoder_vocab_size`. Inputs and outputs are passed in the *source's* ids; the shift
happens here, and :func:`encoder_inputs` undoes it.

Worked example (a parity_check row, input 1 1 1 -> class 1; a stack_manipulation row, stack 0
then POP -> the empty stack: termination 2, then padding 0 0, only the termination scored)::

    encoder_lists([[1, 1, 1], [0, 2]], [[1], [2, 0, 0]], scored=[1, 1])
    tokens     [[3, 3, 3, 1, 0],      lengths [4, 5]
                [2, 4, 1, 1, 1]]
    targets    [[0, 0, 0, 1, 0],
                [0, 0, 2, 0, 0]]
    loss_mask  [[F, F, F, T, F],      row 0: p = 3 predicts class 1
                [F, F, T, F, F]]      row 1: p = 2 predicts 2; p = 3, 4 are trained by the
                                      source but not scored (see stack_manipulation)

Notation: b batch, s position in the padded sequence, n input tokens, m output slots, k scored
slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.tasks.base import Batch, Length, check_vocab, length_range

PAD = 0  # the padding id every task shares
EMPTY = 1  # the empty output slot, the sources' output token
FIRST_SYMBOL = 2  # the source's input symbol k is token k + FIRST_SYMBOL


def encoder_vocab_size(input_size: int, output_size: int) -> int:
    """Ids a model must embed and predict: PAD, EMPTY and ``input_size`` symbols in, classes out."""
    return max(input_size + FIRST_SYMBOL, output_size)


def encoder_batch(inputs: Tensor, input_lengths: Tensor, outputs: Tensor, output_lengths: Tensor,
                  scored_lengths: Tensor | None = None, *, width: int | None = None) -> Batch:
    """One encoder-form batch (module docstring).

    inputs [b, n_max] and outputs [b, m_max] int64 in the source's ids (values past each row's
    length are ignored); input_lengths, output_lengths [b]; scored_lengths [b] the leading output
    slots that are scored (default: all of them). The batch is right-padded with PAD to its
    longest row, or to ``width`` positions when given (:func:`encoder_inputs`' counterpart in a
    task's ``label``)."""
    device = inputs.device
    n, m = input_lengths.long(), output_lengths.long()
    k = m if scored_lengths is None else scored_lengths.long()
    if bool(((k < 0) | (k > m)).any()):
        raise ValueError("scored_lengths must lie in [0, output_lengths]")
    lengths = n + m  # [b]
    longest = int(lengths.max()) if len(lengths) else 0
    width = longest if width is None else width
    if width < longest:
        raise ValueError(f"width {width} is shorter than the longest sequence ({longest} tokens)")
    s = torch.arange(width, device=device)[None, :]  # [1, s]
    x = _read(inputs, s) + FIRST_SYMBOL  # [b, s] the input at s
    y = _read(outputs, s - n[:, None])  # [b, s] the output slot s - n
    in_input = s < n[:, None]
    in_output = ~in_input & (s < lengths[:, None])
    tokens = torch.where(in_input, x, torch.where(in_output, EMPTY, PAD))
    targets = torch.where(in_output, y, 0)
    loss_mask = in_output & (s < (n + k)[:, None])
    return Batch(tokens=tokens, targets=targets, loss_mask=loss_mask, lengths=lengths)


def encoder_lists(inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                  scored: Sequence[int] | None = None, *, device: torch.device | str = "cpu") -> Batch:
    """:func:`encoder_batch` from Python lists (one input and one output per example, source ids;
    ``scored``: the scored leading slots per example, default all)."""
    x, n = _pad(inputs, device)
    y, m = _pad(outputs, device)
    k = None if scored is None else torch.tensor(list(scored), dtype=torch.long, device=device)
    return encoder_batch(x, n, y, m, k)


def encoder_inputs(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """The inputs of an encoder-form batch from its tokens alone: (inputs [b, s] in the source's
    ids, 0 past each row's input; input_lengths [b]). Input tokens are the only ids >= 2, and they
    come first."""
    is_symbol = tokens >= FIRST_SYMBOL  # [b, s]
    n = is_symbol.sum(-1)  # [b]
    return torch.where(is_symbol, tokens - FIRST_SYMBOL, 0), n


class Rows(NamedTuple):
    """One batch of a task's rule in the source's ids, before the presentation."""

    inputs: Tensor  # [b, n_max] int64 input symbols; any value past input_lengths
    input_lengths: Tensor  # [b]
    outputs: Tensor  # [b, m_max] int64 output classes; any value past output_lengths
    output_lengths: Tensor  # [b]
    scored: Tensor | None = None  # [b] leading output slots scored; None: all


class EncoderTask:
    """What the encoder-form tasks share (a mixin for frozen dataclasses).

    A task defines ``name``, ``input_size`` and ``output_size`` (the source's), ``inputs`` (its
    input length n for a task length L), ``output_length(n)``, ``answer`` (the rule: outputs from
    inputs) and ``draw`` (random rows at given task lengths; a task whose answer falls out of its
    generator may override ``draw`` to return it, ``label`` still recomputes it with ``answer``).
    The task length is the sources' ``sample_batch(length=L)`` argument. Lengths of a batch are drawn
    only when lo < hi, so ``length=L`` and ``length=(L, L)`` give the same batch.
    """

    target_kind: ClassVar[str] = "sequence"
    model_form: ClassVar[str] = "encoder"
    benchmark: ClassVar[str] = "ruoss"
    train_range: ClassVar[tuple[int, int]] = (1, 40)  # both papers: L ~ U(1, 40) ...
    test_range: ClassVar[tuple[int, int]] = (41, 500)  # ... scored on L = 41 .. 500
    length_unit: ClassVar[str] = "input tokens"

    @property
    def input_size(self) -> int:
        raise NotImplementedError

    @property
    def output_size(self) -> int:
        raise NotImplementedError

    def input_length(self, length: int) -> int:
        """Input tokens of a sequence of task length L (L itself, unless the source changes it)."""
        return length

    def output_length(self, n: int) -> int:
        """Output slots after n input tokens (the sources' ``output_length``)."""
        return 1

    def answer(self, inputs: Tensor, n: Tensor) -> Rows:
        raise NotImplementedError

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        return encoder_vocab_size(self.input_size, self.output_size)

    @property
    def chance(self) -> float:
        return 1.0 / self.output_size

    def validate(self, min_length: int) -> None:
        length_range(min_length)

    def max_tokens(self, length: int) -> int:
        """The most tokens of a sequence of task length at most ``length``."""
        lo, hi = length_range(length)
        return max(n + self.output_length(n) for n in {self.input_length(L) for L in range(1, hi + 1)})

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch:
        lo, hi = length_range(length)
        self.validate(lo)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError("batch_size", batch_size, "a positive integer")
        device = generator.device
        if lo == hi:
            lengths = torch.full((batch_size,), hi, dtype=torch.long, device=device)
        else:
            lengths = torch.randint(lo, hi + 1, (batch_size,), generator=generator, device=device)
        return encoder_batch(*self.draw(generator, lengths))

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Targets and loss mask [b, s] recomputed from the input tokens alone (``answer``)."""
        inputs, n = encoder_inputs(tokens)
        batch = encoder_batch(*self.answer(inputs, n), width=tokens.shape[1])
        return batch.targets, batch.loss_mask


def _read(rows: Tensor, at: Tensor) -> Tensor:
    """rows [b, w] read at positions at [b|1, s], clamped into [0, w); zeros when w = 0."""
    b, w = rows.shape
    at = at.expand(b, -1)
    if w == 0:
        return torch.zeros_like(at)
    return rows.long().gather(1, at.clamp(0, w - 1))


def _pad(rows: Sequence[Sequence[int]], device: torch.device | str) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
    out = torch.zeros((len(rows), max([len(r) for r in rows], default=0)), dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        if len(r):
            out[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long, device=device)
    return out, lengths


def render(tokens: Tensor, length: int, symbols: Sequence[str]) -> str:
    """One sequence's first ``length`` tokens as symbols, space-separated (docs and tests):
    ``symbols`` names the source's input symbols; PAD shows as ``.`` and EMPTY as ``_``."""
    names = [".", "_", *symbols]
    return " ".join(names[int(t)] for t in tokens[:length])


def uniform_inputs(generator: torch.Generator, lengths: Tensor, high: int) -> Tensor:
    """I.i.d. uniform symbols in [0, high), [b, max L], 0 past each row's length (one ``randint``)."""
    hi = int(lengths.max())
    x = torch.randint(0, high, (len(lengths), hi), generator=generator, device=generator.device)
    return x.masked_fill(torch.arange(hi, device=x.device) >= lengths[:, None], 0)


class AlphabetTask(EncoderTask):
    """An encoder task over an alphabet of ``m`` symbols (a dataclass field of the task, >= 2) whose
    output classes are the same m symbols, with i.i.d. uniform inputs: reverse_string,
    duplicate_string, odds_first, bucket_sort."""

    m: int

    def __post_init__(self):
        check_vocab(self.m, least=2)

    @property
    def input_size(self) -> int:
        return self.m

    @property
    def output_size(self) -> int:
        return self.m

    def draw(self, generator: torch.Generator, lengths: Tensor) -> Rows:
        return self.answer(uniform_inputs(generator, lengths, self.m), lengths)
