"""Zero-shot evaluation of the reasoning tasks on a pretrained checkpoint: the plumbing (tokenize,
greedy decode, detokenize, exact match) on a tiny random Llama, and a model forced to emit the
answer scores 1 while the same model forced to emit a wrong answer scores 0."""

from __future__ import annotations

import torch
from torch import nn

from poslab.pretrained import encode_text, load
from poslab.pretrained.zero_shot import zero_shot_rows
from poslab.tasks.reasoning import TASKS, generate


class Forced(nn.Module):
    """The checkpoint, with a large bonus on the logit of ``target[t]`` at the t-th generated step
    (decoded here without a cache: the scoring's plumbing is under test, not the decoder)."""

    def __init__(self, model, prompt_len: int, target: torch.Tensor):
        super().__init__()
        self.model, self.prompt_len, self.target = model, prompt_len, target
        self.tokenizer, self.config = model.tokenizer, model.config

    def forward(self, tokens):
        logits = self.model(tokens).clone()
        t = tokens.shape[1] - self.prompt_len
        if t < len(self.target):
            logits[:, -1, self.target[t]] += 1e4
        return logits

    @torch.no_grad()
    def greedy(self, prompt: torch.Tensor, n_new: int) -> list[int]:
        tokens, out = prompt, []
        for _ in range(n_new):
            nxt = self(tokens)[0, -1].argmax()
            out.append(int(nxt))
            tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
        return out


def test_a_random_llama_runs_every_task_and_scores_near_zero(tiny):
    model = load(str(tiny("llama")))
    examples = [generate(task, 360, 0.5, 0) for task in sorted(TASKS)]
    rows = zero_shot_rows(model, examples)
    assert [r["task"] for r in rows] == sorted(TASKS)
    for ex, r in zip(examples, rows, strict=True):
        assert r["prompt_tokens"] == len(ex.prompt.encode("utf-8"))  # byte-level: no tokenizer in the tiny model
        assert r["answer"] == ex.answer.strip() and r["exact"] in (0.0, 1.0)
        assert len(r["output"]) > 0
    assert sum(r["exact"] for r in rows) == 0  # random weights do not find a 7-digit number


def test_a_model_forced_to_emit_the_answer_scores_one_and_a_wrong_one_zero(tiny):
    model = load(str(tiny("llama")))
    for task in sorted(TASKS):
        ex = generate(task, 360, 0.3, 1)
        n = len(encode_text(model, ex.prompt))
        right = Forced(model, n, encode_text(model, ex.answer + "\n"))
        assert zero_shot_rows(right, [ex])[0]["exact"] == 1.0, task
        wrong = Forced(model, n, encode_text(model, ex.answer[:-1] + "#\n"))  # last character changed
        assert zero_shot_rows(wrong, [ex])[0]["exact"] == 0.0, task


def test_greedy_is_the_argmax_of_the_full_forward(tiny):
    model = load(str(tiny("llama")))
    ids = encode_text(model, "The grass is green.")
    out = model.greedy(ids[None], 3)
    with torch.no_grad():
        first = int(model(ids[None])[0, -1].argmax())
        second = int(model(torch.cat([ids, torch.tensor([first])])[None])[0, -1].argmax())
    assert out[:2] == [first, second]
