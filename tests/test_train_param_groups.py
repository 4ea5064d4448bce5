"""train.param_groups: parameters with their own learning rate and weight decay, still trained
exactly per member (an ensemble member equals the same seed trained alone)."""

from functools import partial

import pytest
import torch

from poslab.errors import ConfigError
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.tasks import build_task
from poslab.train import TrainConfig, _optimizer, _set_lr, group_names, train_ensemble, train_plain

MOPE = ["log_omega_scale", "log_sigma_scale"]
GROUP = dict(match=MOPE, lr=0.05, weight_decay=0.0)


def transformer(**options):
    return partial(Transformer, TransformerConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=2, max_len=16,
                                                  encoding="mope",
                                                  encoding_options=dict(per_head=True, init_sigma=4.0, **options)))


def rel_err(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm()) if b.norm() else float((a - b).norm())


def test_first_adam_step_moves_each_group_by_its_own_lr():
    """Adam's first step is lr * sign(grad) (m / sqrt(v) = +-1): the group's parameters move by its lr,
    the rest by train.lr; weight decay 0 in the group, 0.1 outside (2-D) as configured."""
    cfg = TrainConfig(steps=1, lr=1e-3, optimizer="adamw", weight_decay=0.1, decay_1d=False, param_groups=(GROUP,))
    model = transformer()()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = _optimizer(dict(model.named_parameters()), cfg)
    batch = build_task("shift", K=2).sample(torch.Generator().manual_seed(0), 8, 12)
    model.loss(batch).backward()
    opt.step()
    for name, p in model.named_parameters():
        g = p.grad
        sign_step = lambda lr, g=g: lr * g / (g.abs() + 1e-8)  # noqa: E731  (Adam's first step, eps 1e-8)
        got = before[name] - p.detach()
        if any(m in name for m in MOPE):
            assert (g != 0).any() and torch.allclose(got, sign_step(0.05), rtol=1e-4, atol=1e-6), name
        elif p.dim() > 1:  # decoupled decay lr * wd * w on top of the sign step
            assert torch.allclose(got, sign_step(1e-3) + 1e-3 * 0.1 * before[name], rtol=1e-4, atol=1e-6), name
    wd = {tuple(sorted(id(p) for p in g["params"])): g["weight_decay"] for g in opt.param_groups}
    mine = tuple(sorted(id(p) for n, p in model.named_parameters() if any(m in n for m in MOPE)))
    assert wd[mine] == 0.0


def test_the_schedule_scales_every_group():
    cfg = TrainConfig(steps=100, lr=1e-3, lr_schedule="cosine", warmup_steps=5, min_lr=1e-4, optimizer="adamw",
                      param_groups=(GROUP,))
    opt = _optimizer(dict(transformer()().named_parameters()), cfg)
    for t in (0, 3, 50, 99):
        _set_lr(opt, cfg, t)
        assert opt.param_groups[0]["lr"] == pytest.approx(cfg.lr_at(t) * 50)
        assert all(g["lr"] == pytest.approx(cfg.lr_at(t)) for g in opt.param_groups[1:])


def test_ensemble_members_with_groups_equal_the_seed_trained_alone():
    cfg = TrainConfig(steps=30, batch_size=16, min_length=12, max_length=12, optimizer="adamw", weight_decay=0.1,
                      decay_1d=False, lr_schedule="cosine", warmup_steps=3, min_lr=1e-4, grad_clip=1.0,
                      param_groups=(GROUP,))
    make, tasks = transformer(admissibility="hard"), [build_task("shift", K=2)] * 3
    ens = train_ensemble(make, tasks, [0, 1, 2], cfg, progress=False)
    alone = train_ensemble(make, tasks[:1], [2], cfg, progress=False).models[0]
    plain, _ = train_plain(make, tasks[0], 2, cfg)
    for name, p in ens.models[2].state_dict().items():
        assert rel_err(p, alone.state_dict()[name]) < 1e-5, name
        assert rel_err(p, plain.state_dict()[name]) < 1e-5, name
    # the group's lr made the log-scales move: far more than train.lr alone moves them
    slow = train_ensemble(make, tasks[:1], [2], TrainConfig(**{**cfg.__dict__, "param_groups": ()}),
                          progress=False).models[0]
    moved = ens.models[2].encoding.log_sigma_scale.abs().max()
    assert moved > 0.2 and moved > 5 * slow.encoding.log_sigma_scale.abs().max()


@pytest.mark.parametrize("group", [dict(match=MOPE, rate=1.0), dict(lr=0.1), dict(match=[]), dict(match=MOPE, lr=0),
                                   dict(match=MOPE, weight_decay=-1.0), "log_sigma_scale"])
def test_bad_groups_are_refused(group):
    with pytest.raises(ConfigError, match="param_groups"):
        TrainConfig(param_groups=(group,)).validate()


def test_a_group_that_matches_nothing_is_refused_when_strict():
    names = [n for n, _ in transformer()().named_parameters()]
    assert group_names(names, TrainConfig(param_groups=(GROUP,)))[0] == [n for n in names if "log_" in n]
    nothing = TrainConfig(param_groups=(dict(match="no_such_weight"),))
    assert group_names(names, nothing) == [[]]  # a member without those parameters trains as usual
    with pytest.raises(ConfigError, match="param_groups.match"):
        group_names(names, nothing, strict=True)
