"""``poslab bench train``: Table 1 training as ``poslab run`` does it, against a plain loop.

Both sides train the same model on the same batches. The ensemble side trains every (K, seed)
member of an encoding in one vectorized pass over the grid fast path, the encodings' groups in
parallel worker processes exactly as ``poslab run`` schedules them; the plain side trains one
model at a time through the direct forward, in this process, right after. Machines like these
are noisy, so the ratio of the two, measured in one run, is the number to read.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from poslab.experiments import members as study_members
from poslab.experiments.config import apply_overrides
from poslab.experiments.executors import worker_pool
from poslab.experiments.schedule import one_thread, share_out, step_seconds, wall_estimate
from poslab.experiments.training import train_members
from poslab.studies import phenomenon
from poslab.train import train_plain

SCALING_SIZES = (6, 12, 24, 48)  # ensemble sizes bench train times for its fixed + marginal fit


def bench_train(*, steps: int = 4000, plain_steps: int = 200, workers: int | None = None,
                scaling: tuple[int, ...] = SCALING_SIZES, scaling_steps: int = 100, echo=print) -> dict:
    """Table 1's 72 members as its ensembles (one per group key) beside the plain loop, one model at
    a time, on the same cores: the ensembles run in ``workers`` processes of ``cores / workers``
    threads (their wall time, worker start-up included, is measured); the plain loop runs one model
    of each group for ``plain_steps`` steps on all the cores, and its time for every member of the
    group at the preset's steps is projected from that, once before the ensembles and once after,
    so the ratio comes with the spread a noisy machine gives it. ``steps`` below the preset's
    projects the ensembles' wall time in proportion (marked so).

    ``scaling`` (ensemble sizes; empty: skipped) then times each group's ensemble step on one
    thread at those sizes and fits it as fixed + marginal x members (:func:`ensemble_scaling`).
    The marginal cost bounds the engine whatever the shares: with no fixed cost at all, Table 1
    needs members x steps x marginal / workers, and the plain loop over that is the most this
    engine can reach on this machine."""
    paper = phenomenon.study("paper")
    study = apply_overrides(paper, [f"train.steps={steps}"])
    by_label = table1_groups(study)
    everyone = [m for group in by_label.values() for m in group]
    workers = min(workers or os.cpu_count() or 1, len(everyone))
    before = {label: _plain_step_ms(group, study, plain_steps) for label, group in by_label.items()}
    start = time.perf_counter()  # the groups' calibration (step_costs) is part of the wall time
    parts = share_out(list(by_label.values()), workers)  # as `poslab run` shares them out
    pool, threads = worker_pool(workers)
    with pool:
        futures = [pool.submit(train_members, part, desc=f"ensemble x{len(part)}", position=i)
                   for i, part in enumerate(parts)]
        seconds = [f.result().seconds for f in futures]
    wall = time.perf_counter() - start
    full = paper.train.steps  # the Table 1 protocol, whatever --steps timed
    ens_total = wall * full / steps
    member_steps = len(everyone) * steps
    echo(f"ensembles: {len(by_label)} groups, {len(everyone)} members x {steps} steps as {len(parts)} ensembles of "
         f"{'/'.join(str(len(p)) for p in parts)} in {workers} worker(s) x {threads} thread(s): training "
         f"{', '.join(f'{s:.1f} s' for s in seconds)}; {wall:.1f} s wall with worker start-up = "
         f"{wall / member_steps * 1e3:.3f} ms of wall per member-step")
    after = {label: _plain_step_ms(group, study, plain_steps) for label, group in by_label.items()}
    plain = {label: (before[label] + after[label]) / 2 for label in by_label}

    def projected(ms: dict) -> float:  # seconds for every member of every group at the preset's steps
        return sum(ms[label] * full * len(group) / 1e3 for label, group in by_label.items())

    for label, group in by_label.items():
        echo(f"plain loop, {label}: {plain[label]:.3f} ms/step ({before[label]:.3f} before the ensembles, "
             f"{after[label]:.3f} after; {plain_steps} steps each, {torch.get_num_threads()} thread(s)) "
             f"x {len(group)} members")
    plain_total = projected(plain)
    echo(f"Table 1 training ({len(everyone)} members x {full} steps): ensembles {ens_total:.0f} s wall"
         f"{'' if steps == full else ' (projected)'}, plain loop {plain_total:.0f} s (projected), "
         f"speed-up {plain_total / ens_total:.1f}x (plain loop timed before: {projected(before) / ens_total:.1f}x, "
         f"after: {projected(after) / ens_total:.1f}x)")
    out = dict(wall=wall, seconds=seconds, ensemble_total=ens_total, plain_ms=plain, plain_total=plain_total,
               speedup=plain_total / ens_total,
               speedup_range=tuple(sorted((projected(before) / ens_total, projected(after) / ens_total))))
    if scaling:
        out |= _scaling_report(by_label, parts, workers, scaling, scaling_steps, full, plain_total, ens_total, echo)
    return out


def table1_groups(study) -> dict[str, list]:
    """The study's members by group, each group under its label (one ensemble each, as `poslab run`
    trains them)."""
    groups: dict[str, list] = {}
    for m in study_members("bench", study):
        groups.setdefault(m.group_key(), []).append(m)
    return {group[0].group_label: group for group in groups.values()}


def _scaling_report(by_label: dict, parts: list, workers: int, sizes, steps: int, full: int, plain_total: float,
                    ens_total: float, echo) -> dict:
    """bench train's second half: each group's fixed + marginal fit, the training time it predicts for
    ``parts`` (shared out longest first, as the pool hands them out), and the engine's cap."""
    fits = {label: ensemble_scaling(group, sizes, steps) for label, group in by_label.items()}
    for label, fit in fits.items():
        echo(f"ensemble step, {label}, one thread: {fit['fixed_ms']:.2f} ms + {fit['marginal_ms']:.3f} ms "
             f"x members (fit to {', '.join(f'{e}: {ms:.2f}' for e, ms in fit['ms'].items())} ms a step)")
    label_of = {group[0].group_key(): label for label, group in by_label.items()}
    predicted = wall_estimate(parts, workers, lambda part: _cost(fits[label_of[part[0].group_key()]], len(part))) \
        * full / 1e3
    cap = sum(fits[label]["marginal_ms"] * len(group) for label, group in by_label.items()) * full / 1e3 / workers
    echo(f"the fit predicts {predicted:.0f} s of training for these {len(parts)} ensembles on {workers} worker(s) "
         f"(measured above: {ens_total:.0f} s wall with start-up and calibration); with no fixed cost at all, "
         f"every member at its marginal cost, Table 1 needs {cap:.0f} s: at most {plain_total / cap:.1f}x this "
         f"plain loop (40x needs the marginal cost at {plain_total / 40 / cap * 100:.0f}% of the fit's)")
    return dict(scaling=fits, scaling_predicted=predicted, cap_seconds=cap, cap_speedup=plain_total / cap)


