"""Results store: one SQLite file for runs and metric rows, safetensors weights beside it.

A run is keyed by ``config_hash(config)`` (or any file-name-safe key the caller chooses). A sweep
reads which of its keys are recorded (``runs``), trains the rest, and ``record``s each one; a
sweep interrupted at any point resumes without losing or duplicating a row.

Layout and schema::

    <dir>/poslab.sqlite                 WAL mode, PRAGMA application_id = APPLICATION_ID,
                                        PRAGMA user_version = SCHEMA_VERSION
        runs(key PRIMARY KEY, experiment, config_json, status, timings_json, revision,
             weights, created_at)       status: "finished" | "diverged"; weights: file name
                                        relative to <dir>, NULL when none were saved
        metrics(run_key, idx, row_json, nonfinite_json)
                                        one tidy row per line, PRIMARY KEY (run_key, idx)
    <dir>/weights/<key>.safetensors

``row_json`` is strict JSON, so plain SQL reads it::

    SELECT r.config_json, json_extract(m.row_json, '$.accuracy')
    FROM metrics m JOIN runs r ON r.key = m.run_key WHERE r.experiment = 'offset';

SQLite's JSON (before 3.42) rejects NaN and infinities, which diverged runs produce, so a
non-finite float is ``null`` in ``row_json`` and its exact value sits in ``nonfinite_json``
(``{"loss": "nan"}``); ``rows()`` puts it back.

Atomicity. ``record`` writes the weights first (temp file, fsync, ``os.replace``), then deletes
any earlier run with the key, inserts the run row and inserts its metric rows in one SQLite
transaction. A crash before the commit leaves no trace of the run in the database (at worst a
stray weights file, which nothing reads and the next ``record`` overwrites); a crash after it
leaves a complete run. Readers therefore never see a run without all its rows. One caveat:
re-recording an existing key replaces its weights file before the new row commits, so a crash
in between pairs the old row with the new weights of the same key (``--force`` deletes first).

Opening. ``Store(path)`` creates a new store at a path that does not exist (or an empty file),
and opens an existing one; anything else — a file that is not SQLite, another program's SQLite
database, a directory, a path that cannot be created — raises ``ConfigError("--store", ...)``
and leaves the file byte-for-byte as it was: the file is inspected read-only first (its header,
then its tables), and only a poslab store is ever opened for writing. A store is recognised by
its ``application_id``, or, for stores written before it was set, by having exactly the
``runs`` and ``metrics`` tables with poslab's columns (such a store is stamped on open).

Concurrency. Several processes may write one store at once: WAL mode lets readers run beside
the writer, each ``record`` is one ``BEGIN IMMEDIATE`` transaction (writers queue instead of
deadlocking), and a writer waits up to ``BUSY_TIMEOUT_S`` for the lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from poslab.errors import ConfigError

STATUSES = ("finished", "diverged")
APPLICATION_ID = int.from_bytes(b"PSLB", "big")  # PRAGMA application_id of every poslab store
SCHEMA_VERSION = 1  # PRAGMA user_version; a store with a higher one was written by a newer poslab
BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another process's transaction

_STORE_ALLOWED = "a poslab store (SQLite file) or a new path in a writable directory"
_SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
    key          TEXT PRIMARY KEY,
    experiment   TEXT NOT NULL,
    config_json  TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('finished', 'diverged')),
    timings_json TEXT,
    revision     TEXT,
    weights      TEXT,
    created_at   TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS runs_experiment ON runs (experiment)",
    """CREATE TABLE IF NOT EXISTS metrics (
    run_key        TEXT NOT NULL REFERENCES runs (key) ON DELETE CASCADE,
    idx            INTEGER NOT NULL,
    row_json       TEXT NOT NULL,
    nonfinite_json TEXT,
    PRIMARY KEY (run_key, idx)
)""",
)
# Where each experiment last wrote its outputs (``poslab report`` finds them there); added to
# stores of either age when they are opened, so it is not one of the legacy-detection columns.
_OUTPUTS = """CREATE TABLE IF NOT EXISTS outputs (
    experiment TEXT PRIMARY KEY,
    folder     TEXT NOT NULL,
    written_at TEXT NOT NULL
)"""
# Every claim's judgements (experiment/registry.py): its first, then each whose fingerprint (what judges it)
# differs; judging again under a fingerprint already recorded adds nothing. Added to stores of either age.
_JUDGEMENTS = """CREATE TABLE IF NOT EXISTS judgements (
    experiment  TEXT NOT NULL,
    claim       TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    criterion   TEXT,
    role        TEXT,
    verdict     TEXT,
    na_kind     TEXT,
    reason      TEXT,
    revision    TEXT,
    judged_at   TEXT NOT NULL,
    PRIMARY KEY (experiment, claim, fingerprint)
)"""
# The columns of each table, in order: a store from before APPLICATION_ID is recognised by them.
_COLUMNS = {
    "runs": ("key", "experiment", "config_json", "status", "timings_json", "revision", "weights",
             "created_at"),
    "metrics": ("run_key", "idx", "row_json", "nonfinite_json"),
}

_SAFE_KEY = re.compile(r"[\w=+:-][\w.=+:-]*")


def config_hash(config: dict) -> str:
    """First 16 hex digits of the sha256 of the canonical JSON of ``config``."""
    return hashlib.sha256(_dump_config(config).encode()).hexdigest()[:16]


def git_revision(path: str | Path = ".") -> str | None:
    """``git rev-parse HEAD`` at ``path``, with ``-dirty`` if tracked files changed; else None."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):  # git missing, not a repo, no commit yet
        return None
    return f"{head}-dirty" if dirty else head


