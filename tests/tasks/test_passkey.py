"""Passkey retrieval inside text: the needle is planted where asked, and scored on its digits."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.errors import ConfigError
from poslab.probes.passkey_eval import passkey
from poslab.studies.context_extension import PASSKEY_DEPTHS
from poslab.tasks import build_task
from poslab.tasks.passkey import NEEDLE, QUERY, PasskeyText
from poslab.tasks.text import CharText


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("L", [40, 97])
def test_needle_planted_at_depth_and_asked_at_the_end(depth, L):
    task = PasskeyText(share=1.0, split="val", depth=depth, digits=5)
    batch, answer = task.sample_with_answers(gen(3), 6, L)
    N, Q = len(NEEDLE.format("00000")), len(QUERY.format("00000"))
    p = round(depth * (L + 1 - N - Q))
    for i in range(6):
        text = task.decode(torch.cat([batch.tokens[i], batch.targets[i, -1:]]))  # L + 1 characters
        digits = text[p + len("pass key "):p + len("pass key ") + 5]
        assert digits.isdigit()
        assert text[p:p + N] == NEEDLE.format(digits)
        assert text[-Q:] == QUERY.format(digits)
        assert task.decode(batch.targets[i][answer[i]]) == digits  # the answer is the last 5 targets
        assert answer[i].nonzero().flatten().tolist() == list(range(L - 5, L))
    assert (batch.loss_mask == torch.ones_like(batch.loss_mask)).all()  # score="all": every character


def test_share_is_the_fraction_of_windows_with_a_needle_and_text_keeps_its_ids():
    task = PasskeyText(share=0.25)
    batch, answer = task.sample_with_answers(gen(0), 2000, 64)
    frac = answer.any(1).float().mean().item()
    assert abs(frac - 0.25) < 0.03
    text = CharText()
    assert task.vocab.startswith(text.vocab) and task.vocab_size == text.vocab_size + 9  # "3" is in the corpus
    plain = batch.tokens[~answer.any(1)]
    assert plain.max() < text.vocab_size  # windows without a needle are corpus text, ids unchanged


def test_answer_score_masks_everything_but_the_digits_and_validation():
    task = build_task("passkey", share=1.0, score="answer", depth=0.5)
    batch = task.sample(gen(0), 4, 50)
    assert batch.loss_mask.sum().item() == 4 * task.digits
    assert task.chance == 0.1
    with pytest.raises(ConfigError, match="share"):
        PasskeyText(share=0.5, score="answer")
    with pytest.raises(ConfigError, match="depth"):
        PasskeyText(depth=1.5)
    with pytest.raises(ConfigError, match="length"):
        PasskeyText(share=1.0).validate(20)


class Copier(torch.nn.Module):
    """An oracle that copies the digits after the first "pass key " into the answer positions."""

    def __init__(self, task):
        super().__init__()
        self.cue = task.encode("pass key ")
        self.digits, self.m = task.digits, task.vocab_size
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        b, L = tokens.shape
        k = len(self.cue)
        hit = (tokens.unfold(1, k, 1) == self.cue).all(-1)  # [b, L - k + 1]
        p = hit.float().argmax(1)  # the needle's start
        logits = torch.zeros(b, L, self.m)
        for i in range(b):
            for j in range(self.digits):
                logits[i, L - self.digits + j, tokens[i, p[i] + k + j]] = 30.0
        return logits


def test_passkey_scoring_with_a_perfect_copier_and_a_blind_model():
    task = PasskeyText(share=1.0, split="val")
    rows = passkey(lambda L: Copier(task), None, [40, 80], n=8, seed=0, digits=5, device="cpu", depths=PASSKEY_DEPTHS)
    assert len(rows) == 2 * 5  # lengths x depths
    assert all(r["accuracy"] == 1.0 and r["digit_accuracy"] == 1.0 for r in rows)
    assert all(r["loss"] < 1e-3 for r in rows)

    blind = lambda tokens: torch.zeros(*tokens.shape, task.vocab_size)  # noqa: E731
    rows = passkey(lambda L: blind, None, [40], n=8, seed=0, digits=5, device="cpu", depths=PASSKEY_DEPTHS)
    assert all(r["loss"] == pytest.approx(math.log(task.vocab_size), rel=1e-5) for r in rows)
    assert all(r["accuracy"] == 0.0 for r in rows)  # argmax of flat logits is token 0, never a digit


def test_answer_weight_marks_the_answer_digits_of_planted_windows_only():
    task = PasskeyText(share=0.5, digits=5, answer_weight=20.0)
    batch, answer = task.sample_with_answers(gen(4), 16, 64)
    assert batch.loss_weight.shape == batch.targets.shape
    assert (batch.loss_weight[answer] == 20.0).all() and (batch.loss_weight[~answer] == 1.0).all()
    assert answer.any(1).sum() not in (0, 16)  # some windows planted, some plain
    same, _ = PasskeyText(share=0.5, digits=5).sample_with_answers(gen(4), 16, 64)
    assert same.loss_weight is None and torch.equal(same.tokens, batch.tokens)  # the weight draws nothing


@pytest.mark.parametrize("weight", [0, -1.0, math.nan, math.inf, True, "2"])
def test_bad_answer_weight_is_refused(weight):
    with pytest.raises(ConfigError, match="answer_weight"):
        PasskeyText(answer_weight=weight)


def test_weighted_loss_is_the_weighted_mean_over_the_mask():
    from poslab.models.loss import masked_cross_entropy
    from poslab.tasks.base import Batch

    g = gen(5)
    logits = torch.randn(3, 7, 11, generator=g)
    targets = torch.randint(0, 11, (3, 7), generator=g)
    mask = torch.rand(3, 7, generator=g) < 0.7
    weight = torch.rand(3, 7, generator=g) * 5
    batch = Batch(tokens=targets, targets=targets, loss_mask=mask, lengths=torch.full((3,), 7), loss_weight=weight)
    naive_num = naive_den = 0.0
    for i in range(3):
        for t in range(7):
            if mask[i, t]:
                ce = -torch.log_softmax(logits[i, t], -1)[targets[i, t]]
                naive_num, naive_den = naive_num + weight[i, t] * ce, naive_den + weight[i, t]
    assert masked_cross_entropy(logits, batch) == pytest.approx(float(naive_num / naive_den), rel=1e-6)
    batch.loss_weight = torch.ones(3, 7)
    plain = Batch(tokens=targets, targets=targets, loss_mask=mask, lengths=torch.full((3,), 7))
    assert masked_cross_entropy(logits, batch) == pytest.approx(float(masked_cross_entropy(logits, plain)), rel=1e-6)


# --- the reasoning mixture (tasks of poslab.tasks.reasoning ending a share of the windows)

from poslab.tasks import reasoning as rs  # noqa: E402

MIX = dict(share=0.1, answer_weight=10.0, reasoning=tuple(rs.TASKS), reasoning_share=0.5, reasoning_weight=5.0)


def _windows(task, batch):
    """Each window's L + 1 characters (its tokens, then the last target)."""
    return [task.decode(torch.cat([batch.tokens[i], batch.targets[i, -1:]])) for i in range(batch.tokens.shape[0])]