def _cost(fit: dict, members: int) -> float:
    return fit["fixed_ms"] + fit["marginal_ms"] * members


def _plain_step_ms(group: list, study, steps: int) -> float:
    """ms a step of one member of ``group`` trained alone by the plain loop (after 10 untimed steps)."""
    make, task = group[0].make_model(), group[0].task
    train_plain(make, task, 0, study.train, steps=10)  # warm-up, not timed
    t0 = time.perf_counter()
    train_plain(make, task, 0, study.train, steps=steps)
    return (time.perf_counter() - t0) / steps * 1e3


def ensemble_scaling(group: list, sizes=SCALING_SIZES, steps: int = 100) -> dict:
    """One group's ensemble step on one thread (as a worker trains) at each size in ``sizes``,
    fitted by least squares as ``fixed_ms + marginal_ms x members``. Members past the group's own
    repeat it (a member's cost does not depend on its seed). Each size trains ``steps`` steps after
    one untimed step, the data drawn as in training (``train.chunk`` steps a draw)."""
    with one_thread():
        ms = {E: float(step_seconds([group[i % len(group)] for i in range(E)], steps).mean()) * 1e3 for E in sizes}
    if len(ms) > 1:
        marginal, fixed = np.polyfit(list(ms), list(ms.values()), 1)
    else:  # one size: no fixed cost can be told apart
        (E, t), = ms.items()
        marginal, fixed = t / E, 0.0
    return dict(ms=ms, fixed_ms=float(fixed), marginal_ms=float(marginal))


# ----------------------------------------------------------------------------- poslab bench lm

def bench_parity(*, device: str = "cpu", members: int = 3, steps: int = 50, echo=print) -> list[dict]:
    """Ensemble = solo on ``device``: Table 1's groups (RoPE, APE; K = 2, ``members`` seeds, ``steps``
    steps of the paper recipe) trained as one ensemble each, and each seed alone, on ``device``. Per
    group: the largest absolute difference of any final weight (0 on CPU: bit for bit; a GPU's
    batched kernels may round otherwise) and of any step's reported loss (the vmapped mean may add
    up in another order even where the weights are bit for bit)."""
    study = apply_overrides(phenomenon.study("paper"), [f"train.steps={steps}", f"seeds={members}", "grid.task.K=[2]",
                                                       "grid.encoding_options.learned.init_std=[0.02]"])
    out = []
    for label, group in table1_groups(study).items():
        ensemble = train_members(group, device=device, progress=False)
        weights = losses = 0.0
        for i, member in enumerate(group):
            solo = train_members([member], device=device, progress=False)
            mine, theirs = ensemble.models[i].state_dict(), solo.models[0].state_dict()
            weights = max(weights, *((mine[k] - theirs[k]).abs().max().item() for k in theirs))
            losses = max(losses, float(np.abs(ensemble.loss_curve[:, i] - solo.loss_curve[:, 0]).max()))
        row = dict(group=label, device=device, members=len(group), steps=steps, max_weight_diff=weights,
                   max_loss_diff=losses, weights_bit_for_bit=weights == 0)
        echo(f"{label} on {device}: {len(group)} members x {steps} steps, ensemble against each alone: "
             f"largest weight difference {weights:.3g}{' (bit for bit)' if weights == 0 else ''}, "
             f"largest loss difference {losses:.3g}")
        out.append(row)
    return out


