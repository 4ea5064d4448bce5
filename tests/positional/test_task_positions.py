"""Position coupling (Cho et al. 2024) and Abacus (McLeish et al. 2024): each equals a naive formula written
here, forward and backward through the registry on the task's positions, their defining properties (ids of
the same significance share a vector; the random start / offset covers the table in training and is off in
evaluation; non-digits get no Abacus vector) and bad input."""

import pytest
import torch
from torch.func import functional_call, stack_module_state, vmap

from poslab.errors import ConfigError
from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.positional import build_encoding, encoding_class, registered
from poslab.tasks import build_task

D = 8
GEOM = dict(d_model=D, n_heads=2, d_head=4, max_len=64)
NAMES = ("position_coupling", "abacus")
TASK_POSITIONS = {"position_coupling": "coupled", "abacus": "abacus"}


def build(name, **options):
    torch.manual_seed(0)
    return build_encoding(name, **GEOM, **options)


def batch(name, n=24, length=(1, 5), seed=0):
    task = build_task("digit_addition", positions=TASK_POSITIONS[name])
    return task, task.sample(torch.Generator().manual_seed(seed), n, length)


def naive(name, enc, x, pos, shift=None):
    """x + W_pos[id] per token, written element by element; Abacus adds nothing where id = 0."""
    out = x.clone()
    for r in range(pos.shape[0]):
        for t in range(pos.shape[1]):
            p = int(pos[r, t])
            if name == "abacus" and p == 0:
                continue
            q = p + (0 if shift is None or p == 0 else int(shift[r]))
            out[r, t] = x[r, t] + enc.W_pos[q]
    return out


@pytest.mark.parametrize("name", NAMES)
def test_evaluation_embedding_equals_the_naive_formula(name):
    enc = build(name, **({"max_pos": 12} if name == "position_coupling" else {"max_position": 12})).eval()
    _, b = batch(name)
    x = torch.randn(*b.tokens.shape, D)
    torch.testing.assert_close(enc.embed(x, b.positions), naive(name, enc, x, b.positions))


@pytest.mark.parametrize("name", NAMES)
def test_training_draw_is_one_shift_per_sequence_over_the_whole_table(name):
    """Coupling: start s = 1 + u, u uniform in 0 .. max_pos - (row's largest id); Abacus: k in 0 .. K (capped at
    the table's room). Each row's ids move together; the shifted embedding is the formula at the shifted ids."""
    big = dict(max_pos=30) if name == "position_coupling" else dict(max_position=60, max_offset=20)
    enc = build(name, **big).train()
    _, b = batch(name, n=6)
    pos = b.positions
    top = 30 if name == "position_coupling" else 20  # the largest shift a row can take here
    seen = {r: set() for r in range(6)}
    for i in range(400):
        torch.manual_seed(i)
        p = enc.shifted(pos)
        moved = p - pos
        real = pos > 0
        for r in range(6):
            u = moved[r][real[r]].unique()
            assert len(u) == 1 and (moved[r][~real[r]] == 0).all()
            seen[r].add(int(u))
    for r in range(6):
        room = top - int(pos[r].max()) if name == "position_coupling" else top
        assert seen[r] == set(range(room + 1)), (r, sorted(seen[r]))
    torch.manual_seed(7)
    shift = (enc.shifted(pos) - pos).amax(-1)
    x = torch.randn(*pos.shape, D)
    torch.manual_seed(7)
    torch.testing.assert_close(enc.embed(x, pos), naive(name, enc, x, pos, shift))
    enc.eval()
    torch.testing.assert_close(enc.embed(x, pos), enc.embed(x, pos))


def test_abacus_offset_is_capped_by_the_table_room():
    enc = build("abacus", max_position=8, max_offset=100).train()
    pos = torch.tensor([[1, 2, 3, 0, 1, 2, 3, 0]])
    assert max(int((enc.shifted(pos) - pos).max()) for _ in range(200)) == 5  # 8 - 3


