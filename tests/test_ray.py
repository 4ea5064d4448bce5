"""The Ray executor end to end on a local Ray instance: same rows as an inline run, store
written by the driver only. Skipped only where ray cannot be imported (the extra poslab[ray])."""

from __future__ import annotations

import pytest
import torch

from poslab.experiments import run_study
from poslab.experiments.config import apply_overrides
from poslab.experiments.executors import Inline, make_executor
from poslab.store import Store
from poslab.studies import get_experiment

ray = pytest.importorskip("ray", reason="the Ray executor needs the extra: pip install 'poslab[ray]'")
pytestmark = pytest.mark.xdist_group("ray")  # under pytest -n one worker runs these: one local Ray cluster at a time

SETS = ['grid.encoding=["rope"]', "grid.task.K=[2]", "seeds=2", "train.steps=20", "train.batch_size=16",
        "eval.lengths=[12,20]", "eval.n_sequences=32"]


def _metrics(rows):
    return sorted((tuple(sorted((k, v) for k, v in r.items() if k != "run_key")) for r in rows), key=repr)


def _inline_rows(exp, study, out):
    """The rows of an inline run with one thread: what a Ray task with one CPU computes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Store(out / "s.sqlite") as db:
            run_study(exp, study, store=db, out=out, progress=False, executor=Inline())
            return db.rows()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance (two CPUs) for this module's tests: its start, and its workers'
    imports, are paid once."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_executor_equals_inline(tmp_path, local_ray):
    exp = get_experiment("phenomenon")
    study = apply_overrides(exp.study("quick"), SETS)
    inline = _inline_rows(exp, study, tmp_path / "inline")
    with Store(tmp_path / "ray" / "s.sqlite") as db:
        summary = run_study(exp, study, store=db, out=tmp_path / "ray", progress=False,
                            executor=make_executor("ray", cpus=1))
        got = db.rows()
        assert summary["trained"] == summary["members"] >= 2
        assert len(db.runs()) == summary["members"] + summary["variants"]
        assert all(db.load_weights(r["key"]) for r in db.runs())  # the driver wrote every weight file
    assert _metrics(got) == _metrics(inline)
    assert (tmp_path / "ray" / "claims.json").exists()


def test_ray_spreads_a_pretrained_studys_members(tmp_path, local_ray):
    """pretrained-extension's members (method x scale points of a checkpoint) run as Ray tasks; the
    driver alone writes the store; the rows equal an inline run's with one thread."""
    pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
    import dataclasses

    exp = get_experiment("pretrained-extension")
    quick = exp.study("quick")
    study = dataclasses.replace(quick, model={**quick.model, "windows": 1, "depths": [0.5], "trials": 1,
                                              "reasoning": ["multikey"], "capability": None},
                                grid={"model.method": ("none", "pi"), "model.scale": (1, 2)})
    inline = _inline_rows(exp, study, tmp_path / "inline")
    with Store(tmp_path / "ray.sqlite") as db:
        summary = run_study(exp, study, store=db, out=tmp_path / "ray", progress=False,
                            executor=make_executor("ray", cpus=1))
        got = db.rows()
        assert summary["trained"] == summary["members"] == 4 and len(db.runs()) == 4
    drop = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert _metrics(drop(got)) == _metrics(drop(inline))
