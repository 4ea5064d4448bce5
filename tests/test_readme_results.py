"""The README's results table is read from the stored paper-preset claims, not typed beside them:
each study row's yes / no / n.a. counts equal those of docs/paper-preset/<study>/claims.json."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `(?P<study>[a-z0-9-]+)` \|.*\| (?P<yes>\d+) / (?P<no>\d+) / (?P<na>\d+) \|[^|]*\|\s*$")


def readme_counts() -> dict[str, tuple[int, int, int]]:
    out = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        m = ROW.match(line)
        if m:
            out[m["study"]] = (int(m["yes"]), int(m["no"]), int(m["na"]))
    return out


def stored_counts(study: str) -> tuple[int, int, int]:
    claims = json.loads((ROOT / "docs" / "paper-preset" / study / "claims.json").read_text())
    claims = claims["claims"] if isinstance(claims, dict) else claims
    holds = [c["holds"] for c in claims]
    return holds.count(True), holds.count(False), holds.count(None)


def test_the_readme_has_a_counted_row_for_every_stored_paper_preset_run():
    stored = {p.name for p in (ROOT / "docs" / "paper-preset").iterdir() if (p / "claims.json").exists()}
    assert stored and stored <= set(readme_counts()), sorted(stored - set(readme_counts()))


@pytest.mark.parametrize("study", sorted(readme_counts()))
def test_readme_counts_are_the_stored_claims(study):
    assert readme_counts()[study] == stored_counts(study)
