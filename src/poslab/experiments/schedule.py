"""The CPU scheduling cost model: how groups of members are shared out among workers.

A group's cost per member is measured (a few timed steps, :func:`step_costs`); the largest groups
are halved until every worker has a part, then while halving shortens the estimated wall time
(:func:`split_groups`, :func:`wall_estimate`). Only the schedule reads these costs: what each
member computes does not depend on its part.
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections.abc import Callable

import numpy as np
import torch

from poslab.experiments.experiment import Member
from poslab.train import crops, train_ensemble

SPLIT_OVERHEAD = 5  # an ensemble's fixed cost per step, in members: 12 members cost 0.58 of 24 (measured, CPU)
MIN_SPLIT = 8  # balancing halves only parts at least this large, so both halves stay vmapped ensembles


def split_groups(groups: list[list[Member]], slots: int, costs: list[float] | None = None) -> list[list[Member]]:
    """The groups as parts to train, costliest first (the order a pool hands them out).

    Members of one group share the model and training config, so any part of a group is a group
    (each member computes what it computes alone; an ensemble's members are bit for bit those of
    any part of it, tests/test_train.py). On a CPU with more workers than groups, the largest is
    halved until every slot has a part. Then, where the parts do not share out evenly (three groups
    on two workers leave one idle for a third of the run), the costliest part of at least MIN_SPLIT
    members is halved while that shortens the estimated wall time: each part costs its members plus
    SPLIT_OVERHEAD, times its group's cost per member (``costs``, one per group: e.g.
    :func:`step_costs`; equal when None), assigned costliest first to the least loaded slot.
    """
    weights = [1.0] * len(groups) if costs is None else [float(c) for c in costs]
    if len(weights) != len(groups):
        raise ValueError(f"{len(weights)} costs for {len(groups)} groups")

    def cost(part: tuple[float, list]) -> float:
        return (len(part[1]) + SPLIT_OVERHEAD) * part[0]

    def halve_largest(parts: list[tuple[float, list]], smallest: int, by) -> list[tuple[float, list]] | None:
        splittable = [i for i in range(len(parts)) if len(parts[i][1]) >= smallest]
        if not splittable:
            return None
        largest = max(splittable, key=lambda i: by(parts[i]))
        (w, group), half = parts[largest], (len(parts[largest][1]) + 1) // 2
        return parts[:largest] + [(w, group[:half]), (w, group[half:])] + parts[largest + 1:]

    out = [(w, list(g)) for w, g in zip(weights, groups, strict=True) if g]
    while len(out) < slots:
        split = halve_largest(out, 2, by=lambda part: len(part[1]))
        if split is None:
            break
        out = split
    best, candidate = out, out
    for _ in range(2 * slots if slots > 1 else 0):
        halved = halve_largest(candidate, MIN_SPLIT, by=cost)
        if halved is None:
            break
        candidate = halved
        if wall_estimate(candidate, slots, cost) < wall_estimate(best, slots, cost):
            best = candidate
    return [part for _, part in sorted(best, key=cost, reverse=True)]


def alone_where_cropped(groups: list[list[Member]]) -> list[list[Member]]:
    """Each group whose training cuts batches to their longest sequence (``train.crop_padding`` on a
    padding-inert model) as one part per member; the other groups as they are.

    A cropped ensemble's step is as wide as its widest member's sequence, so a member's batches, and
    with them its float rounding, would depend on which members share its part, and so on the
    schedule (the workers, the measured costs). Alone, each is cut to its own length whatever the
    schedule, and costs less: even_pairs, one thread, 10.7 ms a member-step alone against 14.7 in an
    ensemble of 3 (docs/speed.md)."""
    out: list[list[Member]] = []
    for group in groups:
        cfg = group[0].study.train
        if len(group) > 1 and cfg.crop_padding:
            with torch.random.fork_rng():  # building the model to ask it draws from torch's generator
                alone = crops(group[0].make_model()(), cfg)
            if alone:
                out.extend([m] for m in group)
                continue
        out.append(group)
    return out


def wall_estimate(parts: list, slots: int, cost: Callable | None = None) -> float:
    """The largest load when ``parts`` (each costing ``cost(part)``; by default its members plus
    SPLIT_OVERHEAD) go costliest first to the least loaded of ``slots``."""
    cost = cost or (lambda part: len(part) + SPLIT_OVERHEAD)
    loads = [0.0] * max(1, slots)
    for part in sorted(parts, key=cost, reverse=True):
        loads[loads.index(min(loads))] += cost(part)
    return max(loads)


def share_out(groups: list[list[Member]], slots: int, costs: list[float] | None = None) -> list[list[Member]]:
    """:func:`split_groups` weighed by ``costs`` (default: :func:`step_costs` where there are shares
    to make, more than one slot and one group; by member count otherwise): how ``poslab run`` and
    ``bench train`` share groups out on a CPU."""
    if costs is None and slots > 1 and len(groups) > 1:
        costs = step_costs(groups)
    return split_groups(groups, slots, costs)


def training_seconds(groups: list[list[Member]], costs: list[float]) -> float:
    """The groups' estimated training seconds on one thread, each trained whole as one ensemble
    (its members plus SPLIT_OVERHEAD, times its cost per member from :func:`step_costs`)."""
    return float(sum((len(g) + SPLIT_OVERHEAD) * c for g, c in zip(groups, costs, strict=True)))


CALIBRATION_STEPS = 8  # timed steps per group in step_costs (after one untimed step); their median counts


def step_costs(groups: list[list[Member]]) -> list[float]:
    """Each group's training seconds per member, estimated for :func:`split_groups`: a few steps of
    an ensemble of (at most) two of its members on one thread, as a worker trains, scaled to the
    group's steps; per member, SPLIT_OVERHEAD of them being the ensemble's fixed cost. Groups differ
    several-fold (a d_model of 256 against 64, Shaw's direct forward against the grid fast path),
    which counting members cannot see. A step counts at the median of the timed ones: the mean of
    three once shared Table 1's three groups (equal in cost) out as 24/24/24, one worker training
    two of them (134 s against 96-119 s as 24/24/12/12, docs/speed.md). Only the schedule reads it:
    what each member computes does not depend on its part."""
    costs = []
    with one_thread():
        for group in groups:
            part = group[:2]
            seconds = step_seconds(part, CALIBRATION_STEPS, chunk=CALIBRATION_STEPS + 1)
            costs.append(float(np.median(seconds)) / (len(part) + SPLIT_OVERHEAD) * group[0].study.train.steps)
    return costs


@contextlib.contextmanager
def torch_threads(n: int) -> typing.Iterator[None]:
    """torch on ``n`` threads inside; the caller's threads after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def one_thread() -> contextlib.AbstractContextManager[None]:
    """torch on one thread, as a worker trains, inside; the caller's threads after."""
    return torch_threads(1)


def step_seconds(part: list[Member], steps: int, chunk: int | None = None) -> np.ndarray:
    """Seconds of each of ``steps`` training steps of ``part`` (members of one group; repeats allowed)
    as one ensemble, after one untimed step (its first draw and warm-up); callers time on
    :func:`one_thread`. ``chunk``: steps of data per draw (None: the study's own, so draws fall
    where training has them). Timing only: nothing is kept."""
    cfg = part[0].study.train
    short = dataclasses.replace(cfg, steps=steps + 1, warmup_steps=0, snapshot_steps=(), compile=False,
                                chunk=cfg.chunk if chunk is None else chunk)
    result = train_ensemble(part[0].make_model(), [m.task for m in part], [m.seed for m in part], short,
                            progress=False)
    assert result.step_ends is not None
    return np.diff(result.step_ends)