class PlainGPT(torch.nn.Module):
    """The LM written plainly, for ``bench_lm``: the same layers, widths and parameters as poslab's
    Transformer with ``bias=False`` (pre-LN, GELU MLP, untied readout), nanoGPT-style code with one
    fused q/k/v projection and ``F.scaled_dot_product_attention(is_causal=True)``; positions are
    a learned table added at the input, or RoPE applied to q and k."""

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, context: int, encoding: str):
        super().__init__()
        from torch import nn

        self.h, self.encoding = n_heads, encoding
        self.W_E = nn.Parameter(torch.randn(vocab_size, d_model))
        if encoding == "learned":
            self.W_pos = nn.Parameter(torch.randn(context, d_model))
        d = d_model // n_heads
        theta = 10000.0 ** (-torch.arange(0, d, 2).float() / d)  # [d / 2]
        angle = torch.arange(context)[:, None] * theta  # [s, d / 2]
        self.register_buffer("cos", angle.cos().repeat_interleave(2, -1), persistent=False)  # [s, d]
        self.register_buffer("sin", angle.sin().repeat_interleave(2, -1), persistent=False)
        self.layers = nn.ModuleList(nn.ModuleDict(dict(
            ln_1=nn.LayerNorm(d_model, bias=False), qkv=nn.Linear(d_model, 3 * d_model, bias=False),
            out=nn.Linear(d_model, d_model, bias=False), ln_2=nn.LayerNorm(d_model, bias=False),
            mlp=nn.Sequential(nn.Linear(d_model, 4 * d_model, bias=False), nn.GELU(),
                              nn.Linear(4 * d_model, d_model, bias=False)))) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.U = nn.Linear(d_model, vocab_size, bias=False)

    def _rope(self, x):  # x [b, h, s, d], pairs (2i, 2i + 1) rotated by angle s theta_i
        s = x.shape[-2]
        pair = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
        return x * self.cos[:s] + pair * self.sin[:s]

    def forward(self, tokens):
        b, s = tokens.shape
        x = torch.nn.functional.embedding(tokens, self.W_E)
        if self.encoding == "learned":
            x = x + self.W_pos[:s]
        for layer in self.layers:
            q, k, v = layer["qkv"](layer["ln_1"](x)).view(b, s, 3, self.h, -1).permute(2, 0, 3, 1, 4)
            if self.encoding == "rope":
                q, k = self._rope(q), self._rope(k)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + layer["out"](o.transpose(1, 2).reshape(b, s, -1))
            x = x + layer["mlp"](layer["ln_2"](x))
        return self.U(self.ln_f(x))


def _lm_member(preset: str, encoding: str, members: int):
    """The first member of ``poslab run lm``'s group for ``encoding`` (``members`` seeds) and its recipe."""
    from poslab.studies.lm import lm_study

    study = lm_study(preset, encodings=(encoding,), seeds=members)
    return study_members("bench", study)[0], study.train


def _poslab_ms(preset: str, encoding: str, steps: int, *, members: int = 1, E: int = 1, compiled: bool = False,
               warm: int = 3) -> float:
    """ms per step of the ensemble trainer on ``E`` members as ``poslab run lm`` trains them (the
    first ``warm`` steps not timed)."""
    from poslab.train import train_ensemble

    member, cfg = _lm_member(preset, encoding, members)
    result = train_ensemble(member.make_model(), [member.task] * E, list(range(E)),
                            replace(cfg, steps=steps + warm, warmup_steps=0, compile=compiled), progress=False)
    assert result.step_ends is not None
    return (result.step_ends[-1] - result.step_ends[warm - 1]) / steps * 1e3


def _plain_ms(preset: str, encoding: str, steps: int, *, members: int = 1, compiled: bool = False,
              warm: int = 3) -> float:
    """ms per step of :class:`PlainGPT` in a plain loop as nanoGPT's (uncompiled unless
    ``compiled``; AdamW, the schedule and the gradient clip of the recipe), on the same batches."""
    import torch.nn.functional as F

    from poslab.train import DataStream, _optimizer, _set_lr

    member, cfg = _lm_member(preset, encoding, members)
    m = member.model_config
    torch.manual_seed(0)
    model = PlainGPT(m.vocab_size, m.d_model, m.n_layers, m.n_heads, cfg.max_length, encoding)
    forward = torch.compile(model) if compiled else model
    opt = _optimizer(dict(model.named_parameters()), cfg)
    stream = DataStream(member.task, 0, cfg)
    for step in range(steps + warm):
        if step == warm:
            start = time.perf_counter()
        batch = stream.next()
        loss = F.cross_entropy(forward(batch.tokens).flatten(0, 1), batch.targets.flatten())
        opt.zero_grad(set_to_none=True)
        _set_lr(opt, cfg, step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
    return (time.perf_counter() - start) / steps * 1e3


def _side_by_side_child(plain: bool, preset: str, encoding: str, steps: int, members: int, barrier) -> float:
    """In a pool worker: warm up, wait for the other workers, then time one member's steps."""
    arm = _plain_ms if plain else _poslab_ms
    arm(preset, encoding, 2, members=members)  # imports, allocator and kernels warm before the barrier
    barrier.wait()
    return arm(preset, encoding, steps, members=members)


def bench_lm(*, steps: int = 100, members: int = 2, encoding: str = "learned", preset: str = "paper",
             rounds: int = 3, compile: bool = True, side_by_side: bool = True, echo=print) -> dict:
    """The LM training step as ``poslab run lm`` takes it (the ensemble trainer, one member) beside
    the plain model above in a plain loop (nanoGPT's CPU recipe: uncompiled, one process on every
    core), same recipe and batches, interleaved ``rounds`` times (the best time of each arm counts;
    the first steps of every run are not timed). With ``compile`` also the trainer with
    ``train.compile`` and the plain model under ``torch.compile``. With ``side_by_side`` the thread
    layout ``poslab run lm`` gives a sweep on CPU: one member per core in worker processes of one
    thread each, started together, its cost per member-step the wall time of one step over the
    members training at once (1 / sum of their steps per ms); and as the control the plain loop in
    the same layout, so the ratio says what the layout buys and what poslab's step does. The
    ratio's baseline stays the uncompiled plain loop on every core. Then the ensemble's cost per
    member for 1 and ``members`` members, with the fused kernel looped under vmap and with the
    explicit path."""
    import multiprocessing

    from poslab import attention as attention_module
    from poslab.errors import ConfigError

    if encoding not in ("learned", "rope"):
        raise ConfigError("--encoding", encoding, "learned or rope (the plain model writes these two)")
    for field, value in (("--steps", steps), ("--members", members), ("--rounds", rounds)):
        if not (isinstance(value, int) and value >= 1):
            raise ConfigError(field, value, "a positive integer")
    member, cfg = _lm_member(preset, encoding, members)
    m, L = member.model_config, cfg.max_length
    run = dict(preset=preset, encoding=encoding, members=members)

    arms: dict[str, Callable[[], float]] = {"poslab": lambda: _poslab_ms(steps=steps, **run),
                                           "plain SDPA": lambda: _plain_ms(steps=steps, **run)}
    if compile:
        arms |= {"poslab, train.compile": lambda: _poslab_ms(steps=steps, compiled=True, **run),
                 "plain SDPA, torch.compile": lambda: _plain_ms(steps=steps, compiled=True, **run)}
    cores = os.cpu_count() or 1
    n = min(members, cores)
    stack = contextlib.ExitStack()
    if side_by_side and n > 1:
        pool, threads = worker_pool(n)
        stack.enter_context(pool)
        barrier = stack.enter_context(multiprocessing.get_context("spawn").Manager()).Barrier(n)

        def side(plain: bool) -> Callable[[], float]:
            def arm() -> float:
                futures = [pool.submit(_side_by_side_child, plain, preset, encoding, steps, members, barrier)
                           for _ in range(n)]
                return 1.0 / sum(1.0 / f.result() for f in futures)
            return arm
        layout = f"{n} side by side x {threads} thread(s), per member-step"
        arms |= {f"poslab, {layout}": side(False), f"plain SDPA, {layout}": side(True)}
    times: dict[str, list[float]] = {name: [] for name in arms}
    with stack:
        for _ in range(rounds):
            for name, arm in arms.items():
                times[name].append(arm())
    best = {name: min(t) for name, t in times.items()}
    params = sum(p.numel() for p in member.make_model()().parameters())
    echo(f"lm {preset} ({encoding}, {params:,} parameters, batch {cfg.batch_size} x {L}), {steps} steps x {rounds} "
         f"rounds, {torch.get_num_threads()} thread(s); best round, ratio to the uncompiled plain loop:")
    width = max(map(len, times))
    for name, t in times.items():
        echo(f"  {name:<{width}} {best[name]:7.1f} ms  {best[name] / best['plain SDPA']:5.2f}x   "
             f"(rounds {', '.join(f'{x:.1f}' for x in t)})")
    fastest = min((n for n in best if n.startswith("poslab")), key=best.__getitem__)
    ratio = best[fastest] / best["plain SDPA"]
    echo(f"poslab's best ({fastest}): {ratio:.2f}x the plain loop's ms per member-step (target <= 0.85x)")
    flops = lm_step_flops(m, cfg.batch_size, L)
    peak = matmul_gflops()
    achieved = flops / best["poslab"] * 1e3 / 1e9
    echo(f"one member's step: {flops / 1e9:.2f} GFLOP = "
         f"{achieved:.0f} GFLOP/s, against {peak:.0f} GFLOP/s for a 1024^3 matmul on {torch.get_num_threads()} "
         f"thread(s) here ({achieved / peak:.0%}): an ensemble can only save what one member leaves idle")
    per_member = {}
    for E in sorted({1, members}):
        per_member[E] = _poslab_ms(steps=steps, E=E, **run) / E
        echo(f"ensemble of {E}: {per_member[E] * E:.1f} ms/step = {per_member[E]:.1f} ms per member-step")
    explicit = None
    if members > 1:
        saved = attention_module.FUSED_UNDER_VMAP
        attention_module.FUSED_UNDER_VMAP = False
        try:
            explicit = _poslab_ms(steps=steps, E=members, **run) / members
        finally:
            attention_module.FUSED_UNDER_VMAP = saved
        echo(f"ensemble of {members}, explicit attention under vmap instead of the looped fused kernel: "
             f"{explicit:.1f} ms per member-step")
    return dict(ms=best, rounds=times, poslab_ms=best["poslab"], plain_ms=best["plain SDPA"],
                ratio=best["poslab"] / best["plain SDPA"], best_ratio=ratio, best_arm=fastest,
                per_member_ms=per_member, explicit_under_vmap_ms=explicit, step_gflop=flops / 1e9,
                achieved_gflops=achieved, matmul_gflops=peak)


def lm_step_flops(m, batch_size: int, L: int) -> float:
    """Floating-point operations of one training step of the causal LM ``m`` (a TransformerConfig):
    forward + backward = 3 forwards, a forward = 2 x multiply-adds:

        6 T (n_layers (4 D^2 + 2 D F) + m D)  +  12 n_layers b L^2 D      (T = b L tokens, F MLP width)

    the second term being q k^T and weights @ v over the full L x L square. Embedding lookups and
    element-wise work are not counted. (torch's own flop counter agrees on the explicit attention
    path, tests/experiments/test_lm.py, but does not count the fused CPU attention kernel.)"""
    T, D = batch_size * L, m.d_model
    matrices = m.n_layers * (4 * D * D + 2 * D * m.mlp_width) + m.vocab_size * D
    return 6 * T * matrices + 12 * m.n_layers * batch_size * L * L * D


def matmul_gflops(n: int = 1024, repeats: int = 10) -> float:
    """This process's float32 matmul rate at its current thread count (best of ``repeats``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


# ----------------------------------------------------------------------------- poslab bench floor

def step_flops(model, batches) -> float:
    """Mean matmul FLOPs of one training step of ``model`` (forward and backward of ``model.loss``)
    over ``batches``, by torch's FlopCounterMode: matmuls and attention kernels it knows;
    element-wise work, gathers and the optimizer are not counted, so this is a lower bound."""
    from torch.utils.flop_counter import FlopCounterMode

    total, n = 0.0, 0
    for batch in batches:
        with FlopCounterMode(display=False) as counter:
            model.loss(batch).backward()
        total, n = total + counter.get_total_flops(), n + 1
    return total / max(n, 1)


def bench_floor(experiments: tuple[str, ...] = ("all",), *, preset: str = "paper", batches: int = 10,
                echo=print) -> dict:
    """The arithmetic floor of training ``experiments`` at ``preset`` on this machine: each trained
    group's matmul FLOPs per member-step (mean over ``batches`` of its first member's own batches)
    x members x steps, over this process's float32 matmul rate on all its threads. No schedule
    trains them faster; evaluation, element-wise work and per-op overheads come on top."""
    from poslab.studies import PAPER_STUDIES, get_experiment
    from poslab.train import DataStream, build_member

    names = [n for e in experiments for n in (PAPER_STUDIES if e == "all" else (e,))]
    exps = {n: get_experiment(n) for n in names}  # an unknown name stops here, before any work
    rate = matmul_gflops() * 1e9
    rows, total = [], 0.0
    for name, exp in exps.items():
        if exp.run is not None:
            echo(f"{name}: trains nothing (a pretrained checkpoint), skipped")
            continue
        groups: dict[str, list] = {}
        for m in study_members(name, exp.study(preset)):
            if m.variant is None:  # evaluate-only variants train nothing
                groups.setdefault(m.group_key(), []).append(m)
        flops = 0.0
        for group in groups.values():
            first, cfg = group[0], group[0].study.train
            stream = DataStream(first.task, first.seed, cfg)
            per_step = step_flops(build_member(first.make_model(), first.seed), (stream.next() for _ in range(batches)))
            flops += per_step * cfg.steps * len(group)
        rows.append(dict(experiment=name, groups=len(groups), members=sum(map(len, groups.values())), flops=flops,
                         floor_s=flops / rate))
        total += flops
        echo(f"{name}: {rows[-1]['members']} trained members in {len(groups)} group(s), {flops / 1e12:.3f} TFLOP of "
             f"matmuls: at least {flops / rate:.0f} s")
    echo(f"all of them: {total / 1e12:.2f} TFLOP at {rate / 1e9:.1f} GFLOP/s (float32 1024^3 matmul, "
         f"{torch.get_num_threads()} thread(s)): at least {total / rate:.0f} s of training")
    return dict(rows=rows, flops=total, gflops=rate / 1e9, floor_s=total / rate)


# ----------------------------------------------------------------------------- poslab bench eval

MMAP_THRESHOLD = 131072  # bytes: the evaluation children's fixed glibc mmap threshold


def start_measured(ctx, target, args):
    """Start ``target(*args)`` in a fresh ``ctx`` process whose peak memory is its working set.

    glibc's dynamic mmap threshold otherwise lets freed chunk buffers pile up on the heap (a
    bounded growth, some 30 MiB, that reads as if memory grew with L); the child starts with a
    fixed one, ``MMAP_THRESHOLD``, and this process's environment is left as it was."""
    proc = ctx.Process(target=target, args=args)
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    try:
        proc.start()
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    return proc


