"""Bad input, tried wholesale: every case stops before any work with ONE line on stderr naming
the field and what is allowed, exit status 2, and the store byte-for-byte unchanged.

Cases run the real command line in this process (click's runner), against a store that already
holds a run; a hypothesis test fuzzes ``--set`` values the same way.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poslab.cli import main
from poslab.store import Store

QUICK = ["run", "phenomenon", "--preset", "quick", "--no-progress"]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A directory with a real store holding one run, and the bad files the cases point at."""
    root = tmp_path_factory.mktemp("world")
    with Store(root / "store" / "s.sqlite") as db:
        db.record("abc123", experiment="phenomenon", config={"x": 1}, rows=[{"accuracy": 0.5}],
                  weights={"w": torch.ones(2)})
    (root / "text.sqlite").write_text("not a database at all\n")
    (root / "corrupt.sqlite").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    with sqlite3.connect(root / "foreign.sqlite") as conn:
        conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    with sqlite3.connect(root / "otherapp.sqlite") as conn:
        conn.execute("PRAGMA application_id = 1234")
        conn.execute("CREATE TABLE t (x)")
    (root / "a_file").write_text("x")
    (root / "adir.sqlite").mkdir()
    (root / "empty.txt").write_text("")
    (root / "binary.txt").write_bytes(b"\xff\xfe\x00\x81" * 100)
    (root / "corpus_dir").mkdir()
    return root


def S(*items: str) -> list[str]:
    return [x for item in items for x in ("--set", item)]


