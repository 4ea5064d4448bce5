"""What every task shares: lengths, padding, determinism, fixed evaluation sets, the registry."""

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import TASKS, build_task, eval_batch, eval_seed

# tasks whose length is their token count; the benchmark tasks (issue 39) declare another length_unit
TOKEN_LENGTH_TASKS = sorted(name for name in TASKS if not hasattr(TASKS[name], "length_unit"))


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", TOKEN_LENGTH_TASKS)
def test_lengths_in_range_and_padding_masked(name):
    task = build_task(name)
    batch = task.sample(gen(), 256, (6, 12))
    assert batch.tokens.shape == (256, 12)
    assert batch.lengths.min() >= 6 and batch.lengths.max() <= 12
    assert set(batch.lengths.tolist()) == set(range(6, 13))  # every length occurs in 256 draws
    pad = torch.arange(12) >= batch.lengths[:, None]
    assert (batch.tokens[pad] == 0).all()
    assert batch.tokens.min() >= 0 and batch.tokens.max() < task.vocab_size
    if task.target_kind == "sequence":
        assert not batch.loss_mask[pad].any()


@pytest.mark.parametrize("name", TOKEN_LENGTH_TASKS)
def test_fixed_length(name):
    batch = build_task(name).sample(gen(), 8, 10)
    assert batch.tokens.shape == (8, 10) and (batch.lengths == 10).all()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_same_generator_seed_same_batch(name):
    task = build_task(name)
    a, b = task.sample(gen(5), 16, (6, 12)), task.sample(gen(5), 16, (6, 12))
    c = task.sample(gen(6), 16, (6, 12))
    for field in ("tokens", "targets", "loss_mask", "lengths"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.tokens, c.tokens)


def test_int_length_equals_degenerate_range():
    task = build_task("fixed_offset", K=2)
    a, b = task.sample(gen(4), 8, 10), task.sample(gen(4), 8, (10, 10))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)


def test_eval_batch_fixed_by_seed_and_length():
    task = build_task("fixed_offset")
    torch.manual_seed(0)
    a = eval_batch(task, 16, 32, seed=0)
    torch.manual_seed(1)  # the global generator plays no part
    b = eval_batch(task, 16, 32, seed=0)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.tokens, eval_batch(task, 16, 32, seed=1).tokens)
    assert not torch.equal(a.tokens[:, :16], eval_batch(task, 17, 32, seed=0).tokens[:, :16])
    assert eval_seed(0, 16) == eval_seed(0, (16, 16)) != eval_seed(0, 17)


def test_unknown_task():
    with pytest.raises(ConfigError) as err:
        build_task("no_such_task")  # "copy" is Kazemnejad et al.'s task now
    assert err.value.field == "task" and "fixed_offset" in err.value.allowed


def test_unknown_option():
    with pytest.raises(ConfigError) as err:
        build_task("fixed_offset", K2=3)
    assert err.value.field == "task.K2" and err.value.allowed == "K, m"


def test_build_task_passes_options():
    task = build_task("content_conditioned", m=10, K1=1, K2=5)
    assert (task.m, task.K1, task.K2) == (10, 1, 5)


@pytest.mark.parametrize("length", [0, (5, 4), (0, 3), (1, 2, 3), 2.5])
def test_bad_length(length):
    with pytest.raises(ConfigError) as err:
        build_task("shift", K=1).sample(gen(), 2, length)
    assert err.value.field == "length"