def test_mixture_same_seed_same_text_and_passkey_draws_unchanged():
    task = PasskeyText(**MIX)
    a, wa = task.sample_with_answers(gen(7), 24, 96)
    b, wb = task.sample_with_answers(gen(7), 24, 96)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.loss_weight, b.loss_weight) and torch.equal(wa, wb)
    c, _ = task.sample_with_answers(gen(8), 24, 96)
    assert not torch.equal(a.tokens, c.tokens)
    # listing tasks without a share changes nothing but the vocabulary's tail: same ids, same windows
    plain, _ = PasskeyText(share=0.3).sample_with_answers(gen(3), 24, 96)
    listed, _ = PasskeyText(share=0.3, reasoning=("code",)).sample_with_answers(gen(3), 24, 96)
    assert torch.equal(plain.tokens, listed.tokens) and torch.equal(plain.targets, listed.targets)


def test_mixture_vocabulary_covers_every_reasoning_character_and_keeps_passkey_ids():
    plain, mixed = PasskeyText(), PasskeyText(**MIX)
    assert mixed.vocab.startswith(plain.vocab)  # corpus, then needle characters, then the reasoning ones
    assert set(rs.characters()) <= set(mixed.vocab) and len(set(mixed.vocab)) == mixed.vocab_size
    assert not set(rs.characters()) <= set(plain.vocab)  # TinyShakespeare lacks brackets, '=', '_', ...
    assert PasskeyText(reasoning=("multikey",)).vocab == mixed.vocab  # one vocabulary whatever the tasks


