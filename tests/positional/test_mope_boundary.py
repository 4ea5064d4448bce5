"""MoPE as trained: equal to RoPE at initialization, the admissibility boundary omega sigma >= c
held by a reparametrization or pushed by a penalty, per-head pairs."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.attention import attention
from poslab.errors import ConfigError
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.positional import build_encoding
from poslab.tasks import build_task
from poslab.train import evaluate_loss

GEOM = dict(d_model=8, n_heads=2, d_head=8, max_len=64)
MODES = ["none", "hard", "penalty"]


def model(seed=0, encoding="mope", vocab_size=11, **options):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=vocab_size, d_model=16, n_heads=2, n_layers=2, max_len=64, encoding=encoding,
                            encoding_options=options)
    return Transformer(cfg).double()


@pytest.mark.parametrize("admissibility", MODES)
@pytest.mark.parametrize("per_head", [False, True])
def test_mope_at_initialization_is_rope(admissibility, per_head):
    """omega = RoPE's theta, sigma large: same weights give RoPE's logits (damping ~ 1 at these offsets)."""
    mope = model(admissibility=admissibility, per_head=per_head)
    rope = model(encoding="rope")
    rope.load_state_dict({k: v for k, v in mope.state_dict().items() if not k.startswith("encoding.")})
    theta = rope.encoding.theta.double()
    torch.testing.assert_close(mope.encoding.omega, theta.expand_as(mope.encoding.omega), rtol=0, atol=0)
    assert (mope.encoding.sigma >= 1e4).all()
    x = torch.randint(0, 11, (3, 48), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(mope(x), rope(x), rtol=1e-4, atol=1e-4)


def test_hard_sigma_is_c_over_omega_plus_the_free_width():
    enc = build_encoding("mope", admissibility="hard", admissibility_c=3.0, init_sigma=7.0, **GEOM)
    with torch.no_grad():
        enc.log_omega_scale.normal_(0, 1)
        enc.log_sigma_scale.normal_(0, 1)
    free = 7.0 * enc.log_sigma_scale.exp()
    torch.testing.assert_close(enc.sigma, 3.0 / enc.omega + free)
    assert (enc.omega * enc.sigma > 3.0).all()


def _train(admissibility, steps=12, lr=0.3, **options):
    """A few Adam steps at a large learning rate on windows of text: sigma and omega move a long way."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=65, d_model=16, n_heads=2, n_layers=1, max_len=32, encoding="mope",
                            encoding_options=dict(admissibility=admissibility, init_sigma=2.0, **options))
    m, task, generator = Transformer(cfg), build_task("text"), torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        m.loss(task.sample(generator, 8, 16)).backward()
        opt.step()
    return m


def test_hard_boundary_holds_after_training_steps():
    enc = _train("hard", admissibility_c=5.0).encoding
    assert (enc.log_sigma_scale.abs().max() > 0.5) and (enc.log_omega_scale.abs().max() > 0.5)  # they moved
    assert (enc.omega * enc.sigma >= 5.0).all()
    free = _train("none").encoding  # the same steps without the constraint leave the boundary
    assert (free.omega * free.sigma < 5.0).any()


def test_penalty_is_the_formula_and_zero_inside_the_boundary():
    enc = build_encoding("mope", admissibility="penalty", admissibility_c=5.0, penalty_weight=2.0,
                         init_sigma=1.0, **GEOM)  # theta_f sigma_f = theta_f < 5: every pair violates
    product = enc.omega * enc.sigma
    want = 2.0 * torch.relu(math.log(5.0) - product.log()).square().mean()
    torch.testing.assert_close(enc.penalty(), want)
    assert enc.penalty() > 0
    wide = build_encoding("mope", admissibility="penalty", init_sigma=1e9, **GEOM)
    assert wide.penalty() == 0
    assert build_encoding("mope", **GEOM).penalty() is None and build_encoding("rope", **GEOM).penalty() is None


def test_penalty_enters_the_training_loss_not_the_validation_loss():
    m = model(vocab_size=65, admissibility="penalty", init_sigma=1.0, penalty_weight=3.0)
    plain = model(vocab_size=65, admissibility="none", init_sigma=1.0)
    batch = build_task("text").sample(torch.Generator().manual_seed(0), 4, 16)
    torch.testing.assert_close(m.loss(batch) - plain.loss(batch), m.encoding.penalty())
    torch.testing.assert_close(torch.tensor(evaluate_loss(m, batch)["loss"]),
                               torch.tensor(evaluate_loss(plain, batch)["loss"]))


def test_penalty_training_moves_pairs_toward_admissibility():
    before = build_encoding("mope", admissibility="penalty", init_sigma=2.0, penalty_weight=10.0, d_model=16,
                            n_heads=2, d_head=8, max_len=32).penalty()
    assert _train("penalty", penalty_weight=10.0).encoding.penalty() < 0.5 * before


def test_per_head_pairs_equal_one_encoding_per_head():
    """per_head: head r uses its own (omega, sigma) row, as a shared encoding with that row would."""
    torch.manual_seed(0)
    enc = build_encoding("mope", per_head=True, init_sigma=4.0, **GEOM)
    assert enc.omega.shape == enc.sigma.shape == enc.rotary_frequencies().shape == (2, 4)
    with torch.no_grad():
        enc.log_omega_scale.normal_(0, 0.3)
        enc.log_sigma_scale.normal_(0, 0.5)
    q, k, v = (torch.randn(2, 2, 9, 8) for _ in range(3))
    pos = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 40])
    both = attention(q, k, v, enc, pos, pos, need_weights=True)
    for r in range(2):
        one = build_encoding("mope", init_sigma=4.0, **GEOM)
        with torch.no_grad():
            one.log_omega_scale.copy_(enc.log_omega_scale[r])
            one.log_sigma_scale.copy_(enc.log_sigma_scale[r])
        alone = attention(q[:, r:r + 1], k[:, r:r + 1], v[:, r:r + 1], one, pos, pos, need_weights=True)
        torch.testing.assert_close(both.attn_scores[:, r:r + 1], alone.attn_scores)
        torch.testing.assert_close(both.out[:, r:r + 1], alone.out)


@pytest.mark.parametrize("options, field", [
    (dict(admissibility="soft"), "admissibility"),
    (dict(admissibility_c=0.0), "admissibility_c"),
    (dict(penalty_weight=-1.0), "penalty_weight"),
    (dict(per_head="yes"), "per_head"),
])
def test_bad_boundary_options(options, field):
    with pytest.raises(ConfigError) as err:
        build_encoding("mope", **GEOM, **options)
    assert err.value.field == field
