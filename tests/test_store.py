"""The results store: roundtrips, idempotent upserts, atomicity under crashes, resumable sweeps,
refusing files that are not poslab stores, and concurrent writers."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from click.testing import CliRunner

import poslab.store
from poslab.cli import main
from poslab.errors import ConfigError
from poslab.store import APPLICATION_ID, SCHEMA_VERSION, Store, config_hash, git_revision

ROWS = [
    {"encoding": "rope", "K": 2, "seed": 0, "length": 24, "accuracy": 0.99, "exact": True,
     "note": None},
    {"encoding": "rope", "K": 2, "seed": 0, "length": 48, "accuracy": 1.0, "exact": False,
     "note": "long"},
]



def finished_keys(store: Store, keys) -> set[str]:
    """The keys among ``keys`` whose runs finished (the runner reads ``runs`` the same way)."""
    return {r["key"] for r in store.runs() if r["status"] == "finished"} & set(keys)


def finished(store: Store, key: str) -> bool:
    return key in finished_keys(store, [key])

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

    assert finished(store, "abc") and not finished(store, "nope")
    got = store.rows()
    assert [{k: v for k, v in r.items() if k != "run_key"} for r in got] == ROWS
    assert all(r["run_key"] == "abc" for r in got)
    for want, row in zip(ROWS, got, strict=False):
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
    assert not finished(store, "div") and store.runs()[0]["status"] == "diverged"
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
    assert raw_counts(store, "a") == (0, 0) and not finished(store, "a")
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
    assert raw_counts(store, "a") == (0, 0) and not finished(store, "a")
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


def test_sweep_resumes_without_duplicates(tmp_path):
    path = tmp_path / "s.sqlite"
    keys = [config_hash({"seed": s}) for s in range(4)]
    trained = []

    def sweep(crash_after: int | None) -> None:
        store = Store(path)
        todo = [k for k in keys if k not in finished_keys(store, keys)]
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
    assert finished_keys(store, keys + ["missing"]) == set(keys)


def test_two_stores_share_one_file(tmp_path):
    path = tmp_path / "s.sqlite"
    first, second = Store(path), Store(path)
    record(first, "a")
    assert finished(second, "a") and len(second.rows()) == len(ROWS)
    record(second, "b", experiment="shift")
    assert finished_keys(first, ["a", "b"]) == {"a", "b"}
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
    assert raw_counts(store, "a") == (0, 0) and not finished(store, "a")
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


# ----------------------------------------------------------------------------- opening and refusing


def snapshot(directory) -> dict[str, bytes | None]:
    """Every entry under ``directory`` with its bytes (None for a directory)."""
    return {str(p.relative_to(directory)): None if p.is_dir() else p.read_bytes()
            for p in sorted(directory.rglob("*"))}


def assert_refused(path, directory) -> ConfigError:
    """Store(path) raises ConfigError naming the path and leaves ``directory`` as it was."""
    before = snapshot(directory)
    with pytest.raises(ConfigError) as err:
        Store(path)
    assert err.value.field == "--store" and str(path) in str(err.value)
    assert "a poslab store (SQLite file) or a new path in a writable directory" in str(err.value)
    assert "\n" not in str(err.value)
    assert snapshot(directory) == before  # byte for byte, and no -wal, -shm or -journal beside it
    return err.value


@pytest.mark.parametrize("content", [random.Random(0).randbytes(10_000), b"key,value\n1,2\n",
                                     b"SQLite format 3\x00" + bytes(84)])
def test_refuses_a_file_that_is_not_sqlite(tmp_path, content):
    path = tmp_path / "s.sqlite"
    path.write_bytes(content)
    assert_refused(path, tmp_path)


def _foreign(path, *statements: str, wal: bool = False) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        if wal:
            conn.execute("PRAGMA journal_mode = WAL")
        for statement in statements:
            conn.execute(statement)
        conn.commit()


OUR_TABLES = (
    "CREATE TABLE runs (key TEXT PRIMARY KEY, experiment TEXT NOT NULL, config_json TEXT NOT NULL,"
    " status TEXT NOT NULL, timings_json TEXT, revision TEXT, weights TEXT, created_at TEXT NOT NULL)",
    "CREATE TABLE metrics (run_key TEXT NOT NULL, idx INTEGER NOT NULL, row_json TEXT NOT NULL,"
    " nonfinite_json TEXT, PRIMARY KEY (run_key, idx))",
)
FOREIGN = {
    "other_tables": dict(statements=("CREATE TABLE notes (x)", "INSERT INTO notes VALUES (1)")),
    "other_tables_wal": dict(statements=("CREATE TABLE notes (x)", "INSERT INTO notes VALUES (1)"),
                             wal=True),
    "our_tables_and_more": dict(statements=(*OUR_TABLES, "CREATE TABLE notes (x)")),
    "lookalike_columns": dict(statements=("CREATE TABLE runs (id)", "CREATE TABLE metrics (id)")),
    "other_application": dict(statements=("PRAGMA application_id = 42", *OUR_TABLES)),
    "empty_with_user_version": dict(statements=("PRAGMA user_version = 7",)),
}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_refuses_another_programs_sqlite_database(tmp_path, kind):
    path = tmp_path / "other.db"
    _foreign(path, *FOREIGN[kind]["statements"], wal=FOREIGN[kind].get("wal", False))
    assert_refused(path, tmp_path)


def test_refuses_a_store_from_a_newer_poslab(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        record(store, "a")
    _foreign(path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    assert "newer poslab" in str(assert_refused(path, tmp_path))


def test_refuses_a_directory(tmp_path):
    path = tmp_path / "runs"
    path.mkdir()
    (path / "notes.txt").write_text("keep me")
    assert "directory" in str(assert_refused(path, tmp_path))


@pytest.mark.parametrize("below", ["s.sqlite", "deeper/s.sqlite"])
def test_refuses_a_path_below_a_regular_file(tmp_path, below):
    blocker = tmp_path / "results.csv"
    blocker.write_bytes(b"a,b\n1,2\n")
    err = assert_refused(blocker / below, tmp_path)
    assert "not a directory" in str(err)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only dirs")
def test_refuses_a_new_path_in_a_read_only_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert_refused(locked / "s.sqlite", tmp_path)
    finally:
        locked.chmod(0o755)


def test_cli_reports_a_bad_store_in_one_line(tmp_path):
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"not a database")
    result = CliRunner().invoke(main, ["report", "--store", str(path)])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith("poslab: error: --store") and str(path) in line
    assert path.read_bytes() == b"not a database"


def test_new_and_empty_files_become_stores(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    for path in (tmp_path / "new" / "dir" / "s.sqlite", empty):
        record(Store(path), "a")
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
            assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert finished(Store(path), "a")


def test_opens_a_store_written_before_the_application_id(tmp_path):
    """A store with exactly poslab's tables and no application_id is ours; it is stamped on open."""
    path = tmp_path / "s.sqlite"
    _foreign(path, *OUR_TABLES, "INSERT INTO runs VALUES ('a', 'offset', '{}', 'finished', NULL, NULL,"
                                " NULL, '2024-01-01T00:00:00+00:00')",
             "INSERT INTO metrics VALUES ('a', 0, '{\"accuracy\": 1.0}', NULL)", wal=True)
    store = Store(path)
    assert finished(store, "a") and store.rows() == [{"accuracy": 1.0, "run_key": "a"}]
    record(store, "b")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert finished_keys(Store(path), ["a", "b"]) == {"a", "b"}


