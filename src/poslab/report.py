"""``poslab report``: one page over every stored experiment, as self-contained HTML and as markdown.

For each experiment the store holds (in the order of ``EXPERIMENTS``, then any other name):

    - what the store holds: runs by status, the seeds, and the budgets from the stored configs
      (training steps, batch size, learning rate, training lengths, evaluation lengths and
      sequences): every distinct value, so a report over mixed runs says so;
    - the paper-versus-measured table, rendered from the ``claims.json`` records the experiment's
      report wrote (``experiments/claims.py``), never re-typed;
    - every PNG figure in the experiment's results folder (inlined as base64 in the HTML, linked
      in the markdown);

and at the top a summary: claims met / not met / not judged, per experiment and in all.

The plain listing of the store (experiment, status, runs) is :func:`store_listing`.
"""

from __future__ import annotations

import base64
import html
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from poslab.experiments import registry
from poslab.experiments.claims import (
    ROLES,
    VERDICTS,
    Claim,
    claims_markdown,
    counts_both,
    markdown_table,
    read_claims,
    summary,
)
from poslab.experiments.stages import is_stage
from poslab.store import Store

BUDGETS = (("seeds", "seed"), ("train steps", "train.steps"), ("batch size", "train.batch_size"),
           ("learning rate", "train.lr"), ("train min length", "train.min_length"),
           ("train max length", "train.max_length"), ("eval lengths", "eval.lengths"),
           ("eval sequences", "eval.n_sequences"))


@dataclass
class Section:
    name: str
    title: str
    statuses: dict[str, int]
    budgets: list[tuple[str, str]]  # (what, its distinct values)
    claims: list[Claim] | None  # None: no claims.json found
    figures: list[Path] = field(default_factory=list)
    results: Path | None = None


def store_listing(db: Store) -> list[tuple[str, str, int]]:
    """(experiment, status, runs) for everything the store holds (stored stages as status "stage")."""
    counts = Counter((r["experiment"], "stage" if is_stage(r["config"]) else r["status"]) for r in db.runs())
    return [(e, s, n) for (e, s), n in sorted(counts.items())]


def _get(config: dict, path: str) -> object:
    value: object = config
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _distinct(values: Iterable[object]) -> str:
    seen = sorted({tuple(v) if isinstance(v, list) else v for v in values if v is not None}, key=repr)
    if not seen:
        return "-"
    ints = [v for v in seen if isinstance(v, int) and not isinstance(v, bool)]
    if len(ints) == len(seen) > 3 and ints == list(range(ints[0], ints[-1] + 1)):
        return f"{ints[0]}..{ints[-1]} ({len(ints)})"
    if any(isinstance(v, tuple) for v in seen):  # lists of lengths: one list per distinct value
        return "; ".join(", ".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in seen)
    return ", ".join(map(str, seen))


def sections(db: Store, results: Path | None) -> list[Section]:
    """One section per stored experiment; its outputs from ``results/<experiment>`` when
    ``results`` is given, else from the folder the store recorded when the study last ran."""
    from poslab.studies import EXPERIMENTS

    runs = db.runs()
    written = db.outputs()
    names = [n for n in EXPERIMENTS if any(r["experiment"] == n for r in runs)]
    names += sorted({r["experiment"] for r in runs} - set(names))
    out = []
    for name in names:
        mine = [r for r in runs if r["experiment"] == name and not is_stage(r["config"])]
        stages = sum(r["experiment"] == name and is_stage(r["config"]) for r in runs)
        module = EXPERIMENTS.get(name)
        folder = results / name if results is not None else written.get(name, Path("results") / name)
        claims_file = folder / "claims.json"
        out.append(Section(
            name=name, title=module.title if module is not None else name,
            statuses={**dict(sorted(Counter(r["status"] for r in mine).items())),
                      **({"stored stages": stages} if stages else {})},
            budgets=[(what, _distinct(_get(r["config"], path) for r in mine)) for what, path in BUDGETS],
            claims=registry.registered(name, read_claims(claims_file)) if claims_file.exists() else None,
            figures=sorted(folder.glob("*.png")) if folder.is_dir() else [],
            results=folder if folder.is_dir() else None))
    return out


def _totals(secs: list[Section]) -> list[list]:
    rows: list[list] = []
    total: Counter[str] = Counter()
    for s in secs:
        if s.claims is None:
            rows.append([s.name, s.title, "-", "-", "-", "-", "no claims.json (run the experiment to write it)"])
            continue
        c = summary(s.claims)
        total.update(c)
        rows.append([s.name, s.title, c["held"], c["failed"], c["not_judged"], counts_both(s.claims), ""])
    rows.append(["all", "", total["held"], total["failed"], total["not_judged"], "", ""])
    return rows


SUMMARY_HEADER = ["experiment", "reproduces", "verdicts met", "not met", "n.a.", "by role: yes / no / n.a.", "note"]


