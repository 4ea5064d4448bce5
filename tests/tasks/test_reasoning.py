"""The reasoning / code tasks: deterministic text, answers recoverable by naive solvers, exact-match scoring."""

from __future__ import annotations

import re

import pytest

from poslab.errors import ConfigError
from poslab.tasks.reasoning import CLOSERS, OPENERS, TASKS, Example, generate, grid, score

PARAMS = {"multikey": dict(keys=4), "multivalue": dict(values=3), "vartrack": dict(hops=3, chains=2),
          "brackets": dict(nesting=3, groups=2), "code": dict(functions=6)}


# --- naive solvers, written here independently of the generators

def solve_multikey(prompt):
    key = re.search(r"What is the special magic number for (\w+)\?", prompt).group(1)
    return " " + re.search(rf"magic number for {key} is: (\d+)\.", prompt).group(1)


def solve_multivalue(prompt):
    key = re.search(r"all the special magic numbers for (\w+)\?", prompt).group(1)
    return " " + ", ".join(re.findall(rf"magic number for {key} is: (\d+)\.", prompt))


def solve_vartrack(prompt):
    value = re.search(r"assigned the value (\d+)\?", prompt).group(1)
    holds = []
    for name, rhs in re.findall(r"VAR (\w+) = (\w+)\.", prompt):
        if rhs == value or rhs in holds:
            holds.append(name)
    return " " + " ".join(holds)


def solve_brackets(prompt):
    stack = []
    for c in prompt:
        if c in OPENERS:
            stack.append(c)
        elif c in CLOSERS:
            assert OPENERS.index(stack.pop()) == CLOSERS.index(c)
    if "innermost first" in prompt:
        return " " + " ".join(CLOSERS[OPENERS.index(c)] for c in reversed(stack))
    return " " + CLOSERS[OPENERS.index(stack[0])]


def solve_code(prompt):
    name, x = re.search(r"print\((\w+)\((\d+)\)\)", prompt).groups()
    a, b = re.search(rf"def {name}\(x\):\n    return x \* (\d+) \+ (\d+)", prompt).groups()
    return f" {int(x) * int(a) + int(b)}"


SOLVERS = {"multikey": solve_multikey, "multivalue": solve_multivalue, "vartrack": solve_vartrack,
           "brackets": solve_brackets, "code": solve_code}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_same_seed_same_text_other_seed_other_text(task):
    a, b = generate(task, 500, 0.4, 7, **PARAMS[task]), generate(task, 500, 0.4, 7, **PARAMS[task])
    assert a == b
    c = generate(task, 500, 0.4, 8, **PARAMS[task])
    assert (c.prompt, c.answer) != (a.prompt, a.answer)


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("L", [300, 1200])
def test_a_naive_solver_recovers_the_answer_and_the_length_is_kept(task, depth, L):
    for seed in range(4):
        ex = generate(task, L, depth, seed, **PARAMS[task])
        assert SOLVERS[task](ex.prompt) == ex.answer
        assert L - 60 <= len(ex.prompt) <= L  # whole filler pieces up to L (a piece is < 60 characters)
        assert not re.search(r"[\d()\[\]{}<>]", _filler_only(task, ex.prompt))


def _filler_only(task, prompt):
    """The prompt less its inserts and question: prose filler has no digit or bracket."""
    if task == "code":
        return ""
    body = prompt.rsplit("Question:", 1)[0].rsplit("What ", 1)[0]
    body = re.sub(r"The special magic number for \w+ is: \d+\.|VAR \w+ = \w+\.", "", body)
    return re.sub(r"[()\[\]{}<>]", "", body) if task == "brackets" else body


def test_depth_places_the_key_insert():
    """The asked needle / chain start / first opener / called definition sits near depth x filler."""
    for task in TASKS:
        firsts = []
        for depth in (0.0, 0.5, 1.0):
            ex = generate(task, 2000, depth, 3, **PARAMS[task])
            if task == "multikey":
                key = re.search(r"number for (\w+)\?", ex.prompt).group(1)
                pos = ex.prompt.index(f"number for {key} is:")
            elif task == "multivalue":
                pos = ex.prompt.index("The special magic")
            elif task == "vartrack":
                value = re.search(r"value (\d+)\?", ex.prompt).group(1)
                pos = ex.prompt.index(f"= {value}.")
            elif task == "brackets":
                pos = min(ex.prompt.index(c) for c in OPENERS if c in ex.prompt)
            else:
                name = re.search(r"print\((\w+)\(", ex.prompt).group(1)
                pos = ex.prompt.index(f"def {name}(")
            firsts.append(pos / len(ex.prompt))
        assert firsts[0] < 0.05, (task, firsts)
        assert 0.3 < firsts[1] < 0.7, (task, firsts)
        if task != "brackets":  # a balanced distractor group may come before the first opener
            assert firsts[2] > 0.75, (task, firsts)


def test_hops_nesting_and_ask_change_the_answer():
    assert len(generate("vartrack", 800, 0.2, 0, hops=5).answer.split()) == 5
    assert len(generate("brackets", 800, 0.2, 0, nesting=6).answer.split()) == 6
    out = generate("brackets", 800, 0.2, 0, nesting=4, ask="outermost")
    assert len(out.answer.split()) == 1 and solve_brackets(out.prompt) == out.answer
    assert len(generate("multivalue", 800, 0.2, 0, values=5).answer.split(",")) == 5


