"""The module list of docs/layout.md (scripts/layout.py): one line per module, each from its docstring, and
the page's copy equal to what the script generates now."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("layout", ROOT / "scripts" / "layout.py")
layout = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layout)


def test_readme_module_list_is_the_generated_one():
    got = layout.current((ROOT / "docs" / "layout.md").read_text())
    assert got is not None, "docs/layout.md lost its generated module list"
    assert got == layout.block(), "docs/layout.md's module list is stale: run python scripts/layout.py --write"


def test_every_module_has_one_line_and_no_two_share_one():
    rows = layout.modules()
    files = sorted(p.relative_to(layout.PACKAGE).as_posix() for p in layout.PACKAGE.rglob("*.py"))
    assert [rel for rel, _ in rows] == files
    texts = [text for _, text in rows]
    assert all(texts) and len(set(texts)) == len(texts)


@pytest.mark.parametrize(("doc", "want"), [
    ("One line.\n\nMore.", "One line"),
    ("Heading:\n\nthe sentence after it. And more.", "Heading: the sentence after it"),
    ("ALiBi (Press et al. 2022; a paper). Rest.", "ALiBi (Press et al. 2022; a paper)"),
    ('A "quoted. stop" stays. Rest.', 'A "quoted. stop" stays'),
    ("word " * 40, ("word " * 22).strip() + " …"),
])
def test_summary_takes_the_first_sentence(doc, want):
    assert layout.summary(doc) == want


def test_a_module_without_a_docstring_is_named(tmp_path, monkeypatch):
    (tmp_path / "bare.py").write_text("x = 1\n")
    monkeypatch.setattr(layout, "PACKAGE", tmp_path)
    with pytest.raises(SystemExit, match="bare.py has no module docstring"):
        layout.modules()
