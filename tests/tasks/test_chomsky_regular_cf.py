"""The regular and context-free Chomsky tasks (poslab.tasks.chomsky.regular / .context_free):
worked examples, every sampled answer against a naive reference written here, label, scoring,
determinism, lengths and padding, bad options."""

from __future__ import annotations

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import TASKS, build_task
from poslab.tasks.chomsky import CONTEXT_FREE, REGULAR
from poslab.tasks.chomsky.context_free import ModularArithmeticBrackets, ReverseString, SolveEquation, StackManipulation
from poslab.tasks.chomsky.format import EMPTY, render
from poslab.tasks.chomsky.regular import CycleNavigation, EvenPairs, ModularArithmetic, ParityCheck
from poslab.tasks.scoring import sequence_scores

ALL = REGULAR + CONTEXT_FREE
MA_SYMBOLS = list("01234+-*_")
STACK_SYMBOLS = ["0", "1", "POP", "PUSH0", "PUSH1"]


# ----------------------------------------------------------------------------- naive references

def _stack(x):
    stack = []
    for t in x:
        if t == 2:
            if stack:
                stack.pop()
        else:
            stack.append(t if t < 2 else t - 3)
    out = stack[::-1] + [2]
    return out + [0] * (len(x) + 1 - len(out)), len(stack) + 1


def _chars(task, x):
    return "".join(task.symbols()[v] for v in x)


def _solve(task, x):
    text = _chars(task, x)
    if len(x) < 3:
        assert text == "0" * len(x)
        return 0
    lhs, rhs = text.split("=")
    assert text.count("x") == 1 and len(rhs) == 1
    roots = [v for v in range(task.modulus) if eval(lhs.replace("x", str(v))) % task.modulus == int(rhs)]
    assert len(roots) == 1
    return roots[0]


def _mab(task, x):
    text = _chars(task, x)
    assert "x" not in text and "=" not in text
    return eval(text) % task.modulus  # Python reads the bracketed expression with its own precedence


def _ma(task, x):
    assert len(x) % 2 == 1 and all(v < 5 for v in x[0::2]) and all(v in (5, 6, 7) for v in x[1::2])
    return eval("".join(MA_SYMBOLS[v] for v in x)) % 5


def _top_operator(text):
    """The binary operator of the outermost brackets: at depth 1, after a digit or ')'."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if depth == 1 and c in "+-*" and text[i - 1] not in "(":
            return c
    return None


def reference(task, x: list[int]) -> tuple[list[int], int]:
    """The output classes and the scored slots of input x (source ids), written independently."""
    name = task.name
    if name == "even_pairs":
        return [sum(a != b for a, b in zip(x, x[1:], strict=False)) % 2], 1
    if name == "parity_check":
        return [sum(x) % 2], 1
    if name == "cycle_navigation":
        return [sum(a - 1 for a in x) % 5], 1
    if name == "modular_arithmetic":
        return [_ma(task, x)], 1
    if name == "stack_manipulation":
        return _stack(x)
    if name == "reverse_string":
        return x[::-1], len(x)
    if name == "modular_arithmetic_brackets":
        return [_mab(task, x)], 1
    if name == "solve_equation":
        return [_solve(task, x)], 1
    raise AssertionError(name)


def decode(batch, i):
    """Row i: its input (source ids), its output slots' targets and scored mask, checked layout."""
    L = int(batch.lengths[i])
    tokens = batch.tokens[i].tolist()
    n = sum(t >= 2 for t in tokens)
    assert all(t >= 2 for t in tokens[:n]) and all(t == EMPTY for t in tokens[n:L]) and not any(tokens[L:])
    assert not batch.loss_mask[i, :n].any() and not batch.loss_mask[i, L:].any()
    assert not batch.targets[i, :n].any() and not batch.targets[i, L:].any()
    return [t - 2 for t in tokens[:n]], batch.targets[i, n:L].tolist(), int(batch.loss_mask[i, n:L].sum())


# ----------------------------------------------------------------------------- worked examples

