"""The Chomsky benchmark's context-sensitive tasks: sampled rows against naive references.

Each reference below is written from the sources' task definitions (google-deepmind/
randomized_positional_encodings ``tasks/cs/*.py``) with Python strings and integers, independently
of the tensor code in :mod:`poslab.tasks.chomsky.context_sensitive`.
"""

import math

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import TASKS, build_task
from poslab.tasks.chomsky.context_sensitive import (
    BinaryAddition,
    BinaryMultiplication,
    BucketSort,
    ComputeSqrt,
    DuplicateString,
    MissingDuplicateString,
    OddsFirst,
)
from poslab.tasks.chomsky.format import EMPTY, PAD, encoder_lists
from poslab.tasks.scoring import sequence_scores

NAMES = ["duplicate_string", "missing_duplicate_string", "odds_first", "binary_addition", "binary_multiplication",
         "compute_sqrt", "bucket_sort"]


# ----------------------------------------------------------------------------- naive references
# each: input symbols (source ids) -> (output classes, number of scored leading slots)

def _le_int(bits):
    return int("".join(str(b) for b in reversed(bits)), 2)


def _le_str(v):
    return [int(c) for c in f"{v:b}"[::-1]]


def ref_duplicate(x, d=2):
    return x * d, d * len(x)


def ref_odds_first(x):
    return x[1::2] + x[::2], len(x)


def ref_bucket_sort(x):
    return sorted(x), len(x)


def ref_missing(x):
    if len(x) == 1:
        return [1], 1
    h = len(x) // 2
    i = x.index(2)
    return [x[i + h] if i < h else x[i - h]], 1


def ref_addition(x):
    L = len(x)
    if L <= 2:
        res = _le_str(_le_int(x))
    else:
        i = x.index(2)
        res = _le_str(_le_int(x[:i]) + _le_int(x[i + 1:]))
    return res + [2] + [0] * (L - len(res)), len(res) + 1


def ref_multiplication(x):
    L = len(x)
    if L <= 2:
        res = [0] * (L - 1)
    else:
        i = x.index(2)
        res = _le_str(_le_int(x[:i]) * _le_int(x[i + 1:]))
    return res + [2] + [0] * (L - 1 - len(res)), len(res) + 1


def ref_sqrt(x):
    root = math.isqrt(int("".join(map(str, x)), 2))
    return [int(c) for c in f"{root:b}".zfill(math.ceil(len(x) / 2))], math.ceil(len(x) / 2)


REFS = {"duplicate_string": ref_duplicate, "missing_duplicate_string": ref_missing, "odds_first": ref_odds_first,
        "binary_addition": ref_addition, "binary_multiplication": ref_multiplication, "compute_sqrt": ref_sqrt,
        "bucket_sort": ref_bucket_sort}


def decode(batch, i):
    """Row i of a batch: (input symbols, output slot targets, scored slots), checking its layout."""
    row, L = batch.tokens[i].tolist(), int(batch.lengths[i])
    n = next((p for p, t in enumerate(row) if t == EMPTY), None)
    assert n is not None and n >= 1, "every sequence has input tokens, then empty slots"
    assert all(t >= 2 for t in row[:n]) and all(t == EMPTY for t in row[n:L]) and all(t == PAD for t in row[L:])
    mask = batch.loss_mask[i].tolist()
    assert not any(mask[:n]) and not any(mask[L:])
    k = sum(mask[n:L])
    assert mask[n:n + k] == [True] * k, "the scored slots lead"
    return [t - 2 for t in row[:n]], batch.targets[i, n:L].tolist(), k


# ----------------------------------------------------------------------------- worked examples

