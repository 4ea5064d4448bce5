"""The layers contract (pyproject.toml, [tool.importlinter]; `make lint` runs it): the package as it
is keeps it, and an upward import added to a scratch copy, a lazy one included, breaks it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install -e .[dev])")


def lint(tmp_path: Path, edit: tuple[str, str] | None = None) -> subprocess.CompletedProcess:
    """lint-imports with pyproject.toml's contracts on a scratch copy of src/poslab (``edit``: a
    module path under poslab/ and a line appended to it)."""
    shutil.copytree(ROOT / "src" / "poslab", tmp_path / "src" / "poslab",
                    ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    if edit is not None:
        module = tmp_path / "src" / "poslab" / edit[0]
        module.write_text(module.read_text() + edit[1])
    env = {"PATH": str(LINT.parent), "PYTHONPATH": str(tmp_path / "src")}
    return subprocess.run([str(LINT), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_the_package_keeps_its_layers(tmp_path):
    done = lint(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("module, line, broken", [
    ("positional/rope.py", "\nfrom poslab.studies import EXPERIMENTS  # noqa\n", "poslab.positional is not allowed"),
    ("experiments/runner.py", "\n\ndef _lazy():\n    from poslab.studies import get_experiment  # noqa\n",
     "poslab.experiments is not allowed"),
    ("studies/lm.py", "\nfrom poslab.studies import mope  # noqa\n", "poslab.studies.lm is not allowed"),
])
def test_an_upward_import_fails_lint(tmp_path, module, line, broken):
    done = lint(tmp_path, (module, line))
    assert done.returncode != 0 and broken in done.stdout, done.stdout + done.stderr
