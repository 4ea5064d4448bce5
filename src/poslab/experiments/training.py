"""Training and evaluation of members: one group as one ensemble (``train_group``, a pure function an
executor may run anywhere), trained weights under a variant (``evaluate_variant``), stored weights
probed again (``reevaluate_members``), and evaluate-only members of a pretrained checkpoint
(``evaluate_members``). Nothing here writes the store but ``reevaluate_members`` and
``evaluate_members``, which record what comes back in this process."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from poslab.experiments.executors import Executor, make_executor, workers_that_fit
from poslab.experiments.experiment import Experiment, Member, MemberContext
from poslab.experiments.schedule import torch_threads
from poslab.experiments.stages import Stages
from poslab.machine import MEMORY_FRACTION, memory_bytes
from poslab.store import Store, git_revision
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


def train_group(experiment: Experiment, group: list[Member], device: str = "cpu", progress: bool = True,
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


def member_rows(experiment: Experiment, ctx: MemberContext) -> list[dict]:
    with torch.no_grad():
        rows = experiment.evaluate(ctx)
    return [{**ctx.member.ids, **row} for row in rows]


def evaluate_variant(experiment: Experiment, variant: Member, weights: dict[str, torch.Tensor],
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


def reevaluate_members(experiment: Experiment, trained: list[Member], stored: dict, store: Store, *, device: str,
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


def evaluate_members(experiment: str, members: list[tuple[str, dict]], job: Callable[[dict], list[dict]], *,
                     store: Store, force: bool = False, executor: Executor | str | None = None, workers: int = 1,
                     device: str = "cpu", progress: bool = True, worker_bytes: float | None = None) -> int:
    """Evaluate-only members (a pretrained checkpoint's): every ``(key, config)`` the store lacks is
    one call ``job(config)`` on ``executor`` (``job`` picklable: a module-level function or a
    partial of one, which loads what it reads once per process), and its rows are recorded here,
    the only writer, as each comes back. ``force`` evaluates every member again. ``worker_bytes``
    (a job's peak memory, where its study knows it) runs fewer local workers than ``workers``
    where that many would not fit in memory (:func:`workers_that_fit`; said on stderr). Returns
    how many were evaluated."""
    if force:
        for key, _ in members:
            store.delete(key)
    done = {r["key"] for r in store.runs(experiment=experiment)}
    todo = [(key, config) for key, config in members if key not in done]
    if not todo:
        return 0
    if isinstance(executor, str) or executor is None:
        wanted = min(workers, len(todo))
        fit = workers_that_fit(wanted, worker_bytes)
        if fit < wanted and worker_bytes is not None:
            print(f"{experiment}: each job peaks at about {worker_bytes / 2**30:.1f} GiB of the "
                  f"{memory_bytes() * MEMORY_FRACTION / 2**30:.1f} GiB a run may plan for: {fit} worker(s)",
                  file=sys.stderr, flush=True)
        executor = make_executor(executor or "local", workers=fit, device=device)
    revision = git_revision(Path(__file__).parent)
    if progress:
        print(f"{experiment}: {len(todo)} of {len(members)} members to evaluate", flush=True)
    for i, (key, config, rows, seconds) in enumerate(executor.map_unordered(_timed, [(job, *m) for m in todo])):
        store.record(key, experiment=experiment, config=config, rows=rows, status="finished",
                     timings=dict(eval_seconds=seconds), revision=revision)
        if progress:
            what = ", ".join(f"{k} {v}" for k, v in config.items() if k in ("method", "scale", "length", "bos"))
            print(f"{experiment} {i + 1}/{len(todo)}: {what} ({seconds:.0f} s)", flush=True)
    return len(todo)


def _timed(job: Callable[[dict], list[dict]], key: str, config: dict) -> tuple[str, dict, list[dict], float]:
    start = time.perf_counter()
    rows = job(config)
    return key, config, rows, time.perf_counter() - start
