"""Adding a study is one module plus one entry in poslab.studies.STUDIES, and no other file: in a scratch
copy of the package, the demo study (tests/experiments/demo_shift.py) goes in as one module and one entry;
``poslab list`` lists it, ``poslab run`` runs it at its quick preset, the README's study table
(scripts/readme_studies.py) gets its row, and the import contract (pyproject.toml) keeps it apart from
every other study with no edit: a scratch study that imports another is a broken contract."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
ENTRY = '    Entry("demo_shift", "the demo: a Transformer on the shift task", "[demo](docs/demo.md)"),\n'


def _scratch(tmp_path: Path) -> Path:
    """A copy of src/poslab, pyproject.toml and the README script, with the demo study added by its module
    and one entry; returns the copy's root."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "src" / "poslab", root / "src" / "poslab")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "readme_studies.py", root / "scripts" / "readme_studies.py")
    studies = root / "src" / "poslab" / "studies"
    shutil.copy(ROOT / "tests" / "experiments" / "demo_shift.py", studies / "demo_shift.py")  # the one module
    registry = (studies / "__init__.py").read_text()
    start = registry.index("STUDIES: tuple[Entry, ...] = (")
    end = registry.index("\n)\n", start) + 1
    (studies / "__init__.py").write_text(registry[:end] + ENTRY + registry[end:])  # ... and the one entry
    return root


def _run(root: Path, *args: str, tool: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    return subprocess.run([*(tool or [sys.executable]), *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed beside this Python")
def test_a_study_is_one_module_and_one_entry(tmp_path):
    root = _scratch(tmp_path)
    listed = _run(root, "-m", "poslab", "list")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^demo_shift\s+Demo: a Transformer on the shift task\s+poslab$", listed.stdout, flags=re.M)
    ran = _run(root, "-m", "poslab", "run", "demo_shift", "--preset", "quick", "--executor", "inline",
               "--no-progress", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "s.sqlite"))
    assert ran.returncode == 0, ran.stderr
    assert "demo_shift: 4 members, trained 4" in ran.stdout and (tmp_path / "out" / "table.md").exists()
    readme = _run(root, "scripts/readme_studies.py")
    assert readme.returncode == 0, readme.stderr
    assert "| `demo_shift` | the demo: a Transformer on the shift task | no stored run here | [demo](docs/demo.md) |" \
        in readme.stdout
    kept = _run(root, tool=[str(LINT_IMPORTS)])
    assert kept.returncode == 0 and "Contracts: 2 kept, 0 broken." in kept.stdout, kept.stdout
    # the contract covers the new module with no edit: importing another study from it breaks it
    module = root / "src" / "poslab" / "studies" / "demo_shift.py"
    module.write_text(module.read_text().replace("from pathlib import Path\n",
                                                 "from pathlib import Path\n\nimport poslab.studies.k1  # noqa\n", 1))
    broken = _run(root, "--no-cache", tool=[str(LINT_IMPORTS)])
    assert broken.returncode != 0 and "poslab.studies.demo_shift -> poslab.studies.k1" in broken.stdout, broken.stdout
