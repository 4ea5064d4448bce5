"""The ensemble trainer: parity with training alone, divergence handling, data streams."""

import math
import warnings
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch

from poslab.errors import ConfigError
from poslab.models.loss import masked_cross_entropy
from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.tasks import Batch, build_task, eval_batch
from poslab.train import DataStream, PhaseTimer, TrainConfig, _optimizer, evaluate_loss, train_ensemble, train_plain

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


@pytest.mark.parametrize("encoding", ["rope", "learned"])
def test_a_part_of_an_ensemble_trains_its_members_bit_for_bit_as_the_whole(encoding):
    # what lets the runner split a group to share it out among workers without changing any table
    seeds = list(range(8))
    tasks = [build_task("fixed_offset", K=1 + s % 3) for s in seeds]
    whole = train_ensemble(make(encoding), tasks, seeds, CFG, progress=False)
    part = train_ensemble(make(encoding), tasks[4:], seeds[4:], CFG, progress=False)
    for a, b in zip(whole.models[4:], part.models, strict=True):
        for name, p in a.state_dict().items():
            assert torch.equal(p, b.state_dict()[name]), name
    assert np.array_equal(whole.loss_curve[:, 4:], part.loss_curve)


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
        assert all(torch.equal(getattr(xa, k), getattr(xb, k)) for k in Batch.TENSORS if getattr(xa, k) is not None)
    L = int(xa.lengths[0])
    assert (xa.lengths == L).all() and int(xa.first_query) == L - 1 and xa.n_queries == 1 and 8 <= L <= 16
    assert torch.equal(xa.targets, xa.tokens[:, L - 1 - 2])


def test_data_stream_asks_the_task_and_keeps_its_loss_mask():
    task = build_task("shift", K=2)
    batch = DataStream(task, 3, CFG).next()
    L = int(batch.lengths[0])
    assert batch.targets.shape == batch.tokens.shape and batch.loss_mask.shape == batch.tokens.shape
    assert not batch.loss_mask[:, :2].any() and batch.loss_mask[:, 2:L].all() and not batch.loss_mask[:, L:].any()
    assert torch.equal(batch.targets[:, 2:L], batch.tokens[:, : L - 2])


class _Generic:
    """A task with no sample_steps of its own: the stream falls back to one sample() per step."""

    def __init__(self, task):
        self.task = task

    def __getattr__(self, name):
        if name == "sample_steps":
            raise AttributeError(name)
        return getattr(self.task, name)


def test_generic_tasks_are_drawn_one_sample_per_step_and_padded():
    cfg = TrainConfig(steps=5, batch_size=4, chunk=5, length_sampling="batch")
    chunk = DataStream(_Generic(build_task("shift", K=2)), 0, cfg).draw()
    assert chunk.tokens.shape == (5, 4, 16) and chunk.loss_mask.shape == (5, 4, 16)
    for i in range(5):
        L = int(chunk.lengths[i, 0])
        assert not chunk.loss_mask[i, :, L:].any() and int(chunk.first_query[i]) == L - 1


def transformer(**kw):
    cfg = TransformerConfig(**dict(vocab_size=20, d_model=16, n_layers=2, n_heads=4, max_len=16) | kw)
    return partial(Transformer, cfg)


# a mixed layout (issue 57): chunked and windowed rope, a learned T5 bias with its own temperature, nope, qk-norm
LAYOUT = dict(n_layers=4, layout="rope:chunk=4,t5:window=6:temperature=0.5,rope:window=5,nope", qk_norm=True)
# Llama 4's no-rope temperature tuning, with a floor small enough to act at these lengths
TUNED = dict(n_layers=2, layout="rope:chunk=4,nope:attn_scale=0.5:floor_scale=4", qk_norm=True)


@pytest.mark.parametrize("task, kw, encoding, model_kw", [
    ("shift", dict(K=2), "rope", {}), ("shift", dict(K=2), "learned", {}),
    ("content_conditioned", dict(K1=2, K2=3), "rope", {}), ("content_conditioned", dict(K1=2, K2=3), "learned", {}),
    ("shift", dict(K=2), "rope", LAYOUT), ("shift", dict(K=2), "rope", TUNED),
    ("shift", dict(K=2), "learned", dict(init="normal"))])
