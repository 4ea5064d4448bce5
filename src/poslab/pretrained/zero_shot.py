"""Zero-shot exact match of the text tasks (:mod:`poslab.tasks.reasoning`) on a pretrained checkpoint.

Each example's prompt goes through the checkpoint's tokenizer (no BOS), the answer is decoded
greedily with the checkpoint's KV cache (:meth:`~poslab.pretrained.model.PretrainedLM.greedy`, the
one greedy decoder) for the answer's token count plus ``extra_tokens``, and scored by
:func:`~poslab.tasks.reasoning.score`.
"""

from __future__ import annotations

from poslab.pretrained.model import decode_tokens, encode_text
from poslab.tasks.reasoning import Example, score


def zero_shot_rows(model, examples: list[Example], *, extra_tokens: int = 2) -> list[dict]:
    """One row per example with the prompt's token count, the continuation and ``exact``; ``model``
    is a :class:`~poslab.pretrained.model.PretrainedLM` (or anything with its ``greedy`` and tokenizer)."""
    rows = []
    for ex in examples:
        ids = encode_text(model, ex.prompt)
        n_new = len(encode_text(model, ex.answer)) + extra_tokens
        text = decode_tokens(model, model.greedy(ids[None], n_new))
        rows.append(dict(task=ex.task, length=ex.length, depth=ex.depth, seed=ex.seed, prompt_tokens=len(ids),
                         answer=ex.answer.strip(), output=text, exact=score(ex, text)))
    return rows
