"""`poslab run all`: every study of the seed paper in order, finished runs reused."""

from click.testing import CliRunner

import poslab.studies as experiments
from poslab.cli import main

TINY = ["--preset", "quick", "--seeds", "1", "--set", "train.steps=3", "--set", "eval.n_sequences=8",
        "--set", "eval.lengths=[12,20]", "--no-progress", "--executor", "inline"]


def test_paper_studies_are_registered_in_order():
    assert experiments.PAPER_STUDIES[:2] == ("phenomenon", "validation")
    assert set(experiments.PAPER_STUDIES) <= set(experiments.EXPERIMENTS)


def test_run_all_runs_each_study_once_and_skips_finished_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(experiments, "PAPER_STUDIES", ("k1", "linear-control"))
    args = ["run", "all", *TINY, "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "out")]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert first.output.index("k1:") < first.output.index("linear-control:")
    assert (tmp_path / "out" / "k1" / "table.md").exists()
    assert (tmp_path / "out" / "linear-control" / "claims.json").exists()
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and again.output.count("trained 0,") == 2


def test_run_all_checks_every_study_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(experiments, "PAPER_STUDIES", ("k1", "linear-control"))
    result = CliRunner().invoke(main, ["run", "all", *TINY, "--set", "model.d_modle=3",
                                       "--store", str(tmp_path / "s.sqlite")])
    assert result.exit_code == 2 and "d_modle" in result.output
    assert not (tmp_path / "s.sqlite").exists()
