"""``poslab bench train``: Table 1 training as ``poslab run`` does it, against a plain loop.

Both sides train the same model on the same batches. The ensemble side trains every (K, seed)
member of an encoding in one vectorized pass over the grid fast path, the encodings' groups in
parallel worker processes exactly as ``poslab run`` schedules them; the plain side trains one
model at a time through the direct forward, as a user runs a sweep of plain loops on this
machine: one process per core, one thread each, side by side (as ``poslab bench lm`` times its
sweep), before the ensembles and after. Machines like these are noisy, so the ratio of the two,
measured in one run, is the number to read. Then each ensemble's step as fixed + marginal cost
per member (:func:`ensemble_scaling`).
"""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np

from poslab.experiments import members as study_members
from poslab.experiments.config import apply_overrides
from poslab.experiments.executors import worker_pool
from poslab.experiments.schedule import one_thread, share_out, step_seconds, wall_estimate
from poslab.experiments.training import train_members
from poslab.studies import DEFAULTS, get_experiment
from poslab.train import train_plain

SCALING_SIZES = (6, 12, 24, 48)  # ensemble sizes bench train times for its fixed + marginal fit


def bench_train(*, steps: int = 4000, plain_steps: int = 200, workers: int | None = None,
                scaling: tuple[int, ...] = SCALING_SIZES, scaling_steps: int = 100, echo=print) -> dict:
    """Table 1's 72 members as its ensembles (one per group key) beside the plain loop, one model at
    a time, on the same cores: the ensembles run in ``workers`` processes of ``cores / workers``
    threads (their wall time, worker start-up included, is measured); the plain loop runs as a
    sweep of plain loops is run here, ``workers`` processes of ``cores / workers`` threads side by
    side, each training one member of a group for ``plain_steps`` steps (started together after
    their warm-up; a member-step costs the wall time of one step over the members training at
    once, 1 / sum of their steps per ms), and its time for every member of the group at the
    preset's steps is projected from that, once before the ensembles and once after, so the ratio
    comes with the spread a noisy machine gives it. Both sides are also given as member-steps per
    second. ``steps`` below the preset's projects the ensembles' wall time in proportion (marked so).

    ``scaling`` (ensemble sizes; empty: skipped) then times each group's ensemble step on one
    thread at those sizes and fits it as fixed + marginal x members (:func:`ensemble_scaling`).
    The marginal cost bounds the engine whatever the shares: with no fixed cost at all, Table 1
    needs members x steps x marginal / workers, and the plain loop over that is the most this
    engine can reach on this machine."""
    paper = get_experiment(DEFAULTS["bench"]).study("paper")  # Table 1's study
    study = apply_overrides(paper, [f"train.steps={steps}"])
    by_label = table1_groups(study)
    everyone = [m for group in by_label.values() for m in group]
    workers = min(workers or os.cpu_count() or 1, len(everyone))
    plain_pool, _ = worker_pool(workers)  # the plain side's processes, started once for both timings
    with plain_pool, multiprocessing.get_context("spawn").Manager() as manager:
        barrier = manager.Barrier(workers)
        before = _plain_side_by_side(by_label, study, plain_steps, plain_pool, barrier)
        wall, seconds, parts, threads = _ensembles(by_label, workers)
        after = _plain_side_by_side(by_label, study, plain_steps, plain_pool, barrier)
    full = paper.train.steps  # the Table 1 protocol, whatever --steps timed
    ens_total = wall * full / steps
    member_steps = len(everyone) * steps
    echo(f"ensembles: {len(by_label)} groups, {len(everyone)} members x {steps} steps as {len(parts)} ensembles of "
         f"{'/'.join(str(len(p)) for p in parts)} in {workers} worker(s) x {threads} thread(s): training "
         f"{', '.join(f'{s:.1f} s' for s in seconds)}; {wall:.1f} s wall with worker start-up = "
         f"{wall / member_steps * 1e3:.3f} ms of wall per member-step")
    plain = {label: (before[label] + after[label]) / 2 for label in by_label}

    def projected(ms: dict) -> float:  # seconds for every member of every group at the preset's steps
        return sum(ms[label] * full * len(group) / 1e3 for label, group in by_label.items())

    for label, group in by_label.items():
        echo(f"plain loop, {label}: {plain[label]:.3f} ms per member-step ({before[label]:.3f} before the ensembles, "
             f"{after[label]:.3f} after; {plain_steps} steps, {workers} side by side x {threads} thread(s)) "
             f"x {len(group)} members")
    plain_total = projected(plain)
    full_steps = len(everyone) * full
    echo(f"Table 1 training ({len(everyone)} members x {full} steps): ensembles {ens_total:.0f} s wall"
         f"{'' if steps == full else ' (projected)'} = {full_steps / ens_total:,.0f} member-steps/s, plain loop "
         f"{plain_total:.0f} s (projected) = {full_steps / plain_total:,.0f} member-steps/s, speed-up "
         f"{plain_total / ens_total:.1f}x (plain loop timed before: {projected(before) / ens_total:.1f}x, "
         f"after: {projected(after) / ens_total:.1f}x)")
    out = dict(wall=wall, seconds=seconds, ensemble_total=ens_total, plain_ms=plain, plain_total=plain_total,
               speedup=plain_total / ens_total, ensemble_member_steps_per_s=full_steps / ens_total,
               plain_member_steps_per_s=full_steps / plain_total,
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


def _ensembles(by_label: dict, workers: int) -> tuple[float, list[float], list, int]:
    """Table 1's groups trained as ``poslab run`` trains them: shared out among ``workers`` fresh
    processes; the wall time counts their start-up and the groups' calibration (step_costs)."""
    start = time.perf_counter()
    parts = share_out(list(by_label.values()), workers)  # as `poslab run` shares them out
    pool, threads = worker_pool(workers)
    with pool:
        futures = [pool.submit(train_members, part, desc=f"ensemble x{len(part)}", position=i)
                   for i, part in enumerate(parts)]
        seconds = [f.result().seconds for f in futures]
    return time.perf_counter() - start, seconds, parts, threads


def _plain_side_by_side(by_label: dict, study, steps: int, pool, barrier) -> dict[str, float]:
    """Each group's plain loop as a sweep runs it here: the pool's processes (one per core, its share
    of the threads) side by side, each training one member of the group, timed together after
    ``barrier``; ms per member-step = the wall time of one step over the members training at once
    (1 / sum of their steps per ms)."""
    workers = barrier.parties
    out = {}
    for label, group in by_label.items():
        futures = [pool.submit(_plain_step_ms, group[i % len(group)], study, steps, barrier) for i in range(workers)]
        out[label] = 1.0 / sum(1.0 / f.result() for f in futures)
    return out


def _plain_step_ms(member, study, steps: int, barrier=None) -> float:
    """ms a step of ``member`` trained alone by the plain loop (after 10 untimed steps; then, in a
    side-by-side run, it waits at ``barrier`` so that every process times its steps together)."""
    make, task = member.make_model(), member.task
    train_plain(make, task, member.seed, study.train, steps=10)  # warm-up, not timed
    if barrier is not None:
        barrier.wait()
    t0 = time.perf_counter()
    train_plain(make, task, member.seed, study.train, steps=steps)
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
