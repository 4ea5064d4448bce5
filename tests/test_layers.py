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
    ("studies/hybrid.py", "\nfrom poslab.studies import nope_depth  # noqa\n", "poslab.studies.hybrid is not allowed"),
])
def test_an_upward_import_fails_lint(tmp_path, module, line, broken):
    done = lint(tmp_path, (module, line))
    assert done.returncode != 0 and broken in done.stdout, done.stdout + done.stderr



def test_every_study_module_is_in_the_no_study_imports_another_contract():
    """A study left out of the studies contract could import another unseen (lengthgen-probes did). The
    contract is an independence one over the wildcard ``poslab.studies.*``, which covers every module
    directly in studies/: each is a study of STUDIES, none nested, and only the kit may be imported."""
    import tomllib

    from poslab.studies import STUDIES

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    studies = next(c for c in contracts if c["name"].startswith("studies:"))
    assert studies["type"] == "independence" and studies["modules"] == ["poslab.studies.*"]
    assert studies.get("ignore_imports", []) == ["poslab.studies.* -> poslab.studies.kit.**"]
    modules = {p.stem for p in (ROOT / "src" / "poslab" / "studies").glob("*.py")} - {"__init__"}
    assert {e.module for e in STUDIES} == modules


# Literals outside studies/ that spell a study's name but name something else, each with what it names.
HOMONYMS = {
    "mope": "the encoding (positional.ENCODINGS)",
    "induction": "the task (tasks.TASKS)",
    "hybrid": "an encoding kind (positional.base.KINDS)",
    "lm": "the survey's loss column and `bench eval --model lm` (the character LM as a model kind)",
}


def test_no_module_outside_studies_names_a_study():
    """The engine, the command line, bench, report and survey reach a study only through the
    registry (``studies.EXPERIMENTS``, ``studies.DEFAULTS``): no import of a study module, lazy
    ones included, and no string literal that is a study's name (the homonyms above aside)."""
    import ast

    from poslab.positional import ENCODINGS
    from poslab.studies import EXPERIMENTS
    from poslab.tasks import TASKS

    assert "mope" in ENCODINGS and "induction" in TASKS  # the homonyms are what they say
    study_modules = {p.stem for p in (ROOT / "src" / "poslab" / "studies").glob("*.py")} - {"__init__"}
    found = []
    for path in sorted((ROOT / "src" / "poslab").rglob("*.py")):
        if "studies" in path.relative_to(ROOT / "src" / "poslab").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[:2] == ["poslab", "studies"] and (
                        (len(parts) > 2 and parts[2] in study_modules)
                        or (len(parts) == 2 and any(a.name in study_modules for a in node.names))):
                    found.append(f"{path.name}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Import):
                found += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names
                          if a.name.split(".")[:2] == ["poslab", "studies"] and len(a.name.split(".")) > 2
                          and a.name.split(".")[2] in study_modules]
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in EXPERIMENTS
                  and node.value not in HOMONYMS):
                found.append(f"{path.name}:{node.lineno} names {node.value!r}")
    assert not found, found


def test_the_study_name_check_sees_a_study_named(tmp_path, monkeypatch):
    """The check above fails where a module outside studies/ names one (a scratch copy)."""
    scratch = tmp_path / "src" / "poslab"
    shutil.copytree(ROOT / "src" / "poslab", scratch, ignore=shutil.ignore_patterns("__pycache__", "data"))
    (scratch / "report.py").write_text((scratch / "report.py").read_text() + '\nSTUDY = "two-layer"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="two-layer"):
        test_no_module_outside_studies_names_a_study()
