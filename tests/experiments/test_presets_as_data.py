"""Presets are data: each study declares {preset: {dotted path: value}} over its base, resolved by one
function (config.resolve_preset); ``poslab run X --preset P --print-config`` prints the resolved grid and
runs nothing; an unknown preset is refused naming the allowed ones."""

import dataclasses

import pytest
from click.testing import CliRunner

from poslab.cli import main
from poslab.errors import ConfigError
from poslab.experiments import EvaluateOnly, Trained, describe, members
from poslab.experiments.config import QUICK, StudyConfig, as_preset, resolve_preset
from poslab.studies import EXPERIMENTS
from poslab.train import TrainConfig

BASE = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(m=20),
                   grid={"encoding": ("rope",), "model.window": (None, 4)}, seeds=8, model=dict(d_model=64))


def test_a_preset_changes_only_what_it_names_in_order():
    presets = {"paper": {}, "quick": {**QUICK, "model.d_model": 32, "grid.model.window": (None, 2)},
               "whole": {"train": TrainConfig(steps=7), "train.batch_size": 3}}
    assert resolve_preset(BASE, presets, "paper") == BASE
    quick = resolve_preset(BASE, presets, "quick")
    assert (quick.seeds, quick.train.steps, quick.train.batch_size, quick.eval.n_sequences) == (2, 60, 64, 128)
    assert quick.model == dict(d_model=32) and quick.grid == {"encoding": ("rope",), "model.window": (None, 2)}
    assert dataclasses.replace(quick, seeds=8, model=BASE.model, grid=BASE.grid, train=BASE.train,
                               eval=BASE.eval) == BASE  # nothing else moved
    assert BASE.model == dict(d_model=64) and BASE.grid["model.window"] == (None, 4)  # the base is not mutated
    whole = resolve_preset(BASE, presets, "whole")  # a later path refines an earlier whole field
    assert (whole.train.steps, whole.train.batch_size) == (7, 3)
    assert resolve_preset(BASE, {"all": as_preset(quick)}, "all") == quick


def test_an_unknown_preset_is_one_error_naming_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"preset: got 'fast'; allowed: paper, quick$"):
        resolve_preset(BASE, {"paper": {}, "quick": QUICK}, "fast")
    for name, exp in EXPERIMENTS.items():
        with pytest.raises(ConfigError) as e:
            exp.study("no-such-preset")
        assert e.value.field == "preset" and e.value.allowed == ", ".join(exp.presets), name


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_preset_of_every_study_resolves_to_a_config(name):
    exp = EXPERIMENTS[name]
    assert isinstance(exp, (Trained, EvaluateOnly)) and exp.presets
    for preset in exp.presets:
        assert isinstance(exp.study(preset), StudyConfig)


def test_no_preset_restates_the_whole_config():
    """A preset names the settings it changes over its study's base, not every field (as_preset's form):
    a reader sees what a preset changes from the module. (A preset that follows a registry is a function
    resolved when the preset is, seconds of work for lengthgen: the test above resolves those.)"""
    fields = {f.name for f in dataclasses.fields(StudyConfig)}
    for name, exp in EXPERIMENTS.items():
        for preset, changes in exp.presets.items():
            if not callable(changes):
                assert not fields <= {path.split(".")[0] for path in changes}, (name, preset)


def test_print_config_prints_the_resolved_grid_and_runs_nothing(tmp_path):
    store = tmp_path / "s.sqlite"
    args = ["run", "nope-depth", "--preset", "quick", "--store", str(store), "--out", str(tmp_path / "out"),
            "--print-config"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    study = EXPERIMENTS["nope-depth"].study("quick")
    trained = members(EXPERIMENTS["nope-depth"], study)
    assert f"{len(trained)} trained members" in result.output
    for m in trained:  # every member, its key, steps and lengths
        assert f"key {m.key[:12]}  steps {study.train.steps}  batch {study.train.batch_size}" in result.output
    assert '"steps": 40' in result.output and f"eval lengths {list(study.eval.lengths)}" in result.output
    assert not store.exists() and not (tmp_path / "out").exists()  # nothing run, nothing written
    # --set and --seeds are applied before printing, as a run would apply them
    changed = CliRunner().invoke(main, [*args, "--set", "train.steps=9", "--seeds", "1"])
    assert changed.exit_code == 0 and "steps 9 " in changed.output and "seed=1" not in changed.output


def test_print_config_of_an_evaluate_only_study_lists_its_grid_points():
    result = CliRunner().invoke(main, ["run", "pretrained-leakage", "--preset", "quick", "--print-config"])
    assert result.exit_code == 0, result.output
    assert "2 grid points (evaluate-only: nothing trained)" in result.output
    exp = EXPERIMENTS["pretrained-leakage"]
    assert describe(exp, exp.study("quick")) == result.output.rstrip("\n")


def test_print_config_refuses_a_bad_preset_in_one_line():
    result = CliRunner().invoke(main, ["run", "phenomenon", "--preset", "fast", "--print-config"])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == \
        "poslab: error: preset: got 'fast'; allowed: paper, quick"


def test_a_preset_that_follows_a_registry_is_read_when_resolved():
    registry = ["rope"]
    presets = {"paper": lambda: {"grid.encoding": tuple(registry)}}
    assert resolve_preset(BASE, presets, "paper").grid["encoding"] == ("rope",)
    registry.append("alibi")  # registered after the study was declared
    assert resolve_preset(BASE, presets, "paper").grid["encoding"] == ("rope", "alibi")
