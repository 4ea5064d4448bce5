"""The results store: roundtrips, idempotent upserts, atomicity under crashes, resumable sweeps."""

from __future__ import annotations

import math
import shutil
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import torch

import poslab.store
from poslab.store import Store, config_hash, git_revision

ROWS = [
    {"encoding": "rope", "K": 2, "seed": 0, "length": 24, "accuracy": 0.99, "exact": True,
     "note": None},
    {"encoding": "rope", "K": 2, "seed": 0, "length": 48, "accuracy": 1.0, "exact": False,
     "note": "long"},
]


def record(store: Store, key: str, rows: list[dict] = ROWS, **kw) -> None:
    store.record(key, experiment=kw.pop("experiment", "offset"), config={"key": key}, rows=rows,
                 **kw)


def raw_counts(store: Store, key: str) -> tuple[int, int]:
    """(runs, metric rows) for ``key``, read through a fresh connection."""
    with sqlite3.connect(store.path) as conn:
        runs = conn.execute("SELECT COUNT(*) FROM runs WHERE key = ?", (key,)).fetchone()[0]
        rows = conn.execute("SELECT COUNT(*) FROM metrics WHERE run_key = ?", (key,)).fetchone()[0]
    return runs, rows


def test_config_hash_is_canonical():
    a = {"model": {"d_model": 64, "n_heads": 2}, "lengths": (16, 32), "lr": 1e-3, "pe": None}
    b = {"pe": None, "lr": 1e-3, "lengths": [16, 32], "model": {"n_heads": 2, "d_model": 64}}
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 16 and int(config_hash(a), 16) >= 0
    assert config_hash(a) != config_hash({**a, "lr": 2e-3})
    assert config_hash(a) != config_hash({**a, "model": {"d_model": 64, "n_heads": 4}})
    assert config_hash({"K": 1}) != config_hash({"K": "1"})


def test_record_roundtrip(tmp_path):
    store = Store(tmp_path / "runs" / "poslab.sqlite")
    weights = {"W_Q": torch.randn(4, 3), "bias": torch.arange(5)}
    store.record("abc", experiment="offset", config={"K": 2, "lengths": (8, 16)}, rows=ROWS,
                 timings={"train_s": 1.5}, weights=weights, revision="deadbeef")

    assert store.finished("abc") and not store.finished("nope")
    got = store.rows()
    assert [{k: v for k, v in r.items() if k != "run_key"} for r in got] == ROWS
    assert all(r["run_key"] == "abc" for r in got)
    for want, row in zip(ROWS, got):
        assert [type(row[k]) for k in want] == [type(v) for v in want.values()]

    (run,) = store.runs()
    assert run["key"] == "abc" and run["experiment"] == "offset" and run["status"] == "finished"
    assert run["config"] == {"K": 2, "lengths": [8, 16]}
    assert run["timings"] == {"train_s": 1.5} and run["revision"] == "deadbeef"
    assert run["created_at"].endswith("+00:00")

    assert (tmp_path / "runs" / "weights" / "abc.safetensors").is_file()
    loaded = store.load_weights("abc")
    assert loaded.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor) and loaded[name].dtype == tensor.dtype


def test_nonfinite_and_scalar_values(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    rows = [{"loss": math.nan, "hi": math.inf, "lo": -math.inf, "acc": torch.tensor(0.25),
             "step": torch.tensor(7)}]
    record(store, "div", rows=rows, status="diverged")
    (row,) = store.rows()
    assert math.isnan(row["loss"]) and row["hi"] == math.inf and row["lo"] == -math.inf
    assert row["acc"] == 0.25 and type(row["acc"]) is float
    assert row["step"] == 7 and type(row["step"]) is int
    assert not store.finished("div") and store.runs()[0]["status"] == "diverged"
    # The stored JSON stays strict, so SQLite's own JSON functions can read every row.
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT json_extract(row_json, '$.acc') FROM metrics").fetchall() == [
            (0.25,)]