# (task, input, output, scored): the docstrings' worked examples (the sources' own where they give them)
EXAMPLES = [
    (DuplicateString(), [1, 0, 1], [1, 0, 1, 1, 0, 1], 6),
    (DuplicateString(), [0], [0, 0], 2),
    (DuplicateString(duplication=3), [1, 0], [1, 0, 1, 0, 1, 0], 6),
    (OddsFirst(), [0, 0, 1, 1, 0, 1, 0, 1], [0, 1, 1, 1, 0, 1, 0, 0], 8),
    (OddsFirst(), [1, 1, 0], [1, 1, 0], 3),
    (BucketSort(), [1, 0, 2, 0, 4, 1, 1, 2], [0, 0, 1, 1, 1, 2, 2, 4], 8),
    (BucketSort(m=2), [1, 1, 1, 0, 0, 0, 1], [0, 0, 0, 1, 1, 1, 1], 7),
    (MissingDuplicateString(), [0, 1, 1, 0, 0, 2, 1, 0], [1], 1),
    (MissingDuplicateString(), [1, 0, 1, 1, 2, 1, 3], [0], 1),  # the sources' "1011213"
    (MissingDuplicateString(), [1, 0, 2, 1, 0, 1, 3], [1], 1),
    (MissingDuplicateString(), [1], [1], 1),
    (BinaryAddition(), [0, 0, 1, 2, 0, 1, 1, 0, 1], [0, 1, 0, 1, 1, 2, 0, 0, 0, 0], 6),
    (BinaryAddition(), [1, 0, 0, 1, 2, 0, 0, 0, 0, 0, 1], [1, 0, 0, 1, 0, 1, 2, 0, 0, 0, 0, 0], 7),
    (BinaryAddition(), [0, 1], [0, 1, 2], 3),
    (BinaryAddition(), [0], [0, 2], 2),
    (BinaryMultiplication(), [0, 0, 1, 2, 0, 1, 1, 0, 1], [0, 0, 0, 1, 1, 0, 1, 2, 0], 8),
    (BinaryMultiplication(), [1, 0, 0, 1, 2, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 0], 10),
    (BinaryMultiplication(), [1, 0], [0, 2], 2),
    (BinaryMultiplication(), [1], [2], 1),
    (ComputeSqrt(), [1, 0, 0, 1, 0, 1], [1, 1, 0], 3),
    (ComputeSqrt(), [1, 1, 1], [1, 0], 2),
    (ComputeSqrt(), [0, 0, 0, 1], [0, 1], 2),
]


@pytest.mark.parametrize(("task", "x", "y", "k"), EXAMPLES)
def test_worked_examples(task, x, y, k):
    batch = encoder_lists([x], [[0] * task.output_length(len(x))])  # outputs unknown: the rule fills them in
    targets, mask = task.label(batch.tokens, batch.lengths)
    n = len(x)
    assert targets[0, n:].tolist() == y and mask[0, n:].tolist() == [True] * k + [False] * (len(y) - k)
    reference = REFS[task.name]
    assert (reference(x, task.duplication) if isinstance(task, DuplicateString) else reference(x)) == (y, k)


# ----------------------------------------------------------------------------- sampled rows


def _task(name):
    return build_task(name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("length", [1, 2, 3, 7, (1, 40)])
def test_samples_match_reference(name, length):
    task = _task(name)
    batch = task.sample(torch.Generator().manual_seed(11), 48, length)
    lo, hi = length if isinstance(length, tuple) else (length, length)
    for i in range(batch.size):
        x, y, k = decode(batch, i)
        assert lo <= len(x) <= hi and int(batch.lengths[i]) == len(x) + task.output_length(len(x))
        assert all(0 <= s < task.input_size for s in x)
        assert (y, k) == REFS[name](x)


@pytest.mark.parametrize("name", NAMES)
def test_label_reproduces_targets(name):
    task = _task(name)
    batch = task.sample(torch.Generator().manual_seed(5), 64, (1, 40))
    targets, mask = task.label(batch.tokens, batch.lengths)
    assert torch.equal(targets, batch.targets) and torch.equal(mask, batch.loss_mask)
    assert batch.targets.dtype == torch.long and batch.loss_mask.dtype == torch.bool


@pytest.mark.parametrize("name", NAMES)
def test_oracle_scores_one_and_a_flip_breaks_exact_match(name):
    task = _task(name)
    batch = task.sample(torch.Generator().manual_seed(2), 32, (1, 40))
    accuracy, exact = sequence_scores(batch.targets.clone(), batch)
    assert torch.all(accuracy == 1.0) and torch.all(exact == 1.0)
    wrong = batch.targets.clone()
    rows = torch.arange(batch.size)
    last = batch.loss_mask.long().cumsum(1).argmax(1)  # [b] each row's last scored slot
    wrong[rows, last] = (wrong[rows, last] + 1) % task.output_size
    accuracy, exact = sequence_scores(wrong, batch)
    assert torch.all(exact == 0.0) and torch.all(accuracy < 1.0)
    # a wrong guess on an unscored position changes nothing
    unscored = ~batch.loss_mask
    accuracy, exact = sequence_scores(batch.targets.masked_fill(unscored, 2), batch)
    assert torch.all(exact == 1.0)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_fixed_length_is_a_pair(name):
    task = _task(name)
    a = task.sample(torch.Generator().manual_seed(9), 16, (3, 30))
    b = task.sample(torch.Generator().manual_seed(9), 16, (3, 30))
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("tokens", "targets", "loss_mask", "lengths"))
    c = task.sample(torch.Generator().manual_seed(9), 16, 12)
    d = task.sample(torch.Generator().manual_seed(9), 16, (12, 12))
    assert torch.equal(c.tokens, d.tokens) and torch.equal(c.targets, d.targets)
    e = task.sample(torch.Generator().manual_seed(10), 16, 12)
    assert not torch.equal(c.tokens, e.tokens)


