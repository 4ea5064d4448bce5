"""context-extension end to end in its quick preset (shrunk further), and `poslab encodings`."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from poslab.cli import main
from poslab.errors import ConfigError
from poslab.experiments import context_extension as ce
from poslab.experiments.config import apply_overrides
from poslab.experiments.runner import run_study, validate
from poslab.store import Store
from poslab.survey import NOT_MEASURED, comparison_rows

METHODS = set(ce.ORDER)


def tiny():
    return apply_overrides(ce.study("quick"), ["train.steps=6", "eval.n_sequences=4", "eval.lengths=[32,128]"],
                           fixed=ce.FIXED)


def test_quick_end_to_end_rows_table_figures_and_encodings(tmp_path):
    study = tiny()
    with Store(tmp_path / "s.sqlite") as store:
        first = run_study(ce, study, store=store, out=tmp_path / "out", progress=False)
        assert first["trained"] == 1 and first["variants"] == len(ce.schedules(32))
        names = {p.name for p in first["files"]}
        assert {"rows.csv", "table.md", "claims.json", "positionwise_loss.png", "passkey_heatmap.png",
                "retention.png"} <= names
        rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
        assert {r["method"] for r in rows} == METHODS
        for method in METHODS:
            got = {(r["protocol"], r["length"], r["metric"]) for r in rows if r["method"] == method}
            for L in ("32", "128"):
                assert {("loss", L, "loss"), ("positionwise", L, "loss"), ("passkey", L, "accuracy"),
                        ("passkey", L, "digit_accuracy")} <= got
        buckets = [r for r in rows if r["protocol"] == "positionwise" and r["method"] == "rope" and r["length"] == "128"]
        assert len(buckets) == 128 // (32 // ce.BUCKETS)  # buckets of L0 / 4 positions
        table = (tmp_path / "out" / "table.md").read_text()
        assert all(f"| {m} |" in table for m in METHODS) and "critical dimension d_extra" in table
        first_rows = store.rows(experiment=ce.name)
        again = run_study(ce, study, store=store, out=tmp_path / "out", progress=False)
        assert again["trained"] == 0 and again["evaluated"] == 0

    out = CliRunner().invoke(main, ["encodings", "--store", str(tmp_path / "s.sqlite")])
    assert out.exit_code == 0, out.output
    assert "LM loss at 2x / 4x L0" in out.output and "KV cache" in out.output
    by = {r["encoding"]: r for r in comparison_rows(tmp_path / "s.sqlite")}
    rope_loss = {r["length"]: r["loss"] for r in first_rows if r.get("probe") == "loss" and r.get("method") == "rope"}
    assert by["rope"]["lm"] == f"- / {rope_loss[128]:.3f} (1x: {rope_loss[32]:.3f}; L0 32, 1 seeds, context-extension)"
    assert by["rope"]["fixed_offset"] == NOT_MEASURED and by["alibi"]["lm"] == NOT_MEASURED
    assert by["rope_dynamic"]["kv_cache"] == "no" and by["rope"]["kv_cache"] == "yes"


def test_bad_input_stops_before_work():
    for bad in (["grid.encoding=[\"learned\"]"], ["encoding_options={\"rope\": {\"scaling\": {\"rope_type\": "
                                                   "\"linear\", \"factor\": 2.0}}}"]):
        with pytest.raises(ConfigError):
            validate(apply_overrides(tiny(), bad, fixed=ce.FIXED), "cpu", ce)
    with pytest.raises(ConfigError, match="train.max_length"):
        apply_overrides(tiny(), ["train.max_length=48"], fixed=ce.FIXED)
