"""Faults and resume: a real sweep killed with SIGKILL part-way, then resumed, ends with the
uninterrupted run's table; two sweeps writing one store at once leave it whole.

The sweep is ``poslab run phenomenon --preset quick`` with three shape groups (d_model axis), run
inline so each group is recorded as it finishes. The reference is the same study run in this
process (same CPU thread count, so the same numbers bit for bit).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from poslab.experiments import EvaluateOnly, members, run_study
from poslab.experiments.config import apply_overrides
from poslab.experiments.executors import Inline
from poslab.store import Store
from poslab.studies import get_experiment

OWN = {"encoding": '["rope"]', "task.K": "[2]", "model.d_model": "[8,16,24]"}
SETS = ["seeds=1", "train.steps=150",  # groups seconds apart, so the kill lands between two
        "train.batch_size=16", "eval.lengths=[12,20]", "eval.n_sequences=32"]


def _overrides() -> list[str]:
    """The sweep's --set list: our axes, every other axis of the preset pinned to its first value
    (so the test does not depend on what else the experiment sweeps)."""
    grid = get_experiment("phenomenon").study("quick").grid
    pinned = [f"grid.{axis}={json.dumps([values[0]])}" for axis, values in grid.items() if axis not in OWN]
    return [f"grid.{axis}={values}" for axis, values in OWN.items()] + pinned + SETS


def _cmd(store: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "poslab", "run", "phenomenon", "--preset", "quick", "--executor", "inline",
           "--no-progress", "--store", str(store), "--out", str(out)]
    for item in _overrides():
        cmd += ["--set", item]
    return cmd


def _runs(store: Path) -> list[tuple]:
    if not store.exists():
        return []
    with sqlite3.connect(f"{store.absolute().as_uri()}?mode=ro", uri=True, timeout=30) as conn:
        try:
            return conn.execute("SELECT key, created_at FROM runs ORDER BY rowid").fetchall()
        except sqlite3.OperationalError:  # the schema is being created
            return []


def _tidy(rows: list[dict]) -> list[str]:
    return sorted(json.dumps({k: v for k, v in r.items() if k != "run_key"}, sort_keys=True) for r in rows)


def test_sigkill_part_way_then_resume_equals_uninterrupted(tmp_path):
    exp = get_experiment("phenomenon")
    study = apply_overrides(exp.study("quick"), _overrides())
    keys = [m.key for m in members("phenomenon", study)]
    assert len(keys) == 3

    # the reference: uninterrupted, in this process
    with Store(tmp_path / "ref" / "s.sqlite") as ref:
        run_study(exp, study, store=ref, out=tmp_path / "ref", progress=False, executor=Inline())
        ref_rows = _tidy(ref.rows())
        ref_weights = {k: ref.load_weights(k) for k in keys}

    # a real sweep, killed with SIGKILL once at least one group is recorded
    store = tmp_path / "runs" / "s.sqlite"
    proc = subprocess.Popen(_cmd(store, tmp_path / "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not _runs(store) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    before = _runs(store)
    assert 0 < len(before) < len(keys), f"killed too late or too early: {len(before)} of {len(keys)} recorded"
    finished = {k for k, _ in before}
    weights_dir = store.parent / "weights"
    stamps = {k: os.stat(weights_dir / f"{k}.safetensors").st_mtime_ns for k in finished}
    # what a crash between writing weights and committing leaves: a half-written file for a member
    # the store does not hold, and a stray temp file
    missing = [k for k in keys if k not in finished]
    (weights_dir / f"{missing[0]}.safetensors").write_bytes(b"\x00" * 7)
    (weights_dir / f".{missing[0]}.junk.tmp").write_bytes(b"half")

    # two sweeps resume into the same store at once
    procs = [subprocess.Popen(_cmd(store, tmp_path / f"resume{i}"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs, strict=False):
        assert p.returncode == 0, err[-2000:]
        assert f"reused {len(finished)}" in out or f"reused {len(keys)}" in out, out  # finished runs not retrained

    with sqlite3.connect(store) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        runs = conn.execute("SELECT key FROM runs").fetchall()
        dup = conn.execute("SELECT run_key, idx, COUNT(*) FROM metrics GROUP BY run_key, idx HAVING COUNT(*) > 1")
        assert dup.fetchall() == []
    assert sorted(k for (k,) in runs) == sorted(keys)
    for k in finished:  # the runs recorded before the kill were never retrained
        assert os.stat(weights_dir / f"{k}.safetensors").st_mtime_ns == stamps[k]
        assert (k, dict(before)[k]) in _runs(store)
    with Store(store) as db:
        assert _tidy(db.rows()) == ref_rows  # no row lost or duplicated, same numbers
        for k in keys:  # the half-written file was replaced, never read
            got = db.load_weights(k)
            assert got.keys() == ref_weights[k].keys()
            assert all(torch.equal(got[n], ref_weights[k][n]) for n in got)
    for i in range(2):
        assert (tmp_path / f"resume{i}" / "table.md").read_text() == (tmp_path / "ref" / "table.md").read_text()


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_run_leaves_no_worker_running(tmp_path):
    """SIGKILL a real `poslab run` with a pool of workers: every process it started (the workers, the
    resource tracker, anything else) exits within seconds."""
    if not Path("/proc/self/stat").exists():
        import pytest

        pytest.skip("needs /proc to find the workers")
    sets = [a for s in _overrides() for a in ("--set", s)]
    cmd = [sys.executable, "-m", "poslab", "run", "phenomenon", "--preset", "quick", *sets, "--set",
           "train.steps=100000", "--executor", "local", "--workers", "2", "--no-progress",
           "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "out")]
    workers: set[int] = set()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(workers) < 2:
            time.sleep(0.5)
            workers = {p for p in _children(proc.pid) if "spawn_main" in _cmdline(p)}
        assert len(workers) >= 2, "the run never started its pool workers"
        time.sleep(2)  # let them get into training
        started = _children(proc.pid)  # the workers and every other descendant (the resource tracker)
        assert workers <= started
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(p) for p in started):
            time.sleep(0.2)
        left = {p: _cmdline(p) for p in started if _alive(p)}
        assert not left, f"processes outlived their killed parent: {left}"
        workers = started
    finally:  # whatever failed above, nothing of this run is left running (the run itself included)
        left_over = _children(proc.pid) | workers
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in left_over:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _rows_of(job, *, device: str) -> list[dict]:
    return [dict(probe="value", value=job.config["x"])]


def test_evaluate_jobs_runs_only_as_many_workers_as_fit_in_memory(tmp_path, monkeypatch, capsys):
    from poslab.experiments import Job
    from poslab.experiments import training as runner
    from poslab.machine import MEMORY_FRACTION, memory_bytes

    asked = []

    def fake_executor(name, workers, **_):
        asked.append(workers)
        return Inline()

    monkeypatch.setattr(runner, "make_executor", fake_executor)
    exp = EvaluateOnly(name="memo", title="memo", base=None, presets={}, jobs=lambda study: [], run_job=_rows_of,
                       report=None)
    store = Store(tmp_path / "s.sqlite")
    plenty = memory_bytes() * MEMORY_FRACTION / 10
    jobs = [Job(dict(x=i), memory=plenty) for i in range(4)]
    runner.evaluate_jobs(exp, jobs[:2], store=store, workers=2, progress=False)
    assert asked == [2] and "worker(s)" not in capsys.readouterr().err  # two fit: no cap, nothing said
    # a job peaking at 60% of what a run may plan for: one at a time, and stderr says why
    big = [Job(j.config, memory=0.6 * memory_bytes() * MEMORY_FRACTION) for j in jobs[2:]]
    runner.evaluate_jobs(exp, big, store=store, workers=2, progress=False)
    assert asked == [2, 1] and "1 worker(s)" in capsys.readouterr().err
    assert sorted(r["value"] for r in store.rows(keys=[j.key for j in jobs])) == [0, 1, 2, 3]


def test_an_experiment_is_trained_or_evaluate_only_never_both_nor_neither():
    from poslab.experiments import EvaluateOnly, Experiment, Trained

    with pytest.raises(TypeError, match="a Trained or an EvaluateOnly study"):
        Experiment(name="x", title="x", base=None, presets={}, report=None)
    with pytest.raises(TypeError, match="evaluate"):  # a trained study evaluates its members
        Trained(name="x", title="x", base=None, presets={}, report=None)
    with pytest.raises(TypeError, match="'evaluate'"):  # an evaluate-only one has no evaluate, only jobs
        EvaluateOnly(name="x", title="x", base=None, presets={}, report=None, evaluate=_rows_of, jobs=lambda s: [],
                     run_job=_rows_of)
    with pytest.raises(TypeError, match="run_job"):
        EvaluateOnly(name="x", title="x", base=None, presets={}, report=None, jobs=lambda s: [])
