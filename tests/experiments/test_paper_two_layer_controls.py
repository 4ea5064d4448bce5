"""Section 5.2 (two-layer) and the Fig. 4 controls end to end in their quick preset with tiny
overrides (issue 7), and the engine's ``setting`` axis the controls use."""

import csv
import json

import pytest

from poslab.errors import ConfigError
from poslab.experiments import members, run_study
from poslab.experiments.config import StudyConfig, apply_overrides, apply_point, grid_points
from poslab.probes.weights import rotary_kernel_rows
from poslab.store import Store
from poslab.studies import PAPER_STUDIES, get_experiment

TINY = ["train.steps=5", "eval.n_sequences=16", "seeds=1"]


def _run(name, extra, tmp_path):
    exp = get_experiment(name)
    assert exp.study("paper").train.steps > exp.study("quick").train.steps
    study = apply_overrides(exp.study("quick"), [*TINY, *extra])
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert summary["trained"] == summary["members"] > 0
        again = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert again["trained"] == 0 and again["evaluated"] == 0
        rows = store.rows()
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert claims and all({"paper", "measured", "holds"} <= set(c) for c in claims)
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| claim | paper | measured |" in table and "±" in table
    return summary, rows, claims, table


def test_two_layer_end_to_end(tmp_path):
    summary, rows, claims, table = _run("two-layer", ["eval.lengths=[12,20]"], tmp_path)
    assert {p.name for p in summary["files"]} == {"rows.csv", "heads.csv", "members.csv", "table.md", "claims.json",
                                                   "accuracy.png", "offset_profile.png", "kernel.png"}
    heads = [r for r in rows if r["probe"] == "head"]
    assert len(heads) == 2 * 2 * 2 * 2 * 4  # encodings x widths x lengths x layers x heads
    assert {(r["setting"], r["d_head"]) for r in heads} == {("d_head=64", 64), ("d_head=16", 16)}
    assert all(r["target_frac_out"] is None for r in heads if r["length"] == 12)
    assert all(0 <= r["target_frac_out"] <= 1 and 0 <= r["window_tv"] <= 1 for r in heads if r["length"] == 20)
    assert all(r["window_tv"] == 0 for r in heads if r["length"] == 12)  # the reference length itself
    members = [r for r in rows if r["probe"] == "member"]
    assert {(r["encoding"], r["setting"]) for r in members} == {(e, w) for e in ("rope", "learned")
                                                                 for w in ("d_head=64", "d_head=16")}
    assert all(0 < r["carrier_k"] <= 1 and 0 < r["carrier_k_untrained"] <= 1 for r in members)
    assert all(r["random_direction_head"] == 1 / r["d_head"] for r in members)
    assert all(r["kernel_argmax"] is not None for r in members if r["encoding"] == "rope")
    kernel = [r for r in rows if r["probe"] == "kernel"]
    assert len(kernel) == 2 * 20 and max(abs(r["phi_norm"]) for r in kernel) == 1.0  # rope x widths x [-19, 0]
    lengths = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
    assert {r["length"] for r in lengths} == {"12", "20"}
    assert all(r["accuracy_out"] in ("", "nan") for r in lengths if r["length"] == "12")


def test_controls_end_to_end_with_snapshots_and_evaluate_only_fixes(tmp_path):
    extra = ["eval.lengths=[12,20]", 'grid.setting=["base","d=32","ape 16 rows"]', "train.snapshot_steps=[2,5]"]
    summary, rows, claims, table = _run("controls", extra, tmp_path)
    assert summary["members"] == 3 and summary["variants"] == 2  # interpolate and rescale of "ape 16 rows"
    assert {p.name for p in summary["files"]} == {"rows.csv", "members.csv", "snapshots.csv", "dilution.csv",
                                                   "kernel.csv", "table.md", "claims.json", "controls.png",
                                                   "coemergence.png"}
    snaps = [r for r in rows if r["probe"] == "snapshot" and r["setting"] == "base" and "variant" not in r]
    assert sorted(r["step"] for r in snaps) == [0, 2, 5]
    fixes = {r["variant"] for r in rows if "variant" in r}
    assert fixes == {"interpolate", "rescale"}
    mem = {r["setting"]: r for r in rows if r["probe"] == "member" and "variant" not in r}
    assert mem["d=32"]["d_model"] == 32 and mem["base"]["d_model"] == 64
    assert mem["ape 16 rows"]["kernel_ratio"] is None and 0 < mem["base"]["kernel_ratio"] < 1
    names = [c["name"] for c in claims]
    assert any("margin" in n or "1/(1+(L-1)" in n for n in names) and any("dilution" in n for n in names)
    assert any("selecting offset -K (every length)" in n for n in names)  # "throughout", not only the longest
    assert "APE inference-time fixes" in table and any("at >= 90% of its final value" in n for n in names)


def test_interpolation_changes_what_an_unseen_position_reads():
    import torch

    from poslab.positional import build_encoding

    enc = build_encoding("learned", d_model=8, n_heads=1, d_head=8, max_len=32, max_position=16, out_of_range="clamp")
    pos = torch.arange(20)
    x = torch.zeros(20, 8)
    clamp = enc.embed(x, pos)
    enc.out_of_range = "interpolate"
    interp = enc.embed(x, pos)
    assert torch.equal(clamp[:16], enc.W_pos) and not torch.allclose(clamp, interp)


def test_kernel_has_its_maximum_at_zero_and_a_wider_base_a_higher_ratio():
    rows = {(k["d"], k["base"]): k for k in rotary_kernel_rows(widths=(64,), bases=(1e3, 1e5))}
    assert all(k["unique_max_at_0"] and k["g0"] == 32 for k in rows.values())
    assert rows[(64, 1e3)]["ratio"] < rows[(64, 1e5)]["ratio"] < 1


def test_setting_axis_applies_named_bundles_and_refuses_unknown_names():
    study = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", grid={"setting": ("a", "b")},
                        settings={"a": {}, "b": {"model.d_model": 32, "train.steps": 7}})
    a, b = (apply_point(study, p) for p in grid_points(study))
    assert a.model == {} and b.model == {"d_model": 32} and b.train.steps == 7 and b.settings == {}
    assert [m.ids["setting"] for m in members("x", study)][:1] == ["a"]
    with pytest.raises(ConfigError, match="grid.setting"):
        apply_overrides(study, ['grid.setting=["c"]'])
    with pytest.raises(ConfigError, match="settings.bad"):
        apply_point(StudyConfig(model_type="retrieval_head", task_type="fixed_offset",
                                settings={"bad": {"nope.x": 1}}), {"setting": "bad"})


def test_run_all_includes_both_studies_last():
    assert PAPER_STUDIES[-2:] == ("two-layer", "controls")
