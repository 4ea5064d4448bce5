"""``poslab bench ensemble``: any study preset's groups timed as ensembles and in the plain loop."""

from click.testing import CliRunner

from poslab.bench import bench_ensemble
from poslab.cli import main
from poslab.studies import get_experiment


def test_a_study_presets_groups_are_timed_both_ways():
    lines = []
    got = bench_ensemble(get_experiment("k1"), "quick", steps=2, per_task=1, echo=lines.append)
    # the quick preset's one task is one group (K = 1, 2, 3 share a shape) of 3 x 2 seeds, 2 steps each
    assert got["member_steps"] == 3 * 2 * 2
    assert got["ensemble_seconds"] > 0 and got["plain_seconds"] > 0
    assert got["ratio"] == got["plain_seconds"] / got["ensemble_seconds"]
    assert lines[-1].startswith("k1 quick preset, 1 groups") and "member-steps/s on one thread" in lines[-1]


def test_overrides_reach_the_timed_groups(monkeypatch):
    from poslab.bench import ensemble as module

    seen = []
    real = module.train_plain

    def spy(make, task, seed, cfg, **kw):
        seen.append(cfg.crop_padding)
        return real(make, task, seed, cfg, **kw)

    monkeypatch.setattr(module, "train_plain", spy)
    bench_ensemble(get_experiment("k1"), "quick", steps=1, per_task=1, overrides=("train.crop_padding=true",),
                   echo=lambda line: None)
    assert seen and all(seen)


def test_bad_input_is_one_error_naming_the_field():
    runner = CliRunner()
    got = runner.invoke(main, ["bench", "ensemble", "k1", "--preset", "gpu"])
    assert got.exit_code == 2 and "--preset" in got.output and "quick" in got.output
    got = runner.invoke(main, ["bench", "ensemble", "k1", "--preset", "quick", "--steps", "0"])
    assert got.exit_code == 2 and "--steps" in got.output