# (id, arguments after `poslab`, a word the one line must name). {w} is the world directory;
# `run` cases get `--store {w}/store/s.sqlite` unless they name a store themselves.
CASES = [
    # the command line
    ("unknown experiment", ["run", "nosuch"], "experiment"),
    ("unknown preset", QUICK + ["--preset", "huge"], "preset"),
    ("unknown device", QUICK + ["--device", "tpu"], "device"),
    ("cuda absent", QUICK + ["--device", "cuda"], "device"),
    ("unknown executor", QUICK + ["--executor", "spark"], "executor"),
    ("address without ray", QUICK + ["--address", "10.0.0.1:6379"], "--address"),
    ("unreachable ray cluster", QUICK + ["--executor", "ray", "--address", "127.0.0.1:1"], "--address"),
    ("malformed ray address", QUICK + ["--executor", "ray", "--address", "nowhere"], "--address"),
    ("zero seeds", QUICK + ["--seeds", "0"], "seeds"),
    ("negative seeds", QUICK + ["--seeds", "-2"], "seeds"),
    ("seeds past the cap", QUICK + ["--seeds", "1000000000000"], "seeds"),  # it enumerated members for hours
    ("seeds not a number", QUICK + ["--seeds", "two"], "--seeds"),
    ("zero workers", QUICK + ["--workers", "0"], "workers"),
    ("zero task cpus", QUICK + ["--task-cpus", "0"], "task-cpus"),
    ("unknown option", QUICK + ["--fast"], "--fast"),
    ("unknown command", ["train"], "train"),
    # --set: syntax, unknown names, wrong types
    ("--set without =", QUICK + S("train.steps"), "--set"),
    ("--set empty key", QUICK + S("=3"), "--set"),
    ("--set unknown field", QUICK + S("train.stepz=3"), "train.stepz"),
    ("--set unknown section", QUICK + S("optim.lr=0.1"), "optim.lr"),
    ("--set unknown model field", QUICK + S("model.depth=3"), "model.depth"),
    ("--set study-owned field", QUICK + S("model.vocab_size=5"), "model.vocab_size"),
    ("--set a grid axis directly", QUICK + S("task.K=2"), "task.K"),
    ("--set sub-field of a number", QUICK + S("train.steps.x=1"), "train.steps"),
    ("steps wrong type", QUICK + S("train.steps=abc"), "train.steps"),
    ("steps a float", QUICK + S("train.steps=1.5"), "train.steps"),
    ("seeds a bool", QUICK + S("seeds=true"), "seeds"),
    ("lengths not a list", QUICK + S('eval.lengths={"a":1}'), "eval.lengths"),
    ("lengths of strings", QUICK + S('eval.lengths=["x"]'), "eval.lengths"),
    ("unknown optimizer", QUICK + S("train.optimizer=sgd"), "optimizer"),
    ("unknown schedule", QUICK + S("train.lr_schedule=step"), "lr_schedule"),
    ("unknown attention", QUICK + S("model.attention=cubic"), "attention"),
    ("unknown encoding", QUICK + S('grid.encoding=["rope","nope2"]'), "encoding"),
    ("unknown task option", QUICK + S("task.q=3"), "task"),
    ("unknown task type", QUICK + S("task_type=sorting"), "task"),
    ("unknown model type", QUICK + S("model_type=lstm"), "model"),
    # NaN, negative and zero values
    ("lr NaN", QUICK + S("train.lr=NaN"), "train.lr"),
    ("lr infinite", QUICK + S("train.lr=Infinity"), "train.lr"),
    ("grad_clip NaN", QUICK + S("train.grad_clip=NaN"), "grad_clip"),
    ("lr zero", QUICK + S("train.lr=0"), "lr"),
    ("lr negative", QUICK + S("train.lr=-0.001"), "lr"),
    ("weight decay negative", QUICK + S("train.weight_decay=-1"), "weight_decay"),
    ("steps zero", QUICK + S("train.steps=0"), "steps"),
    ("steps negative", QUICK + S("train.steps=-10"), "steps"),
    ("batch size zero", QUICK + S("train.batch_size=0"), "batch_size"),
    ("betas out of range", QUICK + S("train.betas=[0.9,1.5]"), "betas"),
    ("n_sequences zero", QUICK + S("eval.n_sequences=0"), "n_sequences"),
    ("eval chunk zero", QUICK + S("eval.chunk=0"), "chunk"),
    ("vocabulary zero", QUICK + S("task.m=0"), "m"),
    ("vocabulary negative", QUICK + S("task.m=-4"), "m"),
    ("empty grid axis", QUICK + S("grid.task.K=[]"), "grid.task.K"),
    # impossible offsets and lengths, odd rotary dimensions
    ("offset zero", QUICK + S("grid.task.K=[0]"), "K"),
    ("offset past shortest length", QUICK + S("grid.task.K=[8]"), "K"),
    ("offset negative", QUICK + S("grid.task.K=[-1]"), "K"),
    ("empty eval lengths", QUICK + S("eval.lengths=[]"), "eval.lengths"),
    ("eval length zero", QUICK + S("eval.lengths=[0,12]"), "eval.lengths"),
    ("eval length negative", QUICK + S("eval.lengths=[-12]"), "eval.lengths"),
    ("min length above max", QUICK + S("train.min_length=20"), "min_length"),
    ("max length zero", QUICK + S("train.max_length=0"), "min_length"),
    ("odd rotary head dim", QUICK + S('grid.encoding=["rope"]', "model.d_model=63"), "d"),
    ("heads not dividing d", QUICK + S("model.n_heads=3"), "n_heads"),
    ("rope base negative", QUICK + S('grid.encoding=["rope"]', 'encoding_options={"rope":{"base":-1}}'), "rope_theta"),
    ("unknown encoding option", QUICK + S('grid.encoding=["rope"]', 'encoding_options={"rope":{"bass":1}}'), "bass"),
    ("options for an unused encoding", QUICK + S('grid.encoding=["rope"]', 'encoding_options={"alibi":{}}'),
     "encoding_options"),
    # corpus files (the text task)
    ("corpus missing", ["run", "context-extension", "--preset", "quick"] + S("task.corpus={w}/nope.txt"), "corpus"),
    ("corpus empty", ["run", "context-extension", "--preset", "quick"] + S("task.corpus={w}/empty.txt"), "corpus"),
    ("corpus not UTF-8", ["run", "context-extension", "--preset", "quick"] + S("task.corpus={w}/binary.txt"),
     "corpus"),
    ("corpus a directory", ["run", "context-extension", "--preset", "quick"] + S("task.corpus={w}/corpus_dir"),
     "corpus"),
    ("--corpus missing", ["run", "context-extension", "--preset", "quick", "--corpus", "{w}/nope.txt"], "corpus"),
    ("--corpus a directory", ["run", "context-extension", "--preset", "quick", "--corpus", "{w}/corpus_dir"],
     "corpus"),
    ("--corpus for a task without one", QUICK + ["--corpus", "{w}/binary.txt"], "--corpus"),
    # the store
    ("store a text file", QUICK + ["--store", "{w}/text.sqlite"], "--store"),
    ("store corrupt SQLite", QUICK + ["--store", "{w}/corrupt.sqlite"], "--store"),
    ("store foreign SQLite", QUICK + ["--store", "{w}/foreign.sqlite"], "--store"),
    ("store another program's", QUICK + ["--store", "{w}/otherapp.sqlite"], "--store"),
    ("store under a file", QUICK + ["--store", "{w}/a_file/s.sqlite"], "--store"),
    ("store a directory", QUICK + ["--store", "{w}/adir.sqlite"], "--store"),
    ("store unwritable path", QUICK + ["--store", "/proc/poslab/s.sqlite"], "--store"),
    ("report of a missing store", ["report", "--store", "{w}/missing.sqlite"], "--store"),
    ("bench eval lengths not numbers", ["bench", "eval", "--lengths", "10,abc"], "--lengths"),
    ("bench eval length too short", ["bench", "eval", "--lengths", "10,1000"], "--lengths"),
    ("bench eval zero sequences", ["bench", "eval", "--sequences", "0"], "--sequences"),
    ("report of a foreign store", ["report", "--store", "{w}/foreign.sqlite"], "--store"),
]