def test_grid_is_lengths_x_depths_x_trials_in_order():
    g = grid("multikey", [300, 600], [0.0, 1.0], trials=2, seed=1, keys=2)
    assert [(e.length, e.depth, e.seed) for e in g] == [(L, d, 1000 + t) for L in (300, 600) for d in (0.0, 1.0)
                                                         for t in range(2)]
    assert g[0] == generate("multikey", 300, 0.0, 1000, keys=2)


def test_exact_match_scorer():
    ex = Example(task="multikey", prompt="", answer=" 48213", length=10, depth=0.0, seed=0)
    assert score(ex, " 48213") == 1.0
    assert score(ex, "48213.\nThe") == 1.0
    assert score(" 48213", "  48213 and more") == 1.0
    assert score(ex, " 482130") == 0.0
    assert score(ex, " 4821") == 0.0
    assert score(ex, " 58213") == 0.0
    assert score(" > ] )", " > ] ) done") == 1.0
    assert score(" > ] )", " > ] }") == 0.0


@pytest.mark.parametrize("call, field", [
    (lambda: generate("sudoku", 300, 0.5), "task"),
    (lambda: generate("multikey", 300, 1.5), "depth"),
    (lambda: generate("multikey", 0, 0.5), "length"),
    (lambda: generate("multikey", 60, 0.5, keys=4), "length"),
    (lambda: generate("vartrack", 300, 0.5, hops=0), "hops"),
    (lambda: generate("brackets", 300, 0.5, ask="middle"), "ask"),
    (lambda: generate("code", 300, 0.5, lines=3), "params"),
    (lambda: grid("code", [300], [0.5, 2.0]), "depth"),
])
def test_bad_input_is_one_config_error_naming_the_field(call, field):
    with pytest.raises(ConfigError) as e:
        call()
    assert e.value.field == field


def test_the_docstring_worked_examples_are_what_the_generators_give():
    ex = generate("multikey", 240, 0.0, 0, keys=2)
    assert ex.prompt.startswith("The special magic number for fdatyq is: 7791861. There and back again.")
    assert ex.answer == " 7791861"
    assert generate("brackets", 200, 0.0, 0, nesting=3, groups=1).answer == " ) ] }"
    code = generate("code", 130, 0.0, 0, functions=2)
    assert code.prompt == ("def f_rhyq(x):\n    return x * 2 + 42\ndef f_tbbs(x):\n    return x * 3 + 12\n"
                           "print(f_rhyq(6))  # prints") and code.answer == " 54"


# --- the compact form (the character LM's), fitting a window, and the character set

def solve_compact(task, prompt):
    if task == "multikey":
        key = re.search(r"(\w+):$", prompt).group(1)
        return " " + re.search(rf"{key}: (\d+)\.", prompt).group(1)
    if task == "multivalue":
        key = re.search(r"(\w+) all:$", prompt).group(1)
        return " " + ", ".join(re.findall(rf"{key}: (\d+)\.", prompt))
    if task == "vartrack":
        value, holds = re.search(r"vars = (\d+):$", prompt).group(1), []
        for name, rhs in re.findall(r"([A-Z]+) = (\w+)\.", prompt):
            if rhs == value or rhs in holds:
                holds.append(name)
        return " " + " ".join(holds)
    if task == "brackets":
        stack = []
        for c in prompt:
            if c in OPENERS:
                stack.append(c)
            elif c in CLOSERS:
                stack.pop()
        if prompt.endswith("close first:"):
            return " " + CLOSERS[OPENERS.index(stack[0])]
        return " " + " ".join(CLOSERS[OPENERS.index(c)] for c in reversed(stack))
    name, x = re.search(r"(f_\w+)\((\d+)\) =$", prompt).groups()
    a, b = re.search(rf"{name}\(x\) = x\*(\d+)\+(\d+)", prompt).groups()
    return f" {int(x) * int(a) + int(b)}"


@pytest.mark.parametrize("task", sorted(TASKS))
def test_compact_form_is_solvable_and_fits_the_char_lm_window(task):
    from poslab.tasks.reasoning import CHAR_PARAMS, fitted

    for total in (65, 128, 513):
        for seed in range(3):
            ex = fitted(task, total, 0.5, seed, **CHAR_PARAMS[task])
            assert ex is not None and len(ex.prompt) + len(ex.answer) <= total
            assert solve_compact(task, ex.prompt) == ex.answer
            assert ex == fitted(task, total, 0.5, seed, **CHAR_PARAMS[task])
    assert fitted(task, 12, 0.5, 0, **CHAR_PARAMS[task]) is None  # nothing fits 12 characters
    with pytest.raises(ConfigError, match="form"):
        generate(task, 300, 0.5, 0, form="terse")


def test_characters_cover_every_generated_character():
    """characters() is derived from the templates and alphabets; every generated text stays in it."""
    from poslab.tasks.reasoning import FORMS, characters

    allowed = set(characters())
    assert len(allowed) == len(characters())
    params = {"multikey": [dict(keys=1), dict(keys=9)], "multivalue": [dict(values=1), dict(values=6)],
              "vartrack": [dict(hops=1, chains=1), dict(hops=5, chains=4)],
              "brackets": [dict(nesting=1, groups=0), dict(nesting=8, groups=6, ask="outermost")],
              "code": [dict(functions=1), dict(functions=12, arg=731)]}
    seen = set()
    for task in TASKS:
        for p in params[task]:
            for form in FORMS:
                for seed in range(8):
                    ex = generate(task, 1500, seed / 7, seed, form=form, **p)
                    seen |= set(ex.prompt + ex.answer)
    assert seen <= allowed
    assert set("0123456789()[]{}<>=_*+#\n") <= seen  # the characters TinyShakespeare lacks are really emitted