EXAMPLES = [  # (task, L, rendered sample of manual_seed(0), targets on the output slots, scored slots)
    (EvenPairs(), 6, "0 1 1 0 1 1 _", [1], 1),
    (ParityCheck(), 6, "0 1 1 0 1 1 _", [0], 1),
    (CycleNavigation(), 6, "2 0 2 0 1 0 _", [4], 1),
    (ModularArithmetic(), 6, "4 + 4 * 3 _", [1], 1),
    (StackManipulation(), 6, "1 0 1 1 1 POP _ _ _ _ _ _ _", [1, 1, 0, 1, 2, 0, 0], 5),
    (ReverseString(), 6, "0 1 1 0 1 1 _ _ _ _ _ _", [1, 1, 0, 1, 1, 0], 6),
    (ModularArithmeticBrackets(), 9, "( ( 2 - 4 ) + 3 ) _", [1], 1),
    (SolveEquation(), 9, "( ( 3 ) - x ) = 1 _", [2], 1),
]


def _symbols(task):
    if isinstance(task, ModularArithmetic):
        return MA_SYMBOLS
    if isinstance(task, StackManipulation):
        return STACK_SYMBOLS
    if hasattr(task, "symbols"):
        return task.symbols()
    return [str(v) for v in range(task.input_size)]


@pytest.mark.parametrize("task,L,text,outputs,scored", EXAMPLES, ids=lambda v: getattr(v, "name", None))
def test_docstring_sample(task, L, text, outputs, scored):
    batch = task.sample(torch.Generator().manual_seed(0), 1, L)
    assert render(batch.tokens[0], int(batch.lengths[0]), _symbols(task)) == text
    x, targets, k = decode(batch, 0)
    assert (targets, k) == (outputs, scored) == tuple(reference(task, x))
    assert text.replace(" ", "") in "".join(type(task).__doc__.split())  # the docstring shows this sample


def test_source_examples():
    """The sources' own docstring examples through the rules (``answer``) of the tasks."""
    def one(task, x):
        rows = task.answer(torch.tensor([x]), torch.tensor([len(x)]))
        return rows.outputs[0, : int(rows.output_lengths[0])].tolist(), rows.scored

    assert one(EvenPairs(), [0, 0, 1, 1, 1, 0])[0] == [0]
    assert one(EvenPairs(), [0, 1, 0, 1, 0, 0, 1])[0] == [1]
    assert one(ParityCheck(), [1, 0, 1, 0, 1, 0, 0])[0] == [1]
    assert one(ParityCheck(), [0, 1, 1, 1, 1])[0] == [0]
    assert one(CycleNavigation(), [2, 0, 1, 0, 0])[0] == [3]  # moves 1 -1 0 -1 -1
    assert one(CycleNavigation(), [2, 2, 2, 0])[0] == [2]
    ma = [[1, 5, 2, 7, 3], [1, 6, 1, 6, 1], [0, 7, 1, 5, 4, 7, 3, 6, 2]]  # 1+2*3, 1-1-1, 0*1+4*3-2
    assert [one(ModularArithmetic(), x)[0] for x in ma] == [[2], [4], [0]]
    out, scored = one(StackManipulation(), [0, 1, 1, 0, 4, 2, 2])
    assert out == [1, 1, 0, 2, 0, 0, 0, 0] and scored.tolist() == [4]
    out, scored = one(StackManipulation(), [1, 1, 0, 2, 2, 2])
    assert out == [2, 0, 0, 0, 0, 0, 0] and scored.tolist() == [1]
    assert one(ReverseString(m=4), [1, 2, 3, 0, 2, 1])[0] == [1, 2, 0, 3, 2, 1]
    mab = ModularArithmeticBrackets()
    ids = {c: i for i, c in enumerate(mab.symbols())}
    assert one(mab, [ids[c] for c in "((1+2)*(-3))"])[0] == [1]
    se = SolveEquation()
    ids = {c: i for i, c in enumerate(se.symbols())}
    assert one(se, [ids[c] for c in "((x+2)-(-3))=1"])[0] == [1]
    assert one(se, [ids[c] for c in "(-x)=2"])[0] == [3]


# ----------------------------------------------------------------------------- every row against the reference