def test_transformer_members_equal_the_seed_trained_alone(task, kw, encoding, model_kw):
    cfg = TrainConfig(steps=50, batch_size=16, min_length=8, max_length=16, optimizer="adamw", weight_decay=0.1,
                      decay_1d=False, lr_schedule="cosine", warmup_steps=5, min_lr=1e-4, grad_clip=1.0)
    seeds = [0, 1, 2]
    tasks = [build_task(task, **kw)] * 3
    make = transformer(encoding=encoding, **model_kw)
    ens = train_ensemble(make, tasks, seeds, cfg, progress=False)
    alone = train_ensemble(make, tasks[:1], [2], cfg, progress=False).models[0]
    plain, losses = train_plain(make, tasks[0], 2, cfg)
    for name, p in ens.models[2].state_dict().items():
        assert rel_err(p, alone.state_dict()[name]) < 1e-5, name
        assert rel_err(p, plain.state_dict()[name]) < 1e-5, name
    assert rel_err(ens.models[2].layers[0].W_Q, make().layers[0].W_Q) > 1e-2  # it trained
    for name, p in make().named_parameters():  # every parameter moved, a layer encoding's own included
        assert rel_err(ens.models[2].state_dict()[name], p) > 1e-3, name
    assert abs(ens.loss_curve[-1, 2] - losses[-1]) < 1e-4


@pytest.mark.parametrize("members", [1, 3])
def test_a_timed_ensemble_trains_bit_for_bit_what_an_untimed_one_does(members):
    cfg = TrainConfig(steps=20, batch_size=8, min_length=8, max_length=16, optimizer="adamw", weight_decay=0.1,
                      lr_schedule="cosine", warmup_steps=5, grad_clip=1.0)
    tasks, seeds = [build_task("shift", K=2)] * members, list(range(members))
    timer = PhaseTimer()
    timed = train_ensemble(transformer(), tasks, seeds, cfg, progress=False, timer=timer)
    untimed = train_ensemble(transformer(), tasks, seeds, cfg, progress=False)
    for a, b in zip(timed.models, untimed.models, strict=True):
        for name, p in a.state_dict().items():
            assert torch.equal(p, b.state_dict()[name]), name
    assert (timed.loss_curve == untimed.loss_curve).all()
    assert set(timer.seconds) == {"setup", "sampling", "forward", "backward", "optimizer"}
    assert all(s > 0 for s in timer.seconds.values())


def test_cosine_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(steps=101, lr=1e-3, lr_schedule="cosine", warmup_steps=10, min_lr=1e-4)
    lrs = [cfg.lr_at(t) for t in range(cfg.steps)]
    assert lrs[0] == pytest.approx(1e-3 / 11) and lrs[9] == pytest.approx(1e-3 * 10 / 11)
    assert lrs[10] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
    assert lrs[55] == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))  # half-way through the decay
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert TrainConfig().lr_at(1234) == 1e-3


def test_weight_decay_skips_one_dimensional_parameters_when_asked():
    cfg = TrainConfig(steps=1, optimizer="adamw", weight_decay=0.5, decay_1d=False, lr=0.1)
    model = transformer()()
    opt = _optimizer(dict(model.named_parameters()), cfg)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (p.dim() > 1), name


def test_evaluation_in_chunks_equals_one_pass():
    model = transformer()()
    batch = eval_batch(build_task("shift", K=2), 12, 50, seed=0)
    whole = evaluate_loss(model, batch, chunk=50)
    parts = evaluate_loss(model, batch, chunk=7)
    assert whole["targets"] == parts["targets"] == 50 * 10
    assert parts["loss"] == pytest.approx(whole["loss"], rel=1e-6) and parts["accuracy"] == whole["accuracy"]
    direct = float(masked_cross_entropy(model(batch.tokens), batch))
    assert whole["loss"] == pytest.approx(direct, rel=1e-6)


