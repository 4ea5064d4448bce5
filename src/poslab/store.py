"""Results store: one SQLite file for runs and metric rows, safetensors weights beside it.

A run is keyed by ``config_hash(config)`` (or any file-name-safe key the caller chooses). A sweep
asks ``finished_keys`` which of its keys are done, trains the rest, and ``record``s each one; a
sweep interrupted at any point resumes without losing or duplicating a row.

Layout and schema::

    <dir>/poslab.sqlite                 WAL mode
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
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

STATUSES = ("finished", "diverged")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    key          TEXT PRIMARY KEY,
    experiment   TEXT NOT NULL,
    config_json  TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('finished', 'diverged')),
    timings_json TEXT,
    revision     TEXT,
    weights      TEXT,
    created_at   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_experiment ON runs (experiment);
CREATE TABLE IF NOT EXISTS metrics (
    run_key        TEXT NOT NULL REFERENCES runs (key) ON DELETE CASCADE,
    idx            INTEGER NOT NULL,
    row_json       TEXT NOT NULL,
    nonfinite_json TEXT,
    PRIMARY KEY (run_key, idx)
);
"""

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
        self.dir.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are opened explicitly by _transaction, nowhere else.
        self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finished(self, key: str) -> bool:
        """Whether a run with this key has status "finished" (a diverged one does not count)."""
        return bool(self.finished_keys([key]))

    def finished_keys(self, keys: Iterable[str]) -> set[str]:
        """The subset of ``keys`` whose runs have status "finished"."""
        cur = self._conn.execute(
            "SELECT key FROM runs WHERE status = 'finished'"
            " AND key IN (SELECT value FROM json_each(?))",
            (_json_keys(keys),),
        )
        return {key for (key,) in cur}

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
        created_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        timings_json = None if timings is None else json.dumps(timings)
        with self._transaction():
            self._delete_rows(key)
            self._conn.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, experiment, _dump_config(config), status, timings_json, revision,
                 weights_name, created_at),
            )
            # Rows are encoded lazily, inside the transaction: a bad row rolls back the whole run.
            self._conn.executemany(
                "INSERT INTO metrics VALUES (?, ?, ?, ?)",
                ((key, idx, *_encode_row(row)) for idx, row in enumerate(rows)),
            )

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

    # -- internals ---------------------------------------------------------------------------

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
