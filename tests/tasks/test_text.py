"""Character-level text: the packaged corpus, splits, windows, custom corpora and bad ones."""

import hashlib
import pickle

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import CharText, build_task, task_options
from poslab.tasks.text import TINYSHAKESPEARE_CHARS, TINYSHAKESPEARE_SHA256, load_corpus


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def abc_corpus(tmp_path):
    """120 characters: 108 of training text, then a validation split reading "abcdefghijkl"."""
    path = tmp_path / "abc.txt"
    path.write_text("x" * 108 + "abcdefghijkl", encoding="utf-8")
    return path


def test_packaged_tinyshakespeare():
    text = load_corpus().text
    assert len(text) == TINYSHAKESPEARE_CHARS == 1_115_394
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == TINYSHAKESPEARE_SHA256
    task = CharText()
    assert task.vocab_size == 65 and task.chance == 1 / 65 and task.target_kind == "sequence"
    assert task.vocab == "".join(sorted(set(text))) and task.vocab[:2] == "\n "


def test_splits_are_the_first_90_and_last_10_percent():
    train, val = CharText(), CharText(split="val")
    assert len(train.text) == int(0.9 * TINYSHAKESPEARE_CHARS) == 1_003_854
    assert len(val.text) == TINYSHAKESPEARE_CHARS - 1_003_854 == 111_540
    assert train.text + val.text == load_corpus().text
    assert train.vocab == val.vocab  # one vocabulary, from the whole corpus
    assert torch.equal(train.ids[:100_000], train.encode(train.text[:100_000]))
    assert train.decode(val.ids[:50]) == val.text[:50]


def test_docstring_examples(abc_corpus):
    task = CharText()
    assert task.encode("First Citizen:")[:7].tolist() == [18, 47, 56, 57, 58, 1, 15]
    first = next(task.windows(6, batch_size=1))
    assert first.tokens.tolist() == [[18, 47, 56, 57, 58, 1]]
    assert first.targets.tolist() == [[47, 56, 57, 58, 1, 15]]
    # a length-4 sequence padded to 6: the window at s = 6, "Citi" -> "itiz"
    tokens = task.encode("Citi\n\n")[None]
    targets, mask = task.label(tokens, torch.tensor([4]))
    assert task.decode(targets[0][mask[0]]) == "iti"  # label sees tokens only: the 4th is masked
    assert mask[0].tolist() == [True, True, True, False, False, False]
    val = CharText(corpus=str(abc_corpus), split="val")
    assert val.text == "abcdefghijkl"
    (batch,) = val.windows(5)
    assert [val.decode(t) for t in batch.tokens] == ["abcde", "fghij"]
    assert [val.decode(t) for t in batch.targets] == ["bcdef", "ghijk"]


def test_registry_and_options():
    assert task_options("text") == {"corpus": None, "split": "train"}
    assert build_task("text", split="val") == CharText(split="val")