@pytest.mark.parametrize("field, value", [("optimizer", "sgd"), ("length_sampling", "token"), ("steps", 0),
                                          ("lr", -1.0), ("min_length", 0),
                                          ("lr_schedule", "linear"), ("min_lr", 1.0), ("warmup_steps", 5000),
                                          ("betas", (0.9,)), ("weight_decay", -0.1), ("grad_clip", 0.0)])
def test_bad_train_config(field, value):
    with pytest.raises(ConfigError, match=field):
        TrainConfig(**{field: value}).validate()


def test_members_with_and_without_loss_weights_equal_each_trained_alone():
    """An ensemble mixing a weighted passkey mix (answer digits x 20) with the plain one: each member
    equals its own run (the unweighted member's batches get unit weights, its plain mean)."""
    from poslab.tasks.passkey import PasskeyText

    cfg = TrainConfig(steps=12, batch_size=8, min_length=40, max_length=40, optimizer="adamw", weight_decay=0.1)
    tasks = [PasskeyText(share=0.5, answer_weight=20.0), PasskeyText(share=0.5)]
    m = tasks[0].vocab_size
    make = partial(Transformer, TransformerConfig(vocab_size=m, d_model=16, n_layers=1, n_heads=2, max_len=40))
    ens = train_ensemble(make, tasks, [0, 1], cfg, progress=False)
    for i in range(2):
        alone = train_ensemble(make, tasks[i:i + 1], [i], cfg, progress=False).models[0]
        for name, p in ens.models[i].state_dict().items():
            assert rel_err(p, alone.state_dict()[name]) < 1e-5, (i, name)
    plain = train_ensemble(make, tasks[1:], [0], cfg, progress=False).models[0]
    assert rel_err(ens.models[0].U, plain.U) > 1e-4  # the weights changed what member 0 learned


LM_CFG = TrainConfig(steps=10, batch_size=8, min_length=16, max_length=16, optimizer="adamw", weight_decay=0.1,
                     decay_1d=False, lr_schedule="cosine", warmup_steps=2, grad_clip=1.0)


def test_compile_falls_back_to_eager_training_where_compiling_fails(monkeypatch):
    def broken(fn):
        def call(*args):
            raise RuntimeError("no C++ compiler here")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    tasks = [build_task("shift", K=2)] * 2
    with pytest.warns(UserWarning, match="training eagerly"):
        got = train_ensemble(transformer(), tasks, [0, 1], replace(LM_CFG, compile=True), progress=False)
    eager = train_ensemble(transformer(), tasks, [0, 1], LM_CFG, progress=False)
    for a, b in zip(got.models, eager.models, strict=True):
        for name, p in a.state_dict().items():
            assert torch.equal(p, b.state_dict()[name]), name


def test_compile_and_crop_padding_are_part_of_a_runs_key_only_when_on():
    from poslab.experiments.experiment import train_fields

    for name in ("compile", "crop_padding"):
        assert name not in train_fields(LM_CFG)
        assert train_fields(replace(LM_CFG, **{name: True}))[name] is True


# ----------------------------------------------------------------------------- crop_padding

def chomsky_model(**kw):
    """Ruoss et al.'s form: a bidirectional encoder with key padding (even_pairs: 41 tokens at L <= 40)."""
    cfg = TransformerConfig(vocab_size=build_task("even_pairs").vocab_size, d_model=16, n_layers=2, n_heads=2,
                            max_len=64, causal=False, **kw)
    return partial(Transformer, cfg)


CROP_CFG = TrainConfig(steps=30, batch_size=8, min_length=1, max_length=40, length_sampling="batch", chunk=10)


@pytest.mark.parametrize("task, causal, randomized", [
    ("even_pairs", False, None), ("copy", True, None),
    ("even_pairs", False, dict(N=128, draw="length")), ("copy", True, dict(N=128, draw="length"))])
