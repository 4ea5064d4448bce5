"""Run a study: validate, skip what the store has, train the rest in ensembles, record, report.

    validate everything (before any work)
      -> members: one per grid point x seed, keyed by the hash of its fully resolved config
      -> the store: a recorded member (finished or diverged) is never trained again (--force redoes it)
      -> missing members with the same model and training config train as one vectorized ensemble
         (tasks may differ: another K is only other data), groups side by side through an executor
      -> each member is evaluated by the experiment and recorded in one transaction
      -> evaluate-only variants: trained weights from the store under another encoding option,
         schedule or inference-time fix; their rows are stored and resumed like trained ones
      -> the experiment's report reads every member's rows back from the store

Members are recorded one by one as their group finishes, so an interrupted sweep loses at most
the groups in flight and a rerun trains only what is missing. An evaluate-only study (a pretrained
checkpoint: nothing trained, an :class:`EvaluateOnly` study) lists its members as jobs instead (:func:`run_jobs`),
keyed, stored, resumed and run on the executors the same way.

The engine is handed studies (a :class:`~poslab.experiments.experiment.Trained` or an
:class:`~poslab.experiments.experiment.EvaluateOnly` one; :func:`run_study` dispatches on which) and never imports a
study: the command line (or a notebook) resolves names in :mod:`poslab.studies`. :func:`run` is
what ``poslab run`` does for one or more studies; :func:`run_study` runs one.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from poslab.errors import ConfigError
from poslab.experiments import registry
from poslab.experiments.config import StudyConfig, apply_overrides
from poslab.experiments.executors import Auto, Executor, Inline, make_executor
from poslab.experiments.experiment import EvaluateOnly, Experiment, Job, Member, Trained, variant_members
from poslab.experiments.preflight import check_output_folder, check_reevaluate, validate
from poslab.experiments.schedule import alone_where_cropped, share_out, step_costs, training_seconds
from poslab.experiments.stages import Stages
from poslab.experiments.training import (
    MemberResult,
    evaluate_jobs,
    evaluate_variant,
    reevaluate_members,
    train_group,
)
from poslab.store import Store, git_revision
from poslab.tasks import build_task, task_options
from poslab.train import PhaseTimer, spans


# one keyword-only argument per option of a run (the command line's, less those run() resolves first)
def run_study(experiment: Experiment, study: StudyConfig, *, store: Store, out: Path,  # noqa: PLR0913
              device: str = "cpu", force: bool = False, progress: bool = True, workers: int = 1,
              executor: Executor | str | None = None, timer: PhaseTimer | None = None,
              validated: list[Member] | None = None, reevaluate: bool = False) -> dict:
    """Run (or resume) a study and write its report; returns a summary of what was done.

    ``workers`` > 1 trains that many groups at once in worker processes (each a share of the
    cores; on CPU, groups are split to give every worker one, :func:`split_groups`); ``executor``
    may be given instead. Only this process writes the store, as each
    group comes back. ``timer`` (``poslab bench profile``; the inline executor only) gets the
    run's phases: setup, the training phases of :func:`~poslab.train.train_ensemble`,
    evaluation, variants, store, and "tables and figures". ``validated``: the members
    :func:`validate` already returned for this study and device (the command line validates every
    study before it opens the store), so it is not validated twice. ``reevaluate``: train nothing; probe
    every stored member's weights again and replace its rows (after a probe or criterion changed;
    :func:`check_reevaluate` says which studies allow it), variants too.
    """
    span = spans(timer)
    with span("setup"):
        check_output_folder(out)
        trained = validated if validated is not None else validate(study, device, experiment)
    _check_run_options(workers, force, reevaluate)
    stored = check_reevaluate(experiment, study, trained, store) if reevaluate else {}
    if isinstance(experiment, EvaluateOnly):  # nothing to train: its jobs, run and stored like members
        return run_jobs(experiment, study, experiment.jobs(study), store=store, out=out, device=device, force=force,
                        progress=progress, workers=workers, executor=executor)
    assert isinstance(experiment, Trained), experiment  # the two kinds of study
    with span("setup"):
        variants = variant_members(study, trained)
        everyone = trained + [v for v, _ in variants]
    done = _done_keys(experiment, store, trained, everyone, span, force=force, reevaluate=reevaluate)
    todo = [m for m in trained if m.key not in done]
    with span("setup"):
        revision = git_revision(Path(__file__).parent)
    start = time.perf_counter()
    record = _recorder(experiment, store, revision, span)
    _train_missing(experiment, todo, record, span, device=device, progress=progress, workers=workers,
                   executor=executor, timer=timer)
    if reevaluate:
        with span("evaluation"):
            reevaluate_members(experiment, trained, stored, store, device=device, progress=progress,
                               revision=revision)
    stages = Stages(store, experiment.name, revision, force)
    evaluated = _evaluate_variants(experiment, variants, done, store, stages, record, span, device=device)
    files = _write_report(experiment, study, store, everyone, out, span, revision)
    return dict(members=len(trained), trained=len(todo), reused=len(trained) - len(todo),
                reevaluated=len(trained) if reevaluate else 0, variants=len(variants), evaluated=evaluated,
                seconds=time.perf_counter() - start, files=files)


Span = Callable[[str], AbstractContextManager]  # spans(timer): a phase's timing context
Record = Callable[[list[MemberResult]], None]


def _check_run_options(workers: int, force: bool, reevaluate: bool) -> None:
    """The run options' own checks (after validation, before the store is read)."""
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError("workers", workers, "a positive integer")
    if reevaluate and force:
        raise ConfigError("--reevaluate", True, "without --force (--force trains again; --reevaluate never trains)")