def render_markdown(secs: list[Section], store: Path, out: Path) -> str:
    lines = ["# poslab report", "", f"Store: `{store}`.", "", "## Which published claims reproduced", "",
             markdown_table(SUMMARY_HEADER, _totals(secs)), ""]
    for s in secs:
        lines += [f"## {s.name}: {s.title}", "",
                  "Runs: " + ", ".join(f"{n} {status}" for status, n in s.statuses.items()) + ".", "",
                  markdown_table(["budget", "value"], [list(b) for b in s.budgets]), ""]
        if s.claims is not None:
            lines += ["### The paper beside this run", "", claims_markdown(s.claims), ""]
        for f in s.figures:
            lines += [f"![{f.name}]({os.path.relpath(f, out.parent)})", ""]
    return "\n".join(lines)


_CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #bbb;padding:3px 7px;text-align:left;
font-size:0.9em;vertical-align:top}th{background:#eee}td.no{color:#b00;font-weight:bold}td.yes{color:#070}
img{width:100%;height:auto;display:block;margin:0.5em 0 1.5em}figure{margin:0}nav li{margin:0.2em 0}
details summary{cursor:pointer;color:#555}"""


NOTE_FOLD = 90  # characters of a note shown before it folds


def _cell(text: str, fold: bool) -> str:
    """A cell's HTML: escaped, and a long note folded behind its first words."""
    text = html.escape(str(text))
    if not fold or len(text) <= NOTE_FOLD:
        return text
    return f"<details><summary>{text[:NOTE_FOLD].rsplit(' ', 1)[0]} …</summary>{text}</details>"


def _html_table(header: list[str], body: list[list], verdict_col: int | None = None,
                fold_col: int | None = None) -> str:
    e = lambda x: html.escape(str(x))  # noqa: E731
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    rows = []
    for row in body:
        cells = []
        for i, c in enumerate(row):
            cls = f' class="{c}"' if i == verdict_col and c in ("yes", "no") else ""
            cells.append(f"<td{cls}>{_cell(c, i == fold_col)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def render_html(secs: list[Section], store: Path) -> str:
    """The verdict counts first, then the contents, then per study its claims grouped by role
    (long notes folded) and its figures at the page's full width."""
    e = html.escape
    contents = []
    for s in secs:
        tally = f" ({counts_both(s.claims)})" if s.claims is not None else " (no claims yet)"
        contents.append(f'<li><a href="#{e(s.name)}">{e(s.name)}</a>: {e(s.title)}{e(tally)}</li>')
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', "<title>poslab report</title>",
             f"<style>{_CSS}</style></head><body>", "<h1>poslab report</h1>",
             "<h2>Which published claims reproduced</h2>", _html_table(SUMMARY_HEADER, _totals(secs)),
             f"<p>Store: <code>{e(str(store))}</code>. Checks hold by construction and are not counted as "
             "verdicts.</p>", "<nav><h2>Contents</h2><ul>" + "".join(contents) + "</ul></nav>"]
    for s in secs:
        parts += [f'<h2 id="{e(s.name)}">{e(s.name)}: {e(s.title)}</h2>',
                  "<p>Runs: " + e(", ".join(f"{n} {status}" for status, n in s.statuses.items())) + "</p>",
                  _html_table(["budget", "value"], [list(b) for b in s.budgets])]
        figures = list(s.figures)
        headline = _headline(s.name, figures)
        claims_html = "<p>No claims.json yet: run the study to write it.</p>"
        if s.claims is not None:
            claims_html = "<h3>The paper beside this run</h3>" + "".join(
                f"<h4>{role}</h4>" + _html_table(
                    ["claim", "paper", "measured", "criterion", "met", "note"],
                    [[c.name, c.paper, c.measured_text(), c.criterion, VERDICTS[c.holds],
                      c.note] for c in s.claims if c.role == role], verdict_col=4, fold_col=5)
                for role in ROLES if any(c.role == role for c in s.claims))
        parts.append(f'<div class="study">{claims_html}</div>')
        ordered = ([headline] if headline is not None else []) + [f for f in figures if f != headline]
        parts += [_figure(f) for f in ordered]
    parts.append("</body></html>")
    return "\n".join(parts)


def _headline(name: str, figures: list[Path]) -> Path | None:
    """The study's declared headline figure (``Experiment.headline``), else its first figure."""
    from poslab.studies import EXPERIMENTS

    exp = EXPERIMENTS.get(name)
    want = exp.headline if exp is not None else None
    return next((f for f in figures if f.name == want), figures[0] if figures else None)


def _figure(f: Path) -> str:
    e = html.escape
    data = base64.b64encode(f.read_bytes()).decode()
    return (f'<figure><img alt="{e(f.name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(f.name)}</figcaption></figure>")


def write_report(store: Path, results: Path | None, out: Path) -> tuple[Path, Path]:
    """Write ``out`` (HTML) and ``out`` with suffix .md; returns both paths."""
    with Store(store) as db:
        secs = sections(db, results)
    out.parent.mkdir(parents=True, exist_ok=True)
    md = out.with_suffix(".md")
    out.write_text(render_html(secs, store))
    md.write_text(render_markdown(secs, store, md))
    return out, md