def test_same_generator_state_same_batch():
    task = CharText()
    a, b, c = (task.sample(gen(s), 16, (8, 32)) for s in (5, 5, 6))
    for field in ("tokens", "targets", "loss_mask", "lengths"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.parametrize("split", ["train", "val"])
def test_targets_are_the_next_characters_of_the_corpus(split):
    task, L = CharText(split=split), 32
    batch = task.sample(gen(1), 64, L)
    assert batch.tokens.shape == batch.targets.shape == batch.loss_mask.shape == (64, L)
    assert batch.loss_mask.all() and (batch.lengths == L).all()
    # Offsets come first from the generator, uniform over the split's n - L valid starts.
    starts = torch.randint(0, len(task.text) - L, (64,), generator=gen(1)).tolist()
    for row, s in enumerate(starts):
        assert task.decode(batch.tokens[row]) == task.text[s: s + L]
        assert task.decode(batch.targets[row]) == task.text[s + 1: s + L + 1]
    assert torch.equal(batch.targets[:, :-1], batch.tokens[:, 1:])


def test_variable_lengths_pad_and_mask():
    task = CharText()
    fixed, ranged = task.sample(gen(2), 256, 12), task.sample(gen(2), 256, (4, 12))
    assert set(ranged.lengths.tolist()) == set(range(4, 13))
    inside = torch.arange(12) < ranged.lengths[:, None]
    assert torch.equal(ranged.loss_mask, inside)
    assert torch.equal(ranged.tokens[inside], fixed.tokens[inside])  # same offsets, then lengths
    assert torch.equal(ranged.targets[inside], fixed.targets[inside])
    assert (ranged.tokens[~inside] == 0).all() and (ranged.targets[~inside] == 0).all()


def test_label_agrees_with_sample_except_the_last_position():
    task = CharText()
    batch = task.sample(gen(3), 32, (5, 10))
    targets, mask = task.label(batch.tokens, batch.lengths)
    last = torch.arange(10) == batch.lengths[:, None] - 1
    assert torch.equal(mask, batch.loss_mask & ~last)
    assert torch.equal(targets[mask], batch.targets[mask])


def test_windows_tile_the_split():
    task, L = CharText(split="val"), 100
    batches = list(task.windows(L, batch_size=64))
    count = (len(task.text) - 1) // L
    assert [b.size for b in batches] == [64] * (count // 64) + [count % 64]
    tokens = torch.cat([b.tokens for b in batches]).flatten()
    targets = torch.cat([b.targets for b in batches]).flatten()
    assert torch.equal(tokens, task.ids[: count * L]) and torch.equal(targets, task.ids[1: count * L + 1])
    assert all(b.loss_mask.all() and (b.lengths == L).all() for b in batches)
    limited = list(task.windows(L, batch_size=3, limit=7))
    assert [b.size for b in limited] == [3, 3, 1]
    assert torch.equal(torch.cat([b.tokens for b in limited]), torch.cat([b.tokens for b in batches])[:7])


@pytest.mark.parametrize("args, field", [(dict(length=(4, 8)), "length"), (dict(length=0), "length"),
                                         (dict(length=8, batch_size=0), "batch_size"),
                                         (dict(length=8, limit=0), "limit")])
def test_windows_bad_arguments_raise_before_any_batch(args, field):
    with pytest.raises(ConfigError) as err:
        CharText().windows(**args)
    assert err.value.field == field


def test_custom_corpus(tmp_path):
    text = "Ünïcode and plain text, ✓ mixed.\n" * 40
    path = tmp_path / "my corpus.txt"
    path.write_text(text, encoding="utf-8")
    task = build_task("text", corpus=str(path))
    assert task.vocab == "".join(sorted(set(text))) and task.vocab_size == len(set(text))
    assert task.text == text[: int(0.9 * len(text))]
    assert task.decode(task.encode(text)) == text
    batch = task.sample(gen(0), 8, 20)
    for tokens, targets in zip(batch.tokens, batch.targets, strict=False):
        assert task.decode(tokens) + task.decode(targets)[-1:] in text
    assert CharText(corpus=path) == task  # a Path is kept as its string: plain data in the config


def test_encode_decode_roundtrip():
    task = CharText()
    for s in (task.vocab, task.text[:5000], "", "To be, or not to be"):
        ids = task.encode(s)
        assert ids.dtype == torch.long and task.decode(ids) == s
    with pytest.raises(ConfigError) as err:
        task.encode("naïve ✓")
    assert err.value.field == "text" and err.value.value == "ï✓"


def test_pickles_as_its_path_and_rebuilds_cheaply(abc_corpus):
    task = CharText(corpus=str(abc_corpus), split="val")
    data = pickle.dumps(task)
    assert len(data) < 300 and pickle.loads(data) == task
    assert load_corpus(str(abc_corpus)) is load_corpus(str(abc_corpus))  # read once per process
    abc_corpus.write_text("y" * 108 + "mnopqrstuvwx", encoding="utf-8")  # rewritten: read again
    assert CharText(corpus=str(abc_corpus), split="val").text == "mnopqrstuvwx"


BAD = {
    "missing": lambda p: None,
    "empty": lambda p: p.write_bytes(b""),
    "not_utf8": lambda p: p.write_bytes("Grüße aus Köln\n".encode("latin-1") * 10),
    "binary": lambda p: p.write_bytes(bytes(range(256)) * 4),
    "directory": lambda p: p.mkdir(),
    "too_short": lambda p: p.write_text("abcdefghij"),  # 9 train, 1 validation character
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_corpus_is_one_config_error_naming_the_file(tmp_path, kind):
    path = tmp_path / "corpus.txt"
    BAD[kind](path)
    with pytest.raises(ConfigError) as err:
        build_task("text", corpus=str(path))
    message = str(err.value)
    assert err.value.field == "corpus" and str(path) in message and "\n" not in message


def test_corpus_too_short_for_the_length(abc_corpus):
    task = CharText(corpus=str(abc_corpus))  # the validation split has 12 characters
    task.validate(11)
    task.sample(gen(), 4, 11)
    for call in (lambda: task.validate(12), lambda: task.sample(gen(), 4, (4, 12)), lambda: task.windows(12)):
        with pytest.raises(ConfigError) as err:
            call()
        assert err.value.field == "corpus" and str(abc_corpus) in str(err.value)
        assert "val split" in str(err.value) and "12" in str(err.value)


def test_bad_options():
    with pytest.raises(ConfigError) as err:
        CharText(split="test")
    assert err.value.field == "split" and err.value.allowed == "train, val"
    for corpus in ("", 3):
        with pytest.raises(ConfigError) as err:
            CharText(corpus=corpus)
        assert err.value.field == "corpus"
