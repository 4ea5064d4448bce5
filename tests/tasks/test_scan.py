"""SCAN: the grammar's 20,910 commands, their meanings against a naive reference, the decoder-form task."""

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import TASKS, build_task
from poslab.tasks.base import sample_steps
from poslab.tasks.scan import EOS, SEP, SPLITS, SYMBOLS, Scan, action_lengths, commands, interpret
from poslab.tasks.scoring import sequence_scores

TURN = {"left": "LTURN", "right": "RTURN"}


def naive(command: str) -> list[str]:
    """The meaning of a command, parsed from its string: "after" binds loosest, then "and", then
    twice/thrice, then opposite/around."""
    if " after " in command:
        first, second = command.split(" after ")
        return naive(second) + naive(first)
    if " and " in command:
        first, second = command.split(" and ")
        return naive(first) + naive(second)
    words = command.split()
    times = {"twice": 2, "thrice": 3}.get(words[-1], 1)
    if times > 1:
        words = words[:-1]
    verb = [] if words[0] == "turn" else [words[0].upper()]
    if len(words) == 1:
        unit = verb
    elif len(words) == 2:
        unit = [TURN[words[1]]] + verb
    elif words[1] == "opposite":
        unit = [TURN[words[2]]] * 2 + verb
    else:
        assert words[1] == "around", command
        unit = ([TURN[words[2]]] + verb) * 4
    return unit * times


def language() -> set[str]:
    """Every command, written out from the grammar's rules with string templates."""
    us = ["walk", "look", "run", "jump"]
    firsts = us + ["turn"]
    vs = ([f"{x} {d}" for x in firsts for d in TURN] + [f"{x} {m} {d}" for x in firsts for m in ("opposite", "around")
                                                          for d in TURN] + us)
    ss = [v + t for v in vs for t in ("", " twice", " thrice")]
    return set(ss) | {f"{a} {c} {b}" for a in ss for b in ss for c in ("and", "after")}


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def decode(batch, r):
    """(command, actions after SEP up to EOS) of sequence r, checking the layout."""
    row = [SYMBOLS[t] for t in batch.tokens[r, : int(batch.lengths[r])].tolist()]
    n = row.index("SEP")
    assert row[-1] == "EOS" and row.count("SEP") == 1 and row.count("EOS") == 1
    return " ".join(row[:n]), row[n + 1: -1]


# ----------------------------------------------------------------------------- the grammar

def test_count_equals_the_published_20910():
    all_commands = commands()
    assert len(all_commands) == 20_910
    assert len({c.words for c in all_commands}) == 20_910  # the grammar is unambiguous


def test_commands_are_exactly_the_grammars_language():
    assert {" ".join(c.words) for c in commands()} == language()


def test_every_meaning_equals_the_naive_reference():
    for c in commands():
        assert list(c.actions) == naive(" ".join(c.words)), c.words


@pytest.mark.parametrize("command, actions", [
    ("jump twice after walk left", "LTURN WALK JUMP JUMP"),
    ("turn around right", "RTURN RTURN RTURN RTURN"),
    ("run opposite left thrice", "LTURN LTURN RUN LTURN LTURN RUN LTURN LTURN RUN"),
    ("jump", "JUMP"),
    ("jump left", "LTURN JUMP"),
    ("jump around right", "RTURN JUMP RTURN JUMP RTURN JUMP RTURN JUMP"),
    ("turn left twice", "LTURN LTURN"),
    ("jump thrice", "JUMP JUMP JUMP"),
    ("jump opposite left and walk thrice", "LTURN LTURN JUMP WALK WALK WALK"),
    ("jump opposite left after walk around left", "LTURN WALK LTURN WALK LTURN WALK LTURN WALK LTURN LTURN JUMP"),
])
def test_worked_examples_from_the_paper_and_readme(command, actions):
    assert " ".join(interpret(command)) == actions


def test_not_a_command():
    for words in ("turn", "walk twice twice", "jump and", "walk opposite", "walk twice and run after look"):
        with pytest.raises(KeyError):
            interpret(words)


def test_action_lengths_and_the_splits():
    counts: dict[int, int] = {}
    for c in commands():
        counts[len(c.actions)] = counts.get(len(c.actions), 0) + 1
    assert action_lengths() == tuple(sorted(counts)) and min(counts) == 1 and max(counts) == 48
    assert 23 not in counts
    assert Scan.occurring_lengths() == Scan().occurring_lengths() == action_lengths()
    count = lambda lo, hi: sum(n for L, n in counts.items() if lo <= L <= hi)  # noqa: E731
    # Lake & Baroni's length split files hold 16,990 and 3,920 commands; Kazemnejad et al.'s re-split
    # cuts the same 20,910 at 25 actions
    (train, test) = SPLITS["lake_baroni"]
    assert (count(*train), count(*test)) == (16_990, 3_920)
    (train, test) = SPLITS["kazemnejad"]
    assert (count(*train), count(*test)) == (17_774, 3_136)
    assert Scan.train_range == (1, 25) and Scan.test_range == (26, 48)
    assert (Scan().train_range, Scan().test_range) == ((1, 25), (26, 48))
    lb = Scan(split="lake_baroni")
    assert (lb.train_range, lb.test_range) == ((1, 22), (24, 48))


# ----------------------------------------------------------------------------- the task

def test_registered_with_the_contracts_class_variables():
    task = build_task("scan")
    assert TASKS["scan"] is Scan and isinstance(task, Scan)
    assert (Scan.name, Scan.target_kind, Scan.model_form, Scan.benchmark) == ("scan", "sequence", "decoder",
                                                                             "kazemnejad")
    assert Scan.length_unit == "output actions"
    assert task.vocab_size == len(SYMBOLS) == 22 and task.chance == pytest.approx(1 / 7)


