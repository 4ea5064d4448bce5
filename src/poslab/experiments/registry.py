"""Claims registered before they are judged: each claim's first criterion and verdict, and every revision.

A study's claims are declared as :class:`~poslab.experiments.spec.ClaimSpec` records; what judges one
(the rows it reads, the measure, the operator, the line, the gate, the role) hashes to its
``fingerprint``, its prose never does. The project keeps one ledger per study
(``poslab/data/registry/<study>.json``, written by ``scripts/register_claims.py``)::

    {"study": "heads",
     "specs": {"<name template>": {"fingerprint": "…", "revised": null | "YYYY-MM-DD: reason"}},
     "claims": {"<claim name>": {"spec": "<name template>",
                                 "first": {"criterion", "role", "verdict", "na_kind", "revision", "date"},
                                 "revisions": [{… the same, "reason"}],
                                 "withdrawn": null | "why"}}}

``first`` is the claim's first judgement as committed (the backfill reads it from the git history of the
results' ``claims.json`` and the study modules); a revision is a later change of its fingerprint, with the
commit and the reason; a re-evaluation under the same fingerprint adds nothing. The rules, which
:func:`problems` checks and the test suite runs on every study:

- a spec whose fingerprint differs from the registered one carries a ``revised=`` note that the ledger
  does not hold yet (the date and the reason);
- a registered claim no current spec produces carries ``withdrawn`` in the ledger, or a spec declares
  it with ``renamed_from=``.

While a study's report is written (:func:`active`, the runner's), :func:`annotate` gives each revised
claim its first registered criterion and verdict, which ``table.md``, the HTML report and ``poslab
claims`` show beside the current ones.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from poslab.experiments.claims import VERDICTS, Claim
from poslab.experiments.fingerprint import digest

LEDGERS = Path(__file__).resolve().parent.parent / "data" / "registry"

_active: contextvars.ContextVar[str | None] = contextvars.ContextVar("poslab_registry_study", default=None)
# the store a run's judgements are recorded in, and the code revision that judged them
_store: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("poslab_registry_store", default=None)


def ledger_path(study: str, root: Path | None = None) -> Path:
    return (root or LEDGERS) / f"{study}.json"


def load(study: str, root: Path | None = None) -> dict | None:
    """The study's ledger, or None where it has none (a plugin's, or a study not yet registered)."""
    path = ledger_path(study, root)
    return json.loads(path.read_text()) if path.exists() else None


@contextlib.contextmanager
def active(study: str, store=None, revision: str | None = None) -> Iterator[None]:
    """Within: :func:`annotate` reads ``study``'s ledger and records each judgement in ``store`` (the
    runner sets it around a report)."""
    token, stored = _active.set(study), _store.set((store, revision) if store is not None else None)
    try:
        yield
    finally:
        _active.reset(token)
        _store.reset(stored)


def template_pattern(template: str) -> re.Pattern:
    """The claim names a spec's name template gives (``"{encoding}, K={K}"`` → ``(.+?), K=(.+?)``)."""
    parts = re.split(r"\{[^{}]*\}", template)
    return re.compile("(.+?)".join(re.escape(p.replace("{{", "{").replace("}}", "}")) for p in parts) + r"\Z")


def template_fields(template: str) -> list[str]:
    """The fields a name template formats, in order (``"{encoding}, K={K:d}"`` → ``["encoding", "K"]``)."""
    return [f.split(":")[0].split("!")[0] for f in re.findall(r"\{([^{}]*)\}", template)]


def spec_of(name: str, templates: Iterable[str]) -> str | None:
    """The template that gives claim ``name`` (the most literal one where several match)."""
    hits = [t for t in templates if template_pattern(t).match(name)]
    return max(hits, key=lambda t: len(re.sub(r"\{[^{}]*\}", "", t))) if hits else None


def by_template(specs: list, gate=None) -> dict[str, tuple[str, str | None]]:
    """{name template: (fingerprint, revised note)}: the specs that share a template (the same claim in
    rows of other settings) fingerprint as one, their notes joined."""
    return group_fingerprints((s.name, s.fingerprint(gate), s.revised) for s in specs)


def group_fingerprints(items: Iterable[tuple[str, str, str | None]]) -> dict[str, tuple[str, str | None]]:
    """(template, fingerprint, revised note) per spec -> {template: (the group's fingerprint, notes joined)};
    ``scripts/register_claims.py`` groups an earlier revision's dumped specs with it too."""
    fps: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {}
    for template, fp, note in items:
        fps.setdefault(template, []).append(fp)
        if note:
            notes.setdefault(template, []).append(note)
    return {t: (f[0] if len(f) == 1 else digest(f), join_notes(notes.get(t, []))) for t, f in fps.items()}


def join_notes(notes: Iterable[str]) -> str | None:
    """Several specs' ``revised=`` notes as one, each distinct note once, in order (None where there are none)."""
    return "; ".join(dict.fromkeys(n for n in notes if n)) or None


def judgement(claim: Claim) -> dict:
    """What a ledger keeps of one judgement."""
    return dict(criterion=claim.criterion, role=claim.role, verdict=VERDICTS[claim.holds], na_kind=claim.na_kind)