def test_a_cropped_batch_gives_the_padded_batchs_loss_and_gradients(task, causal, randomized):
    from poslab.train import cropped

    t = build_task(task)
    cfg = replace(CROP_CFG, length_sampling="batch" if task == "even_pairs" else "sequence", max_length=12)
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=t.vocab_size, d_model=16, n_layers=2, n_heads=2, max_len=128,
                                          causal=causal, random_positions=randomized))
    assert model.padding_inert
    chunk = DataStream(t, 0, cfg).draw()
    cut = 0
    for i in range(cfg.chunk):
        padded = chunk.map(lambda x, i=i: x[i])
        if task == "copy":  # one length per sequence: padded past the longest to show the cut
            padded = padded.map(lambda x: torch.nn.functional.pad(x, (0, 9)) if x.dim() == 2 else x)
        short = cropped(padded, int(padded.lengths.max()))
        cut += padded.tokens.shape[-1] - short.tokens.shape[-1]
        losses, grads = [], []
        for batch in (padded, short):
            model.zero_grad()
            torch.manual_seed(i)  # randomized positions: the same keys for both
            loss = model.loss(batch)
            loss.backward()
            losses.append(loss.detach())
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
        for name, g in grads[0].items():
            assert rel_err(grads[1][name], g) < 1e-5, name
    assert cut > 0  # some step was shorter than the chunk's width


def test_crop_padding_trains_each_member_as_the_padded_run_and_as_the_plain_loop_to_float_rounding():
    task, seeds = build_task("even_pairs"), [0, 1, 2]
    crop = replace(CROP_CFG, crop_padding=True)
    ens = train_ensemble(chomsky_model(), [task] * 3, seeds, crop, progress=False)
    padded = train_ensemble(chomsky_model(), [task] * 3, seeds, CROP_CFG, progress=False)
    plain, losses = train_plain(chomsky_model(), task, 2, crop)
    for name, p in ens.models[2].state_dict().items():
        assert rel_err(p, padded.models[2].state_dict()[name]) < 1e-4, name
        assert rel_err(p, plain.state_dict()[name]) < 1e-5, name
    np.testing.assert_allclose(ens.loss_curve[:, 2], losses, rtol=1e-5)


def test_crop_padding_cuts_each_step_to_its_longest_sequence_and_only_where_the_loss_ignores_padding(monkeypatch):
    from poslab.train import crops

    widths = []
    original = Transformer.loss

    def recording(self, batch):
        widths.append(batch.tokens.shape[-1])
        return original(self, batch)

    monkeypatch.setattr(Transformer, "loss", recording)
    cfg = replace(CROP_CFG, crop_padding=True, steps=10)
    task = build_task("even_pairs")
    train_ensemble(chomsky_model(), [task] * 2, [0, 1], cfg, progress=False)
    # each step's longest sequence over both members (one length per batch and member: L + 1 tokens)
    longest = torch.stack([DataStream(task, s, cfg).draw().lengths[:, 0] for s in (0, 1)]).amax(0)
    assert widths == longest.tolist() and len(set(widths)) > 1
    widths.clear()
    train_ensemble(chomsky_model(), [task] * 2, [0, 1], replace(cfg, crop_padding=False), progress=False)
    assert set(widths) == {41}
    # randomized positions drawn for the padded width, dropout follows the shape: those keep the padding
    for kw in (dict(random_positions=256), dict(dropout=0.1)):
        assert not crops(chomsky_model(**kw)(), cfg)
    assert crops(chomsky_model()(), cfg) and not crops(chomsky_model()(), CROP_CFG)
    assert crops(chomsky_model(random_positions=dict(N=256, draw="length"))(), cfg)  # drawn per length


@pytest.mark.slow  # compiling takes a minute on a loaded 2-core machine
@pytest.mark.parametrize("members", [1, 2])
def test_compiled_training_equals_eager_training_to_float_rounding(members):
    tasks, seeds = [build_task("shift", K=2)] * members, list(range(members))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fast = train_ensemble(transformer(), tasks, seeds, replace(LM_CFG, compile=True), progress=False)
    assert not [w for w in seen if "training eagerly" in str(w.message)]  # else this test would be vacuous
    eager = train_ensemble(transformer(), tasks, seeds, LM_CFG, progress=False)
    for a, b in zip(fast.models, eager.models, strict=True):
        for name, p in a.state_dict().items():
            assert rel_err(p, b.state_dict()[name]) < 1e-4, name
    np.testing.assert_allclose(fast.loss_curve, eager.loss_curve, rtol=1e-5)
