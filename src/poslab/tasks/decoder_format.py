"""The decoder-only presentation of an input-output task (Kazemnejad et al. 2023; SCAN alike).

A causal model reads one sequence per example::

    tokens   x_1 .. x_n  SEP  y_1 .. y_m  EOS  pad ...
    targets  tokens shifted left by one (targets[p] = tokens[p + 1]; 0 at the last position)
    mask     True at p = n .. n + m (the positions whose next token is y_1 .. y_m or EOS)

so the loss and the score fall on the output and its end token only, as in
McGill-NLP/length-generalization ``src/data/s2s_dl_factory.py``
(``_get_tokenize_function_for_decoder_only``: prompt = input + separator, sample = prompt +
target + EOS, labels -100 over the prompt; the Hugging Face causal LM shifts the labels by one).
``sep=None`` or ``eos=None`` leaves that token out (some of their tasks use an empty separator:
the prompt's own last token, e.g. ``=``, then ends the input). Token 0 is padding.

Worked example (ids: SEP = 1, EOS = 2, symbols 3..)::

    decoder_batch(inputs=tensor([[5, 6, 7], [5, 0, 0]]), input_lengths=tensor([3, 1]),
                  outputs=tensor([[7, 6, 5], [5, 0, 0]]), output_lengths=tensor([3, 1]), sep=1, eos=2)
    tokens     [[5, 6, 7, 1, 7, 6, 5, 2],      lengths [8, 4]
                [5, 1, 5, 2, 0, 0, 0, 0]]
    targets    [[6, 7, 1, 7, 6, 5, 2, 0],
                [1, 5, 2, 0, 0, 0, 0, 0]]
    loss_mask  [[F, F, F, T, T, T, T, F],      row 0: p = 3..6 predict 7 6 5 EOS
                [F, T, T, F, F, F, F, F]]      row 1: p = 1..2 predict 5 EOS

:func:`decoder_label` recomputes targets and mask from the tokens alone, given the token whose
first occurrence ends the prompt (the separator, or the prompt's last token when there is none).

Notation: b batch, s position in the padded sequence, n input tokens, m output tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from poslab.tasks.base import Batch

PAD = 0  # the padding id every task shares


def decoder_batch(inputs: Tensor, input_lengths: Tensor, outputs: Tensor, output_lengths: Tensor, *,
                  sep: int | None, eos: int | None) -> Batch:
    """One decoder-form batch from padded inputs [b, n_max] and outputs [b, m_max] (int64, any
    values past each row's length), with the loss on the output and EOS only (module docstring)."""
    device = inputs.device
    n, m = input_lengths.long(), output_lengths.long()
    start = n + (sep is not None)  # [b] first output position
    lengths = start + m + (eos is not None)  # [b]
    s = torch.arange(int(lengths.max()), device=device)[None, :]  # [1, s]
    # read the input at s, the output at s - start; out-of-range reads are clamped, then replaced
    x = inputs.gather(1, s.clamp(max=inputs.shape[1] - 1).expand(len(n), -1)) if inputs.shape[1] else None
    y_at = (s - start[:, None]).clamp(0, max(outputs.shape[1] - 1, 0))  # [b, s]
    y = outputs.gather(1, y_at) if outputs.shape[1] else torch.zeros_like(y_at)
    tokens = torch.full(y_at.shape, PAD, dtype=torch.long, device=device)  # [b, s]
    in_output = (s >= start[:, None]) & (s < (start + m)[:, None])
    tokens = torch.where(in_output, y, tokens)
    if x is not None:
        tokens = torch.where(s < n[:, None], x, tokens)
    if sep is not None:
        tokens = tokens.masked_fill(s == n[:, None], sep)
    if eos is not None:
        tokens = tokens.masked_fill(s == (start + m)[:, None], eos)
    targets, loss_mask = _shift(tokens, lengths, start)
    return Batch(tokens=tokens, targets=targets, loss_mask=loss_mask, lengths=lengths)


def decoder_lists(inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *, sep: int | None,
                  eos: int | None, device: torch.device | str = "cpu") -> Batch:
    """:func:`decoder_batch` from Python lists of token ids (one input and one output per example)."""
    x, n = _pad(inputs, device)
    y, m = _pad(outputs, device)
    return decoder_batch(x, n, y, m, sep=sep, eos=eos)


def decoder_label(tokens: Tensor, lengths: Tensor, boundary: int) -> tuple[Tensor, Tensor]:
    """Targets and loss mask of a decoder-form batch from its tokens alone: the output starts right
    after the first ``boundary`` token of each row (the separator, or the prompt's last token)."""
    is_boundary = tokens == boundary  # [b, s]
    if not bool(is_boundary.any(-1).all()):
        raise ValueError(f"a sequence has no boundary token {boundary}")
    start = is_boundary.long().argmax(-1) + 1  # [b] first output position
    return _shift(tokens, lengths, start)


def _shift(tokens: Tensor, lengths: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
    """Next-token targets [b, s] and the mask start - 1 <= p < L - 1 (the next token is output or EOS)."""
    targets = torch.nn.functional.pad(tokens[:, 1:], (0, 1), value=PAD)
    s = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
    loss_mask = (s >= start[:, None] - 1) & (s < lengths[:, None] - 1)
    return targets, loss_mask


def _pad(rows: Sequence[Sequence[int]], device: torch.device | str) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
    out = torch.full((len(rows), max([len(r) for r in rows], default=0)), PAD, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        if len(r):
            out[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long, device=device)
    return out, lengths


def render(tokens: Tensor, length: int, symbols: Sequence[str]) -> str:
    """One sequence's first ``length`` tokens as its symbols, space-separated (docs and tests)."""
    return " ".join(symbols[int(t)] for t in tokens[:length])
