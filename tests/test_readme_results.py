"""The README's results tables are read from the stored claims, not typed beside them: each study
row's counts per role (yes / no / n.a.), as first registered and as revised, equal those of
<dir>/<study>/claims.json for the result folders in RESULTS (the paper-preset runs, the next steps'
and benchmarks' cpu-preset runs), and every stored claim carries its role (and an n.a. its reason kind)."""

import json
import re
from pathlib import Path

import pytest

from poslab.experiments.claims import NA_KINDS, ROLES, Claim, counts_both

ROOT = Path(__file__).resolve().parents[1]
ROLE_COUNTS = r"(?:[a-z]+ \d+ / \d+ / \d+(?:; )?)+"
COUNTS = rf"(?:registered: )?{ROLE_COUNTS}(?:revised: {ROLE_COUNTS})?"
ROW = re.compile(rf"^\| `(?P<study>[a-z0-9-]+)` \|.*?\| (?P<counts>{COUNTS}) \|")


def readme_counts() -> dict[str, str]:
    out = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        m = ROW.match(line)
        if m:
            out[m["study"]] = m["counts"].strip()
    return out


RESULTS = ("paper-preset", "next-steps")  # folders of docs/ holding <study>/claims.json
FOLDERS = {p.name: p for d in RESULTS if (ROOT / "docs" / d).is_dir()
           for p in (ROOT / "docs" / d).iterdir() if (p / "claims.json").exists()}


def stored(study: str) -> list[dict]:
    claims = json.loads((FOLDERS[study] / "claims.json").read_text())
    return claims["claims"] if isinstance(claims, dict) else claims


STUDIES = sorted(FOLDERS)


def test_the_readme_has_a_counted_row_for_every_stored_paper_preset_run():
    assert STUDIES and set(STUDIES) <= set(readme_counts()), sorted(set(STUDIES) - set(readme_counts()))


@pytest.mark.parametrize("study", STUDIES)
def test_every_stored_claim_has_a_role_and_every_na_its_reason_kind(study):
    for c in stored(study):
        assert c.get("role") in ROLES, (study, c["name"])
        if c["holds"] is None:
            assert c.get("na_kind") in NA_KINDS, (study, c["name"])


@pytest.mark.parametrize("study", STUDIES)
def test_readme_counts_per_role_are_the_stored_claims(study):
    assert readme_counts()[study] == counts_both([Claim(**c) for c in stored(study)])


def test_the_count_cell_reads_roles_in_order():
    line = "| `x` | a | paper 1 / 0 / 2; check 3 / 0 / 0 | ran | [page](p.md) |"
    assert ROW.match(line)["counts"] == "paper 1 / 0 / 2; check 3 / 0 / 0"
    assert ROW.match("| `x` | a | 6 / 5 / 14 | needs a rerun |") is None  # a study not restated has no roles
    both = "| `x` | a | registered: paper 1 / 1 / 0; revised: paper 2 / 0 / 0 | ran | [page](p.md) |"
    assert ROW.match(both)["counts"] == "registered: paper 1 / 1 / 0; revised: paper 2 / 0 / 0"


def test_the_readme_reads_in_five_minutes_and_names_every_study():
    """At most 160 lines, none over 400 characters, and a row for every built-in study."""
    from poslab import plugins
    from poslab.studies import EXPERIMENTS

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160 and max(map(len, text.splitlines())) <= 400
    named = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.M))
    builtin = {n for n in EXPERIMENTS if plugins.origin("studies", n) == plugins.BUILTIN}
    assert builtin <= named, sorted(builtin - named)