def _done_keys(experiment: Experiment, store: Store, trained: list[Member], everyone: list[Member], span: Span, *,
               force: bool, reevaluate: bool) -> set[str]:
    """The keys of the members (trained and variants) the store already holds, which are not run
    again (``force``: each deleted first, so none; ``reevaluate``: every trained member's)."""
    with span("store"):
        if force:
            for m in everyone:
                store.delete(m.key)
        done = {r["key"] for r in store.runs(experiment=experiment.name)} & {m.key for m in everyone}  # diverged too
    if reevaluate:  # nothing trains; the trained members and every variant are evaluated again below
        done = {m.key for m in trained}
    return done


def _recorder(experiment: Experiment, store: Store, revision: str | None, span: Span) -> Record:
    """A function that records members' results in the store, one transaction each."""
    def record(results: list[MemberResult]) -> None:
        with span("store"):
            for r in results:
                store.record(r.member.key, experiment=experiment.name, config=r.member.config(), rows=r.rows,
                             status="finished" if r.diverged_at is None else "diverged", timings=r.timings,
                             weights=r.weights, revision=revision)
    return record


def _train_missing(experiment: Trained, todo: list[Member], record: Record, span: Span, *, device: str,
                   progress: bool, workers: int, executor: Executor | str | None, timer: PhaseTimer | None) -> None:
    """Train the members in ``todo`` in groups of one model and training config, side by side on
    the executor, recording each group's members as it comes back."""
    groups: dict[str, list[Member]] = {}
    for m in todo:
        groups.setdefault(m.group_key(), []).append(m)
    if isinstance(executor, str) or executor is None:
        executor = make_executor(executor or "local", workers=min(workers, max(1, len(todo))), device=device)
    if timer is not None and not isinstance(executor, Inline):
        raise ValueError("a PhaseTimer sees this process only: time a study with the inline executor")
    batches = list(groups.values())
    if device == "cpu":  # a core per job beats every core on one job (poslab bench lm measures it)
        batches = alone_where_cropped(batches)  # a cropped member's batches its own, whatever the schedule
        with span("setup"):  # the groups' measured costs decide the shares (and, for auto, where they train)
            costs = None
            if batches and isinstance(executor, Auto):
                costs = step_costs(batches)
                executor = executor.choose(training_seconds(batches, costs))
            batches = share_out(batches, getattr(executor, "slots", 1), costs)
    jobs = [(experiment, group, device, progress, i, timer) for i, group in enumerate(batches)]
    for results in executor.map_unordered(train_group, jobs):
        record(results)


