"""Coupled L2 under Adam (``optimizer="adam"`` with ``weight_decay``): the penalty enters the gradient
before Adam's moments, against decoupled AdamW; a naive formula, ensemble = solo parity, and what
each does to parameters that get no loss gradient (the APE rows past L_max)."""

from functools import partial

import torch

from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.tasks import build_task
from poslab.train import TrainConfig, _optimizer, build_member, train_ensemble, train_plain


def naive_adam(w, grads, lr, wd, betas=(0.9, 0.999), eps=1e-8, coupled=True):
    """Adam by hand: g_t = grad_t + wd w (coupled) or w -= lr wd w before the step (decoupled)."""
    w = w.clone().double()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        if coupled:
            g = g + wd * w
        else:
            w = w - lr * wd * w
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        w = w - lr * m_hat / (v_hat.sqrt() + eps)
    return w


def run_optimizer(cfg, w0, grads):
    p = w0.clone().double().requires_grad_(True)
    opt = _optimizer({"p": p}, cfg)
    for g in grads:
        p.grad = g.double().clone()
        opt.step()
    return p.detach()


def test_coupled_l2_is_adam_on_the_penalised_gradient_and_differs_from_adamw():
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(5, 3, generator=gen)
    grads = [torch.randn(5, 3, generator=gen) * 1e-3 for _ in range(20)]
    wd, lr = 0.3, 0.01
    coupled = run_optimizer(TrainConfig(optimizer="adam", weight_decay=wd, lr=lr), w0, grads)
    decoupled = run_optimizer(TrainConfig(optimizer="adamw", weight_decay=wd, lr=lr), w0, grads)
    assert torch.allclose(coupled, naive_adam(w0, grads, lr, wd), atol=1e-10)
    assert torch.allclose(decoupled, naive_adam(w0, grads, lr, wd, coupled=False), atol=1e-10)
    assert (coupled - decoupled).abs().max() > 1e-3  # the two are different optimizers
    plain = run_optimizer(TrainConfig(optimizer="adam", lr=lr), w0, grads)
    assert torch.allclose(plain, naive_adam(w0, grads, lr, 0.0), atol=1e-10)


def test_a_parameter_without_loss_gradient_walks_to_zero_under_coupled_l2_but_barely_moves_under_adamw():
    w0 = torch.full((4,), 0.02)
    grads = [torch.zeros(4)] * 40
    coupled = run_optimizer(TrainConfig(optimizer="adam", weight_decay=1e-4, lr=1e-3), w0, grads)
    decoupled = run_optimizer(TrainConfig(optimizer="adamw", weight_decay=1e-4, lr=1e-3), w0, grads)
    # Adam normalises wd w to about sign(w): ~lr per step, whatever wd; AdamW shrinks by (1 - lr wd) per step
    assert float(coupled.abs().max()) < 0.25 * 0.02  # 20 steps of ~lr reach zero; it then hovers within ~lr
    assert torch.allclose(decoupled, w0.double() * (1 - 1e-3 * 1e-4) ** 40)


def make(**kw):
    return partial(RetrievalHead, RetrievalHeadConfig(encoding="learned", d_model=16, max_len=24, **kw))


def test_coupled_l2_ensemble_member_equals_the_seed_trained_alone():
    cfg = TrainConfig(steps=30, batch_size=32, min_length=8, max_length=16, optimizer="adam", weight_decay=1e-2)
    tasks = [build_task("fixed_offset", K=2)] * 3
    ens = train_ensemble(make(), tasks, [0, 1, 2], cfg, progress=False)
    alone = train_ensemble(make(), tasks[:1], [1], cfg, progress=False).models[0]
    plain, _ = train_plain(make(), tasks[0], 1, cfg)
    for name, p in ens.models[1].state_dict().items():
        for other in (alone, plain):
            q = other.state_dict()[name]
            assert float((p - q).norm() / q.norm()) < 1e-5, name
    # the rows past L_max got no loss gradient: only the penalty moved them, and it did
    fresh = build_member(make(), 1)
    W, W0 = ens.models[1].encoding.W_pos.detach(), fresh.encoding.W_pos.detach()
    assert float(W[16:].norm() / W0[16:].norm()) < 0.5
    no_l2 = train_ensemble(make(), tasks[:1], [1], TrainConfig(steps=30, batch_size=32, min_length=8,
                                                                max_length=16), progress=False).models[0]
    assert torch.equal(no_l2.encoding.W_pos.detach()[16:], W0[16:])
