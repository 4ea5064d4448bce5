"""Every experiment end to end in its quick preset; resume; overrides; bad input."""

import csv

import pytest

from poslab.errors import ConfigError
from poslab.experiments import EXPERIMENTS, get_experiment
from poslab.experiments.config import StudyConfig, apply_overrides
from poslab.experiments.runner import run_study
from poslab.store import Store

EXPECTED_FILES = {
    "phenomenon": {"rows.csv", "table.md", "fig1_accuracy.png", "fig1_attention.png"},
    "validation": {"rows.csv", "members.csv", "profiles.csv", "table.md", "fig2_carrier_profile.png",
                   "fig3_dilution.png"},
}


def tiny(name):
    exp = get_experiment(name)
    return exp, apply_overrides(exp.study("quick"), ["train.steps=20", "eval.n_sequences=32", "eval.lengths=[12,20]"])


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_quick_preset_end_to_end_and_rerun_trains_nothing(name, tmp_path):
    exp = get_experiment(name)
    study = exp.study("quick")
    with Store(tmp_path / "s.sqlite") as store:
        first = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        members = len(study.encodings) * len(study.K) * study.seeds
        assert first["trained"] == members and first["reused"] == 0
        assert {p.name for p in first["files"]} == EXPECTED_FILES[name]
        rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
        assert len(rows) == members * len(study.eval.lengths)  # encoding x K x seed x length
        assert {"encoding", "K", "seed", "length", "accuracy", "peak_offset", "peak_height"} <= set(rows[0])
        table = (tmp_path / "out" / "table.md").read_text()
        assert "paper" in table and "measured" in table
        before = store.rows(experiment=name)
        again = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert again["trained"] == 0 and again["reused"] == members
        assert store.rows(experiment=name) == before
        forced = run_study(exp, study, store=store, out=tmp_path / "out", progress=False, force=True)
        assert forced["trained"] == members and len(store.runs(experiment=name)) == members


def test_an_interrupted_sweep_resumes_with_what_is_missing(tmp_path):
    exp, study = tiny("phenomenon")
    with Store(tmp_path / "s.sqlite") as store:
        part = apply_overrides(study, ["encodings=[\"rope\"]"])
        run_study(exp, part, store=store, out=tmp_path / "a", progress=False)
        full = run_study(exp, study, store=store, out=tmp_path / "b", progress=False)
        assert full["reused"] == len(study.K) * study.seeds
        assert full["trained"] == len(study.K) * study.seeds
        assert len(store.runs(experiment="phenomenon")) == full["members"]


@pytest.mark.parametrize("override, field", [
    (["encodings=[\"nosuch\"]"], "encoding"),
    (["K=[8]"], "K"),
    (["model.d_head=7"], "d_head"),
    (["encoding_options={\"learned\": {\"max_position\": 16}}", "eval.lengths=[12,48]"], "length"),
    (["train.stepz=3"], "--set"),
])
def test_bad_input_stops_before_anything_is_written(override, field, tmp_path):
    exp = get_experiment("phenomenon")
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        with pytest.raises(ConfigError, match=field):
            study = apply_overrides(exp.study("quick"), override)
            run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert store.runs() == []
    assert not (tmp_path / "out").exists()


def test_validation_refuses_a_non_rotary_encoding_before_any_work(tmp_path):
    exp = get_experiment("validation")
    study = apply_overrides(exp.study("quick"), ['encodings=["rope","learned"]'])
    with Store(tmp_path / "s.sqlite") as store:
        with pytest.raises(ConfigError, match="encodings.*learned.*rotary"):
            run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert store.runs() == []


def test_every_registry_encoding_runs_the_phenomenon_protocol(tmp_path):
    from poslab.positional import ENCODINGS

    exp = get_experiment("phenomenon")
    study = apply_overrides(exp.study("quick"), ["seeds=1", "K=[2]", "train.steps=3", "eval.n_sequences=8",
                                                 "eval.lengths=[12,24]", f"encodings={list(ENCODINGS)}".replace("'", '"')])
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert summary["trained"] == len(ENCODINGS)
        assert {r["encoding"] for r in store.rows()} == set(ENCODINGS)


def test_unknown_experiment():
    with pytest.raises(ConfigError, match="experiment.*phenomenon"):
        get_experiment("table9")


def test_overrides_are_typed():
    cfg = apply_overrides(StudyConfig(), ["train.lr=0.01", "eval.lengths=[12]", "K=2", "model.encoding_options={}"])
    assert cfg.train.lr == 0.01 and cfg.eval.lengths == (12,) and cfg.K == (2,)
    for bad in ["train.steps=1.5", "K=[\"a\"]", "nokey", "train=3"]:
        with pytest.raises(ConfigError, match="--set"):
            apply_overrides(StudyConfig(), [bad])


def test_worker_processes_give_the_same_rows_as_one_process(tmp_path):
    exp, study = tiny("phenomenon")
    study = apply_overrides(study, ["seeds=1", "K=[2]"])
    with Store(tmp_path / "a.sqlite") as one, Store(tmp_path / "b.sqlite") as two:
        run_study(exp, study, store=one, out=tmp_path / "a", progress=False, workers=1)
        summary = run_study(exp, study, store=two, out=tmp_path / "b", progress=False, workers=2)
        assert summary["trained"] == 2
        strip = lambda rows: sorted((tuple(sorted((k, v) for k, v in r.items() if k != "run_key")) for r in rows))  # noqa: E731
        assert strip(one.rows()) == strip(two.rows())


def test_pinning_share_and_spread():
    from poslab.experiments.phenomenon import pinning

    cells = [dict(K=1, seed=0, peak_position=p) for p in (5, 5, 5, 7)] + \
            [dict(K=1, seed=1, peak_position=p) for p in (2, 2, 2, 2)]
    share, spread = pinning(cells)
    assert share == 7 / 8 and spread == 1.0