def test_weights_are_contiguous_cpu_copies(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    W = torch.randn(3, 5, requires_grad=True)
    weights = {"W_E": W, "U": W, "W_T": W.t(), "slice": W[:, ::2]}  # tied, transposed, strided
    record(store, "w", weights=weights)
    loaded = store.load_weights("w")
    for name, tensor in weights.items():
        assert loaded[name].is_contiguous() and loaded[name].device.type == "cpu"
        assert torch.equal(loaded[name], tensor.detach())
    record(store, "no_weights")
    with pytest.raises(KeyError):
        store.load_weights("no_weights")


def test_upsert_replaces_run_and_rows(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    record(store, "a", rows=ROWS)
    record(store, "a", rows=[{"accuracy": 0.5}], status="diverged")
    assert raw_counts(store, "a") == (1, 1)
    assert store.rows() == [{"accuracy": 0.5, "run_key": "a"}]
    assert [r["status"] for r in store.runs()] == ["diverged"]


def test_crash_inside_record_leaves_no_run(tmp_path, monkeypatch):
    store = Store(tmp_path / "s.sqlite")
    record(store, "other")
    encode, calls = poslab.store._encode_row, []

    def crash_on_second_row(row):
        calls.append(row)
        if len(calls) == 2:
            raise RuntimeError("simulated crash")
        return encode(row)

    monkeypatch.setattr(poslab.store, "_encode_row", crash_on_second_row)
    with pytest.raises(RuntimeError, match="simulated crash"):
        record(store, "a", weights={"W": torch.ones(2)})
    monkeypatch.undo()

    assert len(calls) == 2  # the run row and one metric row were written, then rolled back
    assert raw_counts(store, "a") == (0, 0) and not store.finished("a")
    assert (tmp_path / "weights" / "a.safetensors").is_file()  # written before the transaction
    with pytest.raises(KeyError):
        store.load_weights("a")  # but a stray file without a run is never read
    assert raw_counts(store, "other") == (1, len(ROWS))
    assert [r["key"] for r in store.runs()] == ["other"]

    record(store, "a", weights={"W": torch.zeros(2)})  # a later record overwrites the stray file
    assert raw_counts(store, "a") == (1, len(ROWS))
    assert torch.equal(store.load_weights("a")["W"], torch.zeros(2))


def test_process_killed_mid_record_leaves_no_run(tmp_path):
    """A real crash: the process dies between two metric inserts, without any rollback."""
    path = tmp_path / "s.sqlite"
    record(Store(path), "other")
    script = textwrap.dedent(f"""
        import os, poslab.store
        encode = poslab.store._encode_row
        def die_on_second_row(row, calls=[]):
            calls.append(row)
            if len(calls) == 2:
                os._exit(3)
            return encode(row)
        poslab.store._encode_row = die_on_second_row
        store = poslab.store.Store({str(path)!r})
        store.record("a", experiment="offset", config={{}}, rows=[{{"x": 1}}, {{"x": 2}}])
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == 3
    store = Store(path)
    assert raw_counts(store, "a") == (0, 0) and not store.finished("a")
    assert raw_counts(store, "other") == (1, len(ROWS))


def test_bad_input_writes_nothing(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    with pytest.raises(ValueError, match="status"):
        record(store, "a", status="crashed")
    with pytest.raises(TypeError, match="'curve'"):
        record(store, "a", rows=[{"x": 1}, {"curve": [0.1, 0.2]}])
    with pytest.raises(ValueError, match="key"):
        record(store, "../escape", weights={"W": torch.ones(1)})
    assert raw_counts(store, "a") == (0, 0) and store.runs() == []
    assert not (tmp_path / "escape.safetensors").exists()
    with pytest.raises(TypeError, match="single string"):
        store.finished_keys("abc")


def test_sweep_resumes_without_duplicates(tmp_path):
    path = tmp_path / "s.sqlite"
    keys = [config_hash({"seed": s}) for s in range(4)]
    trained = []

    def sweep(crash_after: int | None) -> None:
        store = Store(path)
        todo = [k for k in keys if k not in store.finished_keys(keys)]
        for i, key in enumerate(todo):
            if i == crash_after:
                raise KeyboardInterrupt
            trained.append(key)
            record(store, key, rows=[{"seed": keys.index(key), "accuracy": 1.0}])

    with pytest.raises(KeyboardInterrupt):
        sweep(crash_after=2)
    sweep(crash_after=None)
    sweep(crash_after=None)  # nothing left to do

    assert trained == keys  # each key trained exactly once
    store = Store(path)
    assert [r["key"] for r in store.runs()] == keys
    assert [r["seed"] for r in store.rows()] == [0, 1, 2, 3]
    assert store.finished_keys(keys + ["missing"]) == set(keys)


def test_two_stores_share_one_file(tmp_path):
    path = tmp_path / "s.sqlite"
    first, second = Store(path), Store(path)
    record(first, "a")
    assert second.finished("a") and len(second.rows()) == len(ROWS)
    record(second, "b", experiment="shift")
    assert first.finished_keys(["a", "b"]) == {"a", "b"}
    second.delete("a")
    assert [r["key"] for r in first.runs()] == ["b"]


def test_filters(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    record(store, "a", experiment="offset")
    record(store, "b", experiment="shift")
    record(store, "c", experiment="offset")
    assert {r["run_key"] for r in store.rows(experiment="offset")} == {"a", "c"}
    assert {r["run_key"] for r in store.rows(keys=["b", "c"])} == {"b", "c"}
    assert {r["run_key"] for r in store.rows(experiment="offset", keys=iter(["b", "c"]))} == {"c"}
    assert store.rows(keys=[]) == []
    assert [r["key"] for r in store.runs(experiment="shift")] == ["b"]


def test_delete_removes_run_rows_and_weights(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    record(store, "a", weights={"W": torch.ones(2)})
    record(store, "b")
    store.delete("a")
    store.delete("never-recorded")
    assert raw_counts(store, "a") == (0, 0) and not store.finished("a")
    assert not (tmp_path / "weights" / "a.safetensors").exists()
    assert [r["key"] for r in store.runs()] == ["b"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_revision(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # never find an outer repo
    repo = tmp_path / "repo"
    repo.mkdir()
    assert git_revision(repo) is None
    assert git_revision(tmp_path / "missing") is None

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                       check=True, capture_output=True)

    git("init")
    assert git_revision(repo) is None  # no commit yet
    (repo / "f.txt").write_text("one")
    git("add", "f.txt")
    git("commit", "-m", "one")
    head = git_revision(repo)
    assert head is not None and len(head) == 40
    (repo / "untracked.txt").write_text("ignored")
    assert git_revision(repo) == head
    (repo / "f.txt").write_text("two")
    assert git_revision(repo) == f"{head}-dirty"
