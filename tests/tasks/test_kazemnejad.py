"""Kazemnejad et al.'s decoder tasks (poslab.tasks.kazemnejad, kazemnejad_math) against naive
references written here: decoded samples, the docstrings' worked examples, label, oracle scores,
determinism, lengths and padding, and bad options."""

from __future__ import annotations

import re

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import TASKS, build_task
from poslab.tasks.scoring import sequence_scores

CONFIGS = [("copy", {"variant": v}) for v in ("copy", "copy_2x", "repeat", "repeat_2x", "repeat_change")]
CONFIGS += [("reverse", {"variant": v}) for v in ("reverse", "reverse_2x", "reverse_copy")]
CONFIGS += [("sort", {"variant": "multi_digit"}), ("sort", {"variant": "single_token", "m": 7}),
            ("addition", {}), ("summation", {}), ("summation", {"modulo": 1000}), ("parity", {}),
            ("polynomial_evaluation", {}), ("polynomial_evaluation", {"modulo": 97})]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in CONFIGS]
NAMES = ["copy", "reverse", "addition", "sort", "summation", "parity", "polynomial_evaluation"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- naive references

def _number(words):
    sign = -1 if words and words[0] == "-" else 1
    return sign * int("".join(words[1:] if sign < 0 else words))


def _spell(n):
    return (["-"] if n < 0 else []) + list(str(abs(n)))


def _listed(words):
    """'[ a b , c ]' -> [['a', 'b'], ['c']]."""
    inner = words[words.index("[") + 1:words.index("]")]
    out, cur = [], []
    for w in inner:
        if w == ",":
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out + [cur]


def reference(name, options, prompt):
    """The output words the source's string format gives for a prompt (words, separator excluded)."""
    answer = ["The", "answer", "is"]
    if name == "copy":
        variant = options.get("variant", "copy")
        if variant == "repeat_change":
            assert prompt[0] == "Replace" and prompt[2] == "with" and prompt[4] == "in"
            assert set(prompt[5:]) == {prompt[1]} and prompt[3] != prompt[1]
            return [prompt[3]] * len(prompt[5:])
        seq = prompt[1:]
        assert prompt[0] == "Copy:"
        if variant.startswith("repeat"):
            assert len(set(seq)) == 1
        return {"copy": seq, "repeat": seq, "copy_2x": seq + ["[NEXT]"] + seq, "repeat_2x": seq + seq}[variant]
    if name == "reverse":
        seq = prompt[1:]
        rev = seq[::-1]
        return {"reverse": rev, "reverse_2x": rev + ["[NEXT]"] + rev,
                "reverse_copy": rev + ["[NEXT]"] + seq}[options.get("variant", "reverse")]
    if name == "sort":
        assert prompt[:5] == ["Sort", "the", "following", "list", "["] and prompt[-2:] == ["]", "."]
        parts = _listed(prompt)
        if options.get("variant", "multi_digit") == "multi_digit":
            values = sorted(int("".join(p)) for p in parts)
            assert all(10 <= v <= 9999 for v in values)
            body = [w for v in values for w in list(str(v)) + [","]][:-1]
        else:
            (symbols,) = zip(*parts, strict=True)
            body = [w for s in sorted(symbols, key=lambda s: int(s[1:])) for w in (s, ",")][:-1]
        return ["The", "sorted", "list", "is", "["] + body + ["]", "."]
    if name == "addition":
        assert prompt[0] == "Compute" and prompt[-1] == "?"
        plus = prompt.index("+")
        a, b = prompt[1:plus], prompt[plus + 1:-1]
        assert all(len(x) == 1 or x[0] != "0" for x in (a, b))  # no leading zeros
        return answer + _spell(_number(a) + _number(b)) + ["."]
    if name == "summation":
        assert prompt[0] == "Compute:" and prompt[-1] == "."
        values = [int(w) for w in prompt[1:-1:2]]
        assert all(w == "+" for w in prompt[2:-1:2]) and all(1 <= v <= 9 for v in values)
        return answer + _spell(sum(values) % options.get("modulo", 10)) + ["."]
    if name == "parity":
        assert " ".join(prompt[:10]) == "Is the number of 1's even in the sequence [" and prompt[-1] == "?"
        bits = [int(w) for (w,) in _listed(prompt)]
        return answer + ["Yes" if sum(bits) % 2 == 0 else "No", "."]
    if name == "polynomial_evaluation":
        assert prompt[:4] == ["Evaluate", "at", "x", "="] and prompt[-1] == "?"
        at = prompt.index("in")
        x = _number(prompt[4:at])
        total, terms = 0, " ".join(prompt[at + 1:-1]).split(" + ")
        for term in terms:
            c, rest = term.split(" * x ** ")
            c, d = _number(c.split()), int(rest)
            assert -3 <= c <= 3 and 0 <= d <= 3 and -2 <= x <= 2
            total += c * x ** d
        return answer + _spell(total % options.get("modulo", 10)) + ["."]
    raise AssertionError(name)


def task_length(name, options, prompt):
    """The task's own length, read from a prompt."""
    if name in ("copy", "reverse"):
        return len(prompt) - (5 if options.get("variant") == "repeat_change" else 1)
    if name == "addition":
        plus = prompt.index("+")
        return max(plus - 1, len(prompt) - plus - 2)
    if name == "summation":
        return (len(prompt) - 1) // 2
    if name == "polynomial_evaluation":
        return len(" ".join(prompt).split(" + "))
    return len(_listed(prompt))  # sort, parity


def decode(task, batch, i):
    """(prompt words, output words, scored positions) of sequence i; the separator and EOS are dropped."""
    L = int(batch.lengths[i])
    words = [task.symbols[int(t)] for t in batch.tokens[i, :L]]
    cut = words.index(task.boundary) + 1
    prompt = words[:cut - 1] if task.boundary == "[SEP]" else words[:cut]
    assert words[-1] == "</s>" and "</s>" not in words[:-1]
    scored = batch.loss_mask[i].nonzero().flatten().tolist()
    return prompt, words[cut:-1], scored, cut


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("name,options", CONFIGS, ids=IDS)
def test_samples_match_reference(name, options):
    task = build_task(name, **options)
    lo, hi = task.train_range[0], task.test_range[1]
    batch = task.sample(gen(1), 96, (lo, hi))
    for i in range(batch.size):
        prompt, output, scored, cut = decode(task, batch, i)
        assert output == reference(name, options, prompt)
        assert lo <= task_length(name, options, prompt) <= hi
        L = int(batch.lengths[i])
        assert scored == list(range(cut - 1, L - 1))  # the last prompt token .. the last output token
        assert batch.targets[i, :L - 1].tolist() == batch.tokens[i, 1:L].tolist()


WORKED = [  # (task, options, prompt, output) as in the docstrings; the reference must agree
    ("copy", {}, "Copy: t7 t0 t7", "t7 t0 t7"),
    ("copy", {"variant": "copy_2x"}, "Copy: t4 t9", "t4 t9 [NEXT] t4 t9"),
    ("copy", {"variant": "repeat_change"}, "Replace t3 with t8 in t3 t3", "t8 t8"),
    ("reverse", {}, "Reverse: t5 t1 t8", "t8 t1 t5"),
    ("reverse", {"variant": "reverse_copy"}, "Reverse: t5 t1", "t1 t5 [NEXT] t5 t1"),
    ("sort", {}, "Sort the following list [ 4 0 7 , 1 2 ] .", "The sorted list is [ 1 2 , 4 0 7 ] ."),
    ("sort", {"variant": "single_token"}, "Sort the following list [ t9 , t2 , t9 ] .",
     "The sorted list is [ t2 , t9 , t9 ] ."),
    ("addition", {}, "Compute 4 7 + 5 ?", "The answer is 5 2 ."),
    ("addition", {}, "Compute 0 + 9 ?", "The answer is 9 ."),
    ("summation", {}, "Compute: 7 + 4 + 9 .", "The answer is 0 ."),
    ("summation", {}, "Compute: 6 .", "The answer is 6 ."),
    ("parity", {}, "Is the number of 1's even in the sequence [ 1 , 0 , 1 ] ?", "The answer is Yes ."),
    ("parity", {}, "Is the number of 1's even in the sequence [ 1 ] ?", "The answer is No ."),
    ("polynomial_evaluation", {}, "Evaluate at x = - 2 in 3 * x ** 2 + - 1 * x ** 3 ?", "The answer is 0 ."),
    ("polynomial_evaluation", {}, "Evaluate at x = 1 in - 3 * x ** 0 ?", "The answer is 7 ."),
]


@pytest.mark.parametrize("name,options,prompt,output", WORKED)
def test_worked_examples(name, options, prompt, output):
    assert " ".join(reference(name, options, prompt.split())) == output
    task = build_task(name, **options)
    assert set(prompt.split() + output.split()) <= set(task.symbols)  # every word is one token
    doc = re.sub(r"\s+", " ", re.sub(r"(?<=[^\s*])\*(?=\s|$)", "", task.__doc__ or ""))  # scored marks dropped
    assert f"{prompt} " in doc


@pytest.mark.parametrize("name,options", CONFIGS, ids=IDS)
def test_label_reproduces_targets(name, options):
    task = build_task(name, **options)
    batch = task.sample(gen(2), 32, task.train_range)
    targets, loss_mask = task.label(batch.tokens, batch.lengths)
    assert torch.equal(targets, batch.targets) and torch.equal(loss_mask, batch.loss_mask)
    assert targets.dtype == torch.long and loss_mask.dtype == torch.bool


@pytest.mark.parametrize("name,options", CONFIGS, ids=IDS)
def test_oracle_scores_one_and_a_flip_breaks_exact_match(name, options):
    task = build_task(name, **options)
    batch = task.sample(gen(3), 16, task.test_range)
    accuracy, exact = sequence_scores(batch.targets.clone(), batch)
    assert (accuracy == 1).all() and (exact == 1).all()
    wrong = batch.targets.clone()
    p = int(batch.loss_mask[0].nonzero()[-1])  # the EOS prediction of sequence 0
    wrong[0, p] = (wrong[0, p] + 1) % task.vocab_size
    accuracy, exact = sequence_scores(wrong, batch)
    assert exact[0] == 0 and accuracy[0] < 1 and (exact[1:] == 1).all()


@pytest.mark.parametrize("name,options", CONFIGS, ids=IDS)
def test_deterministic_lengths_and_padding(name, options):
    task = build_task(name, **options)
    a, b = task.sample(gen(4), 24, (3, 9)), task.sample(gen(4), 24, (3, 9))
    for field in ("tokens", "targets", "loss_mask", "lengths"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.tokens, task.sample(gen(5), 24, (3, 9)).tokens)
    one, pair = task.sample(gen(6), 8, 5), task.sample(gen(6), 8, (5, 5))
    assert torch.equal(one.tokens, pair.tokens)
    s = torch.arange(a.tokens.shape[1])
    pad = s >= a.lengths[:, None]
    assert a.tokens.shape[1] == int(a.lengths.max()) <= task.max_tokens(9)
    assert not a.tokens[pad].any() and not a.loss_mask[pad].any()
    assert (a.tokens[~pad] > 0).all() and a.tokens.max() < task.vocab_size
    lengths = {task_length(name, options, decode(task, a, i)[0]) for i in range(a.size)}
    assert lengths <= set(range(3, 10)) and len(lengths) > 1


@pytest.mark.parametrize("name,options", CONFIGS, ids=IDS)
def test_max_tokens_is_reached(name, options):
    """max_tokens(L) bounds every sequence of length L and is tight for the longest numbers."""
    task = build_task(name, **options)
    batch = task.sample(gen(7), 512, 6)
    assert int(batch.lengths.max()) <= task.max_tokens(6)
    if name not in ("summation", "polynomial_evaluation", "sort"):  # answers / items rarely all at full width
        assert int(batch.lengths.max()) == task.max_tokens(6)


def test_addition_digit_counts_follow_the_source_bins():
    task = build_task("addition")
    batch = task.sample(gen(8), 2000, (9, 16))
    pairs = set()
    for i in range(batch.size):
        prompt = decode(task, batch, i)[0]
        plus = prompt.index("+")
        pairs.add((plus - 1, len(prompt) - plus - 2))
    assert all(max(p) >= 9 and max(p) <= 16 and min(p) >= 1 for p in pairs)
    assert (16, 1) in pairs and (1, 9) in pairs  # the test set holds one short operand too
    train = task.sample(gen(9), 2000, (1, 8))
    counts = {len(decode(task, train, i)[0]) for i in range(train.size)}
    assert min(counts) == 5 and max(counts) == 19  # 1 + 1 digits .. 8 + 8 digits, plus Compute, +, ?


def test_contract_class_variables():
    for name in NAMES:
        cls = TASKS[name]
        assert cls.name == name and cls.model_form == "decoder" and cls.benchmark == "kazemnejad"
        assert cls.target_kind == "sequence" and isinstance(cls.length_unit, str)
        assert cls.train_range[1] + 1 == cls.test_range[0] and cls.test_range[1] == 2 * cls.train_range[1]
    assert TASKS["copy"].train_range == (2, 20) and TASKS["addition"].train_range == (1, 8)


def test_chance():
    assert build_task("copy").chance == pytest.approx(1 / 101)
    assert build_task("addition").chance == pytest.approx(1 / 15)
    assert build_task("parity").chance == pytest.approx(1 / 7)


@pytest.mark.parametrize("name,options", [
    ("copy", {"variant": "triple"}), ("copy", {"m": 0}), ("copy", {"variant": "repeat_change", "m": 1}),
    ("reverse", {"variant": "copy"}), ("reverse", {"m": True}), ("sort", {"variant": "bubble"}),
    ("sort", {"m": 0}), ("summation", {"modulo": 1}), ("polynomial_evaluation", {"modulo": 2.5}),
    ("addition", {"modulo": 10}), ("parity", {"m": 2}),
])
def test_bad_options_one_config_error(name, options):
    with pytest.raises(ConfigError):
        build_task(name, **options)


@pytest.mark.parametrize("length", [0, (0, 4), (5, 3), (1, 2, 3), 2.5])
def test_bad_length(length):
    with pytest.raises(ConfigError):
        build_task("copy").sample(gen(), 2, length)
