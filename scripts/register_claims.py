"""Register every study's claims from the git history: their first judgement and every revision since.

    python scripts/register_claims.py              # rebuild src/poslab/data/registry/*.json from the history
    python scripts/register_claims.py --restate    # and rewrite the stored results' claims.json / table.md
    python scripts/register_claims.py --withdraw STUDY "CLAIM NAME" "YYYY-MM-DD: why"

It walks the commits since the studies became claim specs (``--since``), oldest first. At each commit that
touches a study module or the claim machinery it imports that revision's studies (in a fresh Python, from
``git archive``) and fingerprints each claim spec with today's rule (``poslab.experiments.fingerprint``:
what judges it, never its prose). At each commit that touches a stored result
(``docs/paper-preset/STUDY/claims.json``, ``docs/next-steps/STUDY/claims.json``) it reads the verdicts.

- A claim's ``first`` judgement is the first committed verdict of that name, with its criterion and role.
- A revision is a later commit where its spec's fingerprint changed (the reason: the spec's ``revised=``
  note, or, before registration existed, the commit's subject), or where the stored role or declared n.a.
  changed with no spec change (a rule applied after judging); its verdict is the next stored one.
- A registered claim whose spec is gone is ``withdrawn`` (where it vanished, the commit; or the reason
  given with ``--withdraw``).

Run it after committing a spec change with its ``revised=`` note, and commit the ledgers it writes. The
dumps of each commit are cached in ``.cache/register_claims``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # today's poslab; --dump-all drops it from sys.modules before each revision's

from poslab.experiments.claims import (  # noqa: E402
    VERDICTS,
    as_registered,
    claims_markdown,
    counts_text,
    markdown_table,
    read_claims,
    write_claims,
)
from poslab.experiments.fingerprint import digest  # noqa: E402
from poslab.experiments.registry import (  # noqa: E402
    annotate_stored,
    group_fingerprints,
    join_notes,
    template_fields,
    template_pattern,
)
from poslab.experiments.rows import frame  # noqa: E402
from poslab.experiments.spec import COMPARE  # noqa: E402

SINCE = "fb03655"  # "Studies move to poslab/studies ... Claims as data (experiments/spec.py: ClaimSpec ...)"
# the commit that registered every claim: from it on, a claim whose spec vanishes is withdrawn only by
# --withdraw (or followed by a spec's renamed_from=), never by the walk (tests fail until it is declared)
REGISTERED = "e204ae1"  # "Claims registered before they are judged (issue 53 items 1-2) ..."
CODE = ["src/poslab/studies", "src/poslab/experiments/spec.py", "src/poslab/experiments/claims.py"]
RESULTS = ["docs/paper-preset", "docs/next-steps"]
CACHE = ROOT / ".cache" / "register_claims"
LEDGERS = ROOT / "src" / "poslab" / "data" / "registry"
# renames in the history, before renamed_from= existed (the walk cannot see them): study -> (new name
# pattern, the old name it replaces). Each was read from the commit named beside it.
HISTORY_RENAMES = {
    # f193f74: the BOS swap judged on the three replacements together, n.a. where they disagree
    "leakage": [(r"(standard RoPE): BOS swap changes early \(b\), all three replacements",
                 r"\1: BOS swap (most frequent token) changes early (b)")],
    # c7831de: W's top singular-value energy judged as an overlap of intervals (its name carries the range)
    "heads": [(r"(.*), H=(\d+), d_model=64: per-head top singular-value energy of W, range \[.*",
               r"\1, H=\2, d_model=64: highest per-head top singular-value energy of W")],
}
DECLARED_NA = ("undecidable", "comparison")  # n.a. kinds a declaration (or a rule) gives, not the data


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


# ----------------------------------------------------------------------------- one revision's specs

def dump(src: str) -> dict:
    """{study: [{name, fingerprint, criterion, role, na_kind, revised, renamed_from}]} of the poslab at ``src``
    (in this Python: the poslab modules of an earlier dump are dropped first; torch and the rest stay)."""
    for name in [n for n in sys.modules if n == "poslab" or n.startswith("poslab.")]:
        del sys.modules[name]
    sys.path.insert(0, src)
    importlib.invalidate_caches()
    try:
        return _dump_studies()
    finally:
        sys.path.remove(src)


def _fingerprint_module():
    here = Path(__file__).resolve().parent.parent / "src" / "poslab" / "experiments" / "fingerprint.py"
    spec = importlib.util.spec_from_file_location("today_fingerprint", here)
    assert spec is not None and spec.loader is not None
    fp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fp)
    return fp


def _dump_studies() -> dict:
    import pkgutil

    fp = _fingerprint_module()
    studies = importlib.import_module("poslab.studies")
    out = {}
    for m in pkgutil.iter_modules(studies.__path__):
        if m.ispkg:
            continue
        module = importlib.import_module(f"poslab.studies.{m.name}")
        specs = getattr(module, "CLAIMS", None)
        experiment = getattr(module, "EXPERIMENT", None)
        if specs is None or experiment is None:
            continue
        specs = specs() if callable(specs) else specs
        gate = getattr(module, "GATE", None)
        rows = []
        for s in specs:
            what = fp.canonical(s)
            if getattr(s, "trained", False):
                what["gate"] = fp.canonical(gate)
            criterion = s.criterion() if hasattr(s, "criterion") else ""
            rows.append(dict(name=s.name, fingerprint=fp.digest(what), criterion=criterion,
                             role=getattr(s, "role", "paper"),
                             na_kind=getattr(s.na, "kind", "undecidable") if getattr(s, "na", None) else None,
                             revised=getattr(s, "revised", None), renamed_from=getattr(s, "renamed_from", None),
                             terms=[[t.column, t.op, t.value] for t in getattr(s.where, "terms", ())
                                    if not hasattr(t.value, "column")]))
        out[experiment.name] = json.loads(json.dumps(rows, default=str))
    return out


def dump_all(commits: list[str]) -> None:
    """Cache every commit's dump, in one Python (``--dump-all``): each revision's src from ``git archive``."""
    CACHE.mkdir(parents=True, exist_ok=True)
    todo = [c for c in commits if not (CACHE / f"{c}.json").exists()]
    if not todo:
        return
    with tempfile.TemporaryDirectory() as tmp:
        for commit in todo:
            archive = subprocess.run(["git", "archive", commit, "src"], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            with tarfile.open(fileobj=BytesIO(archive)) as tar:
                tar.extractall(f"{tmp}/{commit}", filter="data")
        env = {**os.environ, "MPLBACKEND": "Agg"}
        subprocess.run([sys.executable, __file__, "--dump-all", tmp, *todo], env=env, check=True, cwd=tmp)


def _dump_many(tmp: str, commits: list[str]) -> None:
    for i, commit in enumerate(commits):
        print(f"  dump {i + 1}/{len(commits)} {commit[:7]}", file=sys.stderr)
        try:
            got = dump(f"{tmp}/{commit}/src")
        except Exception as e:  # an earlier revision that does not import: its commit keeps the last dump
            print(f"  {commit[:7]}: its studies do not import ({type(e).__name__}: {e}); kept the last",
                  file=sys.stderr)
            got = {}
        (CACHE / f"{commit}.json").write_text(json.dumps(got))


def dump_at(commit: str) -> dict:
    return json.loads((CACHE / f"{commit}.json").read_text())


# ----------------------------------------------------------------------------- the walk

def _stored(commit: str, study: str) -> list[dict] | None:
    for folder in RESULTS:
        try:
            return json.loads(git("show", f"{commit}:{folder}/{study}/claims.json"))
        except subprocess.CalledProcessError:
            continue
    return None


def _judged(c: dict) -> dict:
    holds = c.get("holds")
    return dict(criterion=c.get("criterion", ""), role=c.get("role", "paper"),
                verdict=VERDICTS[holds], na_kind=c.get("na_kind"))


def _declared(j: dict) -> tuple:
    """What a stored judgement says about how it was decided, apart from the data: its role, and an
    n.a. that a declaration or a rule gave (an interval or a missing value is the data's)."""
    na = j.get("na_kind") if j.get("na_kind") in DECLARED_NA and "95% intervals span" not in j.get("note", "") else None
    return j.get("role") or "paper", na


def _fits(spec: dict, name: str) -> bool:
    """Whether the claim ``name`` can come from ``spec``: its name fits the template, and the values the
    name gives the template's fields meet the spec's terms on those columns."""

    m = template_pattern(spec["name"]).match(name)
    if m is None:
        return False
    got = dict(zip(template_fields(spec["name"]), m.groups(), strict=False))
    for column, op, value in spec.get("terms", []):
        if column not in got:
            continue
        text = got[column]
        if op == "in":
            if text not in {str(v) for v in value}:
                return False
            continue
        try:
            a, b = float(text), float(value)
        except (TypeError, ValueError):
            continue
        if op in COMPARE and not COMPARE[op](a, b):
            return False
    return True


def _spec_for(name: str, rows: list[dict]) -> dict | None:
    """The spec a claim comes from at one revision (several that fit: one record, their fingerprints joined)."""
    fit = [r for r in rows if _fits(r, name)]
    if not fit:
        return None
    if len(fit) == 1:
        return fit[0]
    return {**fit[0], "fingerprint": digest([r["fingerprint"] for r in fit]),
            "revised": join_notes(r.get("revised") for r in fit)}


def changed_in(commit: str) -> list[str]:
    """The paths a commit changed against its first parent (a merge's whole change, as main saw it)."""
    return git("diff", "--name-only", f"{commit}^1", commit).split()


def walk(since: str) -> dict[str, dict]:
    commits = git("rev-list", "--reverse", "--first-parent", f"{since}^..HEAD", "--", *CODE, *RESULTS).split()
    dump_all([c for i, c in enumerate(commits) if i == 0 or any(p.startswith(tuple(CODE)) for p in changed_in(c))])
    ledgers: dict[str, dict] = {}
    specs: dict[str, list[dict]] = {}  # study -> its spec records at the commit walked
    registered = False
    for i, commit in enumerate(commits):
        registered = registered or commit.startswith(REGISTERED)
        subject, date = git("show", "-s", "--format=%s%n%ad", "--date=short", commit).strip().split("\n")[:2]
        changed = changed_in(commit)
        print(f"[{i + 1}/{len(commits)}] {commit[:7]} {date} {subject[:70]}", file=sys.stderr)
        if i == 0 or any(p.startswith(tuple(CODE)) for p in changed):
            for study, rows in dump_at(commit).items():
                specs[study] = rows
                _revise(ledgers.setdefault(study, dict(study=study, specs={}, claims={})), rows, commit, date, subject,
                        registered)
        for study in sorted({p.split("/")[2] for p in changed if p.startswith(tuple(RESULTS))
                             and p.endswith("/claims.json") and p.count("/") == 3}):
            stored = _stored(commit, study)
            if stored is not None:
                _judge(ledgers.setdefault(study, dict(study=study, specs={}, claims={})), stored,
                       specs.get(study, []), commit, date, subject)
    for study, ledger in ledgers.items():  # the spec groups as registered now (what registry.problems compares)
        ledger["specs"] = _groups(specs.get(study, []))
    return ledgers


def _groups(rows: list[dict]) -> dict[str, dict]:
    """The dumped specs grouped by template as registry.problems groups today's (registry.group_fingerprints)."""
    groups = group_fingerprints((r["name"], r["fingerprint"], r.get("revised")) for r in rows)
    return {t: dict(fingerprint=fp, revised=note) for t, (fp, note) in groups.items()}


def _revise(ledger: dict, rows: list[dict], commit: str, date: str, subject: str, registered: bool = False) -> None:
    """At a commit that changed the code: a revision for each registered claim whose spec's fingerprint
    changed; ``withdrawn`` for one that no spec gives any more."""
    for name, claim in ledger["claims"].items():
        if claim.get("withdrawn"):
            continue
        spec = _spec_for(name, rows)
        if spec is None:
            renamed = [r for r in rows if r.get("renamed_from") == claim["spec"]]
            if not renamed:
                if not registered:
                    claim["withdrawn"] = (f"its spec vanished in commit {commit[:7]} ({date}), before registration "
                                          f"existed: {subject[:200]}")
                continue
            spec = renamed[0]
        claim["spec"] = spec["name"]
        if spec["fingerprint"] == claim["fingerprint"]:
            continue
        note = spec.get("revised")
        reason = note if note and note != claim.get("revised") else \
            f"before registration, commit {commit[:7]}: {subject[:300]}"
        claim["revisions"].append(dict(criterion=spec["criterion"], role=spec["role"], verdict="not re-judged",
                                       na_kind=spec["na_kind"], revision=commit[:7], date=date, reason=reason))
        claim.update(fingerprint=spec["fingerprint"], revised=note)


def _renamed(ledger: dict, name: str) -> str | None:
    """The registered claim ``name`` replaces under :data:`HISTORY_RENAMES`, where there is one."""
    for pattern, old in HISTORY_RENAMES.get(ledger["study"], []):
        m = re.fullmatch(pattern, name)
        if m is not None and m.expand(old) in ledger["claims"]:
            return m.expand(old)
    return None


def _renamed_by_spec(ledger: dict, name: str, rows: list[dict], stored: set[str]) -> str | None:
    """The registered claim that ``name`` renames under its spec's ``renamed_from=``: the one the old template
    gives with the same values of the fields both templates have, where this commit's results no longer hold it."""
    spec = _spec_for(name, rows)
    if not spec or not spec.get("renamed_from"):
        return None
    new = template_pattern(spec["name"]).match(name)
    want = dict(zip(template_fields(spec["name"]), new.groups(), strict=False)) if new else {}
    old_pattern, old_fields = template_pattern(spec["renamed_from"]), template_fields(spec["renamed_from"])
    for registered, record in ledger["claims"].items():
        m = old_pattern.match(registered)
        if m is None or record.get("withdrawn") or registered in stored:
            continue
        got = dict(zip(old_fields, m.groups(), strict=False))
        if all(got[k] == v for k, v in want.items() if k in got):
            return registered
    return None


def _judge(ledger: dict, stored: list[dict], rows: list[dict], commit: str, date: str, subject: str) -> None:
    """At a commit that stored verdicts: a new claim's first judgement; a pending revision's verdict."""
    names = {c["name"] for c in stored}
    for c in stored:
        j = _judged(c)
        claim = ledger["claims"].get(c["name"])
        old = _renamed(ledger, c["name"]) if claim is None else None
        how = "a rename before registration, declared in scripts/register_claims.py"
        if claim is None and old is None:
            old, how = _renamed_by_spec(ledger, c["name"], rows, names), "renamed_from= on its spec"
        if old is not None:
            record = ledger["claims"][old]
            ledger["claims"][c["name"]] = claim = {**record, "withdrawn": None, "revisions": [
                *record["revisions"], dict(**j, revision=commit[:7], date=date, reason=(
                    f"renamed from {old!r} ({how}); {record.get('withdrawn') or ''}"))]}
            record["withdrawn"] = f"renamed to {c['name']!r} in commit {commit[:7]}"
            spec = _spec_for(c["name"], rows)  # the claim now follows its new spec (a later commit compares to it)
            if spec is not None:
                claim.update(spec=spec["name"], fingerprint=spec["fingerprint"], revised=spec.get("revised"))
            continue
        if claim is None or claim.get("withdrawn"):
            spec = _spec_for(c["name"], rows) or {}
            ledger["claims"][c["name"]] = dict(spec=spec.get("name"), fingerprint=spec.get("fingerprint"),
                                               revised=spec.get("revised"),
                                               first=dict(**j, revision=commit[:7], date=date),
                                               revisions=[], withdrawn=None)
            continue
        last = claim["revisions"][-1] if claim["revisions"] else claim["first"]
        if last.get("verdict") == "not re-judged":
            last.update(**j, judged_in=commit[:7])  # what the stored file judged, under the revised spec
        elif _declared(c) != _declared({**last, "note": ""}):
            claim["revisions"].append(dict(**j, revision=commit[:7], date=date,
                                           reason=f"the stored role or n.a. changed with no spec change, "
                                                  f"commit {commit[:7]}: {subject[:300]}"))


# ----------------------------------------------------------------------------- restating stored results

def _typed(value: str):
    """A rows.csv cell as the row held it (bool, int, float or text)."""
    if value in ("True", "False"):
        return value == "True"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return None if value == "" else value


# studies judged again by today's report since their last revision: their stored claims are that report's own
# (judged by the specs that wrote them), so --restate only annotates them
RERUN = {"phenomenon": "2026-12-07, paper preset rerun, 4 min 21 s",
         "heads": "2026-12-07, paper preset rerun, 1 min 59 s; again after the singular-value rename, 1 min 15 s",
         "bias-comparison": "2026-12-07, paper preset rerun, 9 min 22 s (303 members)",
         "controls": "2026-12-07, paper preset rerun, 75 s",
         "linear-control": "2026-12-07, paper preset rerun, 39 s; again with one claim per width, 40 s",
         "k1": "2026-12-07, paper preset rerun, 25 s", "validation": "2026-12-07, paper preset rerun, 39 s",
         "lengthgen": "2026-12-07, cpu preset at issue 56's calibrated scale, 3 seeds, its first run (987.4 s, 38 of "
                      "54 members reused from the calibration's store)",
         "hybrid": "2026-12-07, cpu preset, its first run (864.9 s)",
         "arithmetic": "2026-12-07, cpu preset, its first run (1816.8 s)"}
UNDECIDED: list[str] = []  # stored claims whose spec their name cannot pick among several: restated by a rerun


def recompute(study: str, claims: list, folder: Path) -> list:
    """A stored study's claims under today's specs where every spec says what it is (source and setting):
    the role computed from them, and the learned-in-range gate (the study's GATE) read from the stored
    rows.csv, which only takes a verdict away (an n.a. 'not-learned' with the in-range score). The measured
    values are the stored ones: nothing is re-measured. Other studies' claims are returned as they are."""

    from poslab.studies import EXPERIMENTS

    module = importlib.import_module(EXPERIMENTS[study].report.__module__)
    specs, gate = module.CLAIMS, getattr(module, "GATE", None)
    if any(s.source is None for s in specs):
        return claims
    rows = []
    if (folder / "rows.csv").exists():
        with open(folder / "rows.csv", newline="") as f:
            rows = [{k: _typed(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if gate is not None and gate.where.select(frame(rows)).empty:  # rows.csv without the gate's rows (a study
        rows = gate_rows(claims, specs, gate)  # whose CSV keeps other kinds): the scores its stored claims hold
    out = []
    for c in claims:
        mine = [s for s in specs if _fits(dict(name=s.name, terms=[[t.column, t.op, t.value] for t in s.where.terms
                                                                   if not hasattr(t.value, "column")]), c.name)]
        judged_as = {(m.role, m.op, m.threshold, m.tol, m.na.kind if m.na else None, m.scale_by, m.trained)
                     for m in mine}
        if len(judged_as) != 1:  # no spec, or specs that its name cannot tell apart: left as stored
            if len(judged_as) > 1:
                UNDECIDED.append(f"{study}: {c.name}")
            out.append(c)
            continue
        spec = mine[0]
        c = _rejudged(dataclasses.replace(c, role=spec.role), spec)
        # the gate, as the engine applies it: it takes a verdict whose models did not learn in range, and gives
        # its reason to a claim today's spec judges that has nothing measured (stored as n.a. of another kind)
        unmeasured = (c.holds is None and spec.na is None and c.na_kind != "not-learned"
                      and _stored_value(c, spec) is None)
        if spec.trained and gate is not None and (c.holds is not None or unmeasured) and rows:
            m = template_pattern(spec.name).match(c.name)
            group = [{k: _typed(v) for k, v in zip(template_fields(spec.name), m.groups(), strict=False)}] if m else []
            score = gate.score(group, rows)
            if (score is None and c.holds is not None) or (score is not None and score < gate.threshold):
                shown = "not measured" if score is None else f"{score:.3f}"
                c = dataclasses.replace(c, holds=None, na_kind="not-learned", criterion=c.criterion or spec.criterion(),
                                        note=f"n.a. (did not learn in range: {gate.text} {shown}, below "
                                             f"{gate.threshold:g}); {c.note}")
        out.append(c)
    return out


def gate_rows(claims: list, specs: list, gate) -> list[dict]:
    """A study stored without its rows.csv: the gate's in-range scores from its stored claims that measure exactly
    what the gate reads (the same rows, the mean of the same column), one row per claim, where one exists."""
    out = []
    for c in claims:
        for s in specs:
            m = template_pattern(s.name).match(c.name)
            if (m and s.where == gate.where and s.measure is not None and s.measure.agg == "mean"
                    and s.measure.column == gate.column and not s.measure.by and isinstance(c.measured, (int, float))):
                fields = {k: _typed(v) for k, v in zip(template_fields(s.name), m.groups(), strict=False)}
                out.append({**gate.where.example(), **fields, gate.column: float(c.measured)})
    return out


def _stored_value(claim, spec) -> float | None:
    """A stored measured value as the measure gave it (a percentage back to a share; text: None)."""
    m = claim.measured
    if isinstance(m, (int, float)) and not isinstance(m, bool):
        return float(m)
    if isinstance(m, str) and spec.percent and m.endswith("%"):
        try:
            return float(m[:-1]) / 100
        except ValueError:
            return None
    return None


def _rejudged(claim, spec):
    """A stored claim under today's spec where only the criterion changed: judged from its stored measured
    value (a spec that now decides what was n.a., or a new line), or n.a. where the spec now declares it.
    A criterion scaled by a row column or decided by intervals needs the rows: left as stored."""

    if spec.na is not None and claim.holds is not None:
        return dataclasses.replace(claim, holds=None, na_kind=spec.na.kind, criterion="",
                                   note=f"n.a. ({spec.na.text}); was judged {VERDICTS[claim.holds]}: {claim.note}")
    value = _stored_value(claim, spec)
    decided = claim.holds is not None or claim.na_kind in DECLARED_NA
    if (spec.op is None or spec.scale_by or spec.interval or value is None or not decided
            or (claim.holds is not None and claim.criterion == spec.criterion())):
        return claim
    holds = spec.judge(value)
    return dataclasses.replace(claim, holds=holds, na_kind=None, criterion=spec.criterion(), note=(
        f"judged from the stored measured value under the revised criterion (nothing re-run); "
        f"stored as {VERDICTS[claim.holds]}{f' under {claim.criterion}' if claim.criterion else ''}: {claim.note}"))


def restate(ledgers: dict[str, dict]) -> None:
    """Rewrite each stored claims.json with its claims' registration and the claims table of its table.md."""

    for folder in RESULTS:
        for path in sorted((ROOT / folder).glob("*/claims.json")):
            study = path.parent.name
            if study not in ledgers:
                continue
            kept = [c for c in read_claims(path) if not ledgers[study]["claims"].get(c.name, {}).get("withdrawn")]
            claims = annotate_stored(kept if study in RERUN else recompute(study, kept, path.parent), ledgers[study])
            write_claims(claims, path)
            table = path.parent / "table.md"
            if table.exists():
                head, sep, tail = table.read_text().partition("## The paper's claims beside this run\n\n")
                if sep:  # the claims table is the run of lines starting with "|" right after the heading
                    lines = tail.split("\n")
                    n = next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))
                    table.write_text(head + sep + "\n".join([claims_markdown(claims), *lines[n:]]))


MARKERS = ("<!-- registered counts -->", "<!-- /registered counts -->")


def counts_block() -> str:
    """docs/results.md's table: each stored study's counts per role as registered and as revised."""

    rows = []
    for folder in RESULTS:
        for path in sorted((ROOT / folder).glob("*/claims.json")):
            claims = read_claims(path)
            revised = sum(bool(c.registered) for c in claims)
            rows.append([f"`{path.parent.name}`", counts_text(as_registered(claims)), counts_text(claims),
                         f"{revised} of {len(claims)}"])
    table = markdown_table(["study", "as first registered (yes / no / n.a.)", "as revised",
                            "claims revised"], rows)
    return f"{MARKERS[0]}\n{table}\n{MARKERS[1]}"


def write_counts_block(path: Path = ROOT / "docs" / "results.md") -> None:
    text = path.read_text()
    head, _, rest = text.partition(MARKERS[0])
    _, _, tail = rest.partition(MARKERS[1])
    path.write_text(head + counts_block() + tail)


UNDECIDED_MARKERS = ("<!-- awaiting a rerun -->", "<!-- /awaiting a rerun -->")


def write_undecided(path: Path = ROOT / "docs" / "results.md") -> None:
    """docs/results.md's list of the stored claims --restate could not tie to one spec (a rerun restates them)."""
    lines = [f"- {c}" for c in UNDECIDED] or ["- none"]
    text = path.read_text()
    head, _, rest = text.partition(UNDECIDED_MARKERS[0])
    _, _, tail = rest.partition(UNDECIDED_MARKERS[1])
    path.write_text(head + UNDECIDED_MARKERS[0] + "\n" + "\n".join(lines) + "\n" + UNDECIDED_MARKERS[1] + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--since", default=SINCE)
    parser.add_argument("--restate", action="store_true", help="rewrite the stored claims.json and table.md")
    parser.add_argument("--dump-all", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--withdraw", nargs=3, metavar=("STUDY", "CLAIM", "WHY"))
    args = parser.parse_args()
    if args.dump_all:
        _dump_many(args.dump_all[0], args.dump_all[1:])
        return
    LEDGERS.mkdir(parents=True, exist_ok=True)
    if args.withdraw:
        study, name, why = args.withdraw
        path = LEDGERS / f"{study}.json"
        ledger = json.loads(path.read_text())
        ledger["claims"][name]["withdrawn"] = why
        path.write_text(json.dumps(ledger, indent=1, ensure_ascii=False) + "\n")
        return
    ledgers = walk(args.since)
    for study, ledger in sorted(ledgers.items()):
        old = LEDGERS / f"{study}.json"
        if old.exists():  # withdrawals given by hand survive a rebuild
            for name, claim in json.loads(old.read_text())["claims"].items():
                if claim.get("withdrawn") and name in ledger["claims"] and not ledger["claims"][name]["withdrawn"]:
                    ledger["claims"][name]["withdrawn"] = claim["withdrawn"]
        old.write_text(json.dumps(ledger, indent=1, ensure_ascii=False) + "\n")
        revised = sum(bool(c["revisions"]) for c in ledger["claims"].values())
        print(f"{study}: {len(ledger['claims'])} claims registered, {revised} revised, "
              f"{sum(bool(c['withdrawn']) for c in ledger['claims'].values())} withdrawn")
    if args.restate:
        restate(ledgers)
        write_counts_block()
        write_undecided()
        if UNDECIDED:
            print(f"{len(UNDECIDED)} stored claims left as stored (their name fits specs judged otherwise; a rerun "
                  f"restates them):\n  " + "\n  ".join(UNDECIDED))


if __name__ == "__main__":
    main()
