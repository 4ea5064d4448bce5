"""The seed paper's other studies end to end in their quick preset with tiny overrides (issue 7)."""

import csv
import json

import numpy as np
import pytest

from poslab.experiments import run_study
from poslab.experiments.config import apply_overrides
from poslab.probes.interpolant import min_norm_interpolant
from poslab.store import Store
from poslab.studies import get_experiment

TINY = ["train.steps=5", "eval.n_sequences=16", "eval.lengths=[12,20]", "seeds=1"]
STUDIES = {  # name: (extra overrides, files)
    "bias-comparison": (['grid.setting=["rope K=2","alibi m=0.5 K=1","t5 16/16 N(0,1) K=2"]'], {"accuracy.png"}),
    "linear-control": ([], {"members.csv", "profiles.csv", "score_profile.png", "accuracy_by_width.png"}),
    "heads": (['grid.setting=["H=1","H=4"]'], {"heads.csv", "peak_by_heads.png"}),
    "k1": (["grid.task.K=[1,2]"], {"members.csv", "k1.png"}),
}


@pytest.mark.parametrize("name", list(STUDIES))
def test_study_end_to_end_in_its_quick_preset(name, tmp_path):
    exp = get_experiment(name)
    extra, files = STUDIES[name]
    assert exp.study("paper").train.steps >= exp.study("quick").train.steps
    study = apply_overrides(exp.study("quick"), [*TINY, *extra])
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert summary["trained"] == summary["members"] > 0
        again = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert again["trained"] == 0
    assert {p.name for p in summary["files"]} == {"rows.csv", "table.md", "claims.json"} | files
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert claims and all({"paper", "measured", "holds"} <= set(c) for c in claims)
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| claim | paper | measured |" in table and "±" in table
    rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
    assert {r["length"] for r in rows} == {"12", "20"} and all(0 <= float(r["accuracy"]) <= 1 for r in rows)


def test_min_norm_interpolant_reproduces_its_support_and_has_least_norm():
    theta = 10000.0 ** (-np.arange(0, 8, 2) / 8)  # 4 frequencies, 8 coefficients
    support = np.arange(-3, 1)  # 4 offsets: under-determined
    values = np.array([0.1, -0.2, 1.0, 0.3])
    assert np.allclose(min_norm_interpolant(theta, support, values, support), values)
    # with as many offsets as coefficients and a trigonometric target, the fit is exact everywhere
    full = np.arange(-7, 1)
    target = 0.5 * np.cos(full * theta[0]) + 0.2 * np.sin(full * theta[2])
    assert np.allclose(min_norm_interpolant(theta, full, target, np.arange(-20, 1))[-8:], target, atol=1e-6)


def test_heads_runs_fixed_offset_as_content_conditioned_with_equal_offsets(tmp_path):
    exp = get_experiment("heads")
    study = apply_overrides(exp.study("quick"), [*TINY, 'grid.setting=["H=2"]'])
    with Store(tmp_path / "s.sqlite") as store:
        run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        rows = store.rows()
    assert {r["task"] for r in rows} == {"fixed offset K=2", "content-conditioned K1=2, K2=3"}
    heads = [r for r in rows if r["probe"] == "head"]
    assert len(heads) == 2 * 2 and all(0 < r["rank_concentration"] <= 1 for r in heads)
