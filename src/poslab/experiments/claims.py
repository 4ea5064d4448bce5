"""Structured claims: what a paper reports beside what a run measured.

An experiment's analysis returns :class:`Claim` records; markdown (and the report's HTML) are
renderings of those records, never tables assembled by hand in each experiment::

    Claim("rope, K=2: cells selecting offset -K", paper="100%", measured=1.0, holds=True,
          criterion="== 100%", note="8 seeds x 7 lengths")

``holds`` is True, False or None (not applicable: a number reported for comparison only).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Claim:
    name: str  # what is claimed, e.g. "rope, K=2: lowest accuracy over lengths <= 48"
    paper: str  # the paper's value or statement, as it reports it
    measured: float | str | None  # what this run measured (a number, or text when it is not one)
    holds: bool | None = None  # met / not met / n.a. (a number shown for comparison only)
    criterion: str = ""  # the tolerance or direction that decides ``holds``
    note: str = ""  # seeds, lengths, definitions: what a reader needs to weigh it

    @property
    def verdict(self) -> str:
        return {True: "yes", False: "**no**", None: "n.a."}[self.holds]

    def measured_text(self) -> str:
        m = self.measured
        if isinstance(m, float):
            return f"{m:.3f}"
        return "" if m is None else str(m)


def claims_markdown(claims: list[Claim]) -> str:
    """The claims as one markdown table: claim, paper, measured, criterion, met, note."""
    header = ["claim", "paper", "measured", "criterion", "met", "note"]
    body = [[c.name, c.paper, c.measured_text(), c.criterion, c.verdict, c.note] for c in claims]
    return markdown_table(header, body)


def markdown_table(header: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def summary(claims: list[Claim]) -> dict:
    """How many claims held, failed, or were not judged."""
    return dict(held=sum(c.holds is True for c in claims), failed=sum(c.holds is False for c in claims),
                not_judged=sum(c.holds is None for c in claims))


def write_claims(claims: list[Claim], path: Path) -> Path:
    """The records as JSON, for the report over every stored experiment."""
    path.write_text(json.dumps([dataclasses.asdict(c) for c in claims], indent=1, default=str))
    return path


def read_claims(path: Path) -> list[Claim]:
    return [Claim(**c) for c in json.loads(path.read_text())]