@pytest.mark.parametrize("name", NAMES)
def test_lengths_padding_and_sizes(name):
    task = _task(name)
    batch = task.sample(torch.Generator().manual_seed(4), 64, (1, 25))
    assert batch.tokens.shape == batch.targets.shape == batch.loss_mask.shape
    assert batch.tokens.shape[1] == int(batch.lengths.max()) <= task.max_tokens(25)
    fixed = task.sample(torch.Generator().manual_seed(4), 8, 25)
    assert fixed.lengths.tolist() == [task.max_tokens(25)] * 8 == [25 + task.output_length(25)] * 8
    past = torch.arange(batch.tokens.shape[1])[None, :] >= batch.lengths[:, None]
    assert torch.all(batch.tokens[past] == PAD) and not batch.loss_mask[past].any()
    assert int(batch.tokens.max()) < task.vocab_size and int(batch.targets.max()) < task.output_size
    assert task.output_size <= task.vocab_size and task.chance == pytest.approx(1 / task.output_size)


def test_source_sizes_and_lengths():
    sizes = {name: (TASKS[name]().input_size, TASKS[name]().output_size) for name in NAMES}
    assert sizes == {"duplicate_string": (2, 2), "missing_duplicate_string": (4, 2), "odds_first": (2, 2),
                     "binary_addition": (3, 3), "binary_multiplication": (3, 3), "compute_sqrt": (2, 2),
                     "bucket_sort": (5, 5)}
    L = 41
    assert [TASKS[name]().output_length(L) for name in NAMES] == [82, 1, 41, 42, 41, 21, 41]
    for name in NAMES:
        cls = TASKS[name]
        assert cls.name == name and cls.target_kind == "sequence" and cls.model_form == "encoder"
        assert cls.benchmark == "ruoss" and cls.train_range == (1, 40) and cls.test_range == (41, 500)
        assert cls.length_unit == "input tokens"


def test_long_lengths_sample_big_numbers():
    """At L = 500 the operands have hundreds of bits: the answers need exact big integers."""
    for name in ("binary_addition", "binary_multiplication", "compute_sqrt"):
        batch = _task(name).sample(torch.Generator().manual_seed(0), 4, 500)
        for i in range(4):
            x, y, k = decode(batch, i)
            assert (y, k) == REFS[name](x)


def test_operand_distribution():
    """binary_addition at L = 6: widths w_n uniform in [1, 4], operands never 0 (the sources' draws)."""
    batch = BinaryAddition().sample(torch.Generator().manual_seed(1), 400, 6)
    widths, zeros = [], 0
    for i in range(batch.size):
        x, _, _ = decode(batch, i)
        at = x.index(2)
        widths.append(at)
        zeros += _le_int(x[:at]) == 0 or _le_int(x[at + 1:]) == 0
    assert zeros == 0 and set(widths) == {1, 2, 3, 4}
    assert all(60 < widths.count(w) < 140 for w in (1, 2, 3, 4))
    roots = ComputeSqrt().sample(torch.Generator().manual_seed(1), 400, 3)
    values = [int("".join(map(str, decode(roots, i)[0])), 2) for i in range(roots.size)]
    assert set(values) == set(range(1, 8))
    missing = MissingDuplicateString().sample(torch.Generator().manual_seed(1), 400, 6)
    assert set(decode(missing, i)[0].index(2) for i in range(missing.size)) == set(range(6))


def test_speed_at_training_length():
    """A batch of 128 at L = 40 is cheap (the contract asks for ~20 ms; loose here for a loaded machine)."""
    import time

    for name in NAMES:
        task, generator = _task(name), torch.Generator().manual_seed(0)
        start = time.perf_counter()
        task.sample(generator, 128, 40)
        assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize(("name", "options", "field"), [
    ("duplicate_string", {"m": 1}, "m"),
    ("duplicate_string", {"duplication": 0}, "duplication"),
    ("odds_first", {"m": "2"}, "m"),
    ("bucket_sort", {"m": 0}, "m"),
    ("binary_addition", {"m": 2}, "task.m"),
    ("compute_sqrt", {"K": 1}, "task.K"),
])
def test_bad_options(name, options, field):
    with pytest.raises(ConfigError) as err:
        build_task(name, **options)
    assert err.value.field == field


@pytest.mark.parametrize("length", [0, (0, 5), (5, 3), -1])
def test_bad_lengths(length):
    with pytest.raises(ConfigError):
        BinaryAddition().sample(torch.Generator(), 2, length)
