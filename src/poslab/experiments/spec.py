"""Claims as data: a study declares what the paper says and how a run is judged against it.

A :class:`ClaimSpec` names a claim, quotes the paper, and says which rows it reads (``where``),
what it measures on them (``measure``), one claim per distinct value of ``per`` columns, and
the operator and threshold that decide it. The criterion text is rendered from the operator,
never typed beside it, and a claim the paper's own task cannot decide carries ``na`` (its
reason) instead of an operator::

    ClaimSpec("{encoding}, K={K}: cells selecting offset -K", paper="100% of cells",
              where=probe("length") & kind("rotary", "relative") & at_least("K", 2),
              per=("encoding", "K"), measure=share("peak_offset", "==", neg("K")), op=">=",
              threshold=1.0, percent=True)

Predicates (:class:`Where`) and measures (:class:`Measure`) are declarative, so a synthetic row
set that meets a predicate and gives a measure any value can be built from the declaration
alone (:func:`synthetic_rows`): every study's verdicts are tested on both sides of every
threshold by one function (tests/experiments/test_claim_specs.py).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, SupportsFloat

import numpy as np

from poslab.experiments import registry
from poslab.experiments.claims import NA_KINDS, ROLES, Claim
from poslab.experiments.fingerprint import canonical, digest

Row = dict

# ----------------------------------------------------------------------------- predicates

COMPARE: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
}


@dataclass(frozen=True)
class Ref:
    """A value read from the same row (``neg("K")`` is minus the row's K)."""

    column: str
    scale: float = 1.0

    def of(self, row: Row):
        value = row[self.column]
        return value if self.scale == 1.0 else self.scale * value  # a string column is compared as is


def neg(column: str) -> Ref:
    return Ref(column, -1.0)


def _value(v, row: Row):
    return v.of(row) if isinstance(v, Ref) else v


@dataclass(frozen=True)
class Term:
    """``row[column] op value`` (``op`` "in": membership in a tuple)."""

    column: str
    op: str
    value: object

    def __call__(self, row: Row) -> bool:
        if self.column not in row or row[self.column] is None:
            return False
        got, want = row[self.column], _value(self.value, row)
        return got in want if self.op == "in" else bool(COMPARE[self.op](got, want))

    def example(self) -> object:
        """A value of the column that satisfies this term (Refs are resolved by the caller)."""
        v: Any = self.value  # "in": a tuple of values; the other ops: the value compared with
        if self.op == "in":
            return v[0]
        if self.op in ("==", ">=", "<="):
            return v
        if self.op == ">":
            return v + 1
        if self.op == "<":
            return v - 1
        raise ValueError(f"no example for {self}")


@dataclass(frozen=True)
class Where:
    """A conjunction of terms (``&`` joins two)."""

    terms: tuple[Term, ...] = ()

    def __call__(self, row: Row) -> bool:
        return all(t(row) for t in self.terms)

    def __and__(self, other: Where) -> Where:
        return Where(self.terms + other.terms)

    def example(self) -> Row:
        """A row that satisfies every term (the last term on a column wins; tests check it)."""
        row: Row = {}
        for t in self.terms:
            if not isinstance(t.value, Ref):
                row[t.column] = t.example()
        return row


def is_(column: str, *values) -> Where:
    return Where((Term(column, "in", tuple(values)),))


def probe(name: str) -> Where:
    return is_("probe", name)


def kind(*kinds: str) -> Where:
    """Rows of encodings of these kinds (``absolute``, ``relative``, ``rotary``, ``none``)."""
    return is_("kind", *kinds)


def at_least(column: str, value) -> Where:
    return Where((Term(column, ">=", value),))


def at_most(column: str, value) -> Where:
    return Where((Term(column, "<=", value),))


def above(column: str, value) -> Where:
    return Where((Term(column, ">", value),))


def below(column: str, value) -> Where:
    return Where((Term(column, "<", value),))


EVERY = Where()

# ----------------------------------------------------------------------------- measures


@dataclass(frozen=True)
class Measure:
    """A number from a set of rows; ``rows_for(value, base)`` builds rows that give ``value``."""

    column: str
    agg: str  # mean | min | max | median | abs_mean | share | lower_bound
    test: tuple = ()  # share: (op, value or Ref) the column is compared with
    text: str = ""
    by: tuple[str, ...] = ()  # non-share: aggregate the means of the groups of rows with equal ``by`` columns

    def __call__(self, rows: list[Row]) -> float | None:
        if self.agg == "share":
            present = [r for r in rows if r.get(self.column) is not None]
            if not present:
                return None
            op, want = self.test
            return float(np.mean([bool(COMPARE[op](r[self.column], _value(want, r))) for r in present]))
        if self.agg == "lower_bound":
            return _lower_bound(rows, self.column)
        vals = [float(r[self.column]) for r in rows if r.get(self.column) is not None]
        if self.by:  # e.g. the lowest over lengths of the mean over seeds
            means: dict[tuple, list[float]] = {}
            for r in rows:
                if r.get(self.column) is not None:
                    means.setdefault(tuple(r.get(c) for c in self.by), []).append(float(r[self.column]))
            vals = [float(np.mean(v)) for v in means.values()]
        if not vals:
            return None
        aggregate: dict[str, Callable[[list[float]], SupportsFloat]] = {
            "mean": np.mean, "min": np.min, "max": np.max, "median": np.median, "abs_mean": lambda v: abs(np.mean(v))}
        return float(aggregate[self.agg](vals))

    def rows_for(self, value: float, base: Row) -> list[Row]:
        """Rows that meet ``base`` and on which this measure is ``value`` (within 1e-9)."""
        if self.agg == "share":
            op, want = self.test
            target = _value(want, base) if isinstance(want, Ref) else want
            hit, miss = {"==": (target, target + 1), "!=": (target + 1, target), ">=": (target, target - 1),
                         ">": (target + 1, target), "<=": (target, target + 1), "<": (target - 1, target)}[op]
            n = 1000
            k = int(round(value * n))
            return [{**base, self.column: hit} for _ in range(k)] + [{**base, self.column: miss}
                                                                      for _ in range(n - k)]
        if self.agg == "lower_bound":  # two seeds at value + 2 +- 1: mean value + 2, standard error 1
            return [{**base, "seed": 0, self.column: value + 3.0}, {**base, "seed": 1, self.column: value + 1.0}]
        return [{**base, self.column: value}]

    @property
    def label(self) -> str:
        if self.text:
            return self.text
        if self.agg == "lower_bound":
            return f"seed mean of {self.column} - 2 standard errors"
        if self.agg == "share":
            op, want = self.test
            want = f"{'-' if isinstance(want, Ref) and want.scale < 0 else ''}{want.column}" \
                if isinstance(want, Ref) else want
            return f"share of rows with {self.column} {op} {want}"
        return f"{self.agg} {self.column}" + (f" of the means by {', '.join(self.by)}" if self.by else "")


def mean(column: str, text: str = "") -> Measure:
    return Measure(column, "mean", text=text)


def minimum(column: str, text: str = "", by: tuple[str, ...] = ()) -> Measure:
    """The lowest value; with ``by``, the lowest of the group means (``by=("length",)``: the worst length)."""
    return Measure(column, "min", text=text, by=tuple(by))


def maximum(column: str, text: str = "", by: tuple[str, ...] = ()) -> Measure:
    return Measure(column, "max", text=text, by=tuple(by))


def median(column: str, text: str = "") -> Measure:
    return Measure(column, "median", text=text)


def abs_mean(column: str, text: str = "") -> Measure:
    return Measure(column, "abs_mean", text=text)


def _lower_bound(rows: list[Row], column: str) -> float | None:
    """mean - 2 standard errors of the per-seed means of ``column`` (None below two seeds)."""
    per_seed: dict[object, list[float]] = {}
    for r in rows:
        if r.get(column) is not None:
            per_seed.setdefault(r.get("seed"), []).append(float(r[column]))
    means = np.array([np.mean(v) for v in per_seed.values()])
    if len(means) < 2:
        return None
    return float(means.mean() - 2.0 * means.std(ddof=1) / math.sqrt(len(means)))


def lower_bound(column: str, text: str = "") -> Measure:
    """The seed mean less two standard errors over seeds: ``op=">", threshold=0`` judges that a
    quantity whose estimate is 0 when absent is present (the usual test where a paper gives no size)."""
    return Measure(column, "lower_bound", text=text)


def share(column: str, op: str, value, text: str = "") -> Measure:
    if op not in COMPARE:
        raise ValueError(f"share: op must be one of {sorted(COMPARE)}, got {op!r}")
    return Measure(column, "share", (op, value), text=text)


# ----------------------------------------------------------------------------- n.a. reasons


@dataclass(frozen=True)
class NA:
    """Why a claim carries no verdict: one of :data:`NA_KINDS` and the reason in words."""

    kind: str
    why: str

    def __post_init__(self):
        if self.kind not in NA_KINDS:
            raise ValueError(f"NA: kind must be one of {NA_KINDS}, got {self.kind!r}")
        if len(self.why.split()) < 4:
            raise ValueError(f"NA({self.kind!r}): say why in words, got {self.why!r}")

    @property
    def text(self) -> str:
        lead = {"undecidable": "the task cannot decide it", "comparison": "a number for comparison only",
                "not-run": "not run", "not-learned": "did not learn in range"}[self.kind]
        return f"{lead}: {self.why}"


def undecidable(why: str) -> NA:
    """The task cannot decide the claim; ``why`` says why its operator would not decide it."""
    return NA("undecidable", why)


def comparison_only(why: str) -> NA:
    """The seed gives the number for comparison only (it states no criterion)."""
    return NA("comparison", why)


def not_run(why: str) -> NA:
    """The setting the claim needs was not run; ``why`` says what it needs."""
    return NA("not-run", why)


# ----------------------------------------------------------------------------- what a claim is

SOURCES = ("seed", "derivation", "cited", "next-step", "survey", "hypothesis")
SETTINGS = ("seed", "usual", "other")


@dataclass(frozen=True)
class Source:
    """Where a claim comes from: ``seed`` (a seed states it: ``which`` seed, ``text`` the sentence or the
    place it is stated), ``derivation`` (it follows from the definitions: a check), ``cited`` (an outside
    paper, arXiv id in ``text``), ``next-step`` (a next step's predicted outcome: the seed names the step,
    not its outcome), ``survey`` (a measurement the survey only names) or ``hypothesis`` (the study's own)."""

    kind: str
    text: str
    which: str = ""  # the seed ("000", "001") for kind "seed"

    def __post_init__(self):
        if self.kind not in SOURCES:
            raise ValueError(f"Source: kind must be one of {SOURCES}, got {self.kind!r}")
        if not self.text.strip():
            raise ValueError(f"Source({self.kind!r}): say what it states or where, got {self.text!r}")


def seed_states(text: str, which: str = "000") -> Source:
    """A seed states it: ``text`` is the sentence (or its place, e.g. "§4 Proposition 2")."""
    return Source("seed", text, which)


def derivation(text: str) -> Source:
    """It follows from the definitions (holds by construction): shown as a check, never a verdict."""
    return Source("derivation", text)


def cited(text: str) -> Source:
    """An outside paper states it: ``text`` names the paper and its arXiv id."""
    return Source("cited", text)


def next_step(text: str) -> Source:
    """A next step's predicted outcome: the seed names the step, not its outcome."""
    return Source("next-step", text)


def survey_names(text: str) -> Source:
    """A measurement the seed's survey only names (it states no outcome)."""
    return Source("survey", text)


def hypothesis(text: str) -> Source:
    """The study's own hypothesis."""
    return Source("hypothesis", text)


def role_of(source: Source, setting: str) -> str:
    """The one rule from what a claim is to its role:

    ==============================  ====================  ==============
    source                          setting               role
    ==============================  ====================  ==============
    a seed states it                the seed's, or usual  ``paper``
    a seed states it                another               ``control``
    an outside paper states it      any                   ``external``
    a next step, the survey, own    any                   ``prediction``
    a derivation                    any                   ``check``
    ==============================  ====================  ==============

    ``usual`` is the field's usual choice where the seed is silent (named in the note)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    if source.kind == "seed":
        return "paper" if setting in ("seed", "usual") else "control"
    return {"derivation": "check", "cited": "external"}.get(source.kind, "prediction")


@dataclass(frozen=True)
class InRange:
    """A study's learned-in-range gate, declared once: the rows holding each model's in-range score
    (``where``, ``column``) and the line it must reach. A claim that reads trained behaviour
    (``ClaimSpec(trained=True)``) is n.a. (``not-learned``, the score in the note) where the models
    its group reads did not learn in range: the lowest, over the distinct values of the ``match``
    columns its group holds (each encoding, each task), of the mean in-range score."""

    where: Where
    column: str
    threshold: float
    match: tuple[str, ...] = ("encoding",)
    text: str = "in-range score"

    def score(self, group: list[Row], rows: list[Row]) -> float | None:
        """The lowest mean in-range score of the models ``group`` reads (None where none was measured)."""
        wanted = {c: {r.get(c) for r in group} for c in self.match if any(r.get(c) is not None for r in group)}
        means: dict[tuple, list[float]] = {}
        for r in rows:
            if self.where(r) and r.get(self.column) is not None and all(r.get(c) in v for c, v in wanted.items()):
                means.setdefault(tuple(r.get(c) for c in wanted), []).append(float(r[self.column]))
        return min(float(np.mean(v)) for v in means.values()) if means else None


# ----------------------------------------------------------------------------- claim specs


OPS = (">=", "<=", ">", "<", "==", "~")  # "~": |measured - threshold| <= tol
_REVISED = re.compile(r"^\d{4}-\d{2}-\d{2}: \S.{8,}")


@dataclass(frozen=True)
class Agreement:
    """Judged only where a group's readings agree: where a row's ``flag`` column is False (its readings,
    e.g. three replacements of one vector, fall on both sides of the line) and the claim has no value,
    it is n.a. (undecidable), measured as the span from the lowest ``lo`` to the highest ``hi`` of those
    rows. ``text`` says why, a format string over ``{lo}`` and ``{hi}`` (the span's ends as shown)."""

    flag: str
    lo: str
    hi: str
    text: str = "the readings disagree, {lo} to {hi}"

    def span(self, group: list[Row]) -> tuple[float, float] | None:
        split = [r for r in group if r.get(self.flag) is False]
        if not split:
            return None
        return min(float(r[self.lo]) for r in split), max(float(r[self.hi]) for r in split)


@dataclass(frozen=True, kw_only=True)
class ClaimSpec:
    """One claim of a paper, as data. ``name`` and ``note`` are format strings over the ``per``
    columns and ``n`` (rows), ``seeds`` (distinct seeds) of the group."""

    name: str
    paper: str
    where: Where = EVERY
    per: tuple[str, ...] = ()
    measure: Measure | None = None
    op: str | None = None
    threshold: float | None = None
    tol: float | None = None
    na: NA | None = None  # why the claim carries no verdict (undecidable / comparison_only / not_run)
    # what the claim is: its role follows from these two by role_of (a bare ``role`` is the older form)
    source: Source | None = None
    setting: str | None = None  # seed | usual | other (SETTINGS)
    role: str = "paper"  # paper | control | prediction | external | check (experiments/claims.py)
    trained: bool = False  # it reads trained behaviour (past the range, or a mechanism): the study's InRange gates it
    # a change of what judges it after its first verdict: "YYYY-MM-DD: the reason" (the registry keeps both)
    revised: str | None = None
    renamed_from: str | None = None  # the name template it was registered under, where it was renamed
    note: str = ""
    percent: bool = False  # show the measured value and threshold as percentages
    scale_by: str | None = None  # the threshold is multiplied by this column of the group (e.g. chance)
    # (lo, hi): the columns holding each row's 95% interval (e.g. a Wilson interval of an exact match
    # on few examples). Judged only where every row's interval lies on one side of the line; where
    # they reach both sides the claim is n.a. (undecidable), the intervals' span in the note
    interval: tuple[str, str] | None = None
    agree: Agreement | None = None  # judged only where the group's readings agree (see Agreement)

    def __post_init__(self):
        if self.op is not None and self.op not in OPS:
            raise ValueError(f"ClaimSpec {self.name!r}: op must be one of {OPS}, got {self.op!r}")
        if self.op is not None and self.threshold is None:
            raise ValueError(f"ClaimSpec {self.name!r}: op {self.op!r} needs a threshold")
        if self.op == "~" and self.tol is None:
            raise ValueError(f"ClaimSpec {self.name!r}: op '~' needs a tol")
        if self.op is not None and self.na is not None:
            raise ValueError(f"ClaimSpec {self.name!r}: a claim is judged (op) or n.a. (na), not both")
        if self.na is not None and not isinstance(self.na, NA):
            raise ValueError(f"ClaimSpec {self.name!r}: na must be undecidable(...), comparison_only(...) or "
                             f"not_run(...), got {self.na!r}")
        if self.op is None and self.na is None:
            raise ValueError(f"ClaimSpec {self.name!r}: a claim needs an op (judged) or an na (with its reason)")
        if (self.source is None) != (self.setting is None):
            raise ValueError(f"ClaimSpec {self.name!r}: source and setting come together (the role follows from both)")
        if self.source is not None:
            object.__setattr__(self, "role", role_of(self.source, self.setting or ""))
        if self.role not in ROLES:
            raise ValueError(f"ClaimSpec {self.name!r}: role must be one of {ROLES}, got {self.role!r}")
        if self.revised is not None and not _REVISED.match(self.revised):
            raise ValueError(f"ClaimSpec {self.name!r}: revised must read 'YYYY-MM-DD: the reason', "
                             f"got {self.revised!r}")
        if self.interval is not None and self.op not in (">=", "<=", ">", "<"):
            raise ValueError(f"ClaimSpec {self.name!r}: an interval is judged against a one-sided op "
                             f"(>=, <=, >, <), got {self.op!r}")

    def fingerprint(self, gate: InRange | None = None) -> str:
        """A hash of what judges the claim: the rows it reads, the measure, the operator, the line, the
        gate (where it reads trained behaviour) and its role's inputs; never its prose."""
        what = canonical(self)
        if self.trained:
            what["gate"] = canonical(gate)
        return digest(what)

    def limit(self, group: list[Row]) -> float | None:
        if self.threshold is None:
            return None
        if self.scale_by is None:
            return self.threshold
        return self.threshold * float(group[0][self.scale_by])

    def criterion(self, group: list[Row] | None = None) -> str:
        if self.op is None:
            return ""
        show = (lambda v: f"{100 * v:g}%") if self.percent else (lambda v: f"{v:g}")
        t = show(self.threshold)
        if self.scale_by:
            t = f"{t} x {self.scale_by}"
        if self.op == "~":
            return f"within {show(self.tol)} of {t}"
        return f"{ {'>=': '≥', '<=': '≤'}.get(self.op, self.op)} {t}"

    def judge(self, value: float | None, group: list[Row] | None = None) -> bool | None:
        if self.op is None or value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        limit = self.limit(group) if group else self.threshold
        assert limit is not None  # __post_init__: an op comes with a threshold
        if self.op == "~":
            assert self.tol is not None  # __post_init__: "~" comes with a tol
            return bool(abs(value - limit) <= self.tol)
        return bool(COMPARE[self.op](value, limit))

    def sides(self, group: list[Row]) -> tuple[float, float, bool | None] | None:
        """With ``interval``: (lowest lo, highest hi, verdict) over the group's intervals; the
        verdict is True / False where every interval meets / misses the line, None where they reach
        both sides. None without ``interval`` or interval columns."""
        if self.interval is None:
            return None
        lo_col, hi_col = self.interval
        los = [float(r[lo_col]) for r in group if r.get(lo_col) is not None]
        his = [float(r[hi_col]) for r in group if r.get(hi_col) is not None]
        if not los or not his:
            return None
        lo, hi = min(los), max(his)
        a, b = self.judge(lo, group), self.judge(hi, group)
        return lo, hi, (a if a == b else None)

    def evaluate(self, rows: Iterable[Row], gate: InRange | None = None) -> list[Claim]:
        rows = list(rows)
        groups: dict[tuple, list[Row]] = {}
        for r in rows:
            if self.where(r):
                groups.setdefault(tuple(r.get(c) for c in self.per), []).append(r)
        out = []
        for key in sorted(groups, key=_sort_key):
            group = groups[key]
            fields = dict(zip(self.per, key, strict=False), n=len(group), seeds=len({r.get("seed") for r in group}))
            value = self.measure(group) if self.measure is not None else None
            holds = None if self.na else self.judge(value, group)
            note = self.note.format(**fields) if self.note else f"{fields['seeds']} seeds, {len(group)} rows"
            na_kind, shown = None, None  # shown: the measured value as text, where it is not one number
            span = None if self.na or holds is None else self.sides(group)
            if span is not None:
                holds = span[2]
            gated = gate is not None and self.trained and (holds is not None or value is None)
            learned = gate.score(group, rows) if gate is not None and gated else None
            if self.na:
                na_kind = self.na.kind
                note = f"n.a. ({self.na.text})" + (f"; {note}" if note else "")
            elif gate is not None and gated and _not_learned(holds, learned, gate.threshold):
                holds, na_kind = None, "not-learned"
                score = "not measured" if learned is None else f"{learned:.3f}"
                note = (f"n.a. (did not learn in range: {gate.text} {score}, below {gate.threshold:g})"
                        + (f"; {note}" if note else ""))
            elif span is not None and holds is None:
                na_kind = "undecidable"
                note = (f"n.a. (the task cannot decide it: the 95% intervals span {span[0]:.3f} to {span[1]:.3f}, "
                        f"both sides of {self.limit(group):g})" + (f"; {note}" if note else ""))
            elif holds is None and self.agree is not None and (split := self.agree.span(group)) is not None:
                na_kind = "undecidable"
                lo, hi = (f"{100 * v:+.1f}%" if self.percent else f"{v:.3f}" for v in split)
                shown = f"{lo} to {hi}"
                note = (f"n.a. (the task cannot decide it: {self.agree.text.format(lo=lo, hi=hi)})"
                        + (f"; {note}" if note else ""))
            elif holds is None:
                na_kind = "not-run"
                note = "n.a. (not run: nothing measured)" + (f"; {note}" if note else "")
            measured = value if not (self.percent and value is not None) else f"{100 * value:.1f}%"
            out.append(Claim(name=self.name.format(**fields), paper=self.paper, measured=shown or measured, holds=holds,
                             criterion=self.criterion(group), note=note, role=self.role, na_kind=na_kind))
        return out


def _not_learned(holds: bool | None, learned: float | None, threshold: float) -> bool:
    """Whether the gate takes the claim: a verdict whose models' in-range score is below the line or was not
    measured, or a claim with nothing measured whose models were measured below the line (the reason it has no
    value is that they did not learn, not that nothing ran)."""
    if holds is not None:
        return learned is None or learned < threshold
    return learned is not None and learned < threshold


def _sort_key(key: tuple) -> tuple:
    return tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in key)


def judge_all(specs: Iterable[ClaimSpec], rows: list[Row], gate: InRange | None = None) -> list[Claim]:
    """Every spec's claims on these rows, in declaration order; with the study's ``gate``, each claim
    that reads trained behaviour is n.a. where its models did not learn in range. Where a registry
    is active (the runner's, :mod:`poslab.experiments.registry`), a revised claim carries its first
    registered criterion and verdict."""
    specs = list(specs)
    claims = [c for spec in specs for c in spec.evaluate(rows, gate)]
    return registry.annotate(claims, specs, gate)


# ----------------------------------------------------------------------------- verdict tests


def synthetic_rows(spec: ClaimSpec, value: float, base: Row | None = None) -> list[Row]:
    """Rows that meet ``spec.where`` and on which ``spec.measure`` gives ``value``."""
    measure = spec.measure
    if measure is None:
        raise ValueError(f"synthetic_rows: ClaimSpec {spec.name!r} has no measure to give a value")
    row = {**(base or {}), **spec.where.example()}
    for c in spec.per:
        row.setdefault(c, 0)
    row.setdefault("seed", 0)
    if spec.scale_by is not None:
        row.setdefault(spec.scale_by, 0.05)
    if measure.agg == "share" and isinstance(measure.test[1], Ref):  # compared with another column
        row.setdefault(measure.test[1].column, 0)
    rows = measure.rows_for(value, row)
    if spec.interval is not None:  # a point interval: the verdict is the measured value's
        rows = [{**r, spec.interval[0]: r[measure.column], spec.interval[1]: r[measure.column]}
                for r in rows]
    return rows


def flip_values(spec: ClaimSpec, base: Row | None = None, eps: float = 1e-3) -> tuple[float, float]:
    """(a measured value that meets the claim, one that misses it), just either side of the line."""
    group = synthetic_rows(spec, spec.threshold or 0.0, base)
    limit = spec.limit(group)
    if spec.op is None or limit is None:
        raise ValueError(f"flip_values: ClaimSpec {spec.name!r} is not judged (no op, no threshold)")
    if spec.op == "~":
        assert spec.tol is not None  # __post_init__: "~" comes with a tol
        return limit, limit + 2 * spec.tol + eps
    inside = {">=": limit, ">": limit + eps, "<=": limit, "<": limit - eps, "==": limit}[spec.op]
    outside = {">=": limit - eps, ">": limit, "<=": limit + eps, "<": limit, "==": limit - eps}[spec.op]
    return inside, outside


@dataclass
class FlipReport:
    """What :func:`check_flips` found: specs judged, and any whose verdict did not flip."""

    judged: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def check_flips(specs: Iterable[ClaimSpec], base: Row | None = None) -> FlipReport:
    """Feed every judged spec synthetic rows just inside and just outside its threshold; its
    verdict must be yes then no (and every n.a. spec must stay n.a.)."""
    report = FlipReport()
    for spec in specs:
        if spec.op is None:
            if spec.measure is not None:
                got = spec.evaluate(synthetic_rows(spec, 0.5, base))
                if any(c.holds is not None for c in got):
                    report.failures.append(f"{spec.name}: n.a. spec gave a verdict")
            continue
        inside, outside = flip_values(spec, base)
        yes = spec.evaluate(synthetic_rows(spec, inside, base))
        no = spec.evaluate(synthetic_rows(spec, outside, base))
        report.judged.append(spec.name)
        if [c.holds for c in yes] != [True] or [c.holds for c in no] != [False]:
            report.failures.append(f"{spec.name}: {inside} -> {[c.holds for c in yes]}, "
                                   f"{outside} -> {[c.holds for c in no]}")
    return report


# ----------------------------------------------------------------------------- the survey table

@dataclass(frozen=True)
class Extrapolation:
    """What a study measured past its training length (``Experiment.extrapolation``), read by the
    survey's comparison table (:func:`poslab.survey.measurements`)."""

    column: str  # the survey column it fills: "fixed_offset" (accuracy) or "lm" (loss)
    where: Where  # the study's rows that hold one length's number
    value: str  # the row column holding the number
    summary: str = "mean"  # "mean": mean over unseen lengths; "by_ratio": one number per L / L_train
    # the registry encoding a row measured (None: not one); default: the row's or the run's encoding.
    # A declaration that names it reads evaluate-only variants too (a schedule applied to trained weights);
    # a module-level function, so that the Experiment still pickles
    encoding: Callable[[dict], str | None] | None = None