class Store:
    """Runs, metric rows and weights under one directory; see the module docstring."""

    def __init__(self, path: str | Path = "runs/poslab.sqlite"):
        self.path = Path(path)
        self.dir = self.path.parent
        new = _inspect(self.path) == "new"
        if new:
            _make_dir(self.path)
        failure = "it cannot be created" if new else "it cannot be opened for writing"
        try:
            # Autocommit mode: transactions are opened explicitly by _transaction, nowhere else.
            self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise _refuse(self.path, f"{failure}: {e}") from None
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            _use_wal(self._conn)
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._create_schema()
        except BaseException as e:
            self._conn.close()
            if isinstance(e, sqlite3.Error):
                raise _refuse(self.path, f"{failure}: {e}") from None
            raise

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(
        self,
        key: str,
        *,
        experiment: str,
        config: dict,
        rows: list[dict],
        status: str = "finished",
        timings: dict | None = None,
        weights: Mapping[str, torch.Tensor] | None = None,
        revision: str | None = None,
    ) -> None:
        """Store one run and its metric rows atomically, replacing any earlier run with ``key``."""
        if status not in STATUSES:
            raise ValueError(f"status: got {status!r}; allowed: {', '.join(STATUSES)}")
        weights_name = None if weights is None else self._write_weights(key, weights)
        created_at = datetime.now(UTC).isoformat(timespec="seconds")
        timings_json = None if timings is None else json.dumps(timings)
        with self._transaction():
            self._delete_rows(key)
            self._conn.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, experiment, _dump_config(config), status, timings_json, revision,
                 weights_name, created_at),
            )
            self._insert_rows(key, rows)

    def rows(
        self, *, experiment: str | None = None, keys: Iterable[str] | None = None
    ) -> list[dict]:
        """Metric rows, each with its ``run_key``; runs in recording order, rows as recorded."""
        where, params = _where(experiment, keys)
        cur = self._conn.execute(
            "SELECT m.run_key, m.row_json, m.nonfinite_json"
            " FROM metrics m JOIN runs r ON r.key = m.run_key"
            f" WHERE {where} ORDER BY r.rowid, m.idx",
            params,
        )
        return [{**_decode_row(row_json, nonfinite), "run_key": key}
                for key, row_json, nonfinite in cur]

    def runs(self, *, experiment: str | None = None) -> list[dict]:
        """Run rows in recording order, with ``config`` and ``timings`` parsed."""
        where, params = _where(experiment, None)
        cur = self._conn.execute(
            "SELECT key, experiment, config_json, status, timings_json, revision, weights,"
            f" created_at FROM runs r WHERE {where} ORDER BY r.rowid",
            params,
        )
        return [
            {"key": key, "experiment": exp, "config": json.loads(config), "status": status,
             "timings": None if timings is None else json.loads(timings), "revision": revision,
             "weights": weights, "created_at": created_at}
            for key, exp, config, status, timings, revision, weights, created_at in cur
        ]

    def replace_rows(self, key: str, rows: list[dict], *, revision: str | None = None) -> None:
        """Replace run ``key``'s metric rows (``poslab run --reevaluate``: the same weights probed again),
        keeping its config, status and weights; its timings record the revision that re-evaluated it."""
        with self._transaction():
            found = self._conn.execute("SELECT timings_json FROM runs WHERE key = ?", (key,)).fetchone()
            if found is None:
                raise KeyError(f"no run {key!r} to re-evaluate")
            timings = {**json.loads(found[0] or "{}"), "reevaluated_revision": revision,
                       "reevaluated_at": datetime.now(UTC).isoformat(timespec="seconds")}
            self._conn.execute("UPDATE runs SET timings_json = ? WHERE key = ?", (json.dumps(timings), key))
            self._conn.execute("DELETE FROM metrics WHERE run_key = ?", (key,))
            self._insert_rows(key, rows)

    def load_weights(self, key: str) -> dict[str, torch.Tensor]:
        """The weights recorded with run ``key`` (on CPU); KeyError if there are none."""
        found = self._conn.execute("SELECT weights FROM runs WHERE key = ?", (key,)).fetchone()
        if found is None or found[0] is None:
            raise KeyError(f"no weights recorded for run {key!r}")
        return safetensors.torch.load_file(self.dir / found[0])

    def delete(self, key: str) -> None:
        """Remove run ``key``, its rows and its weights file (for ``--force``)."""
        with self._transaction():
            self._delete_rows(key)
        if _SAFE_KEY.fullmatch(key):
            self._weights_path(key).unlink(missing_ok=True)

    def record_outputs(self, experiment: str, folder: str | Path) -> None:
        """Remember where ``experiment`` wrote its table, claims and figures (absolute path)."""
        with self._transaction():
            self._conn.execute("INSERT OR REPLACE INTO outputs VALUES (?, ?, ?)",
                               (experiment, str(Path(folder).resolve()),
                                datetime.now(UTC).isoformat(timespec="seconds")))

    def record_judgements(self, experiment: str, judgements: Iterable[Mapping[str, Any]],
                          revision: str | None = None) -> int:
        """Record each claim's judgement ({claim, fingerprint, criterion, role, verdict, na_kind, reason})
        where its fingerprint is new for that claim; returns how many were new."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._transaction():
            before = self._conn.total_changes
            self._conn.executemany(
                "INSERT OR IGNORE INTO judgements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ((experiment, j["claim"], j["fingerprint"], j.get("criterion"), j.get("role"), j.get("verdict"),
                  j.get("na_kind"), j.get("reason"), revision, now) for j in judgements))
            return self._conn.total_changes - before

    def judgements(self, experiment: str) -> dict[str, list[dict]]:
        """{claim: its recorded judgements, first first} of one experiment."""
        out: dict[str, list[dict]] = {}
        cols = ("claim", "fingerprint", "criterion", "role", "verdict", "na_kind", "reason", "revision", "judged_at")
        for row in self._conn.execute(f"SELECT {', '.join(cols)} FROM judgements WHERE experiment = ? "
                                      "ORDER BY judged_at, rowid", (experiment,)):
            record = dict(zip(cols, row, strict=True))
            out.setdefault(record["claim"], []).append(record)
        return out

    def outputs(self) -> dict[str, Path]:
        """{experiment: the folder it last wrote its outputs to}."""
        return {e: Path(f) for e, f in self._conn.execute("SELECT experiment, folder FROM outputs")}

    # -- internals ---------------------------------------------------------------------------

    def _create_schema(self) -> None:
        # Checked again inside the write transaction: the file may have changed since _inspect.
        with self._transaction():
            kind = _classify(self._conn, self.path)
            self._conn.execute(_OUTPUTS)
            self._conn.execute(_JUDGEMENTS)
            if kind == "ours":
                return
            for statement in _SCHEMA:
                self._conn.execute(statement)
            self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        # IMMEDIATE takes the write lock up front, so two writers queue instead of deadlocking.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _insert_rows(self, key: str, rows: list[dict]) -> None:
        # Rows are encoded lazily, inside the caller's transaction: a bad row rolls back the whole run.
        self._conn.executemany(
            "INSERT INTO metrics VALUES (?, ?, ?, ?)",
            ((key, idx, *_encode_row(row)) for idx, row in enumerate(rows)),
        )

    def _delete_rows(self, key: str) -> None:
        self._conn.execute("DELETE FROM metrics WHERE run_key = ?", (key,))
        self._conn.execute("DELETE FROM runs WHERE key = ?", (key,))

    def _weights_path(self, key: str) -> Path:
        return self.dir / "weights" / f"{key}.safetensors"

    def _write_weights(self, key: str, weights: Mapping[str, torch.Tensor]) -> str:
        if not _SAFE_KEY.fullmatch(key):
            raise ValueError(f"key: got {key!r}; a weights file name needs [A-Za-z0-9_.=+:-]")
        target = self._weights_path(key)
        target.parent.mkdir(exist_ok=True)
        # A fresh contiguous CPU copy: safetensors refuses strided, non-CPU and tied storage.
        tensors = {
            name: t.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
            for name, t in weights.items()
        }
        data = safetensors.torch.save(tensors, metadata={"run_key": key})
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return target.relative_to(self.dir).as_posix()


def _refuse(path: Path, problem: str) -> ConfigError:
    return ConfigError("--store", str(path), f"{_STORE_ALLOWED} ({problem})")


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL mode (it stays so), waiting out other processes' locks.

    The switch needs the file to itself and, unlike a transaction, does not call the busy
    handler: a second process creating the same store at the same moment gets SQLITE_BUSY at
    once. So it is retried here, up to BUSY_TIMEOUT_S.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _make_dir(path: Path) -> None:
    """Create the directory a new store goes in, or raise ConfigError saying why it cannot be."""
    try:
        existing = next(p for p in path.parents if p.exists())
        if not existing.is_dir():
            raise _refuse(path, f"{existing} is a file, not a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _refuse(path, f"its directory cannot be created: {e.strerror}") from None


def _inspect(path: Path) -> str:
    """Whether ``path`` is "new" (absent or empty: create a store there) or "ours" (a store).

    Anything else raises ConfigError. Nothing here writes: the header is read as bytes, and the
    tables, where the header cannot tell, through a read-only connection.
    """
    try:
        if not path.exists():
            return "new"
        if path.is_dir():
            raise _refuse(path, "it is a directory")
        if not path.is_file():
            raise _refuse(path, "it is not a regular file")
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as e:
        raise _refuse(path, f"it cannot be read: {e.strerror}") from None
    if not header:
        return "new"  # SQLite initialises a 0-byte file as an empty database
    if not header.startswith(_SQLITE_MAGIC):
        raise _refuse(path, "it is not a SQLite database")
    application_id = int.from_bytes(header[68:72], "big", signed=True)
    if application_id not in (0, APPLICATION_ID):
        raise _refuse(path, f"it is another program's SQLite database (application_id {application_id})")
    # With no -wal file beside it the main file holds everything, and ``immutable`` reads it
    # without creating -wal/-shm files; otherwise read through the existing write-ahead log.
    wal = path.with_name(path.name + "-wal")
    uri = path.absolute().as_uri() + ("?mode=ro" if wal.exists() else "?mode=ro&immutable=1")
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)) as conn:
            kind = _classify(conn, path)
    except sqlite3.DatabaseError as e:
        raise _refuse(path, f"it is not a readable SQLite database: {e}") from None
    return "new" if kind == "empty" else "ours"


def _classify(conn: sqlite3.Connection, path: Path) -> str:
    """The database is "ours", "legacy" (poslab's tables, no application_id yet) or "empty";
    anything else raises ConfigError."""
    application_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if application_id == APPLICATION_ID:
        if version > SCHEMA_VERSION:
            raise _refuse(path, f"it was written by a newer poslab (schema version {version}; this one "
                                f"reads up to {SCHEMA_VERSION})")
        return "ours"
    if application_id != 0:
        raise _refuse(path, f"it is another program's SQLite database (application_id {application_id})")
    objects = conn.execute(
        "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'").fetchall()
    if not objects and version == 0:
        return "empty"
    tables = sorted(name for kind, name in objects if kind == "table")
    columns = {t: tuple(row[1] for row in conn.execute("SELECT * FROM pragma_table_info(?)", (t,)))
               for t in tables}
    if columns == _COLUMNS:
        return "legacy"
    if not tables:
        raise _refuse(path, f"it is another program's SQLite database (user_version {version})")
    raise _refuse(path, f"it is a SQLite database with other tables: {', '.join(tables)}")


def _dump_config(config: dict) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


def _json_keys(keys: Iterable[str]) -> str:
    # One JSON array parameter instead of one "?" per key: no limit on how many keys a sweep has.
    if isinstance(keys, str):
        raise TypeError("keys: expected an iterable of keys, got a single string")
    return json.dumps(list(keys))


def _where(experiment: str | None, keys: Iterable[str] | None) -> tuple[str, list[str]]:
    clauses, params = ["1"], []
    if experiment is not None:
        clauses.append("r.experiment = ?")
        params.append(experiment)
    if keys is not None:
        clauses.append("r.key IN (SELECT value FROM json_each(?))")
        params.append(_json_keys(keys))
    return " AND ".join(clauses), params


def _encode_row(row: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(row_json, nonfinite_json)`` for one flat row of scalars."""
    clean: dict[str, Any] = {}
    nonfinite: dict[str, str] = {}
    for name, value in row.items():
        if not isinstance(name, str):
            raise TypeError(f"metric row field {name!r}: names must be strings")
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # numpy / torch scalar
            value = value.item()
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise TypeError(
                f"metric row field {name!r}: got {type(value).__name__}; "
                "allowed: None, bool, int, float, str (one row per value keeps rows tidy)"
            )
        if isinstance(value, float) and not math.isfinite(value):
            nonfinite[name] = repr(value)  # "nan", "inf", "-inf": float() reads each back
            value = None
        clean[name] = value
    return json.dumps(clean, allow_nan=False), json.dumps(nonfinite) if nonfinite else None


def _decode_row(row_json: str, nonfinite_json: str | None) -> dict[str, Any]:
    row = json.loads(row_json)
    if nonfinite_json is not None:
        row.update((name, float(text)) for name, text in json.loads(nonfinite_json).items())
    return row
