"""``--executor auto`` (``poslab run``'s default): worker processes, except a run whose training is
estimated under WORKER_START_SECONDS, which trains in this process (starting two workers costs
4-5 s here, more than a quick preset's whole training). Both give the same rows."""

from __future__ import annotations

from poslab.experiments import executors, run, schedule
from poslab.experiments.executors import Auto, Inline, ProcessPool, make_executor
from poslab.store import Store
from poslab.studies import get_experiment

SMALL = ["seeds=1", "grid.task.K=[2]", "grid.encoding=[\"rope\"]", "train.steps=20", "eval.lengths=[12]",
         "eval.n_sequences=16"]


def test_choose_is_inline_below_the_worker_start_and_the_pool_above():
    auto = make_executor("auto", workers=2)
    assert isinstance(auto, Auto) and auto.slots == 2
    assert isinstance(auto.choose(executors.WORKER_START_SECONDS - 0.01), Inline)
    assert auto.choose(executors.WORKER_START_SECONDS) is auto.pool
    assert isinstance(auto.pool, ProcessPool) and auto.pool.workers == 2
    # one worker or a CUDA device runs inline, as local does
    assert isinstance(make_executor("auto", workers=1), Inline)
    assert isinstance(make_executor("auto", workers=2, device="cuda"), Inline)


def test_training_seconds_counts_each_group_whole_with_its_fixed_cost():
    groups = [["a", "b", "c"], ["d"]]
    assert schedule.training_seconds(groups, [2.0, 0.5]) == (3 + schedule.SPLIT_OVERHEAD) * 2.0 + \
        (1 + schedule.SPLIT_OVERHEAD) * 0.5


class _Spy:
    """Counts the jobs ProcessPool.map_unordered is handed, and runs them here."""

    def __init__(self, monkeypatch):
        self.jobs = 0

        def map_unordered(pool, fn, jobs):
            jobs = list(jobs)
            self.jobs += len(jobs)
            for job in jobs:
                yield fn(*job)

        monkeypatch.setattr(ProcessPool, "map_unordered", map_unordered)


def _run(tmp_path, name, monkeypatch, cost_per_member=None):
    spy = _Spy(monkeypatch)
    if cost_per_member is not None:  # the schedule's estimate, replaced: a run of that many seconds
        monkeypatch.setattr("poslab.experiments.runner.step_costs", lambda groups: [cost_per_member] * len(groups))
    summary, = run([get_experiment("phenomenon")], "quick", store=tmp_path / f"{name}.sqlite", out=tmp_path / name,
                   overrides=SMALL + ["grid.model.d_model=[8,16]"], workers=2, progress=False)
    assert summary["trained"] == 2
    with Store(tmp_path / f"{name}.sqlite") as db:
        rows = sorted(tuple(sorted((k, v) for k, v in r.items() if k != "run_key")) for r in db.rows())
    return spy.jobs, rows


def test_a_small_run_trains_here_and_a_large_one_goes_to_the_workers(tmp_path, monkeypatch):
    small_jobs, small_rows = _run(tmp_path, "small", monkeypatch)  # the real estimate: well under a second
    assert small_jobs == 0, "a run of a fraction of a second started worker processes"
    large_jobs, large_rows = _run(tmp_path, "large", monkeypatch, cost_per_member=60.0)
    assert large_jobs == 2  # the two shape groups, one per worker
    assert small_rows == large_rows


def test_local_always_starts_the_workers(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    run([get_experiment("phenomenon")], "quick", store=tmp_path / "s.sqlite", out=tmp_path / "out",
        overrides=SMALL + ["grid.model.d_model=[8,16]"], workers=2, progress=False, executor="local")
    assert spy.jobs == 2
