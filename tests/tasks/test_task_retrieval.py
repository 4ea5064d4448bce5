"""Fixed-offset and content-conditioned retrieval: targets checked by hand-indexing."""

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import ContentConditioned, FixedOffset


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("K, expected", [(1, 5), (2, 17)])
def test_fixed_offset_docstring_examples(K, expected):
    tokens = torch.tensor([[3, 17, 5, 9]])
    targets, mask = FixedOffset(K=K).label(tokens, torch.tensor([4]))
    assert targets.tolist() == [expected] and mask.tolist() == [True]


def test_fixed_offset_docstring_padded_example():
    targets, _ = FixedOffset(K=1).label(torch.tensor([[4, 11, 2, 0, 0]]), torch.tensor([3]))
    assert targets.tolist() == [11]


def test_content_conditioned_docstring_examples():
    task = ContentConditioned(m=20, K1=2, K2=3)
    tokens = torch.tensor([[7, 12, 3, 18, 4], [7, 12, 3, 18, 15], [9, 1, 6, 10, 0]])
    targets, _ = task.label(tokens, torch.tensor([5, 5, 4]))
    assert targets.tolist() == [3, 12, 9]


@pytest.mark.parametrize("K", [1, 3])
def test_fixed_offset_sample_matches_hand_indexing(K):
    batch = FixedOffset(m=20, K=K).sample(gen(1), 32, (5, 9))
    for row, L, y in zip(batch.tokens.tolist(), batch.lengths.tolist(), batch.targets.tolist(), strict=False):
        assert y == row[L - 1 - K]
    assert batch.targets.shape == (32,) and batch.loss_mask.all()
    assert batch.tokens.dtype == batch.targets.dtype == batch.lengths.dtype == torch.int64
    assert batch.loss_mask.dtype == torch.bool


def test_content_conditioned_sample_matches_hand_indexing():
    task = ContentConditioned(m=10, K1=1, K2=4)
    batch = task.sample(gen(2), 64, (6, 10))
    used = set()
    for row, L, y in zip(batch.tokens.tolist(), batch.lengths.tolist(), batch.targets.tolist(), strict=False):
        K = 1 if row[L - 1] < 5 else 4
        used.add(K)
        assert y == row[L - 1 - K]
    assert used == {1, 4}  # both classes of query occur


def test_content_conditioned_odd_vocab_split():
    task = ContentConditioned(m=5, K1=1, K2=2)  # split at 5 // 2 = 2: {0, 1} -> K1
    assert task.offset(torch.arange(5)).tolist() == [1, 1, 2, 2, 2]


def test_chance():
    assert FixedOffset(m=20).chance == pytest.approx(1 / 20)
    assert ContentConditioned(m=40).chance == pytest.approx(1 / 40)
    assert FixedOffset(m=10).vocab_size == 10
    assert FixedOffset().target_kind == ContentConditioned().target_kind == "last"


def test_offset_must_fit_shortest_length():
    with pytest.raises(ConfigError) as err:
        FixedOffset(K=8).validate(8)
    assert err.value.field == "K"
    assert str(err.value) == "K: got 8; allowed: an integer in [1, 7] for a shortest training length of 8"
    FixedOffset(K=7).validate(8)
    with pytest.raises(ConfigError, match="^K: got 8"):
        FixedOffset(K=8).sample(gen(), 4, (8, 16))


def test_content_conditioned_checks_both_offsets():
    with pytest.raises(ConfigError) as err:
        ContentConditioned(K1=2, K2=9).validate(8)
    assert err.value.field == "K2"
    with pytest.raises(ConfigError) as err:
        ContentConditioned(K1=0)
    assert err.value.field == "K1"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_offset_value(bad):
    with pytest.raises(ConfigError) as err:
        FixedOffset(K=bad)
    assert err.value.field == "K"


def test_bad_vocab():
    with pytest.raises(ConfigError) as err:
        ContentConditioned(m=1)
    assert err.value.field == "m"