def _eval_child(cfg, state, L: int, n: int, key_chunk: int, K: int, queue) -> None:
    """In a fresh process: peak RSS growth and time of one streamed evaluation at length L."""
    import resource

    import torch

    from poslab.models.retrieval_head import RetrievalHead
    from poslab.probes.streaming import StreamedTokens, stream_length_row

    torch.set_num_threads(1)
    model = RetrievalHead(cfg)
    model.load_state_dict(state)
    model.eval()
    warm = StreamedTokens(b=n, m=cfg.vocab_size, L=2 * key_chunk, seed=1, chunk=key_chunk)
    stream_length_row(model, warm, 2 * key_chunk, K, key_chunk=key_chunk)  # allocator and kernels warm
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    row = stream_length_row(model, StreamedTokens(b=n, m=cfg.vocab_size, L=L, chunk=key_chunk), L, K,
                            key_chunk=key_chunk)
    seconds = time.perf_counter() - start
    queue.put(dict(row, length=L, seconds=seconds,
                   peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   growth_mib=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024))


def bench_eval(*, lengths=(1_000, 10_000, 100_000, 1_000_000), n_sequences: int = 16, key_chunk: int = 4096,
               steps: int = 1000, K: int = 2, figure=None, echo=print) -> list[dict]:
    """Train one RoPE retrieval head (Table 1 model, K = 2), then evaluate it streamed at each length,
    each in a fresh process (so its peak resident memory is its own); with ``figure`` also draw
    accuracy and peak height against L beside the dilution law 1/a* = c (L - 1) + b fitted on
    L <= 48 by the ordinary (unchunked) evaluation."""
    import multiprocessing

    import numpy as np

    from poslab import probes
    from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
    from poslab.tasks import build_task, eval_batch
    from poslab.train import TrainConfig, train_ensemble

    cfg = RetrievalHeadConfig(vocab_size=20, d_model=64, encoding="rope", max_len=48)
    task = build_task("fixed_offset", m=20, K=K)
    t0 = time.perf_counter()
    trained = train_ensemble(lambda: RetrievalHead(cfg), [task], [0], TrainConfig(steps=steps), progress=False)
    model = trained.models[0].eval()
    echo(f"trained a RoPE head (d=64, m=20, K={K}, {steps} steps) in {time.perf_counter() - t0:.1f} s")
    short = (12, 16, 20, 24, 32, 40, 48)
    a_short, acc_short = [], []
    for L in short:
        acc, attn = probes.accuracy_and_attention(model, eval_batch(task, L, 1024, 0))
        a_short.append(probes.attention_at_offset(attn[0], L, -K))
        acc_short.append(acc)
    fit = probes.dilution_fit(short, a_short)
    echo(f"dilution law fitted on L <= 48: 1/a* = {fit['slope']:.4f} (L - 1) + {fit['intercept']:.3f}, "
         f"R^2 {fit['r2']:.3f}; unchunked accuracy at L = {', '.join(map(str, short))}: "
         f"{', '.join(f'{a:.3f}' for a in acc_short)}")
    ctx = multiprocessing.get_context("spawn")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows = []
    echo(f"{'length':>9} {'seconds':>8} {'peak RSS MiB':>13} {'growth MiB':>11} {'accuracy':>9} {'peak':>7} "
         f"{'a*':>9} {'a* (law)':>9}   (n={n_sequences} sequences, key chunk {key_chunk}, 1 thread, "
         f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD})")
    for L in lengths:
        queue = ctx.Queue()
        proc = start_measured(ctx, _eval_child, (cfg, state, L, n_sequences, key_chunk, K, queue))
        row = queue.get()
        proc.join()
        row["a_star_law"] = 1 / (fit["slope"] * (L - 1) + fit["intercept"])
        rows.append(row)
        echo(f"{L:>9} {row['seconds']:>8.2f} {row['peak_mib']:>13.1f} {row['growth_mib']:>11.1f} "
             f"{row['accuracy']:>9.3f} {row['peak_height']:>7.4f} {row['a_star']:>9.2e} {row['a_star_law']:>9.2e}")
    if figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from poslab.experiments.outputs import save

        Ls = np.array([r["length"] for r in rows], dtype=float)
        grid = np.geomspace(min(short), max(Ls), 200)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
        a1.semilogx(short, acc_short,
                    "o-", label="measured (unchunked)")
        a1.semilogx(Ls, [r["accuracy"] for r in rows], "s-", label="measured (streamed)")
        a1.axhline(1 / 20, color="grey", ls=":", lw=1, label="chance")
        a1.set(xlabel="evaluation length L", ylabel="accuracy", title=f"RoPE, K = {K}: accuracy", ylim=(-0.02, 1.02))
        a1.legend(fontsize=8)
        a2.loglog(short, a_short, "o", label="a* measured (unchunked)")
        a2.loglog(Ls, [r["peak_height"] for r in rows], "s", label="peak height (streamed)")
        a2.loglog(Ls, [r["a_star"] for r in rows], "x", label="a* (streamed)")
        a2.loglog(grid, 1 / (fit["slope"] * (grid - 1) + fit["intercept"]), "-", color="grey",
                  label="dilution law 1/(c(L-1)+b), fit L<=48")
        a2.set(xlabel="evaluation length L", ylabel="attention weight", title="peak height vs the dilution law")
        a2.legend(fontsize=8)
        echo(f"wrote {save(fig, figure)}")
    return rows


