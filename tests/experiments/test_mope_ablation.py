"""poslab run mope: the quick preset end to end, its refusals, and the analysis on hand-made rows."""

from __future__ import annotations

import csv
import json
import math

import pytest

from poslab.errors import ConfigError
from poslab.studies import get_experiment
from poslab.studies import mope as exp
from poslab.experiments.config import apply_overrides
from poslab.experiments.runner import members, run_study
from poslab.store import Store


def test_quick_preset_end_to_end(tmp_path):
    study = exp.study("quick")
    assert get_experiment("mope") is exp
    groups = {m.group_key() for m in members("mope", study)}
    assert len(groups) == 4  # one ensemble per cell: its seeds train together
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
    assert summary["trained"] == 4 * study.seeds
    assert {p.name for p in summary["files"]} == {"rows.csv", "table.md", "claims.json", "pairs.png",
                                                  "positionwise.png", "gate_tau.png"}
    rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
    member = [r for r in rows if r["probe"] == "member"]
    assert {(r["encoding"], r["energy_gate"]) for r in member} == {("rope", "False"), ("rope", "True"),
                                                                   ("mope", "False"), ("mope", "True")}
    assert all(math.isfinite(float(r["val_loss"])) for r in member)
    gated = {r["energy_gate"]: int(r["gate_parameters"]) for r in member}
    D, H, L = study.model["d_model"], study.model["n_heads"], study.model["n_layers"]
    assert gated == {"False": 0, "True": L * (H * D + H)}
    pairs = [r for r in rows if r["probe"] == "pair"]
    assert {r["encoding"] for r in pairs} == {"mope"} and len(pairs) == 2 * study.seeds * H * (D // H // 2)
    assert all(float(r["ratio"]) >= 1 for r in pairs)  # the boundary holds after training
    gates = [r for r in rows if r["probe"] == "gate"]
    assert {r["energy_gate"] for r in gates} == {"True"} and len(gates) == 2 * study.seeds * L * H
    positions = [r for r in rows if r["probe"] == "positionwise"]
    assert {int(r["length"]) for r in positions} == set(study.eval.lengths)
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert [c["paper"] for c in claims[:3]] == ["+0.119", "+0.092", "-0.032"]
    table = (tmp_path / "out" / "table.md").read_text()
    assert "improvement (paper)" in table and "+0.119" in table and "seeds (0, 1)" in table


@pytest.mark.parametrize("override", [['grid.encoding=["rope","alibi"]'], ['grid.model.energy_gate=[true]'],
                                      ["train.min_length=8"], ["eval.lengths=[32]"]])
def test_refuses_before_any_work(override, tmp_path):
    study = apply_overrides(exp.study("quick"), override)
    with Store(tmp_path / "s.sqlite") as store:
        with pytest.raises(ConfigError):
            run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert store.runs(experiment="mope") == []


def test_unknown_preset():
    with pytest.raises(ConfigError):
        exp.study("large")


def test_gpu_preset_is_near_the_published_scale():
    from poslab.experiments.runner import resolve_model_config, resolve_task
    from poslab.models.transformer import Transformer

    study = exp.study("gpu")
    point = members("mope", study)[-1].study  # MoPE + EGA
    model = Transformer(resolve_model_config(point, resolve_task(point)))
    n = sum(p.numel() for p in model.parameters())
    assert 4e6 < n < 6e6 and study.train.max_length == 256
    assert model.encoding.omega.numel() == 128  # the abstract's pair count


def test_improvements_are_paired_by_seed():
    rows = []
    for (enc, gate), losses in {("rope", False): [2.0, 3.0], ("rope", True): [1.9, 2.7],
                                ("mope", False): [2.1, 3.0], ("mope", True): [1.8, 2.8]}.items():
        rows += [dict(probe="member", encoding=enc, energy_gate=gate, seed=s, val_loss=v) for s, v in enumerate(losses)]
    gains = exp.improvements(rows)
    assert gains[("rope", True)] == pytest.approx([0.1, 0.3])
    assert gains[("mope", False)] == pytest.approx([-0.1, 0.0])
    assert gains[("mope", True)] == pytest.approx([0.2, 0.2])
