"""Structured claims: what a paper reports beside what a run measured.

An experiment's analysis returns :class:`Claim` records; markdown (and the report's HTML) are
renderings of those records, never tables assembled by hand in each experiment::

    Claim("rope, K=2: cells selecting offset -K", paper="100%", measured=1.0, holds=True,
          criterion="== 100%", note="8 seeds x 7 lengths")

``holds`` is True, False or None (n.a.). Every claim has a ``role``:

- ``paper``: a statement of a seed, in the seed's setting (or the field's usual choice where the seed
  is silent, named in the note);
- ``control``: the same statement in another setting; its yes / no is a finding about robustness;
- ``check``: a derivation or sanity check that holds by construction: shown, never counted as a verdict;
- ``external``: a number from a cited outside source (paper and arXiv id in the note), judged apart.

An n.a. carries one of :data:`NA_KINDS` in ``na_kind``: ``undecidable`` (the task cannot decide it,
and the note says why), ``comparison`` (the seed gives the number for comparison only) or
``not-run`` (the setting was not run, or nothing was measured; the note says what it needs).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

ROLES = ("paper", "control", "external", "check")  # the order table.md and the report group them in
VERDICT_ROLES = ("paper", "control", "external")  # a check is shown, never counted as a verdict
NA_KINDS = ("undecidable", "comparison", "not-run")


@dataclass(frozen=True, kw_only=True)
class Claim:
    name: str  # what is claimed, e.g. "rope, K=2: lowest accuracy over lengths <= 48"
    paper: str  # the paper's value or statement, as it reports it
    measured: float | str | None  # what this run measured (a number, or text when it is not one)
    holds: bool | None = None  # met / not met / n.a. (a number shown for comparison only)
    criterion: str = ""  # the tolerance or direction that decides ``holds``
    note: str = ""  # seeds, lengths, definitions: what a reader needs to weigh it
    role: str = "paper"  # paper | control | external | check (see the module docstring)
    na_kind: str | None = None  # with holds None: undecidable | comparison | not-run

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"claim {self.name!r}: role must be one of {ROLES}, got {self.role!r}")
        if self.holds is None and self.na_kind not in NA_KINDS:
            raise ValueError(f"claim {self.name!r}: an n.a. needs na_kind, one of {NA_KINDS}, got {self.na_kind!r}")
        if self.holds is not None and self.na_kind is not None:
            raise ValueError(f"claim {self.name!r}: a judged claim has no na_kind")

    @property
    def verdict(self) -> str:
        return {True: "yes", False: "**no**", None: "n.a."}[self.holds]

    def measured_text(self) -> str:
        m = self.measured
        if isinstance(m, float):
            return f"{m:.3f}"
        return "" if m is None else str(m)


def by_role(claims: list[Claim]) -> list[Claim]:
    """The claims grouped by role (paper, control, external, check), declaration order within a role."""
    return sorted(claims, key=lambda c: ROLES.index(c.role))


def claims_markdown(claims: list[Claim]) -> str:
    """The claims as one markdown table grouped by role: role, claim, paper, measured, criterion, met, note."""
    header = ["role", "claim", "paper", "measured", "criterion", "met", "note"]
    body = [[c.role, c.name, c.paper, c.measured_text(), c.criterion, c.verdict, c.note] for c in by_role(claims)]
    return markdown_table(header, body)


def markdown_table(header: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def summary(claims: list[Claim]) -> dict:
    """How many verdicts held, failed, or were not judged (checks are not verdicts and not counted)."""
    verdicts = [c for c in claims if c.role in VERDICT_ROLES]
    return dict(held=sum(c.holds is True for c in verdicts), failed=sum(c.holds is False for c in verdicts),
                not_judged=sum(c.holds is None for c in verdicts))


def role_counts(claims: list[Claim]) -> dict[str, tuple[int, int, int]]:
    """(yes, no, n.a.) per role present, in :data:`ROLES` order."""
    out = {}
    for role in ROLES:
        mine = [c.holds for c in claims if c.role == role]
        if mine:
            out[role] = (mine.count(True), mine.count(False), mine.count(None))
    return out


def counts_text(claims: list[Claim]) -> str:
    """``paper 14 / 0 / 2; control 3 / 1 / 0; check 4 / 0 / 0``: the README's and report's count cell."""
    return "; ".join(f"{role} {y} / {n} / {na}" for role, (y, n, na) in role_counts(claims).items())


def write_claims(claims: list[Claim], path: Path) -> Path:
    """The records as JSON, for the report over every stored experiment."""
    path.write_text(json.dumps([dataclasses.asdict(c) for c in claims], indent=1, default=str))
    return path


def read_claims(path: Path) -> list[Claim]:
    """The records of a claims.json (files written before claims had roles read as ``paper``, with an
    n.a.'s kind ``undecidable``: rerun the study to write them as declared)."""
    out = []
    for c in json.loads(path.read_text()):
        c.setdefault("role", "paper")
        if c.get("holds") is None:
            c.setdefault("na_kind", "undecidable")
        out.append(Claim(**c))
    return out