def test_reopens_after_a_crash_left_a_write_ahead_log(tmp_path):
    """A store whose -wal file is still there (its writer was killed) opens and keeps its rows."""
    path = tmp_path / "s.sqlite"
    script = textwrap.dedent(f"""
        import os, poslab.store
        store = poslab.store.Store({str(path)!r})
        store._conn.execute("PRAGMA wal_autocheckpoint = 0")
        store.record("a", experiment="offset", config={{}}, rows=[{{"x": 1}}])
        os._exit(0)
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == 0
    assert (tmp_path / "s.sqlite-wal").stat().st_size > 0
    assert Store(path).rows() == [{"x": 1, "run_key": "a"}]


# ----------------------------------------------------------------------------- concurrent writers

RUNS_PER_WRITER = 50


def _write_runs(path: str, writer: int, barrier) -> None:
    """Open the store and record RUNS_PER_WRITER runs of three rows, all writers at once."""
    barrier.wait()
    store = Store(path)
    for i in range(RUNS_PER_WRITER):
        time.sleep(0.002)  # a worker between two members: lets the other writer take the lock
        store.record(f"w{writer}-{i}", experiment="offset", config={"writer": writer, "i": i},
                     rows=[{"writer": writer, "i": i, "row": r} for r in range(3)])
    store.close()


def test_two_processes_write_one_store_at_once(tmp_path):
    path = tmp_path / "s.sqlite"  # absent: both processes also race to create it
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    writers = [ctx.Process(target=_write_runs, args=(str(path), w, barrier)) for w in range(2)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(timeout=120)
    assert [p.exitcode for p in writers] == [0, 0]

    store = Store(path)
    want = {f"w{w}-{i}" for w in range(2) for i in range(RUNS_PER_WRITER)}
    keys = [r["key"] for r in store.runs()]
    assert len(keys) == len(want) and set(keys) == want
    rows = [(r["run_key"], r["row"]) for r in store.rows()]
    assert sorted(rows) == sorted((k, r) for k in want for r in range(3))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
