"""Verdicts that moved between two claims.json files of one study, as a markdown section.

    python scripts/verdict_diff.py OLD/claims.json NEW/claims.json [--page docs/x.md] >> NEW/table.md

Claims are matched by name. A claim whose role, verdict or n.a. kind changed is listed old -> new
(a claim stored before claims had roles counts as ``paper``); a claim only in the new file or only
in the old one is listed with "-" on the other side. The reasons are on the study's
docs page (``--page`` links it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VERDICT = {True: "yes", False: "**no**", None: "n.a."}


def label(c: dict | None) -> str:
    if c is None:
        return "-"
    v = VERDICT[c["holds"]]
    if c["holds"] is None and c.get("na_kind"):
        v += f" ({c['na_kind']})"
    return f"{c.get('role', 'paper (no role)')}: {v}"


def moved(o: dict, n: dict) -> bool:
    """Role (a claim stored before roles counts as ``paper``), verdict, or n.a. kind where both have one."""
    if (o.get("role", "paper"), o["holds"]) != (n.get("role", "paper"), n["holds"]):
        return True
    return "na_kind" in o and o.get("na_kind") != n.get("na_kind")


def diff(old: list[dict], new: list[dict]) -> list[tuple[str, str, str]]:
    before = {c["name"]: c for c in old}
    after = {c["name"]: c for c in new}
    rows = []
    for name in list(after) + [n for n in before if n not in after]:
        o, n = before.get(name), after.get(name)
        if o is None or n is None or moved(o, n):
            rows.append((name, label(o), label(n)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--page", default="", help="the docs page that gives the reasons")
    parser.add_argument("--since", default="the previous revision")
    args = parser.parse_args()
    rows = diff(json.loads(args.old.read_text()), json.loads(args.new.read_text()))
    print(f"\n## Verdicts moved since {args.since}\n")
    if not rows:
        print("None.")
        return
    if args.page:
        print(f"Why each moved: [{args.page}]({args.page}). '-': the claim is new, or was replaced.\n")
    print("| claim | before | now |\n| --- | --- | --- |")
    for name, o, n in rows:
        print(f"| {name} | {o} | {n} |")


if __name__ == "__main__":
    main()
