"""Evaluate-only studies as declarations (``EvaluateOnly``: ``jobs`` / ``run_job`` / ``prepare``): the
engine lists, keys, stores and resumes their members, runs ``prepare`` only when a job is to run,
hands what it returns to every job, and refuses ``--reevaluate``; a toy study, no checkpoint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from poslab.errors import ConfigError
from poslab.experiments import EvaluateOnly, Job, run_study, validate
from poslab.experiments.config import StudyConfig
from poslab.experiments.executors import Inline
from poslab.store import Store

CALLS: dict[str, list] = {"prepare": [], "run": []}


def _study(preset: str) -> StudyConfig:
    return StudyConfig(model_type="pretrained", model=dict(x=[1, 2, 3]), task_type="text", task={}, seeds=1)


def _jobs(study: StudyConfig) -> list[Job]:
    return [Job(dict(experiment="toy", x=x), args=dict(where=f"/nowhere/{x}"), label=f"x={x}")
            for x in study.model["x"]]


def _prepare(study: StudyConfig, todo: list[Job], *, stages, device: str, progress: bool) -> dict:
    CALLS["prepare"].append(sorted(j.config["x"] for j in todo))
    stages.put({"stage": "offset"}, [dict(offset=100)])
    return dict(offset=100)


def _run_job(job: Job, *, device: str, offset: int = 0) -> list[dict]:
    CALLS["run"].append(job.config["x"])
    return [dict(probe="value", x=job.config["x"], value=job.config["x"] + offset, where=job.args["where"])]


def _report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    path = out / "rows.json"
    path.write_text(json.dumps(sorted((r["x"], r["value"]) for r in rows)))
    return [path]


TOY = EvaluateOnly(name="toy", title="a toy evaluate-only study", base=_study("quick"), presets={"quick": {}},
                   jobs=_jobs, run_job=_run_job, prepare=_prepare, report=_report)


def _run(store: Store, out: Path, study: StudyConfig, **kw) -> dict:
    return run_study(TOY, study, store=store, out=out, progress=False, executor=Inline(), **kw)


def test_jobs_are_keyed_stored_resumed_and_prepared_only_when_one_runs(tmp_path):
    CALLS["prepare"].clear()
    CALLS["run"].clear()
    study = _study("quick")
    assert validate(study, "cpu", TOY) == []  # no trained members
    with Store(tmp_path / "s.sqlite") as store:
        first = _run(store, tmp_path / "out", study)
        assert (first["members"], first["trained"], first["reused"]) == (3, 3, 0)
        assert json.loads((tmp_path / "out" / "rows.json").read_text()) == [[1, 101], [2, 102], [3, 103]]
        assert CALLS == {"prepare": [[1, 2, 3]], "run": [1, 2, 3]}
        stored = {r["key"]: r["config"] for r in store.runs(experiment="toy")}
        assert {j.key: j.config for j in _jobs(study)}.items() <= stored.items()  # keyed by the config's hash
        again = _run(store, tmp_path / "out", study)  # resumed: nothing runs, nothing is prepared
        assert (again["trained"], again["reused"]) == (0, 3) and CALLS["run"] == [1, 2, 3]
        assert len(CALLS["prepare"]) == 1
        more = _run(store, tmp_path / "out", dataclasses.replace(study, model=dict(x=[2, 4])))
        assert (more["members"], more["trained"], more["reused"]) == (2, 1, 1)
        assert CALLS["prepare"][-1] == [4] and CALLS["run"][-1] == 4  # only the missing job
        forced = _run(store, tmp_path / "out", study, force=True)
        assert forced["trained"] == 3 and CALLS["prepare"][-1] == [1, 2, 3]
        assert store.outputs()["toy"] == (tmp_path / "out").resolve()


def test_an_evaluate_only_study_refuses_reevaluate(tmp_path):
    with Store(tmp_path / "s.sqlite") as store, pytest.raises(ConfigError, match="evaluates a pretrained"):
        _run(store, tmp_path / "out", _study("quick"), reevaluate=True)