def _evaluate_variants(experiment: Trained, variants: list[tuple[Member, Member]], done: set[str], store: Store,
                       stages: Stages, record: Record, span: Span, *, device: str) -> int:
    """Evaluate every variant not in ``done`` on its base member's stored weights and record it;
    returns how many were evaluated."""
    evaluated = 0
    for variant, base in variants:
        if variant.key in done:
            continue
        with span("store"):
            weights = store.load_weights(base.key)
        with span("variants"):
            result = evaluate_variant(experiment, variant, weights, device, stages)
        record([result])
        evaluated += 1
    return evaluated


def _write_report(experiment: Experiment, study: StudyConfig, store: Store, everyone: list[Member], out: Path,
                  span: Span, revision: str | None) -> list:
    """The experiment's report over every member's stored rows, written to ``out``; its files (its judgements
    recorded in ``store`` under ``revision``, the run's)."""
    with span("store"):
        rows = store.rows(keys=[m.key for m in everyone])
    with span("tables and figures"):
        out.mkdir(parents=True, exist_ok=True)
        with registry.active(experiment.name, store, revision):
            files = experiment.report(rows, study, out)
    with span("store"):
        store.record_outputs(experiment.name, out)
    return files


def run_jobs(experiment: EvaluateOnly, study: StudyConfig, jobs: list[Job], *, store: Store, out: Path,
             device: str = "cpu", force: bool = False, progress: bool = True, workers: int = 1,
             executor: Executor | str | None = None) -> dict:
    """Run (or resume) an evaluate-only study: its ``jobs`` (``experiment.jobs(study)``), those
    the store lacks (with ``force``, every one) run on the executor after the experiment's
    ``prepare`` (the driver's work, stored as stages), each recorded as it comes back; then its
    report from the store. Returns :func:`run_study`'s summary ("trained": the jobs evaluated)."""
    start = time.perf_counter()
    if force:
        for job in jobs:
            store.delete(job.key)
    done = {r["key"] for r in store.runs(experiment=experiment.name)}
    todo = [job for job in jobs if job.key not in done]
    revision = git_revision(Path(__file__).parent)
    prepared = {}
    if todo and experiment.prepare is not None:
        prepared = experiment.prepare(study, todo, stages=Stages(store, experiment.name, revision, force),
                                      device=device, progress=progress)
    evaluate_jobs(experiment, todo, store=store, executor=executor, workers=workers, device=device,
                  progress=progress, prepared=prepared, revision=revision)
    rows = store.rows(keys=[job.key for job in jobs])
    out.mkdir(parents=True, exist_ok=True)
    with registry.active(experiment.name, store, revision):
        files = experiment.report(rows, study, out)
    store.record_outputs(experiment.name, out)
    return dict(members=len(jobs), trained=len(todo), reused=len(jobs) - len(todo), reevaluated=0, variants=0,
                evaluated=0, seconds=time.perf_counter() - start, files=files)


def prepare(experiment: Experiment, preset: str, *, seeds: int | None = None, overrides: Sequence[str] = (),
            corpus: Path | None = None, checkpoint: str | None = None) -> StudyConfig:
    """The study ``poslab run`` runs: the preset's grid, then a corpus (a text task's), a checkpoint (a
    pretrained study's), the number of seeds and the ``--set`` overrides, in that order."""
    study = experiment.study(preset)  # the preset's changes over the study's base (an unknown preset: refused)
    if corpus is not None:
        study = with_corpus(study, corpus)
    if checkpoint is not None:
        if "checkpoint" not in study.model:
            raise ConfigError("--model", checkpoint, "an experiment on a pretrained checkpoint (one whose preset sets "
                                                     "model.checkpoint)")
        study = dataclasses.replace(study, model={**study.model, "checkpoint": checkpoint})
    if seeds is not None:
        study = apply_overrides(study, [f"seeds={seeds}"])
    return apply_overrides(study, overrides, fixed=experiment.fixed)


