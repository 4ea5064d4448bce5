"""Training and evaluation of members: one group as one ensemble (``train_group``, a pure function an
executor may run anywhere), trained weights under a variant (``evaluate_variant``), stored weights
probed again (``reevaluate_members``), and the members of an evaluate-only study (``evaluate_jobs``:
a pretrained checkpoint's). Nothing here writes the store but ``reevaluate_members`` and
``evaluate_jobs``, which record what comes back in this process."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import torch

from poslab.experiments.executors import Executor, make_executor, workers_that_fit
from poslab.experiments.experiment import EvaluateOnly, Job, Member, MemberContext, Trained
from poslab.experiments.schedule import torch_threads
from poslab.experiments.stages import Stages
from poslab.machine import MEMORY_FRACTION, memory_bytes
from poslab.store import Store
from poslab.train import PhaseTimer, TrainResult, build_member, spans, train_ensemble


@dataclass
class MemberResult:
    member: Member
    rows: list[dict]
    weights: dict[str, torch.Tensor] | None  # None: an evaluate-only variant (its weights are its base's)
    diverged_at: int | None
    timings: dict


def train_members(group: list[Member], *, device: str = "cpu", progress: bool = True, desc: str = "train",
                  position: int = 0, timer: PhaseTimer | None = None) -> TrainResult:
    """Train one group (one group key) as one ensemble."""
    study = group[0].study
    return train_ensemble(group[0].make_model(), [m.task for m in group], [m.seed for m in group], study.train,
                          device=device, progress=progress, desc=desc, position=position, timer=timer)


def train_group(experiment: Trained, group: list[Member], device: str = "cpu", progress: bool = True,
                position: int = 0, timer: PhaseTimer | None = None) -> list[MemberResult]:
    """Train one group as an ensemble and evaluate every member.

    A pure function of its (picklable) arguments, so an executor may run it anywhere: in this
    process, in a worker process, or on a Ray worker. It never touches the store. ``timer``
    (inline only: a worker's copy never comes back) also gets each member's ``evaluation``.
    """
    result = train_members(group, device=device, progress=progress, position=position,
                           desc=f"{experiment.name} {group[0].group_label} x{len(group)}", timer=timer)
    span = spans(timer)
    out = []
    for i, member in enumerate(group):
        with span("evaluation"):
            model = result.models[i].eval()
            untrained = build_member(member.make_model(), member.seed).to(device).eval()
            start = time.perf_counter()
            snapshots = {step: states[i] for step, states in result.snapshots.items()}  # train.snapshot_steps
            trained = dict(group_train_seconds=result.seconds, group_size=len(group),
                           train_threads=torch.get_num_threads(), cores=os.cpu_count() or 1,
                           final_loss=[float(x) for x in result.loss_curve[-1:, i]],
                           loss_curve=[float(x) for x in result.loss_curve[:, i]])
            rows = member_rows(experiment, MemberContext(model, untrained, member, device, snapshots, trained))
            out.append(MemberResult(member=member, rows=rows, diverged_at=result.diverged_at[i],
                                    weights={k: v.detach().cpu() for k, v in model.state_dict().items()},
                                    timings=dict(train_seconds=result.seconds / len(group), group_size=len(group),
                                                 group_train_seconds=result.seconds,
                                                 eval_seconds=time.perf_counter() - start,
                                                 eval_threads=torch.get_num_threads(),
                                                 diverged_at=result.diverged_at[i],
                                                 final_loss=[float(x) for x in result.loss_curve[-1:, i]])))
    return out


def member_rows(experiment: Trained, ctx: MemberContext) -> list[dict]:
    with torch.no_grad():
        rows = experiment.evaluate(ctx)
    return [{**ctx.member.ids, **row} for row in rows]


def evaluate_variant(experiment: Trained, variant: Member, weights: dict[str, torch.Tensor],
                     device: str = "cpu", stages: Stages | None = None, timings: dict | None = None) -> MemberResult:
    """Evaluate trained weights under a variant's config (no training); ``timings``: the stored run's,
    when a trained member is re-evaluated (``--reevaluate``)."""
    make = variant.make_model()
    model = build_member(make, variant.seed)
    model.load_state_dict(weights)
    model = model.to(device).eval()
    untrained = build_member(make, variant.seed).to(device).eval()
    start = time.perf_counter()
    rows = member_rows(experiment, MemberContext(model, untrained, variant, device, stages=stages,
                                                     timings=dict(timings or {})))
    return MemberResult(member=variant, rows=rows, weights=None, diverged_at=None,
                        timings=dict(eval_seconds=time.perf_counter() - start))


def reevaluate_members(experiment: Trained, trained: list[Member], stored: dict, store: Store, *, device: str,
                       progress: bool, revision: str | None) -> None:
    """``--reevaluate``: every trained member's stored weights probed again (the runner's evaluation,
    with the stored timings, on the threads its first evaluation had), its rows replaced."""
    from tqdm import tqdm

    for member in tqdm(trained, desc=f"{experiment.name} re-evaluate", disable=not progress, leave=False):
        timings = stored[member.key]["timings"] or {}
        # the threads its evaluation ran on, so reductions add up in the same order (runs stored before
        # eval_threads was: one, as a CPU worker of `run` evaluates)
        threads = timings.get("eval_threads") or (1 if device == "cpu" else torch.get_num_threads())
        with torch_threads(threads):
            result = evaluate_variant(experiment, member, store.load_weights(member.key), device, timings=timings)
        store.replace_rows(member.key, result.rows, revision=revision)


def evaluate_jobs(experiment: EvaluateOnly, jobs: list[Job], *, store: Store, executor: Executor | str | None = None,
                  workers: int = 1, device: str = "cpu", progress: bool = True, prepared: Mapping | None = None,
                  revision: str | None = None) -> None:
    """Evaluate-only members (:class:`~poslab.experiments.experiment.Job`): each one call
    ``experiment.run_job(job, device=device, **prepared)`` on ``executor`` (a study's module-level
    function, which loads what it reads once per process), its rows recorded here, the only writer,
    as each comes back. Where the jobs say their peak memory (``Job.memory``), fewer local workers
    than ``workers`` run where that many would not fit (:func:`workers_that_fit`; said on stderr)."""
    from tqdm import tqdm

    if not jobs:
        return
    if isinstance(executor, str) or executor is None:
        wanted = min(workers, len(jobs))
        peak = max((j.memory for j in jobs if j.memory is not None), default=None)
        fit = workers_that_fit(wanted, peak)
        if fit < wanted and peak is not None:
            print(f"{experiment.name}: each job peaks at about {peak / 2**30:.1f} GiB of the "
                  f"{memory_bytes() * MEMORY_FRACTION / 2**30:.1f} GiB a run may plan for: {fit} worker(s)",
                  file=sys.stderr, flush=True)
        executor = make_executor(executor or "local", workers=fit, device=device)
    run_job = partial(_timed, partial(experiment.run_job, device=device, **(prepared or {})))
    with tqdm(total=len(jobs), desc=f"{experiment.name} evaluate", disable=not progress, leave=False) as bar:
        for job, rows, seconds in executor.map_unordered(run_job, [(j,) for j in jobs]):
            store.record(job.key, experiment=experiment.name, config=job.config, rows=rows, status="finished",
                         timings=dict(eval_seconds=seconds), revision=revision)
            bar.set_postfix_str(f"{job.label} ({seconds:.0f} s)", refresh=False)
            bar.update()


def _timed(run_job: Callable[[Job], list[dict]], job: Job) -> tuple[Job, list[dict], float]:
    start = time.perf_counter()
    rows = run_job(job)
    return job, rows, time.perf_counter() - start