def annotate(claims: list[Claim], specs: list, gate=None) -> list[Claim]:
    """Each revised claim with its first registered judgement (``Claim.registered``), where a study is
    active: from the project's ledger where the study has one, else from the run's store (whose first
    judgement of a claim under another fingerprint is its registration). Each judgement is recorded in
    the store (a fingerprint already recorded for the claim adds nothing). A spec with a ``revised=`` note
    the ledger does not hold yet counts as revised too (registered at the next
    ``scripts/register_claims.py``)."""
    study = _active.get()
    if not study:
        return claims
    groups = by_template(specs, gate)
    template = {c.name: spec_of(c.name, list(groups)) for c in claims}
    history = _record(study, claims, groups, template)
    ledger = load(study) or dict(study=study, specs={}, claims={})
    pending = {t: note for t, (fp, note) in groups.items()
               if note and ledger["specs"].get(t, {}).get("revised") != note
               and ledger["specs"].get(t, {}).get("fingerprint") not in (None, fp)}
    by_ledger = annotate_stored(claims, ledger, {n: pending[t] for n, t in template.items() if t in pending})
    by_store = _from_store(claims, groups, template, history)
    # the project's registration where it holds the claim; a claim it does not know: this store's first judgement
    return [a if c.name in ledger["claims"] else b for c, a, b in zip(claims, by_ledger, by_store, strict=True)]


def _record(study: str, claims: list[Claim], groups: dict, template: dict) -> dict[str, list[dict]]:
    """Record this report's judgements in the active store; the store's history of the study's claims."""
    active_store = _store.get()
    if active_store is None:
        return {}
    store, revision = active_store
    rows = [dict(claim=c.name, fingerprint=groups[template[c.name]][0], reason=groups[template[c.name]][1],
                 **judgement(c)) for c in claims if template[c.name] is not None]
    store.record_judgements(study, rows, revision=revision)
    return store.judgements(study)


def _from_store(claims: list[Claim], groups: dict, template: dict, history: dict[str, list[dict]]) -> list[Claim]:
    out = []
    for c in claims:
        records = history.get(c.name, [])
        t = template.get(c.name)
        if not records or t is None or records[0]["fingerprint"] == groups[t][0]:
            out.append(c)
            continue
        first = records[0]
        reason = groups[t][1] or "changed with no revised= note"
        out.append(dataclasses.replace(c, registered=dict(
            criterion=first["criterion"], role=first["role"], verdict=first["verdict"], na_kind=first["na_kind"],
            revision=first["revision"], date=(first["judged_at"] or "")[:10], reason=reason)))
    return out


def registered(study: str, claims: list[Claim]) -> list[Claim]:
    """A study's stored claims with each revised one's registered criterion and verdict, from its ledger
    (as stored where it has none)."""
    ledger = load(study)
    return claims if ledger is None else annotate_stored(claims, ledger)


def annotate_stored(claims: list[Claim], ledger: dict, pending: dict[str, str] | None = None) -> list[Claim]:
    """``claims`` with ``registered`` set from ``ledger`` wherever a claim was revised after its first
    verdict and reads otherwise than it was registered (criterion, role, verdict or n.a. kind);
    ``pending``: {claim name: a revision note not yet in the ledger}. The ledger keeps every revision,
    those that left all four as they were (a rewrite of how a spec is written) too."""
    out = []
    pending = pending or {}
    for c in claims:
        record = ledger["claims"].get(c.name)
        reasons = [r["reason"] for r in (record or {}).get("revisions", [])]
        if pending.get(c.name):
            reasons.append(pending[c.name])
        first = (record or {}).get("first", {})
        moved = (first.get("criterion", ""), first.get("role"), first.get("verdict"), first.get("na_kind")) != (
            c.criterion, c.role, VERDICTS[c.holds], c.na_kind)
        if record is None or not reasons or not moved:
            out.append(dataclasses.replace(c, registered=None))
            continue
        registered = {**{k: v for k, v in first.items() if v is not None}, "reason": "; ".join(reasons)}
        out.append(dataclasses.replace(c, registered=registered))
    return out


def problems(study: str, specs: list, gate=None, root: Path | None = None) -> list[str]:
    """What breaks registration in ``study``: a changed fingerprint without a new ``revised=`` note, a
    registered claim that no spec gives any more without ``withdrawn`` or ``renamed_from=``."""
    ledger = load(study, root)
    if ledger is None:
        return []
    out = []
    renamed_from = {s.name: s.renamed_from for s in specs if s.renamed_from}
    for template, (fp, note) in by_template(specs, gate).items():
        known = ledger["specs"].get(template) or ledger["specs"].get(renamed_from.get(template, ""))
        if known is None:
            continue  # a new claim: registered when first judged
        if known["fingerprint"] != fp and (not note or note == known["revised"]):
            out.append(f"{study}: claim {template!r} changed what judges it after its first verdict "
                       f"(fingerprint {known['fingerprint']} -> {fp}): say why with "
                       f"revised='YYYY-MM-DD: the reason'")
    renamed = {s.renamed_from for s in specs if s.renamed_from}
    templates = [s.name for s in specs] + sorted(renamed)  # a name the old template gives follows its new spec
    for name, record in ledger["claims"].items():
        if record.get("withdrawn"):
            continue
        if spec_of(name, templates) is None and record.get("spec") not in renamed:
            out.append(f"{study}: registered claim {name!r} is no longer given by any spec: declare "
                       f"renamed_from={record.get('spec')!r} on its new spec, or withdraw it in the ledger "
                       f"(scripts/register_claims.py --withdraw)")
    return out