@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
@pytest.mark.parametrize("length", [(1, 40), 1, 2, 3, 5, 23])
def test_samples_match_reference(cls, length):
    task = cls()
    batch = task.sample(torch.Generator().manual_seed(7), 48, length)
    for i in range(batch.size):
        x, targets, k = decode(batch, i)
        L = int(batch.lengths[i]) - len(targets)  # n
        assert len(targets) == task.output_length(L)
        assert (targets, k) == tuple(reference(task, x)), (task.name, x)
    tok, tgt = batch.tokens, batch.targets
    assert int(tok.max()) < task.vocab_size and int(tgt.max()) < task.output_size <= task.vocab_size
    assert task.chance == pytest.approx(1 / task.output_size)


def test_draws_follow_the_sources():
    """Input lengths, stack split and ranges as the sources draw them."""
    g = torch.Generator().manual_seed(3)
    ma = ModularArithmetic().sample(g, 16, 8)
    assert ma.lengths.tolist() == [8] * 16  # L = 8 -> 7 input tokens + 1 slot
    st = StackManipulation().sample(g, 256, 6)
    x = st.tokens[:, :6] - 2
    assert (x[:, 0] < 2).all() and (x[:, 5] >= 2).all()  # 1 <= k <= L - 1: a stack bit first, an action last
    k = (x < 2).long().cumprod(1).sum(1)  # stack prefix
    assert set(k.tolist()) == {1, 2, 3, 4, 5} and ((x >= 2) | (torch.arange(6) < k[:, None])).all()
    mab = ModularArithmeticBrackets().sample(g, 256, 7)
    texts = ["".join(_chars(ModularArithmeticBrackets(), [t - 2 for t in row[:7]])) for row in mab.tokens.tolist()]
    tops = [_top_operator(t) for t in texts]  # n = 7 >= 5: always (A o B)
    assert all(sum(t.count(c) for c in "()") == 2 * t.count("(") for t in texts)
    assert {o: tops.count(o) > 40 for o in "+-*"} == {"+": True, "-": True, "*": True}  # ~85 each of 256
    se = SolveEquation().sample(g, 256, 9)
    assert not any("*" in _chars(SolveEquation(), [t - 2 for t in row[:9]]) for row in se.tokens.tolist())


# ----------------------------------------------------------------------------- label, scoring, determinism

@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_label_reproduces_sample(cls):
    task = cls()
    batch = task.sample(torch.Generator().manual_seed(1), 32, (1, 30))
    targets, mask = task.label(batch.tokens, batch.lengths)
    assert torch.equal(targets, batch.targets) and torch.equal(mask, batch.loss_mask)
    wide = torch.nn.functional.pad(batch.tokens, (0, 5))
    targets, mask = task.label(wide, batch.lengths)
    assert torch.equal(targets[:, :-5], batch.targets) and not mask[:, -5:].any() and not targets[:, -5:].any()


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_oracle_scores_one_and_a_flip_breaks_exact_match(cls):
    task = cls()
    batch = task.sample(torch.Generator().manual_seed(2), 16, (1, 20))
    accuracy, exact = sequence_scores(batch.targets.clone(), batch)
    assert accuracy.tolist() == [1.0] * 16 and exact.tolist() == [1.0] * 16
    wrong = batch.targets.clone()
    row = 3
    p = int(batch.loss_mask[row].nonzero()[-1])  # the last scored slot of row 3
    wrong[row, p] = (wrong[row, p] + 1) % task.output_size
    accuracy, exact = sequence_scores(wrong, batch)
    assert exact[row] == 0 and accuracy[row] < 1 and exact.sum() == 15
    unscored = ~batch.loss_mask & (torch.arange(batch.tokens.shape[1]) < batch.lengths[:, None])
    noise = torch.where(unscored, 1 - batch.targets.clamp(max=1), batch.targets)  # wrong only where not scored
    assert sequence_scores(noise, batch)[1].tolist() == [1.0] * 16


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_determinism_lengths_and_padding(cls):
    task = cls()
    a = task.sample(torch.Generator().manual_seed(5), 24, (1, 40))
    b = task.sample(torch.Generator().manual_seed(5), 24, (1, 40))
    c = task.sample(torch.Generator().manual_seed(6), 24, (1, 40))
    for f in ("tokens", "targets", "loss_mask", "lengths"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.tokens, c.tokens) if a.tokens.shape == c.tokens.shape else True
    assert a.tokens.dtype == a.targets.dtype == a.lengths.dtype == torch.long and a.loss_mask.dtype == torch.bool
    assert a.tokens.shape[1] == int(a.lengths.max()) <= task.max_tokens(40)
    pad = torch.arange(a.tokens.shape[1]) >= a.lengths[:, None]
    assert not a.tokens[pad].any() and not a.loss_mask[pad].any()
    fixed = task.sample(torch.Generator().manual_seed(5), 4, 41)
    pair = task.sample(torch.Generator().manual_seed(5), 4, (41, 41))
    assert torch.equal(fixed.tokens, pair.tokens)
    assert fixed.lengths.tolist() == [task.max_tokens(41)] * 4  # every row of L = 41 has the most tokens


