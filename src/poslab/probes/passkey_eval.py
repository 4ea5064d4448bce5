"""Passkey retrieval and reasoning / code exact match of a character LM, by depth x length.

Both probes read a model through ``model_at(L)`` (its model at window length L: a length-dependent
schedule gives one per length) on validation windows of :class:`poslab.tasks.passkey.PasskeyText`'s
corpus, one teacher-forced forward per cell: :func:`passkey` scores the answer digits of a planted
passkey, :func:`reasoning` the greedy answer of an example of :mod:`poslab.tasks.reasoning` ending
the window (its compact form, ``rs.CHAR_PARAMS``, as the training mixture writes it).
Used by a study of context extension on character LMs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from poslab.tasks import reasoning as rs
from poslab.tasks.passkey import PasskeyText
from poslab.tasks.text import CharText


def cell_seed(seed: int, L: int, depth: float) -> int:
    """The generator seed of one (length, depth) cell."""
    return (seed * 1_000_003 + L * 1009 + int(round(depth * 1000))) % (2 ** 62)


def passkey(model_at, corpus, lengths, n: int, seed: int, digits: int, device, *,
            depths: Sequence[float]) -> list[dict]:
    """Exact-match accuracy, digit accuracy and digit loss by depth x length (validation haystacks)."""
    rows = []
    for L in lengths:
        model = model_at(L)
        for depth in depths:
            task = PasskeyText(corpus=corpus, split="val", share=1.0, digits=digits, depth=depth, score="answer")
            g = torch.Generator().manual_seed(cell_seed(seed, L, depth))
            batch, answer = task.sample_with_answers(g, n, L)
            batch, answer = batch.to(device), answer.to(device)
            logits = model(batch.tokens)
            ce = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")  # [b, L]
            right = (logits.argmax(-1) == batch.targets) & answer  # [b, L]
            per_seq = right.sum(1) == answer.sum(1)
            rows.append(dict(probe="passkey", length=L, depth=depth, accuracy=float(per_seq.float().mean()),
                             digit_accuracy=float(right.sum() / answer.sum()), loss=float(ce[answer].mean()),
                             passkeys=n))
    return rows


def reasoning(model_at, task: PasskeyText, lengths, n: int, seed: int, device, *,
              depths: Sequence[float]) -> list[dict]:
    """Exact match of the greedy answer per reasoning task of ``task`` by depth x length: ``n``
    examples per cell, each ending a validation window of L characters (:func:`reasoning_windows`).

    One teacher-forced forward per (length, task), every depth in it: greedy decoding writes the
    answer iff every answer character is the argmax after the characters before it, and the
    prediction after the last is not a letter or digit (``rs.score``'s run-on rule; strict about the
    single leading space a character model is trained on). Also the accuracy and loss of the
    answer's characters (its leading space excluded), as the training weights them. A depth whose
    example cannot fit L is left out."""
    alnum = torch.tensor([c.isalnum() for c in task.vocab], device=device)
    rows = []
    for L in lengths:
        model = model_at(L)
        for name in task.reasoning:
            cells = [(depth, cell) for depth in depths
                     if (cell := reasoning_windows(task, name, L, depth, n, seed)) is not None]
            if not cells:
                continue
            tokens = torch.cat([c[0] for _, c in cells]).to(device)  # [cells x n, L]
            first = torch.cat([c[1] for _, c in cells]).to(device)  # [cells x n]
            full = model(tokens)  # [cells x n, L, vocab]
            logits = full[:, :-1]  # position t predicts token t + 1
            ce = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # [cells x n, L - 1]
            right = logits.argmax(-1) == tokens[:, 1:]
            t = torch.arange(L - 1, device=device)
            answer = t >= first[:, None] - 1  # predicting the answer, leading space included
            content = t >= first[:, None]  # ... without it
            exact = (right | ~answer).all(1) & ~alnum[full[:, -1].argmax(-1)]  # no run-on after the answer
            for k, (depth, _) in enumerate(cells):
                i = slice(k * n, (k + 1) * n)
                rows.append(dict(probe="reasoning", task=name, length=L, depth=depth,
                                 exact=float(exact[i].float().mean()),
                                 answer_accuracy=float(right[i][content[i]].float().mean()),
                                 loss=float(ce[i][content[i]].mean()), examples=n))
    return rows


@functools.lru_cache(maxsize=512)
def reasoning_windows(task: PasskeyText, name: str, L: int, depth: float, n: int,
                      seed: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``n`` windows of L characters (token ids of ``task``'s vocabulary, [n, L]) and the index of
    each one's answer (its leading space) [n]: validation text, a line break, then an example of
    ``name`` at ``depth`` (``rs.fitted`` with rs.CHAR_PARAMS, seed ``seed * 1000 + trial``), prompt and
    answer ending the window, as the training mixture writes them. None when it cannot fit L."""
    examples = [rs.fitted(name, L - 1, depth, seed * 1000 + trial, **rs.CHAR_PARAMS[name]) for trial in range(n)]
    if any(ex is None for ex in examples):
        return None
    text = CharText(corpus=task.corpus, split="val").ids  # corpus ids are the same in task's vocabulary
    g = torch.Generator().manual_seed(cell_seed(seed + 101 + list(rs.TASKS).index(name), L, depth))
    starts = torch.randint(0, text.numel() - L, (n,), generator=g)
    tokens = text[starts[:, None] + torch.arange(L)]  # [n, L]
    first = torch.empty(n, dtype=torch.long)
    for i, ex in enumerate(examples):
        assert ex is not None
        ids = task.encode("\n" + ex.prompt + ex.answer)  # as the training mixture writes it
        tokens[i, L - len(ids):] = ids
        first[i] = L - len(ex.answer)
    return tokens, first
