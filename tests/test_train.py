"""The ensemble trainer: parity with training alone, divergence handling, data streams."""

from functools import partial

import math

import pytest
import torch

from poslab.errors import ConfigError
from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.tasks import build_task
from poslab.train import DataStream, TrainConfig, train_ensemble, train_plain

CFG = TrainConfig(steps=50, batch_size=32, min_length=8, max_length=16)


def make(encoding="rope", **kw):
    return partial(RetrievalHead, RetrievalHeadConfig(encoding=encoding, d_model=16, max_len=16, **kw))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm()) if b.norm() else float((a - b).norm())


@pytest.mark.parametrize("encoding", ["rope", "learned"])
def test_ensemble_member_equals_the_seed_trained_alone(encoding):
    seeds = list(range(8))
    tasks = [build_task("fixed_offset", K=1 + s % 3) for s in seeds]
    ens = train_ensemble(make(encoding), tasks, seeds, CFG, progress=False)
    for i in (0, 5):
        alone = train_ensemble(make(encoding), [tasks[i]], [seeds[i]], CFG, progress=False).models[0]
        plain, _ = train_plain(make(encoding), tasks[i], seeds[i], CFG)
        for name, p in ens.models[i].state_dict().items():
            assert rel_err(p, alone.state_dict()[name]) < 1e-5, name
            assert rel_err(p, plain.state_dict()[name]) < 1e-5, name
    # and training moved the weights: the comparison is not between two untrained models
    fresh = make(encoding)()
    assert rel_err(ens.models[0].W_Q, fresh.W_Q) > 1e-2


def test_sequence_length_sampling_matches_plain_loop_too():
    cfg = TrainConfig(steps=20, batch_size=32, length_sampling="sequence")
    task = build_task("fixed_offset", K=2)
    ens = train_ensemble(make(), [task, task], [0, 1], cfg, progress=False)
    plain, _ = train_plain(make(), task, 1, cfg)
    assert rel_err(ens.models[1].W_K, plain.W_K) < 1e-5


def test_a_nan_member_is_frozen_while_the_others_finish():
    seeds = [0, 1, 2, 3]

    def poisoned():
        model = make()()
        if torch.initial_seed() == 2:  # build_member seeds before building
            with torch.no_grad():
                model.W_E[0, 0] = math.nan
        return model

    tasks = [build_task("fixed_offset", K=2)] * 4
    result = train_ensemble(poisoned, tasks, seeds, CFG, progress=False)
    assert result.diverged_at == [None, None, 1, None]
    assert torch.isnan(result.models[2].W_E[0, 0])
    torch.manual_seed(2)  # member 2 keeps its initial weights (frozen at step 1)
    untouched = make()()
    assert torch.equal(result.models[2].W_Q, untouched.W_Q)
    clean = train_ensemble(make(), [tasks[0]], [1], CFG, progress=False).models[0]
    assert rel_err(result.models[1].W_Q, clean.W_Q) < 1e-5
    assert torch.isfinite(torch.tensor(result.loss_curve[-1][[0, 1, 3]])).all()


def test_per_member_clipping_is_independent_of_the_other_members():
    cfg = TrainConfig(steps=10, batch_size=32, grad_clip=0.01)
    tasks = [build_task("fixed_offset", K=2)] * 3
    ens = train_ensemble(make(), tasks, [0, 1, 2], cfg, progress=False)
    alone = train_ensemble(make(), tasks[:1], [1], cfg, progress=False)
    assert rel_err(ens.models[1].W_K, alone.models[0].W_K) < 1e-5


def test_snapshots_and_loss_curve():
    cfg = TrainConfig(steps=30, batch_size=32, snapshot_steps=(10, 30))
    res = train_ensemble(make(), [build_task("fixed_offset", K=1)] * 2, [0, 1], cfg, progress=False)
    assert sorted(res.snapshots) == [10, 30]
    assert torch.equal(res.snapshots[30][1]["W_Q"], res.models[1].W_Q.detach())
    assert res.loss_curve.shape == (30, 2)
    assert res.loss_curve[-1].mean() < res.loss_curve[0].mean()


def test_data_stream_depends_only_on_seed():
    task = build_task("fixed_offset", K=2)
    a, b = DataStream(task, 7, CFG), DataStream(task, 7, CFG)
    for _ in range(60):  # crosses a chunk boundary
        xa, xb = a.next(), b.next()
        assert all(torch.equal(u, v) for u, v in zip(xa[:3], xb[:3])) and xa[3] == xb[3]
    tokens, targets, lengths, q = xa
    L = int(lengths[0])
    assert (lengths == L).all() and q == L - 1 and 8 <= L <= 16
    assert torch.equal(targets, tokens[:, L - 1 - 2])


@pytest.mark.parametrize("field, value", [("optimizer", "sgd"), ("length_sampling", "token"), ("steps", 0),
                                          ("lr", -1.0), ("min_length", 0)])
def test_bad_train_config(field, value):
    with pytest.raises(ConfigError, match=field):
        TrainConfig(**{field: value}).validate()