def test_max_tokens():
    assert [EvenPairs().max_tokens(L) for L in (1, 40, 500)] == [2, 41, 501]
    assert [ModularArithmetic().max_tokens(L) for L in (1, 2, 40, 41)] == [2, 2, 40, 42]
    assert [StackManipulation().max_tokens(L) for L in (1, 40)] == [3, 81]
    assert [ReverseString().max_tokens(L) for L in (1, 40)] == [2, 80]
    assert [SolveEquation().max_tokens(L) for L in (1, 40)] == [2, 41]


# ----------------------------------------------------------------------------- registry and options

@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_registered_with_the_contract(cls):
    assert TASKS[cls.name] is cls
    task = build_task(cls.name)
    assert (task.target_kind, task.model_form, task.benchmark) == ("sequence", "encoder", "ruoss")
    assert task.train_range == (1, 40) and task.test_range == (41, 500) and task.length_unit
    with pytest.raises(ConfigError):
        task.sample(torch.Generator(), 4, 0)
    with pytest.raises(ConfigError):
        build_task(cls.name, nonsense=1)


def test_source_sizes():
    sizes = {c.name: (c().input_size, c().output_size, c().vocab_size) for c in ALL}
    assert sizes == {"even_pairs": (2, 2, 4), "modular_arithmetic": (9, 5, 11), "parity_check": (2, 2, 4),
                     "cycle_navigation": (3, 5, 5), "stack_manipulation": (5, 3, 7), "reverse_string": (2, 2, 4),
                     "modular_arithmetic_brackets": (11, 5, 13), "solve_equation": (11, 5, 13)}


@pytest.mark.parametrize("cls,options", [
    (ModularArithmetic, {"modulus": 1}), (ModularArithmetic, {"modulus": True}),
    (ModularArithmetic, {"operators": ("/",)}), (ModularArithmetic, {"operators": ()}),
    (ModularArithmetic, {"operators": ("+", "+")}), (ReverseString, {"m": 1}),
    (ModularArithmeticBrackets, {"modulus": 11}), (ModularArithmeticBrackets, {"mult": "yes"}),
    (SolveEquation, {"modulus": 0}),
])
def test_bad_options(cls, options):
    with pytest.raises(ConfigError) as info:
        cls(**options)
    assert info.value.field in options


def test_options_change_the_task():
    g = torch.Generator().manual_seed(0)
    ma = ModularArithmetic(modulus=7, operators=("+",)).sample(g, 32, 9)
    for i in range(32):
        x, targets, _ = decode(ma, i)
        assert all(v == 7 for v in x[1::2]) and targets == [sum(x[0::2]) % 7]
    rs = ReverseString(m=5).sample(g, 32, 10)
    assert int(rs.tokens.max()) == 6 and all(decode(rs, i)[1] == decode(rs, i)[0][::-1] for i in range(32))
    mab = ModularArithmeticBrackets(mult=False).sample(g, 64, 15)
    assert not (mab.tokens == 2 + 7).any()  # no *
