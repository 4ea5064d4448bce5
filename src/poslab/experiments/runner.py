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
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Protocol

import torch
from tqdm.auto import tqdm

from poslab.errors import ConfigError
from poslab.experiments.config import StudyConfig
from poslab.models.retrieval_head import RetrievalHead
from poslab.positional import check_encoding, encoding_class
from poslab.store import Store, config_hash, git_revision
from poslab.tasks import build_task
from poslab.train import build_member, train_ensemble

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


def validate(study: StudyConfig, device: str) -> None:
    """Every check on user input, before anything is trained or written."""
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
        encoding_class(name)
        check_encoding(name, study.encoding_options.get(name))
        with torch.device("meta"):
            model = RetrievalHead(model_config(study, name))
        for L in (*study.eval.lengths, study.train.max_length):
            model.check_length(L)


def run_study(experiment: Experiment, study: StudyConfig, *, store: Store, out: Path,
              device: str = "cpu", force: bool = False, progress: bool = True) -> dict:
    """Run (or resume) a study and write its report; returns a summary of what was done."""
    validate(study, device)
    members = [Member(e, K, s) for e in study.encodings for K in study.K for s in range(study.seeds)]
    configs = {m: member_config(experiment.name, study, m) for m in members}
    keys = {m: config_hash(c) for m, c in configs.items()}
    if force:
        for key in keys.values():
            store.delete(key)
    done = {r["key"] for r in store.runs(experiment=experiment.name)} & set(keys.values())  # diverged too
    todo = [m for m in members if keys[m] not in done]
    revision = git_revision(Path(__file__).parent)
    trained_seconds = 0.0
    for encoding in study.encodings:
        group = [m for m in todo if m.encoding == encoding]
        if not group:
            continue
        make = partial(RetrievalHead, model_config(study, encoding))
        tasks = [build_task("fixed_offset", m=study.m, K=m.K) for m in group]
        result = train_ensemble(make, tasks, [m.seed for m in group], study.train, device=device,
                                progress=progress, desc=f"{experiment.name} {encoding} x{len(group)}")
        trained_seconds += result.seconds
        for i, member in enumerate(tqdm(group, desc=f"evaluate {encoding}", disable=not progress, leave=False)):
            model = result.models[i].eval()
            untrained = build_member(make, member.seed).to(device).eval()
            start = time.perf_counter()
            rows = experiment.evaluate(model, untrained, member, study, device)
            diverged = result.diverged_at[i]
            store.record(keys[member], experiment=experiment.name, config=configs[member], rows=rows,
                         status="finished" if diverged is None else "diverged",
                         timings=dict(train_seconds=result.seconds / len(group), group_size=len(group),
                                      eval_seconds=time.perf_counter() - start, diverged_at=diverged),
                         weights={k: v for k, v in model.state_dict().items()}, revision=revision)
    rows = store.rows(keys=keys.values())
    out.mkdir(parents=True, exist_ok=True)
    files = experiment.report(rows, study, out)
    return dict(members=len(members), trained=len(todo), reused=len(members) - len(todo),
                train_seconds=trained_seconds, files=files)
