"""Run a study: validate, skip what the store has, train the rest in ensembles, record, report.

    validate everything (before any work)
      -> members (encoding, K, seed), each keyed by the hash of its full config
      -> the store: a recorded member (finished or diverged) is never trained again (--force redoes it)
      -> the missing members of one encoding train together in one vectorized ensemble
      -> each member is evaluated by the experiment's probes and recorded in one transaction
      -> the experiment's report reads every member's rows back from the store

Members are recorded one by one as their group finishes, so an interrupted sweep loses at most
the group in flight and a rerun trains only what is missing.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Protocol

import torch

from poslab.errors import ConfigError
from poslab.experiments.config import StudyConfig
from poslab.models.retrieval_head import RetrievalHead
from poslab.positional import check_encoding
from poslab.store import Store, config_hash, git_revision
from poslab.tasks import build_task
from poslab.train import TrainResult, build_member, train_ensemble

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Member:
    encoding: str
    K: int
    seed: int


class Experiment(Protocol):
    name: str
    title: str  # the published artefact, e.g. "Table 1 / Fig. 1"

    def study(self, preset: str) -> StudyConfig: ...

    def evaluate(self, model: RetrievalHead, untrained: RetrievalHead, member: Member,
                 study: StudyConfig, device: str) -> list[dict]: ...

    def report(self, rows: list[dict], study: StudyConfig, out: Path) -> list[Path]: ...


def model_config(study: StudyConfig, encoding: str):
    longest = max((*study.eval.lengths, study.train.max_length))
    return dataclasses.replace(study.model, vocab_size=study.m, encoding=encoding,
                               encoding_options=dict(study.encoding_options.get(encoding, {})),
                               max_len=max(study.model.max_len, longest))


def member_config(experiment: str, study: StudyConfig, member: Member) -> dict:
    """Everything that determines a member's result; its hash is the run key."""
    return dict(experiment=experiment, encoding=member.encoding, K=member.K, seed=member.seed,
                model=dataclasses.asdict(model_config(study, member.encoding)),
                task=dict(name="fixed_offset", m=study.m, K=member.K),
                train=dataclasses.asdict(study.train), eval=dataclasses.asdict(study.eval))


