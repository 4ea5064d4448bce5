"""The induction task: worked examples, the content rule against a naive loop, an oracle scoring 1.0."""

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import TASKS, build_task, eval_batch
from poslab.tasks.induction import Induction
from poslab.tasks.scoring import sequence_scores


def _label(tokens, L):
    """The docstring's rule written naively: the most recent earlier occurrence, then the token after it."""
    out = []
    for t in range(L):
        js = [j for j in range(t) if tokens[j] == tokens[t]]
        out.append(tokens[js[-1] + 1] if js else None)
    return out


@pytest.mark.parametrize("tokens, L, want", [
    ([5, 2, 7, 0, 5, 2, 7, 0], 8, [None] * 4 + [2, 7, 0, 5]),
    ([3, 6, 1, 4, 3, 6, 1], 7, [None] * 4 + [6, 1, 4]),
    ([1, 0, 6, 1, 0, 0, 0, 0], 5, [None] * 3 + [0, 6, None, None, None]),
])
def test_worked_examples(tokens, L, want):
    task = Induction(m=8)
    x = torch.tensor([tokens])
    targets, mask = task.label(x, torch.tensor([L]))
    got = [int(targets[0, t]) if mask[0, t] else None for t in range(len(tokens))]
    assert got == want


def test_samples_repeat_a_distinct_prefix_and_label_by_content():
    task = Induction(m=16)
    g = torch.Generator().manual_seed(0)
    batch = task.sample(g, 64, (6, 20))
    assert batch.tokens.shape == (64, 20) and batch.targets.shape == (64, 20)
    for b in range(64):
        L = int(batch.lengths[b])
        P = (L + 1) // 2
        seq = batch.tokens[b, :L].tolist()
        assert len(set(seq[:P])) == P and seq[P:] == seq[: L - P]  # distinct prefix, then repeated
        assert (batch.tokens[b, L:] == 0).all()
        want = _label(seq, L)
        assert [bool(v) for v in batch.loss_mask[b, :L]] == [w is not None for w in want]
        assert not batch.loss_mask[b, L:].any()
        assert [int(batch.targets[b, t]) for t in range(P, L)] == want[P:]
        assert want[P:] == [seq[t - P + 1] for t in range(P, L)]  # the offset the content sets: -(P - 1)


def test_an_oracle_that_reads_the_earlier_copy_scores_one():
    task = Induction(m=32)
    batch = eval_batch(task, 40, 128, seed=3)
    L = 40
    predictions = torch.zeros_like(batch.tokens)
    for b in range(batch.size):  # content match: find the earlier occurrence, copy what followed it
        seq = batch.tokens[b].tolist()
        for t, y in enumerate(_label(seq, L)):
            if y is not None:
                predictions[b, t] = y
    accuracy, exact = sequence_scores(predictions, batch)
    assert accuracy.mean() == 1.0 and exact.mean() == 1.0
    predictions[0, 30] = (predictions[0, 30] + 1) % 32  # one wrong token: exact match 0 for that sequence
    accuracy, exact = sequence_scores(predictions, batch)
    assert exact[0] == 0 and accuracy[0] == pytest.approx(19 / 20)


def test_registry_determinism_and_bad_lengths():
    assert TASKS["induction"] is Induction and build_task("induction", m=8) == Induction(m=8)
    task = Induction(m=8)
    a, b = eval_batch(task, 12, 16, seed=1), eval_batch(task, 12, 16, seed=1)
    assert torch.equal(a.tokens, b.tokens) and task.chance == 1 / 8
    with pytest.raises(ConfigError, match="length"):
        task.sample(torch.Generator().manual_seed(0), 4, 17)  # a prefix of 9 distinct tokens out of 8
    with pytest.raises(ConfigError, match="length"):
        task.validate(2)
    with pytest.raises(ConfigError, match="m"):
        Induction(m=1)
