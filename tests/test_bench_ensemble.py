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


def test_compile_times_the_ensemble_and_each_member_alone_on_the_compiled_path(monkeypatch):
    import poslab.train as train_module

    calls = []

    def eager(fn):  # torch.compile's cost has no place in a unit test: record the call, run eagerly
        calls.append(fn)
        return fn

    monkeypatch.setattr(train_module, "compiled", eager)
    lines = []
    got = bench_ensemble(get_experiment("k1"), "quick", steps=4, per_task=1, compile=True, echo=lines.append)
    # warm-up (1 member), the ensemble, and each of its 6 members alone all took the compiled path
    assert len(calls) == 1 + 1 + 6
    assert got["ensemble_over_alone"] == got["ensemble_seconds"] / got["alone_compiled_seconds"] > 0
    assert lines[-1].startswith("compiled (steady state") and "each member alone" in lines[-1]


def test_steady_seconds_leaves_out_the_first_quarter_of_steps():
    from types import SimpleNamespace

    import numpy as np

    from poslab.bench.ensemble import steady_seconds

    # 8 steps: the first (a compile) takes 10 s, the rest 1 s each; steps 3-8 time 1 s a step -> 8 s
    ends = np.cumsum([10.0] + [1.0] * 7)
    assert steady_seconds(SimpleNamespace(step_ends=ends)) == 8.0
    assert steady_seconds(SimpleNamespace(step_ends=np.array([3.0]))) == 3.0


def test_compile_times_a_cropped_groups_members_once(monkeypatch):
    """A cropped group trains member by member (as poslab run trains it), so its parts are the
    'each alone' arm too: no member trains a second time."""
    import poslab.train as train_module

    calls = []
    monkeypatch.setattr(train_module, "compiled", lambda fn: calls.append(fn) or fn)
    got = bench_ensemble(get_experiment("lengthgen"), "quick", steps=2, per_task=1, compile=True, echo=lambda _: None,
                         overrides=('grid.setting=["even_pairs"]', 'grid.encoding=["rope"]',
                                    "grid.model.random_positions=[null]", "seeds=2", "train.crop_padding=true"))
    assert len(calls) == 1 + 2  # the warm-up, then each of the 2 members once
    assert got["alone_compiled_seconds"] == got["ensemble_seconds"]