@pytest.mark.parametrize("length", [4, (1, 25), (26, 48), (24, 24)])
def test_samples_decode_to_commands_and_their_meanings(length):
    lo, hi = length if isinstance(length, tuple) else (length, length)
    batch = Scan().sample(gen(1), 64, length)
    s = batch.tokens.shape[1]
    assert s == int(batch.lengths.max()) and batch.tokens.max() < Scan().vocab_size
    for r in range(64):
        command, actions = decode(batch, r)
        assert actions == naive(command) and lo <= len(actions) <= hi
        L, n = int(batch.lengths[r]), len(command.split())
        assert L == n + len(actions) + 2
        assert (batch.tokens[r, L:] == 0).all()
        # loss on the positions whose next token is an action or EOS, the targets those tokens
        p = torch.arange(s)
        assert torch.equal(batch.loss_mask[r], (p >= n) & (p <= L - 2))
        assert torch.equal(batch.targets[r, n: L - 1], batch.tokens[r, n + 1: L])
        assert batch.targets[r, L - 2] == EOS and batch.tokens[r, n] == SEP


@pytest.mark.parametrize("command, scored, length", [
    ("jump twice after walk left", [5, 6, 7, 8, 9], 11),
    ("turn around right", [3, 4, 5, 6, 7], 9),
    ("look", [1, 2], 4),
])
def test_docstring_worked_examples(command, scored, length):
    actions = naive(command)
    batch = Scan().sample(gen(3), 20_000, len(actions))  # 860 commands have 4 actions, 6 have 1
    prefix = torch.tensor([SYMBOLS.index(w) for w in [*command.split(), "SEP"]])
    r = int((batch.tokens[:, : len(prefix)] == prefix).all(-1).nonzero()[0])
    assert decode(batch, r) == (command, actions)
    assert batch.lengths[r] == length and batch.loss_mask[r].nonzero().flatten().tolist() == scored
    assert [SYMBOLS[t] for t in batch.targets[r, scored].tolist()] == [*actions, "EOS"]


def test_uniform_over_the_commands_of_a_length():
    batch = Scan().sample(gen(2), 6000, 1)  # six commands have one action
    got: dict[str, int] = {}
    for r in range(6000):
        command = decode(batch, r)[0]
        got[command] = got.get(command, 0) + 1
    assert set(got) == {"walk", "look", "run", "jump", "turn left", "turn right"}
    assert all(850 < n < 1150 for n in got.values()), got  # 1000 each; 5 standard deviations is 46


def test_label_reproduces_the_targets_and_recomputes_the_rule():
    task = Scan()
    batch = task.sample(gen(4), 32, (1, 48))
    targets, loss_mask = task.label(batch.tokens, batch.lengths)
    assert torch.equal(targets, batch.targets) and torch.equal(loss_mask, batch.loss_mask)
    # a wrong action in the input: the label still asks for the command's true action there
    tokens = batch.tokens.clone()
    p = int((tokens[0] == SEP).nonzero()) + 1
    true = int(tokens[0, p])
    tokens[0, p] = SYMBOLS.index("JUMP") if SYMBOLS[true] != "JUMP" else SYMBOLS.index("WALK")
    targets, _ = task.label(tokens, batch.lengths)
    assert targets[0, p - 1] == true


def test_oracle_scores_one_and_a_flip_breaks_exact_match():
    batch = Scan().sample(gen(5), 16, (26, 48))
    accuracy, exact = sequence_scores(batch.targets.clone(), batch)
    assert (accuracy == 1).all() and (exact == 1).all()
    predictions = batch.targets.clone()
    p = int(batch.loss_mask[3].nonzero()[2])
    predictions[3, p] = EOS if predictions[3, p] != EOS else SYMBOLS.index("WALK")
    accuracy, exact = sequence_scores(predictions, batch)
    assert exact[3] == 0 and accuracy[3] < 1 and exact[torch.arange(16) != 3].eq(1).all()


def test_same_generator_same_batch():
    task = Scan()
    a, b, c = (task.sample(gen(s), 16, (1, 25)) for s in (7, 7, 8))
    for field in ("tokens", "targets", "loss_mask", "lengths"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.tokens, c.tokens)


def test_max_tokens():
    task = Scan()
    for L in (1, 4, 22, 25, 48):
        assert task.max_tokens(L) == max(len(c.words) + len(c.actions) + 2 for c in commands() if len(c.actions) <= L)
    assert task.max_tokens(48) == 59  # nine words, 48 actions, SEP, EOS
    assert task.sample(gen(), 256, (40, 48)).tokens.shape[1] <= task.max_tokens(48)


@pytest.mark.parametrize("per", ["batch", "sequence"])
def test_sample_steps_pad_to_max_tokens(per):
    task = Scan()
    steps = sample_steps(task, gen(6), 3, 8, (20, 25), per)
    assert steps.tokens.shape == (3, 8, task.max_tokens(25)) and steps.lengths.shape == (3, 8)
    for i in range(3):
        step = steps.map(lambda x, i=i: x[i])
        counts = {len(decode(step, r)[1]) for r in range(8)}
        assert counts <= set(range(20, 26)) - {23}
        if per == "batch":
            assert len(counts) == 1


def test_bad_options_and_lengths():
    with pytest.raises(ConfigError) as err:
        Scan(split="simple")
    assert err.value.field == "split"
    with pytest.raises(ConfigError) as err:
        build_task("scan", variant="x")
    assert err.value.field == "task.variant"
    for length in (23, (41, 47), 49, 0, (5, 4)):
        with pytest.raises(ConfigError) as err:
            Scan().sample(gen(), 4, length)
        assert err.value.field == "length"
    with pytest.raises(ConfigError):
        Scan().validate(23)
    Scan().validate(24)