# ----------------------------------------------------------------------------- poslab bench eval --model lm

def _peak_since_reset() -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB; write "5" to /proc/self/clear_refs first to reset the high-water mark."""
    with open("/proc/self/status") as f:
        status = f.read()
    return tuple(int(status.split(f"{key}:")[1].split()[0]) / 1024 for key in ("VmRSS", "VmHWM"))


def _eval_lm_child(cfg, state, L: int, chunk: int, memory_limit: int, device: str, queue) -> None:
    """In a fresh process: time and peak RSS of the streamed position-wise loss at length L."""
    import torch

    from poslab.models.transformer import Transformer
    from poslab.probes.lm_streaming import positionwise_loss, text_window

    torch.set_num_threads(1)
    model = Transformer(cfg)
    model.load_state_dict(state)
    model.eval().to(device)
    tokens, source = text_window(None, L)
    positionwise_loss(model, text_window(None, 2 * chunk)[0], chunk=chunk, memory_limit=memory_limit)  # warm
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark restarts at the current resident size (Linux >= 4.0)
    before, _ = _peak_since_reset()
    start = time.perf_counter()
    out = positionwise_loss(model, tokens, chunk=chunk, memory_limit=memory_limit, device=device)
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    _, peak = _peak_since_reset()
    queue.put(dict(length=L, seconds=seconds, peak_mib=peak, growth_mib=peak - before, loss=out.loss,
                   accuracy=out.accuracy, source=source, storage=out.storage,
                   last_bucket=out.rows()[-1], buckets=out.rows()))


def bench_eval_lm(*, lengths=(1_000, 10_000, 30_000), steps: int = 200, chunk: int = 512, encoding: str = "rope",
                  device: str = "cpu", extrapolate_to: int = 1_000_000, figure: Path | None = None,
                  echo=print) -> dict:
    """Position-wise loss of the paper-preset character LM (4 layers, width 128, context 64; trained
    ``steps`` steps of its recipe, 0: random weights) on one TinyShakespeare window per length,
    streamed, each length in a fresh process: wall time and peak resident memory. On CPU the stream
    and keys go to scratch files (memory_limit 0), so memory is bounded whatever L is. Reports the
    time exponent between the two longest lengths and extrapolates seconds = a L^2, a from the
    longest, to ``extrapolate_to`` (not run unless it is one of the lengths). ``figure``: loss per
    log-spaced position bucket for each length, and time and peak memory against length."""
    import multiprocessing

    import numpy as np

    from poslab.experiments import members
    from poslab.studies.lm import EXPERIMENT as LM
    from poslab.studies.lm import lm_study
    from poslab.train import train_ensemble

    study = lm_study("paper", encodings=(encoding,), seeds=1,
                     train=dict(steps=max(steps, 1), warmup_steps=min(100, steps // 2)))
    member = members(LM, study)[0]
    t0 = time.perf_counter()
    if steps > 0:
        model = train_ensemble(member.make_model(), [member.task], [0], study.train, progress=False).models[0]
        echo(f"trained the paper-preset LM ({encoding}, {steps} steps of its recipe) in "
             f"{time.perf_counter() - t0:.1f} s")
    else:
        torch.manual_seed(0)
        model = member.make_model()()
        echo(f"the paper-preset LM ({encoding}), randomly initialised")
    cfg = model.cfg
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    memory_limit = 0 if device == "cpu" else 16 << 30
    ctx = multiprocessing.get_context("spawn")
    echo(f"{'length':>9} {'seconds':>9} {'peak RSS MiB':>13} {'growth MiB':>11} {'loss':>7} {'last bucket':>22} "
         f"  (chunk {chunk}, 1 thread, {device}, {'scratch files' if memory_limit == 0 else 'device tensors'}, "
         f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}; growth = peak over the evaluation minus resident before it)")
    rows = []
    for L in lengths:
        queue = ctx.Queue()
        proc = start_measured(ctx, _eval_lm_child, (cfg, state, L, chunk, memory_limit, device, queue))
        row = queue.get()
        proc.join()
        rows.append(row)
        b = row["last_bucket"]
        last = f"[{b['bucket_start']}, {b['bucket_end']}] {b['loss']:.3f}"
        echo(f"{L:>9} {row['seconds']:>9.2f} {row['peak_mib']:>13.1f} {row['growth_mib']:>11.1f} {row['loss']:>7.3f} "
             f"{last:>22}  {row['source']}")
    # The L^2 law anchored at the longest run: exact causal attention is quadratic, and the per-token
    # work (embedding, projections, MLP, readout) only makes an extrapolation from there an over-estimate.
    longest = max(rows, key=lambda r: r["length"])
    a = longest["seconds"] / longest["length"] ** 2
    fit = dict(a=a, exponent=float("nan"), extrapolated_seconds=a * extrapolate_to ** 2)
    if len(rows) >= 2:
        (L1, s1), (L2, s2) = sorted((r["length"], r["seconds"]) for r in rows)[-2:]
        fit["exponent"] = float(np.log(s2 / s1) / np.log(L2 / L1))
    ran = extrapolate_to in {r["length"] for r in rows}
    echo(f"time law: seconds ~ L^{fit['exponent']:.2f} between the two longest lengths; seconds = {a:.3e} L^2 "
         f"at L = {longest['length']:,}; at L = {extrapolate_to:,}: {fit['extrapolated_seconds']:,.0f} s = "
         f"{fit['extrapolated_seconds'] / 3600:.1f} h on this {device} "
         f"({'measured above' if ran else 'extrapolated, not run'})")
    if figure is not None:
        _lm_eval_figure(rows, fit, encoding, steps, figure)
        echo(f"wrote {figure}")
    return dict(rows=rows, fit=fit, encoding=encoding, steps=steps, chunk=chunk, device=device)


def _lm_eval_figure(rows: list[dict], fit: dict, encoding: str, steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from poslab.experiments.outputs import save

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for row in sorted(rows, key=lambda r: r["length"]):
        buckets = [b for b in row["buckets"] if b["bucket_end"] >= 1]  # log axis: from position 1
        left.plot([(b["bucket_start"] + b["bucket_end"]) / 2 for b in buckets], [b["loss"] for b in buckets],
                  marker=".", label=f"L = {row['length']:,}")
    left.set(xscale="log", xlabel="position (log-spaced buckets)", ylabel="loss (nats)",
             title=f"{encoding} LM ({steps} steps at context 64): loss by position")
    left.legend(fontsize=7)
    lengths = [r["length"] for r in rows]
    right.loglog(lengths, [r["seconds"] for r in rows], "o-", label="seconds (measured)")
    grid = np.geomspace(min(lengths), max(max(lengths), 1_000_000), 50)
    right.loglog(grid, fit["a"] * grid ** 2, ":", color="grey", label="a L^2 (from the longest run)")
    twin = right.twinx()
    twin.plot(lengths, [r["peak_mib"] for r in rows], "s--", color="C3", label="peak RSS MiB")
    twin.set(ylabel="peak RSS (MiB)", ylim=(0, 1.5 * max(r["peak_mib"] for r in rows)))
    right.set(xlabel="length L", ylabel="seconds", title="streamed evaluation: time and memory")
    right.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="lower right")
    save(fig, path)


# ----------------------------------------------------------------------------- where a study's time goes

# The phases of one study, in the order they first happen. The trainer and the runner time them
# with perf_counter spans at their boundaries (train.PhaseTimer); spans never nest, so the phases
# never count a second twice; "other" is the wall time no span covers (the loss curve, progress
# bars, Python between the spans).
PHASES = ("setup", "sampling", "forward", "backward", "optimizer", "evaluation", "variants", "store",
          "tables and figures")
TRAINING = ("sampling", "forward", "backward", "optimizer")


def bench_profile(experiment: str = "phenomenon", *, preset: str = "paper", overrides: tuple[str, ...] = (),
                  device: str = "cpu", echo=print) -> dict:
    """Run one study inline (one process, its groups one after another) in a fresh temporary
    store, and split its wall time into PHASES: seconds, share of the wall time, and ms per
    member-step (trained members x steps; for the evaluation phases, their cost spread over
    the same member-steps). The spans read the clock only: the run computes what it computes
    untimed (tests/test_train.py)."""
    import tempfile

    from poslab.errors import ConfigError
    from poslab.experiments import run_study, validate
    from poslab.experiments.config import apply_overrides
    from poslab.experiments.executors import Inline
    from poslab.store import Store
    from poslab.studies import get_experiment
    from poslab.train import PhaseTimer

    exp = get_experiment(experiment)
    if exp.run is not None:
        raise ConfigError("experiment", experiment, "a study that trains members (this one only evaluates "
                                                    "a pretrained checkpoint)")
    study = apply_overrides(exp.study(preset), list(overrides), fixed=exp.fixed)
    trained = validate(study, device, exp)
    timer = PhaseTimer(sync=torch.cuda.synchronize if device == "cuda" else None)
    with tempfile.TemporaryDirectory(prefix="poslab-profile-") as tmp, Store(Path(tmp) / "s.sqlite") as store:
        start = time.perf_counter()
        summary = run_study(exp, study, store=store, out=Path(tmp) / "out", device=device, progress=False,
                            executor=Inline(), timer=timer)
        wall = time.perf_counter() - start
    seconds = {phase: timer.seconds.get(phase, 0.0) for phase in PHASES}
    seconds["other"] = wall - sum(seconds.values())
    member_steps = len(trained) * study.train.steps
    rows = [dict(phase=p, seconds=s, share=s / wall, ms_per_member_step=1e3 * s / member_steps)
            for p, s in seconds.items()]
    rows.append(dict(phase="wall", seconds=wall, share=1.0, ms_per_member_step=1e3 * wall / member_steps))
    echo(f"{experiment} --preset {preset}{''.join(f' --set {o}' for o in overrides)}: {len(trained)} trained "
         f"members x {study.train.steps} steps = {member_steps:,} member-steps, {summary['variants']} "
         f"evaluate-only variants; inline on {device}, {torch.get_num_threads()} thread(s)")
    echo(f"  {'phase':<20} {'seconds':>9} {'share':>7} {'ms/member-step':>15}")
    for r in rows:
        echo(f"  {r['phase']:<20} {r['seconds']:9.2f} {100 * r['share']:6.1f}% {r['ms_per_member_step']:15.4f}")
    return dict(experiment=experiment, preset=preset, wall=wall, members=len(trained), steps=study.train.steps,
                member_steps=member_steps, rows=rows)


def bench_pretrained(*, model: str = "smollm2-135m", lengths=(2048,), threads: int = 1, echo=print) -> list[dict]:
    """The position-wise loss of a pretrained checkpoint (``token_losses``: its body once, readout
    and loss in chunks) beside the checkpoint's own forward (full logits) at each length, one
    window of text, ``threads`` threads: seconds and peak resident memory added, side by side in
    one run (this machine is noisy: read the ratio)."""
    from poslab.errors import ConfigError
    from poslab.pretrained import encode_text, load
    from poslab.studies.kit.checkpoints import checkpoint_source
    from poslab.tasks.text import CharText

    torch.set_num_threads(threads)
    source = checkpoint_source(model)
    lm = load(source.path if source.kind != "hub" else source.name)
    ids = encode_text(lm, CharText(split="val").text)
    rows = []
    for L in lengths:
        if ids.numel() < L:
            raise ConfigError("--lengths", L, f"at most {ids.numel()} (the validation split's tokens)")
        tokens = ids[:L][None]
        got = {}
        for name, fn in (("forward", lambda t=tokens: lm(t)), ("token_losses", lambda t=tokens: lm.token_losses(t))):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            rss0, _ = _peak_since_reset()
            start = time.perf_counter()
            with torch.no_grad():
                fn()
            got[name] = (time.perf_counter() - start, _peak_since_reset()[1] - rss0)
        row = dict(length=L, threads=threads, forward_s=got["forward"][0], losses_s=got["token_losses"][0],
                   ratio=got["token_losses"][0] / got["forward"][0], forward_peak_mib=got["forward"][1],
                   losses_peak_mib=got["token_losses"][1])
        rows.append(row)
        echo(f"L={L:,}: forward {row['forward_s']:.1f} s (+{row['forward_peak_mib']:.0f} MiB peak), "
             f"token_losses {row['losses_s']:.1f} s (+{row['losses_peak_mib']:.0f} MiB peak): "
             f"{row['ratio']:.2f}x the forward's time, {threads} thread(s)")
    return rows


# ----------------------------------------------------------------------------- leakage memory

def _leakage_child(model: str, config: dict, queue) -> None:
    from poslab.pretrained.model import encode_text
    from poslab.studies.kit.checkpoints import checkpoint_source, loaded, source_path
    from poslab.studies.pretrained_leakage import evaluate_mode
    from poslab.tasks.text import CharText

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    lm = loaded(source_path(checkpoint_source(model)), "float32", "cpu")
    loaded_at = time.perf_counter() - t0
    rows = evaluate_mode(lm, encode_text(lm, CharText(**config["text"]).text), config)
    queue.put(dict(load_s=loaded_at, seconds=time.perf_counter() - t0, rows=len(rows)))


def bench_leakage_memory(*, model: str = "smollm2-135m", length: int = 512, windows: int = 4, groups: int = 2,
                         bos: str = "with BOS", echo=print) -> dict:
    """Peak RSS of one pretrained-leakage worker: one (checkpoint, mode) job of the study
    (:func:`poslab.studies.pretrained_leakage.evaluate_mode`, every variant and swap of the mode) in
    a fresh process, read from the kernel's high-water mark of that child (``ru_maxrss``), beside
    the study's estimate (``worker_bytes``) that decides how many workers run side by side."""
    import multiprocessing as mp
    import resource

    from poslab.pretrained.loading import read_config
    from poslab.studies import pretrained_leakage as pl
    from poslab.studies.kit.checkpoints import checkpoint_source

    study = pl.study("quick")
    config = dict(study.model, checkpoint=model, name=model, length=length, windows=windows, groups=groups, bos=bos,
                  window=64, text=dict(study.task))
    estimate = pl.worker_bytes(length, read_config(checkpoint_source(model)))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_leakage_child, args=(model, config, queue))
    child.start()
    got = queue.get()
    child.join()
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kilobytes on Linux
    out = dict(model=model, length=length, windows=windows, groups=groups, bos=bos, peak_gib=peak / 2**30,
               estimate_gib=estimate / 2**30, **got)
    echo(f"pretrained-leakage worker, {model}, {bos}, {windows} windows of {length} tokens in {groups} groups: "
         f"peak RSS {out['peak_gib']:.2f} GiB (estimate {out['estimate_gib']:.2f} GiB), "
         f"{out['seconds']:.0f} s ({out['load_s']:.0f} s loading)")
    return out
