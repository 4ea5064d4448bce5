"""digit_addition against an independent per-row implementation written here from the formats'
definitions (Cho et al. 2024; McLeish et al. 2024; Zhou et al. 2024): tokens, targets, masks and the
positions it hands out; its draws; bad input."""

import re

import pytest
import torch

from poslab.errors import ConfigError
from poslab.tasks import TASKS, build_task, eval_batch
from poslab.tasks.base import sample_steps
from poslab.train import _pad_steps, cropped

CASES = [(f, p) for f in ("plain", "reversed", "index_hints") for p in ("index", "coupled", "abacus")]


def expected(fmt: str, a: int, b: int, c: int):
    """(symbols, scored next-symbols, coupled ids, abacus ids) of one example, from strings and ints."""
    n = max(len(str(a)), len(str(b)))
    A, B = str(a).zfill(n), str(b).zfill(n)  # most significant first
    S = str(a + b).zfill(n + 1)
    sig_of = lambda width, i: width - 1 - i  # noqa: E731  (position i of a most-significant-first string)
    toks, sig = [], []  # symbol and significance (None: not a digit or hint) per token

    def number(digits: str, order_sig: list[int]):
        for d, s in zip(digits, order_sig, strict=True):
            if fmt == "index_hints":
                toks.append(f"h{c + s}")
                sig.append(("hint", s))
            toks.append(d)
            sig.append(("digit", s))

    number(A, [sig_of(n, i) for i in range(n)])
    toks.append("+"), sig.append(None)
    number(B, [sig_of(n, i) for i in range(n)])
    toks.append("="), sig.append(None)
    out = S if fmt == "plain" else S[::-1]
    out_sig = [sig_of(n + 1, i) for i in range(n + 1)] if fmt == "plain" else list(range(n + 1))
    first_out = len(toks)
    number(out, out_sig)
    toks.append("</s>"), sig.append(None)
    scored = [toks[p + 1] for p in range(len(toks) - 1)
              if (p + 1 >= first_out and sig[p + 1] is not None and sig[p + 1][0] == "digit") or toks[p + 1] == "</s>"]
    coupled = [n + 2 if s is None else n + 1 - s[1] for s in sig]
    abacus = [s[1] + 1 if s is not None and s[0] == "digit" else 0 for s in sig]
    return toks, scored, coupled, abacus


def parse(symbols: list[str]) -> tuple[int, int, int]:
    """The operands and the first hint index of a rendered sequence."""
    text = " ".join(symbols)
    left, right = text.split(" = ")[0].split(" + ")
    digits = lambda part: int("".join(t for t in part.split() if t.isdigit()))  # noqa: E731
    hints = [int(h) for h in re.findall(r"h(\d+)", text)]
    return digits(left), digits(right), min(hints) if hints else 0


@pytest.mark.parametrize("fmt, pos", CASES)
def test_every_field_equals_the_independent_implementation(fmt, pos):
    task = build_task("digit_addition", format=fmt, positions=pos, n_hints=12)
    batch = task.sample(torch.Generator().manual_seed(3), 64, (1, 6))
    assert batch.tokens.shape[1] == int(batch.lengths.max())
    for r in range(64):
        L = int(batch.lengths[r])
        got = [task.symbols[int(t)] for t in batch.tokens[r, :L]]
        a, b, c = parse(got)
        toks, scored, coupled, abacus = expected(fmt, a, b, c)
        assert got == toks
        assert (batch.tokens[r, L:] == 0).all()
        mask = batch.loss_mask[r]
        assert [task.symbols[int(t)] for t in batch.targets[r][mask]] == scored
        assert not mask[L - 1:].any()
        if pos == "index":
            assert batch.positions is None
        else:
            want = coupled if pos == "coupled" else abacus
            assert batch.positions[r, :L].tolist() == want
            assert (batch.positions[r, L:] == 0).all()
    sig, piece = task.places(batch.tokens)  # each token's place, read from the tokens alone
    for r in range(64):
        L = int(batch.lengths[r])
        toks = [task.symbols[int(t)] for t in batch.tokens[r, :L]]
        a, b, c = parse(toks)
        n = max(len(str(a)), len(str(b)))
        digit_at = [i for i, t in enumerate(toks) if t.isdigit()]
        want_piece = [1] * n + [2] * n + [3] * (n + 1)
        assert [int(piece[r, i]) for i in digit_at] == want_piece
        assert (piece[r][[i for i in range(batch.tokens.shape[1]) if i not in digit_at]] == 0).all()
        out_sig = list(range(n, -1, -1)) if fmt == "plain" else list(range(n + 1))
        assert [int(sig[r, i]) for i in digit_at] == 2 * list(range(n - 1, -1, -1)) + out_sig
    targets, loss_mask = task.label(batch.tokens, batch.lengths)  # the rule alone, from the tokens
    assert torch.equal(loss_mask, batch.loss_mask)
    assert torch.equal(targets[loss_mask], batch.targets[loss_mask])


