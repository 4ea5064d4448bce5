"""The command line: list, run (quick), bad input exit code 2 with one line, report."""

import os

from click.testing import CliRunner

from poslab.cli import main
from poslab.positional import ENCODINGS


def test_list_prints_every_encoding_with_metadata():
    result = CliRunner().invoke(main, ["list"])
    assert result.exit_code == 0
    for name in ENCODINGS:
        assert f"\n{name} " in result.output
    assert "KV cache" in result.output and "phenomenon" in result.output


def test_run_quick_then_report(tmp_path):
    args = ["run", "phenomenon", "--preset", "quick", "--seeds", "1", "--set", "train.steps=10",
            "--set", "eval.n_sequences=16", "--set", "eval.lengths=[12]", "--store", str(tmp_path / "s.sqlite"),
            "--out", str(tmp_path / "out"), "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "trained 6" in result.output and (tmp_path / "out" / "fig1_accuracy.png").exists()
    again = CliRunner().invoke(main, args)
    assert "trained 0, reused 6" in again.output
    probed = CliRunner().invoke(main, [*args, "--reevaluate"])
    assert probed.exit_code == 0 and "re-evaluated 6" in probed.output, probed.output
    both = CliRunner().invoke(main, [*args, "--reevaluate", "--force"])
    assert both.exit_code == 2 and "--reevaluate" in both.output and "--force" in both.output
    every = CliRunner().invoke(main, ["run", "all", "--preset", "quick", "--reevaluate", "--no-progress",
                                      "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "all")])
    assert every.exit_code == 2 and len(every.output.strip().splitlines()) == 1, every.output
    assert "controls" in every.output and "named one at a time" in every.output  # every refusal in one line
    assert not (tmp_path / "all").exists()
    page = tmp_path / "page.html"
    report = CliRunner().invoke(main, ["report", "--store", str(tmp_path / "s.sqlite"), "--out", str(page)])
    assert "phenomenon" in report.output and "finished" in report.output
    assert "fig1_accuracy.png" in page.with_suffix(".md").read_text()  # found via the store, without --results


def test_run_validates_each_study_once(tmp_path, monkeypatch):
    from poslab.experiments import runner

    calls = []
    real = runner.validate
    monkeypatch.setattr(runner, "validate", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    args = ["run", "k1", "--preset", "quick", "--seeds", "1", "--set", "train.steps=5", "--set",
            "eval.n_sequences=8", "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "out"),
            "--no-progress", "--executor", "inline"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert len(calls) == 1


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    store = tmp_path / "s.sqlite"
    (tmp_path / "a-file.txt").write_text("not a folder")
    for args, field in [(["run", "nosuch"], "experiment"),
                        (["run", "phenomenon", "--preset", "fast"], "preset"),
                        (["run", "phenomenon", "--set", "train.steps"], "--set"),
                        (["run", "phenomenon", "--set", "grid.encoding=[\"rope\",\"bogus\"]"], "encoding"),
                        (["run", "phenomenon", "--device", "tpu"], "device"),
                        (["run", "phenomenon", "--set", "grid.task.K=[20]"], "K"),
                        (["run", "phenomenon", "--set", "model.encoding=no-such-encoding"], "model.encoding"),
                        (["run", "phenomenon", "--set", "task.K=2"], "grid axis"),
                        (["run", "phenomenon", "--executor", "slurm"], "executor"),
                        (["run", "phenomenon", "--reevaluate"], "--store"),
                        (["run", "phenomenon", "--out", str(tmp_path / "a-file.txt")], "--out"),
                        (["bench", "train", "--scaling", "6,x"], "--scaling"),
                        (["bench", "train", "--scaling", "0,6"], "--scaling"),
                        (["bench", "train", "--scaling-steps", "0"], "--scaling-steps"),
                        (["bench", "parity", "--device", "tpu"], "--device"),
                        (["bench", "parity", "--members", "0"], "--members"),
                        (["run", "phenomenon", "--out", str(tmp_path / "a-file.txt" / "below")], "--out")]:
        result = CliRunner().invoke(main, [*args, "--store", str(store)] if args[1] == "phenomenon" else args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("poslab: error: ") and field in lines[0], result.output
    assert not store.exists()


def test_bench_train_runs_and_reports_the_ratio():
    result = CliRunner().invoke(main, ["bench", "train", "--steps", "2", "--plain-steps", "2", "--scaling", "none"])
    assert result.exit_code == 0, result.output
    assert "ms of wall per member-step" in result.output and "speed-up" in result.output
    assert "plain loop timed before: " in result.output and "ensemble step" not in result.output
    # all of Table 1 on both sides: three group keys (RoPE, and APE at two initialisations), 72 members,
    # each group's plain loop timed and counted (an earlier version timed two and projected 48)
    assert "3 groups, 72 members" in result.output and "(72 members x 4000 steps)" in result.output
    assert sum(line.startswith("plain loop, ") and line.endswith("x 24 members")
               for line in result.output.splitlines()) == 3
    # the plain loop as a sweep runs here: one process per core, side by side; both sides in member-steps/s
    workers = min(os.cpu_count() or 1, 72)
    assert f"{workers} side by side x " in result.output and result.output.count("member-steps/s") == 2


def test_a_bad_store_exits_2_with_one_line_and_is_left_as_it_was(tmp_path):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database at all" * 100)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    quick = ["--preset", "quick", "--seeds", "1", "--set", "train.steps=2", "--no-progress"]
    for path in (corrupt, blocker / "sub" / "s.sqlite"):
        before = corrupt.read_bytes()
        result = CliRunner().invoke(main, ["run", "phenomenon", *quick, "--store", str(path),
                                           "--out", str(tmp_path / "out")])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "--store" in lines[0] and str(path) in lines[0], result.output
        assert corrupt.read_bytes() == before
    assert not (tmp_path / "out").exists()
