"""``poslab bench lm``: one step of the character LM, poslab's engine against :class:`PlainGPT`,
side by side; the step's matmul FLOPs and this CPU's matmul rate."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch

from poslab.bench.plain import PlainGPT
from poslab.experiments import members as study_members
from poslab.experiments.executors import worker_pool


def _lm_member(preset: str, encoding: str, members: int):
    """The first member of ``poslab run lm``'s group for ``encoding`` (``members`` seeds) and its recipe."""
    from poslab.studies.kit.charlm import lm_study

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
    member for 1 and ``members`` members, with the fused kernel folded over members and with the
    explicit path."""
    _check_bench(encoding, steps, members, rounds)
    member, cfg = _lm_member(preset, encoding, members)
    m, L = member.model_config, cfg.max_length
    poslab_ms = partial(_poslab_ms, preset, encoding, steps, members=members)
    plain_ms = partial(_plain_ms, preset, encoding, steps, members=members)

    arms: dict[str, Callable[[], float]] = {"poslab": poslab_ms, "plain SDPA": plain_ms}
    if compile:
        arms |= {"poslab, train.compile": lambda: poslab_ms(compiled=True),
                 "plain SDPA, torch.compile": lambda: plain_ms(compiled=True)}
    n = min(members, os.cpu_count() or 1)
    stack = contextlib.ExitStack()
    if side_by_side and n > 1:
        arms |= _side_by_side_arms(stack, n, preset, encoding, steps, members)
    times: dict[str, list[float]] = {name: [] for name in arms}
    with stack:
        for _ in range(rounds):
            for name, arm in arms.items():
                times[name].append(arm())
    best = {name: min(t) for name, t in times.items()}
    params = sum(p.numel() for p in member.make_model()().parameters())
    echo(f"lm {preset} ({encoding}, {params:,} parameters, batch {cfg.batch_size} x {L}), {steps} steps x {rounds} "
         f"rounds, {torch.get_num_threads()} thread(s); best round, ratio to the uncompiled plain loop:")
    _echo_rounds(echo, times, best)
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
        per_member[E] = poslab_ms(E=E) / E
        echo(f"ensemble of {E}: {per_member[E] * E:.1f} ms/step = {per_member[E]:.1f} ms per member-step")
    explicit = _explicit_under_vmap(poslab_ms, members, echo) if members > 1 else None
    return dict(ms=best, rounds=times, poslab_ms=best["poslab"], plain_ms=best["plain SDPA"],
                ratio=best["poslab"] / best["plain SDPA"], best_ratio=ratio, best_arm=fastest,
                per_member_ms=per_member, explicit_under_vmap_ms=explicit, step_gflop=flops / 1e9,
                achieved_gflops=achieved, matmul_gflops=peak)


def _check_bench(encoding: str, steps: int, members: int, rounds: int) -> None:
    from poslab.errors import ConfigError

    if encoding not in ("learned", "rope"):
        raise ConfigError("--encoding", encoding, "learned or rope (the plain model writes these two)")
    for field, value in (("--steps", steps), ("--members", members), ("--rounds", rounds)):
        if not (isinstance(value, int) and value >= 1):
            raise ConfigError(field, value, "a positive integer")


def _side_by_side_arms(stack: contextlib.ExitStack, n: int, preset: str, encoding: str, steps: int,
                       members: int) -> dict[str, Callable[[], float]]:
    """The poslab and plain arms run as ``n`` one-member workers started together (pool and barrier
    entered on ``stack``): the wall time of one step over the members training at once."""
    import multiprocessing

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
    return {f"poslab, {layout}": side(False), f"plain SDPA, {layout}": side(True)}


def _echo_rounds(echo, times: dict[str, list[float]], best: dict[str, float]) -> None:
    """One line per arm: its best round, its ratio to the uncompiled plain loop, every round."""
    width = max(map(len, times))
    for name, t in times.items():
        echo(f"  {name:<{width}} {best[name]:7.1f} ms  {best[name] / best['plain SDPA']:5.2f}x   "
             f"(rounds {', '.join(f'{x:.1f}' for x in t)})")


def _explicit_under_vmap(poslab_ms: Callable[..., float], members: int, echo) -> float:
    """ms per member-step of an ensemble of ``members`` with the explicit attention under vmap instead of
    the folded fused kernel."""
    from poslab import attention as attention_module

    saved = attention_module.FUSED_UNDER_VMAP
    attention_module.FUSED_UNDER_VMAP = False
    try:
        explicit = poslab_ms(E=members) / members
    finally:
        attention_module.FUSED_UNDER_VMAP = saved
    echo(f"ensemble of {members}, explicit attention under vmap instead of the folded fused kernel: "
         f"{explicit:.1f} ms per member-step")
    return explicit


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
