"""The same command twice gives identical metrics on CPU (bit for bit, same thread count)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from poslab.cli import main
from poslab.store import Store

SETS = ['grid.encoding=["rope","learned"]', "grid.task.K=[2]", "seeds=2", "train.steps=20", "train.batch_size=16",
        "eval.lengths=[12,20]", "eval.n_sequences=32"]


def _metrics(store):
    with Store(store) as db:
        rows = [{k: v for k, v in r.items() if k != "run_key"} for r in db.rows()]
        keys = sorted(r["key"] for r in db.runs())
    return keys, sorted(json.dumps(r, sort_keys=True) for r in rows)


def test_same_command_twice_identical_metrics(tmp_path):
    out = []
    for i in range(2):
        args = ["run", "phenomenon", "--preset", "quick", "--executor", "inline", "--no-progress",
                "--store", str(tmp_path / f"s{i}" / "s.sqlite"), "--out", str(tmp_path / f"o{i}")]
        for s in SETS:
            args += ["--set", s]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (result.output, result.exception)
        out.append(_metrics(tmp_path / f"s{i}" / "s.sqlite"))
    assert out[0][0] == out[1][0] and len(out[0][1]) > 0
    assert out[0][1] == out[1][1]  # every metric identical, not merely close
    assert (tmp_path / "o0" / "table.md").read_text() == (tmp_path / "o1" / "table.md").read_text()
