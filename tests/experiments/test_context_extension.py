"""context-extension end to end in its quick preset (shrunk further), and `poslab encodings`."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from poslab.cli import main
from poslab.errors import ConfigError
from poslab.studies import context_extension as ce
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
        assert "## LongRoPE search" in table and "| longrope-progressive | 8 |" in table
        assert sorted(r["stage"] for r in first_rows if r.get("probe") == "readjust") == ["after", "before"]
        for method, s in (("longrope", ce.FACTOR), ("longrope-progressive", ce.PROGRESSIVE)):
            long = [r["factor"] for r in sorted(first_rows, key=lambda r: r.get("pair", 0))
                    if r.get("probe") == "factors" and r.get("method") == method and r["set"] == "long"]
            assert long and long == sorted(long) and 1.0 <= long[0] and long[-1] <= 2 * s
            assert {r["n_hat"] for r in first_rows if r.get("probe") == "factors" and r.get("method") == method} \
                <= set(ce.N_HATS)
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


def test_search_covers_n_hat_and_keeps_factors_legal():
    """An objective that only rewards n-hat = 4 (read from the candidate's encoding) is solved by the
    search; a fixed n-hat is never changed and gives the plain HF longrope dict."""
    from poslab.models.transformer import Transformer, TransformerConfig

    model = Transformer(TransformerConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, max_len=64)).eval()
    seen = []

    def objective(m):
        seen.append(m.encoding.n_hat)
        assert m.encoding.scaling["factor"] in (8.0, ce.FACTOR)
        return abs(m.encoding.n_hat - 4) + 1e-3 * float(m.encoding.rotary_frequencies().sum())

    factors, n_hat, trace = ce.search(model, 16, 4, objective, seed=0, s=8.0, n_hats=ce.N_HATS)
    assert n_hat == 4 and len(set(seen)) > 2 and trace == sorted(trace, reverse=True)
    assert list(factors) == sorted(factors) and 1.0 <= factors[0] and factors[-1] <= 16.0
    seen.clear()
    _, n_hat, _ = ce.search(model, 16, 4, objective, seed=0, kind="short", n_hats=(0,))
    assert n_hat == 0 and set(seen) == {0}
    assert "n_hat" not in ce.longrope(16, [1.0] * 4, [4.0] * 4) and ce.longrope(16, [1.0] * 4, [4.0] * 4, n_hat=2)["n_hat"] == 2