def test_mixture_windows_end_with_an_example_and_weight_its_answer():
    task = PasskeyText(**MIX)
    batch, answer = task.sample_with_answers(gen(11), 64, 96)
    texts = _windows(task, batch)
    kinds = {"passkey": 0, "reasoning": 0, "plain": 0}
    for i, text in enumerate(texts):
        weights = batch.loss_weight[i]
        if (weights == 10.0).any():  # a passkey: its digits weigh answer_weight
            kinds["passkey"] += 1
            assert task.decode(batch.targets[i][weights == 10.0]).isdigit()
        elif (weights == 5.0).any():  # a reasoning example: its answer, less the leading space, weighs 5
            kinds["reasoning"] += 1
            got = task.decode(batch.targets[i][weights == 5.0])
            assert text.endswith(" " + got) and weights[-len(got):].eq(5.0).all()
            assert torch.equal(answer[i], weights == 5.0)
            assert any(_solves(t, text[:-len(got) - 1], got) for t in rs.TASKS), text  # its prompt asks for it
        else:
            kinds["plain"] += 1
            assert not answer[i].any() and (weights == 1.0).all()
    assert all(kinds.values()), kinds
    assert 0.3 < kinds["reasoning"] / 64 < 0.7


def _solves(task, text, answer):
    from test_reasoning import solve_compact  # tests/tasks is on the path, as demo_shift is for its test

    try:
        return solve_compact(task, text) == " " + answer
    except (AttributeError, IndexError, ValueError):  # not this task's question
        return False


def test_mixture_window_too_short_for_every_task_stays_plain_text():
    task = PasskeyText(share=0.0, reasoning=("multivalue",), reasoning_share=1.0)
    batch, answer = task.sample_with_answers(gen(0), 8, 30)  # multivalue needs about 62 characters
    assert not answer.any()
    corpus = CharText()
    assert batch.tokens.max() < corpus.vocab_size


@pytest.mark.parametrize("field, value", [
    ("reasoning", ("sudoku",)), ("reasoning", "multikey"), ("reasoning", ("code", "code")),
    ("reasoning_share", -0.1), ("reasoning_share", 0.95), ("reasoning_share", True), ("reasoning_share", "0.2"),
    ("reasoning_weight", 0), ("reasoning_weight", math.nan), ("reasoning_weight", True)])
def test_bad_mixture_values_are_refused_naming_the_field(field, value):
    options = dict(MIX, **{field: value})
    with pytest.raises(ConfigError, match=field):
        PasskeyText(**options)


def test_a_share_without_tasks_is_refused():
    with pytest.raises(ConfigError, match="reasoning"):
        PasskeyText(reasoning_share=0.2)
    assert PasskeyText(reasoning=["code", "brackets"]).reasoning == ("code", "brackets")  # a --set list


def test_docstring_code_window_is_real_output():
    task = PasskeyText(share=0.1, reasoning=tuple(rs.TASKS), reasoning_share=0.5)
    batch, answer = task.sample_with_answers(gen(0), 6, 64)
    assert task.decode(batch.tokens[5]) == ", none we\nCBMRS = 51595. VAUCO = CBMRS. vars = 51595: CBMRS VAUC"
    assert task.decode(batch.targets[5][answer[5]]) == "CBMRS VAUCO"
