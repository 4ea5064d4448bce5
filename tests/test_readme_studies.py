"""The README's study tables (scripts/readme_studies.py) come from the one list of studies,
poslab.studies.STUDIES, which the registry reads too: the README's copy equals what the script
generates now, and every built-in study has its row."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("readme_studies", ROOT / "scripts" / "readme_studies.py")
readme_studies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_studies)


def test_the_readme_study_tables_are_the_generated_ones():
    text = (ROOT / "README.md").read_text()
    for table in readme_studies.TABLES:
        got = readme_studies.current(text, table)
        assert got is not None, f"README.md lost its generated {table!r} study table"
        assert got == readme_studies.block(table), "README.md's study tables are stale: run " \
                                                   "python scripts/readme_studies.py --write"


def test_the_list_is_the_registry_and_each_entry_has_one_readme_row():
    from poslab import studies

    assert [studies.entry_experiment(e).name for e in studies.STUDIES] == [
        n for n in studies.EXPERIMENTS if studies.plugins.origin("studies", n) == studies.plugins.BUILTIN]
    assert {e.table for e in studies.STUDIES} <= set(readme_studies.TABLES)
    rows = "\n".join(readme_studies.block(t) for t in readme_studies.TABLES)
    for name in studies.EXPERIMENTS:
        assert rows.count(f"| `{name}` |") == 1, name


def test_a_study_without_stored_claims_says_so(tmp_path):
    assert readme_studies.count_cell("phenomenon", tmp_path, "no run yet") == "no run yet"
    assert readme_studies.count_cell("phenomenon", ROOT / "docs", "no run yet").startswith("registered: paper")
