"""Structured claims: what a paper reports beside what a run measured.

An experiment's analysis returns :class:`Claim` records; markdown (and the report's HTML) are
renderings of those records, never tables assembled by hand in each experiment::

    Claim("rope, K=2: cells selecting offset -K", paper="100%", measured=1.0, holds=True,
          criterion="== 100%", note="8 seeds x 7 lengths")

``holds`` is True, False or None (n.a.). Every claim has a ``role``:

- ``paper``: a statement of a seed, in the seed's setting (or the field's usual choice where the seed
  is silent, named in the note);
- ``control``: the same statement in another setting; its yes / no is a finding about robustness;
- ``prediction``: a statement no seed makes (a next step's predicted outcome, a measurement the survey only
  names, the study's own hypothesis): judged, and counted apart from ``paper``;
- ``external``: a number from a cited outside source (paper and arXiv id in the note), judged apart;
- ``check``: a derivation or sanity check that holds by construction: shown, never counted as a verdict.

A claim's role is computed from what it is (:func:`poslab.experiments.spec.role_of`: its source and
its setting), never chosen claim by claim.

An n.a. carries one of :data:`NA_KINDS` in ``na_kind``: ``undecidable`` (the task cannot decide it,
and the note says why), ``comparison`` (the seed gives the number for comparison only) or
``not-run`` (the setting was not run, or nothing was measured; the note says what it needs) or
``not-learned`` (the models did not learn the task in range, so what they do past it or how they do it
says nothing: the in-range score is in the note).

A claim whose criterion changed after its first verdict carries ``registered``: the criterion, role
and verdict it was first judged under (``poslab.experiments.registry``), shown beside the current ones.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

ROLES = ("paper", "control", "prediction", "external", "check")  # the order table.md and the report group them in
VERDICT_ROLES = ("paper", "control", "prediction", "external")  # a check is shown, never counted as a verdict
NA_KINDS = ("undecidable", "comparison", "not-run", "not-learned")
VERDICTS = {True: "yes", False: "no", None: "n.a."}  # holds -> the verdict in words (a ledger's, the report's)


@dataclass(frozen=True, kw_only=True)
class Claim:
    name: str  # what is claimed, e.g. "rope, K=2: lowest accuracy over lengths <= 48"
    paper: str  # the paper's value or statement, as it reports it
    measured: float | str | None  # what this run measured (a number, or text when it is not one)
    holds: bool | None = None  # met / not met / n.a. (a number shown for comparison only)
    criterion: str = ""  # the tolerance or direction that decides ``holds``
    note: str = ""  # seeds, lengths, definitions: what a reader needs to weigh it
    role: str = "paper"  # paper | control | prediction | external | check (see the module docstring)
    na_kind: str | None = None  # with holds None: undecidable | comparison | not-run | not-learned
    # where the criterion was revised after the first verdict: {"criterion", "role", "verdict", "revision",
    # "date"} of the first judgement and "reason" of the revision (poslab.experiments.registry)
    registered: dict | None = None

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

    @property
    def registered_text(self) -> str:
        """The first registered criterion and verdict of a revised claim, with the revision's reason."""
        r = self.registered
        if not r:
            return ""
        verdict = {"yes": "yes", "no": "**no**"}.get(r.get("verdict", ""), r.get("verdict", ""))
        role = f"{r['role']}, " if r.get("role") and r.get("role") != self.role else ""
        when = ", ".join(str(v) for v in (r.get("revision"), r.get("date")) if v)
        return (f"{role}{r.get('criterion') or 'no criterion'} → {verdict} ({when}); "
                f"revised: {r.get('reason') or 'no reason recorded'}")

    def measured_text(self) -> str:
        m = self.measured
        if isinstance(m, float):
            return f"{m:.3f}"
        return "" if m is None else str(m)


def by_role(claims: list[Claim]) -> list[Claim]:
    """The claims grouped by role (paper, control, external, check), declaration order within a role."""
    return sorted(claims, key=lambda c: ROLES.index(c.role))


def claims_markdown(claims: list[Claim]) -> str:
    """The claims as one markdown table grouped by role: role, claim, paper, measured, criterion, met, note,
    and, where any claim was revised after its first verdict, the registered criterion and verdict."""
    header = ["role", "claim", "paper", "measured", "criterion", "met", "note"]
    revised = any(c.registered for c in claims)
    body = [[c.role, c.name, c.paper, c.measured_text(), c.criterion, c.verdict, c.note]
            + ([c.registered_text] if revised else []) for c in by_role(claims)]
    return markdown_table(header + (["registered (first criterion → verdict)"] if revised else []), body)


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


_HOLDS = {word: holds for holds, word in VERDICTS.items()}


def as_registered(claims: list[Claim]) -> list[Claim]:
    """The claims as first registered: a revised claim's first role and verdict instead of its current ones."""
    out = []
    for c in claims:
        r = c.registered
        if not r:
            out.append(c)
            continue
        holds = _HOLDS.get(r.get("verdict", "n.a."))
        out.append(dataclasses.replace(c, role=r.get("role") or c.role, holds=holds,
                                       na_kind=None if holds is not None else (r.get("na_kind") or "undecidable")))
    return out


def counts_both(claims: list[Claim]) -> str:
    """The count cell as first registered and as revised (one text when nothing was revised)."""
    now, first = counts_text(claims), counts_text(as_registered(claims))
    return now if now == first else f"registered: {first}; revised: {now}"


def write_claims(claims: list[Claim], path: Path) -> Path:
    """The records as JSON, for the report over every stored experiment."""
    records = [{k: v for k, v in dataclasses.asdict(c).items() if k != "registered" or v} for c in claims]
    path.write_text(json.dumps(records, indent=1, default=str))
    return path


_FIELDS = {f.name for f in dataclasses.fields(Claim)}


def read_claims(path: Path) -> list[Claim]:
    """The records of a claims.json (files written before claims had roles read as ``paper``, with an
    n.a.'s kind ``undecidable``: rerun the study to write them as declared)."""
    out = []
    for c in json.loads(path.read_text()):
        c.setdefault("role", "paper")
        c = {k: v for k, v in c.items() if k in _FIELDS}
        if c.get("holds") is None:
            c.setdefault("na_kind", "undecidable")
        out.append(Claim(**c))
    return out