def _run(world: Path, args: list[str]):
    args = [a.replace("{w}", str(world)) for a in args]
    if args[0] == "run" and "--store" not in args:
        args += ["--store", str(world / "store" / "s.sqlite")]
    if args[0] == "run" and "--out" not in args:
        args += ["--out", str(world / "out")]
    before = _snapshot(world)
    result = CliRunner().invoke(main, args)
    assert _snapshot(world) == before, "the command changed files"
    return result


def _check_one_line(result, word: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    line = lines[0]
    assert line.startswith("poslab: error: ") and "allowed" in line, line
    assert word.lower() in line.lower(), line
    return line


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("args,word", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2_store_unchanged(world, args, word):
    _check_one_line(_run(world, args), word)


def test_missing_ray_extra(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the extra
    line = _check_one_line(_run(world, QUICK + ["--executor", "ray"]), "executor")
    assert "poslab[ray]" in line


# hypothesis: any value for a sample of fields is either accepted (and then the config holds
# it) or refused with one ConfigError naming the field; nothing else escapes
FIELDS = ["train.steps", "train.lr", "train.batch_size", "train.min_length", "train.max_length", "train.betas",
          "train.grad_clip", "eval.lengths", "eval.n_sequences", "seeds", "model.d_model", "model.temperature",
          "grid.task.K", "task.m", "train.optimizer"]
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True)
                       | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3), max_leaves=4)


def _literal(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


# fields whose valid values validate builds in full: a huge one (seeds = 10^12 enumerates 10^12 members)
# would run for hours; one such draw hung a fresh clone's suite at 98% (2026-12-07)
BUILT_WHOLE = ("model.d_model", "task.m", "train.max_length", "eval.lengths", "seeds", "eval.n_sequences",
               "grid.task.K")


# derandomize: the same 60 examples every run, so a failure (or a slow draw) reproduces
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=JSONISH)
def test_fuzz_set_values(field, value):
    from poslab.errors import ConfigError
    from poslab.experiments import validate
    from poslab.experiments.config import apply_overrides
    from poslab.studies import get_experiment

    exp = get_experiment("phenomenon")
    study = exp.study("quick")
    # shrink the study so a value that passes validates in milliseconds
    study = apply_overrides(study, ['grid.encoding=["rope"]', "eval.lengths=[12]"])
    try:
        changed = apply_overrides(study, [f"{field}={_literal(value)}"], fixed=getattr(exp, "FIXED", {}))
        if field in BUILT_WHOLE and _too_big(value):
            return  # a valid but huge model or grid: accepted by design, not worth building here
        validate(changed, "cpu", exp)
    except ConfigError as e:
        assert e.field and e.allowed
        assert "\n" not in str(e)
        short = field.split(".")[-1]
        assert short in e.field or short in str(e.allowed) or field in str(e), (field, str(e))


def _too_big(value) -> bool:
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 4096 for v in values)
