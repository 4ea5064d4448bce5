"""``poslab bench ensemble [EXPERIMENT] --preset P``: a study preset's training as ensembles against the
plain loop (default: ``studies.DEFAULTS["bench-ensemble"]``, the length-generalization benchmark's cpu preset).

    ratio = (plain loop: seconds per member-step) / (ensemble: seconds per member-step)

A few of the preset's groups (``per_task`` per task, by default the first encodings of the registry, with
and without randomized positions) train as ``poslab run`` trains a group, one vectorized ensemble
of the cell's seeds on one thread as a worker does (:func:`~poslab.experiments.training.train_members`;
a cropped group member by member, :func:`~poslab.experiments.schedule.alone_where_cropped`), and each
of their members alone through the plain loop (:func:`~poslab.train.train_plain`), the same steps on
the same thread, ensemble and plain interleaved group by group so that a noisy machine weighs both
alike. A short run: the ratio, not the preset's wall time, is the number.

``compile=True`` (``--compile``) trains the ensembles under ``train.compile`` and times a third arm, each
member alone through the same compiled path (``train_members`` with one member): the two compiled
arms are timed over their steps after the first quarter (:func:`steady_seconds`), so that compiling
(tens of seconds cold, a few warm) is not counted, and the plain loop stays the eager loop users run.
"""

from __future__ import annotations

import dataclasses
import time

from poslab.experiments import Experiment
from poslab.experiments import members as study_members
from poslab.experiments.runner import prepare
from poslab.experiments.schedule import alone_where_cropped, one_thread
from poslab.experiments.training import train_members
from poslab.train import train_plain


def bench_ensemble(experiment: Experiment, preset: str, *, steps: int = 20, per_task: int = 2,
                   overrides: tuple[str, ...] = (), compile: bool = False, echo=print) -> dict:
    """Time ``per_task`` groups of each task of ``experiment``'s ``preset`` (with ``overrides``, as
    ``poslab run --set`` takes them) for ``steps`` steps, ensemble against plain (and, with ``compile``,
    against one member alone on the compiled path)."""
    study = prepare(experiment, preset, overrides=(*overrides, *(("train.compile=true",) if compile else ())))
    groups: dict[str, list] = {}
    for m in study_members(experiment, study):
        groups.setdefault(m.group_key(), []).append(m)
    chosen: dict[str, list] = {}
    for group in groups.values():
        chosen.setdefault(group[0].study.task_type, [])
        if len(chosen[group[0].study.task_type]) < per_task:
            chosen[group[0].study.task_type].append(group)
    ensemble = plain = alone = 0.0
    member_steps = 0
    with one_thread():
        for task_groups in chosen.values():
            for group in task_groups:
                short = [dataclasses.replace(m, study=dataclasses.replace(
                    m.study, train=dataclasses.replace(m.study.train, steps=steps, warmup_steps=0))) for m in group]
                train_members(short[:1], progress=False)  # warm-up (first draws, kernels), not timed
                parts = alone_where_cropped([short])  # as `poslab run` trains the group
                ens = 0.0
                for part in parts:
                    t0 = time.perf_counter()
                    result = train_members(part, progress=False)
                    ens += steady_seconds(result) if compile else time.perf_counter() - t0
                t0 = time.perf_counter()
                for m in short:
                    train_plain(m.make_model(), m.task, m.seed, m.study.train, steps=steps)  # eager: it never compiles
                solo = time.perf_counter() - t0
                one = 0.0
                if compile:  # each member alone, compiled; a cropped group's parts already are
                    one = ens if len(parts) == len(short) else sum(
                        steady_seconds(train_members([m], progress=False)) for m in short)
                ensemble, plain, alone = ensemble + ens, plain + solo, alone + one
                member_steps += len(group) * steps
                how = "" if len(parts) == 1 else f" (cropped: {len(parts)} parts of 1, as poslab run trains them)"
                echo(f"{group[0].group_label} x{len(group)}{how}: ensemble {ens:.2f} s, plain loop {solo:.2f} s"
                     + (f", each alone compiled {one:.2f} s" if compile else "") + f" ({steps} steps, one thread)")
    ratio = plain / ensemble
    echo(f"{experiment.name} {preset} preset, {sum(map(len, chosen.values()))} groups, {member_steps} member-steps: "
         f"ensemble "
         f"{ensemble / member_steps * 1e3:.1f} ms, plain loop {plain / member_steps * 1e3:.1f} ms a member-step "
         f"({member_steps / ensemble:.1f} against {member_steps / plain:.1f} member-steps/s on one thread): "
         f"ratio {ratio:.2f}x")
    out = dict(ensemble_seconds=ensemble, plain_seconds=plain, member_steps=member_steps, ratio=ratio)
    if compile:
        echo(f"compiled (steady state, after each run's first quarter of steps): ensemble "
             f"{ensemble / member_steps * 1e3:.1f} ms, each member alone {alone / member_steps * 1e3:.1f} ms a "
             f"member-step: ensemble / alone {ensemble / alone:.2f}x")
        out |= dict(alone_compiled_seconds=alone, ensemble_over_alone=ensemble / alone)
    return out


def steady_seconds(result) -> float:
    """A run's training seconds at its steady-state rate: the steps after the first quarter (where
    compiling and the first draws fall), timed by ``result.step_ends``, scaled to all its steps."""
    ends = result.step_ends
    skip = max(1, len(ends) // 4) if len(ends) > 1 else 0
    if skip == 0:
        return float(ends[-1])
    return float(ends[-1] - ends[skip - 1]) / (len(ends) - skip) * len(ends)