def test_operands_are_drawn_as_the_source_draws_them():
    """Each operand's digit count uniform and independent in lo .. hi (both exactly L at one length); a d-digit
    operand uniform over the d-digit numbers; hint starts uniform over 0 .. n_hints - (n + 1)."""
    task = build_task("digit_addition", format="index_hints", n_hints=10)
    batch = task.sample(torch.Generator().manual_seed(0), 4000, (1, 4))
    counts, firsts, starts = [], [], []
    for r in range(4000):
        a, b, c = parse([task.symbols[int(t)] for t in batch.tokens[r, :int(batch.lengths[r])]])
        counts += [len(str(a)), len(str(b))]
        firsts += [int(str(x)[0]) for x in (a, b) if x >= 10]
        starts.append((c, max(len(str(a)), len(str(b)))))
    assert set(counts) == {1, 2, 3, 4} and all(abs(counts.count(d) / 8000 - 0.25) < 0.03 for d in range(1, 5))
    assert set(firsts) == set(range(1, 10))
    assert all(0 <= c <= 10 - (n + 1) for c, n in starts) and {c for c, n in starts if n == 4} == set(range(6))
    fixed = task.sample(torch.Generator().manual_seed(0), 200, 5)
    for r in range(200):
        a, b, _ = parse([task.symbols[int(t)] for t in fixed.tokens[r, :int(fixed.lengths[r])]])
        assert len(str(a)) == len(str(b)) == 5
    assert int(fixed.lengths.max()) == task.max_tokens(5)


def test_positions_travel_through_sampling_steps_and_evaluation_sets():
    task = build_task("digit_addition", positions="coupled")
    steps = sample_steps(task, torch.Generator().manual_seed(0), 3, 8, (1, 4), "sequence")
    assert steps.positions.shape == steps.tokens.shape == (3, 8, task.max_tokens(4))
    one = steps.map(lambda x: x[1])
    assert torch.equal(one[2:5].positions, one.positions[2:5])
    width = int(one.lengths.max())
    assert torch.equal(cropped(one, width).positions, one.positions[:, :width])  # the trainer's crop keeps them
    padded = _pad_steps(steps, steps.tokens.shape[-1] + 3)  # and its padding of a member's chunk
    assert padded.positions.shape == padded.tokens.shape and (padded.positions[..., -3:] == 0).all()
    ev = eval_batch(task, 7, 16, seed=0)
    assert torch.equal(ev.positions, eval_batch(task, 7, 16, seed=0).positions)
    assert int(ev.positions.max()) == 7 + 2  # the coupled ids of n-digit operands: 1 .. n + 2


@pytest.mark.parametrize("options, field", [
    (dict(format="binary"), "format"), (dict(positions="random"), "positions"), (dict(n_hints=1), "n_hints"),
])
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ConfigError) as e:
        build_task("digit_addition", **options)
    assert e.value.field == field


def test_a_length_past_the_hint_symbols_is_refused_before_any_work():
    task = build_task("digit_addition", format="index_hints", n_hints=6)
    task.validate(5)
    with pytest.raises(ConfigError) as e:
        task.sample(torch.Generator().manual_seed(0), 2, 6)
    assert e.value.field == "n_hints" and "digit_addition" in TASKS