@pytest.mark.parametrize("name", NAMES)
def test_same_significance_shares_a_vector_and_abacus_leaves_other_tokens_alone(name):
    enc = build(name).eval()
    task, b = batch(name, n=8)
    z = enc.embed(torch.zeros(*b.tokens.shape, D), b.positions)
    for r in range(8):
        for i in range(int(b.lengths[r])):
            for j in range(int(b.lengths[r])):
                if b.positions[r, i] == b.positions[r, j]:
                    torch.testing.assert_close(z[r, i], z[r, j])
    digits = (b.tokens >= 4) & (b.tokens < 14)
    if name == "abacus":
        assert (z[~digits] == 0).all() and (z[digits].abs().sum(-1) > 0).all()
    # the three digits of one significance (two operands, the sum) share one id; the sum's top digit is alone
    row = b.positions[0, :int(b.lengths[0])][digits[0, :int(b.lengths[0])]]
    n = (len(row) - 1) // 3
    assert sorted(int((row == v).sum()) for v in row.unique()) == [1] + [3] * n


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("members", [1, 3])
def test_forward_backward_through_the_registry_on_task_positions(name, members):
    task, b = batch(name)
    cfg = TransformerConfig(vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2, encoding=name)
    models = []
    for s in range(members):
        torch.manual_seed(s)
        models.append(Transformer(cfg))
    if members == 1:
        loss = models[0].loss(b)
        grads = torch.autograd.grad(loss, list(models[0].parameters()))
        names = [k for k, _ in models[0].named_parameters()]
        assert all(torch.isfinite(g).all() for g in grads)
        assert grads[names.index("encoding.W_pos")].abs().sum() > 0
        inter = models[0].eval().collect(b)
        assert torch.equal(inter.positions, b.positions)
        return
    params, buffers = stack_module_state(models)
    base = models[0].to("meta")

    def one(p, tokens, positions):
        return functional_call(base, (p, buffers), (tokens, positions))
    out = vmap(one, in_dims=(0, None, None), randomness="different")(params, b.tokens, b.positions)
    assert out.shape == (members, *b.tokens.shape, task.vocab_size) and torch.isfinite(out).all()


def test_the_task_positions_entries_are_absolute_and_requested_by_name():
    for name in NAMES:
        assert encoding_class(name).task_positions and encoding_class(name).kind == "absolute"
        assert name in registered("absolute", task_positions=True) and name not in registered()


@pytest.mark.parametrize("name", NAMES)
def test_missing_positions_is_one_clear_error(name):
    task, b = batch(name)
    model = Transformer(TransformerConfig(vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                          encoding=name))
    with pytest.raises(ConfigError) as e:
        model(b.tokens)
    assert e.value.field == "positions" and name in str(e.value)
    plain = build_task("digit_addition").sample(torch.Generator().manual_seed(0), 4, 3)  # positions="index"
    with pytest.raises(ConfigError, match="positions"):
        model.loss(plain)
    with pytest.raises(ConfigError) as e:
        RetrievalHead(RetrievalHeadConfig(encoding=name))
    assert e.value.field == "encoding"


@pytest.mark.parametrize("name, options, field", [
    ("position_coupling", dict(max_pos=2), "max_pos"), ("position_coupling", dict(random_start=1), "random_start"),
    ("abacus", dict(max_offset=-1), "max_offset"), ("abacus", dict(max_position=0), "max_position"),
])
def test_bad_options_name_the_field(name, options, field):
    with pytest.raises(ConfigError) as e:
        build(name, **options)
    assert e.value.field == field


@pytest.mark.parametrize("name, field", [("position_coupling", "max_pos"), ("abacus", "max_position")])
def test_ids_past_the_table_are_refused(name, field):
    enc = build(name, **{field: 12})
    enc.check_positions(12)
    with pytest.raises(ConfigError) as e:
        enc.check_positions(13)
    assert e.value.field == field