def with_corpus(study: StudyConfig, corpus: Path) -> StudyConfig:
    """The study with its text task reading ``corpus``; the file is read and checked now."""
    if "corpus" not in task_options(study.task_type):
        raise ConfigError("--corpus", str(corpus), f"an experiment whose task reads a corpus (this one's task is "
                                                   f"{study.task_type!r})")
    task = {**study.task, "corpus": os.path.abspath(corpus)}
    build_task(study.task_type, **task)  # a missing, empty, non-UTF-8 or too short file: one ConfigError
    return dataclasses.replace(study, task=task)


def out_folder(out: Path | None, name: str, studies: int) -> Path:
    """--out itself for one study; results/<name> (or --out/<name> for several)."""
    return (out or Path("results")) / name if (out is None or studies > 1) else out


# ``poslab run`` callable from a notebook: one keyword-only argument per option of the command, as cli.run
def run(experiments: Sequence[Experiment], preset: str = "paper", *, store: Path | str = "runs/poslab.sqlite",  # noqa: PLR0913
        out: Path | None = None, seeds: int | None = None, overrides: Sequence[str] = (), device: str = "cpu",
        executor: str = "auto", address: str | None = None, task_cpus: int = 1, workers: int | None = None,
        force: bool = False, reevaluate: bool = False, progress: bool = True, corpus: Path | None = None,
        checkpoint: str | None = None, on_study: Callable[[str, dict, Path], None] | None = None) -> list[dict]:
    """What ``poslab run`` does, callable from a notebook: every study prepared (:func:`prepare`) and
    validated before the store is opened, then each run (or resumed) in turn into ``out`` (see
    :func:`out_folder`). Returns each study's summary (:func:`run_study`'s); ``on_study(name, summary,
    out)`` is called as each finishes."""
    plan = []
    for exp in experiments:
        study = prepare(exp, preset, seeds=seeds, overrides=overrides, corpus=corpus, checkpoint=checkpoint)
        trained = validate(study, device, exp)  # every study, before the store is even opened
        check_output_folder(out_folder(out, exp.name, len(experiments)))
        plan.append((exp, study, trained))
    if executor != "ray" and address is not None:
        raise ConfigError("--address", address, "only with --executor ray")
    if workers is not None and workers < 1:
        raise ConfigError("--workers", workers, "a positive integer")
    if task_cpus < 1:
        raise ConfigError("--task-cpus", task_cpus, "a positive integer")
    if reevaluate:
        check_reevaluate_all(plan, Path(store))
    pool = make_executor(executor, workers=workers or os.cpu_count() or 1, device=device,
                         **(dict(address=address, cpus=task_cpus) if executor == "ray" else {}))
    summaries = []
    for exp, study, trained in plan:  # finished members are reused from the store, not retrained
        folder = out_folder(out, exp.name, len(plan))
        with Store(store) as db:
            summary = run_study(exp, study, store=db, out=folder, device=device, force=force, progress=progress,
                                executor=pool, validated=trained, reevaluate=reevaluate)
        summaries.append(summary)
        if on_study is not None:
            on_study(exp.name, summary, folder)
    return summaries


def check_reevaluate_all(plan: list[tuple[Experiment, StudyConfig, list[Member]]], store: Path) -> None:
    """``--reevaluate``: every study's members stored with weights, before any is re-evaluated."""
    if not store.exists():
        raise ConfigError("--store", str(store), "an existing store holding the study (--reevaluate trains nothing)")
    with Store(store) as db:
        refused = {}
        for exp, study, trained in plan:
            try:
                check_reevaluate(exp, study, trained, db)
            except ConfigError as e:
                refused[exp.name] = e
    if len(plan) == 1 and refused:
        raise next(iter(refused.values()))
    if refused:  # run all: say every study it cannot take, and which it can
        raise ConfigError("--reevaluate", f"all ({', '.join(refused)} cannot be re-evaluated here)",
                          "the studies named one at a time: "
                          + (", ".join(e.name for e, *_ in plan if e.name not in refused) or "none"))