def validate(study: StudyConfig, device: str, experiment: Experiment | None = None) -> None:
    """Every check on user input, before anything is trained or written (the experiment's own
    ``check(study)`` too, where it has one)."""
    if device not in DEVICES:
        raise ConfigError("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "cpu (no CUDA device is available here)")
    if study.seeds < 1:
        raise ConfigError("seeds", study.seeds, "a positive integer")
    if not study.encodings:
        raise ConfigError("encodings", study.encodings, "one or more encoding names")
    study.train.validate()
    if not study.eval.lengths or min(study.eval.lengths) < 1:
        raise ConfigError("eval.lengths", study.eval.lengths, "positive integers")
    if study.eval.n_sequences < 1:
        raise ConfigError("eval.n_sequences", study.eval.n_sequences, "a positive integer")
    for name in study.encoding_options:
        if name not in study.encodings:
            raise ConfigError("encoding_options", name, f"options for one of the study's encodings: "
                                                        f"{', '.join(study.encodings)}")
    for K in study.K:
        task = build_task("fixed_offset", m=study.m, K=K)
        task.validate(study.train.min_length)
        for L in study.eval.lengths:
            task.validate(L)
    for name in study.encodings:
        check_encoding(name, study.encoding_options.get(name))
        model = RetrievalHead(model_config(study, name))  # small; builds every table the run will use
        for L in (*study.eval.lengths, study.train.max_length):
            model.check_length(L)
    if experiment is not None and hasattr(experiment, "check"):
        experiment.check(study)


@dataclass
class MemberResult:
    member: Member
    rows: list[dict]
    weights: dict[str, torch.Tensor]
    diverged_at: int | None
    timings: dict


def make_model(study: StudyConfig, encoding: str) -> partial:
    """The factory of one encoding's members (called after seeding, see ``build_member``)."""
    return partial(RetrievalHead, model_config(study, encoding))


def train_members(study: StudyConfig, encoding: str, group: list[Member], *, device: str = "cpu",
                  progress: bool = True, desc: str = "train", threads: int | None = None,
                  position: int = 0) -> TrainResult:
    """Train one shape-compatible group as one ensemble (picklable: a worker may run it)."""
    if threads:
        torch.set_num_threads(threads)
    tasks = [build_task("fixed_offset", m=study.m, K=m.K) for m in group]
    return train_ensemble(make_model(study, encoding), tasks, [m.seed for m in group], study.train, device=device,
                          progress=progress, desc=desc, position=position)


def worker_pool(workers: int) -> tuple[ProcessPoolExecutor, int]:
    """``workers`` fresh processes ("spawn": safe after torch has started threads) and the
    CPU threads each gets, a share of the cores."""
    threads = max(1, (os.cpu_count() or 1) // workers)
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")), threads


def train_group(experiment_name: str, study: StudyConfig, encoding: str, group: list[Member], device: str = "cpu",
                progress: bool = True, threads: int | None = None, position: int = 0) -> list[MemberResult]:
    """Train one shape-compatible group as an ensemble and probe every member.

    A pure function of its arguments (all picklable), so an executor may run it anywhere: in
    this process, in a worker process, or on a Ray worker. It never touches the store.
    """
    from poslab.experiments import get_experiment

    experiment = get_experiment(experiment_name)
    result = train_members(study, encoding, group, device=device, progress=progress, threads=threads,
                           desc=f"{experiment_name} {encoding} x{len(group)}", position=position)
    make = make_model(study, encoding)
    out = []
    for i, member in enumerate(group):
        model = result.models[i].eval()
        untrained = build_member(make, member.seed).to(device).eval()
        start = time.perf_counter()
        rows = experiment.evaluate(model, untrained, member, study, device)
        out.append(MemberResult(member=member, rows=rows, diverged_at=result.diverged_at[i],
                                weights={k: v.detach().cpu() for k, v in model.state_dict().items()},
                                timings=dict(train_seconds=result.seconds / len(group), group_size=len(group),
                                             group_train_seconds=result.seconds,
                                             eval_seconds=time.perf_counter() - start,
                                             diverged_at=result.diverged_at[i])))
    return out


def run_study(experiment: Experiment, study: StudyConfig, *, store: Store, out: Path,
              device: str = "cpu", force: bool = False, progress: bool = True, workers: int = 1) -> dict:
    """Run (or resume) a study and write its report; returns a summary of what was done.

    ``workers`` > 1 trains that many groups at once in worker processes (one CPU thread each
    share of the cores); only this process writes the store, as each group comes back.
    """
    validate(study, device, experiment)
    if workers < 1:
        raise ConfigError("workers", workers, "a positive integer")
    members = [Member(e, K, s) for e in study.encodings for K in study.K for s in range(study.seeds)]
    configs = {m: member_config(experiment.name, study, m) for m in members}
    keys = {m: config_hash(c) for m, c in configs.items()}
    if force:
        for key in keys.values():
            store.delete(key)
    done = {r["key"] for r in store.runs(experiment=experiment.name)} & set(keys.values())  # diverged too
    todo = [m for m in members if keys[m] not in done]
    groups = [(e, [m for m in todo if m.encoding == e]) for e in study.encodings]
    groups = [(e, g) for e, g in groups if g]
    revision = git_revision(Path(__file__).parent)
    start = time.perf_counter()

    def record(results: list[MemberResult]) -> None:
        for r in results:
            store.record(keys[r.member], experiment=experiment.name, config=configs[r.member], rows=r.rows,
                         status="finished" if r.diverged_at is None else "diverged", timings=r.timings,
                         weights=r.weights, revision=revision)

    workers = min(workers, len(groups))
    if workers <= 1 or device != "cpu":
        for encoding, group in groups:
            record(train_group(experiment.name, study, encoding, group, device, progress))
    else:
        pool, threads = worker_pool(workers)
        with pool:
            futures = [pool.submit(train_group, experiment.name, study, encoding, group, device, progress, threads, i)
                       for i, (encoding, group) in enumerate(groups)]
            for future in as_completed(futures):
                record(future.result())
    rows = store.rows(keys=keys.values())
    out.mkdir(parents=True, exist_ok=True)
    files = experiment.report(rows, study, out)
    return dict(members=len(members), trained=len(todo), reused=len(members) - len(todo),
                seconds=time.perf_counter() - start, files=files)
