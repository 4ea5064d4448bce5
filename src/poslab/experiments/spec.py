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
from typing import Any, SupportsFloat, TypeAlias

import numpy as np

from poslab.experiments import registry
from poslab.experiments.claims import NA_KINDS, ROLES, Claim
from poslab.experiments.fingerprint import canonical, digest
from poslab.experiments.rows import frame, groups, has, sort_key, values
from poslab.lazy import pandas as pd

Row = dict
Rows: TypeAlias = "list[Row] | pd.DataFrame"  # a run's rows, as records or as a frame (poslab.experiments.rows)


def _frame(rows) -> pd.DataFrame:
    """Rows as a frame (:func:`poslab.experiments.rows.frame`); a frame as it is."""
    return rows if isinstance(rows, pd.DataFrame) else frame(rows)


def _column(df: pd.DataFrame, column: str) -> pd.Series:
    """``column`` of the frame; ``None`` in every row where the frame lacks it."""
    return df[column] if column in df.columns else pd.Series([None] * len(df), index=df.index, dtype=object)

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

    def column_of(self, df: pd.DataFrame) -> pd.Series:
        """The referenced value of every row of ``df``."""
        got = df[self.column]
        return got if self.scale == 1.0 else got.map(lambda v: self.scale * v)


def neg(column: str) -> Ref:
    return Ref(column, -1.0)


def _value(v, row: Row):
    return v.of(row) if isinstance(v, Ref) else v


def _compare(got: pd.Series, op: str, want, df: pd.DataFrame) -> pd.Series:
    """``got op want`` row by row (``want`` a value, or a :class:`Ref` read from ``df``'s rows)."""
    wanted = want.column_of(df) if isinstance(want, Ref) else want
    return pd.Series(COMPARE[op](got, wanted), index=got.index, dtype=bool)


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

    def mask(self, df: pd.DataFrame) -> pd.Series:
        """Which rows of ``df`` meet the term (a row without the column meets none)."""
        out = pd.Series(False, index=df.index)
        present = df[has(df, self.column)]
        if present.empty:
            return out
        got = present[self.column]
        if self.op == "in":
            wanted = self.value if isinstance(self.value, tuple) else (self.value,)  # "in": a tuple of values
            out[present.index] = got.map(lambda v: v in wanted).astype(bool)
        else:
            out[present.index] = _compare(got, self.op, self.value, present)
        return out

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

    def select(self, df: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``df`` that meet every term, in order. Term by term, so a term reads only the
        rows the terms before it kept (as ``all`` stops at the first term a row misses)."""
        for t in self.terms:
            df = df[t.mask(df)]
        return df

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

    def __call__(self, rows: Rows) -> float | None:
        df = _frame(rows)
        if self.agg == "share":
            return self._share(df)
        if self.agg == "lower_bound":
            return _lower_bound(df, self.column)
        present = df[has(df, self.column)]
        if self.by:  # e.g. the lowest over lengths of the mean over seeds
            vals = [float(np.mean(values(g, self.column))) for _, g in groups(present, self.by)]
        else:
            vals = list(values(present, self.column))
        if not vals:
            return None
        aggregate: dict[str, Callable[[list[float]], SupportsFloat]] = {
            "mean": np.mean, "min": np.min, "max": np.max, "median": np.median, "abs_mean": lambda v: abs(np.mean(v))}
        return float(aggregate[self.agg](vals))

    def _share(self, df: pd.DataFrame) -> float | None:
        present = df[has(df, self.column)]
        if present.empty:
            return None
        op, want = self.test
        return float(np.mean(_compare(present[self.column], op, want, present).to_numpy(dtype=bool)))

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


def _lower_bound(df: pd.DataFrame, column: str) -> float | None:
    """mean - 2 standard errors of the per-seed means of ``column`` (None below two seeds)."""
    present = df[has(df, column)]
    means = np.array([np.mean(values(g, column)) for _, g in groups(present, ("seed",))])
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

    def score(self, group: Rows, rows: Rows) -> float | None:
        """The lowest mean in-range score of the models ``group`` reads (None where none was measured)."""
        models, df = _frame(group), _frame(rows)
        match = [c for c in self.match if has(models, c).any()]
        chosen = self.where.select(df)
        chosen = chosen[has(chosen, self.column)]
        for c in match:  # the models the group reads: their values of the match columns
            wanted = set(models[c])
            chosen = chosen[_column(chosen, c).map(lambda v, wanted=wanted: v in wanted).astype(bool)]
        means = [float(np.mean(values(g, self.column))) for _, g in groups(chosen, match)]
        return min(means) if means else None


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

    def span(self, group: Rows) -> tuple[float, float] | None:
        group = _frame(group)
        if self.flag not in group.columns:
            return None
        split = group[group[self.flag].map(lambda v: v is False).astype(bool)]
        if not len(split):
            return None
        return float(min(split[self.lo])), float(max(split[self.hi]))


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
        for problem in (*self._judging_problems(), *self._role_problems()):
            raise ValueError(f"ClaimSpec {self.name!r}: {problem}")
        if self.source is not None:
            object.__setattr__(self, "role", role_of(self.source, self.setting or ""))
        if self.role not in ROLES:
            raise ValueError(f"ClaimSpec {self.name!r}: role must be one of {ROLES}, got {self.role!r}")

    def _judging_problems(self) -> list[str]:
        """What is wrong with how the claim is judged (op, threshold, tol, na, interval), in words."""
        judged = self.op is not None
        return [problem for bad, problem in (
            (judged and self.op not in OPS, f"op must be one of {OPS}, got {self.op!r}"),
            (judged and self.threshold is None, f"op {self.op!r} needs a threshold"),
            (self.op == "~" and self.tol is None, "op '~' needs a tol"),
            (judged and self.na is not None, "a claim is judged (op) or n.a. (na), not both"),
            (self.na is not None and not isinstance(self.na, NA),
             f"na must be undecidable(...), comparison_only(...) or not_run(...), got {self.na!r}"),
            (not judged and self.na is None, "a claim needs an op (judged) or an na (with its reason)"),
            (self.interval is not None and self.op not in (">=", "<=", ">", "<"),
             f"an interval is judged against a one-sided op (>=, <=, >, <), got {self.op!r}"),
        ) if bad]

    def _role_problems(self) -> list[str]:
        """What is wrong with what the claim is (source, setting) and its revision, in words."""
        return [problem for bad, problem in (
            ((self.source is None) != (self.setting is None),
             "source and setting come together (the role follows from both)"),
            (self.revised is not None and not _REVISED.match(self.revised),
             f"revised must read 'YYYY-MM-DD: the reason', got {self.revised!r}"),
        ) if bad]

    def fingerprint(self, gate: InRange | None = None) -> str:
        """A hash of what judges the claim: the rows it reads, the measure, the operator, the line, the
        gate (where it reads trained behaviour) and its role's inputs; never its prose."""
        what = canonical(self)
        if self.trained:
            what["gate"] = canonical(gate)
        return digest(what)

    def limit(self, group: Rows) -> float | None:
        if self.threshold is None:
            return None
        if self.scale_by is None:
            return self.threshold
        first = _frame(group)[self.scale_by].iloc[0]
        return self.threshold * float(first)

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

    def judge(self, value: float | None, group: Rows | None = None) -> bool | None:
        if self.op is None or value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        limit = self.limit(group) if group is not None and len(group) else self.threshold
        assert limit is not None  # __post_init__: an op comes with a threshold
        if self.op == "~":
            assert self.tol is not None  # __post_init__: "~" comes with a tol
            return bool(abs(value - limit) <= self.tol)
        return bool(COMPARE[self.op](value, limit))

    def sides(self, group: Rows) -> tuple[float, float, bool | None] | None:
        """With ``interval``: (lowest lo, highest hi, verdict) over the group's intervals; the
        verdict is True / False where every interval meets / misses the line, None where they reach
        both sides. None without ``interval`` or interval columns."""
        if self.interval is None:
            return None
        group = _frame(group)
        los, his = (values(group, c) for c in self.interval)
        if not len(los) or not len(his):
            return None
        lo, hi = float(los.min()), float(his.max())
        a, b = self.judge(lo, group), self.judge(hi, group)
        return lo, hi, (a if a == b else None)

    def evaluate(self, rows: Rows, gate: InRange | None = None) -> list[Claim]:
        """One claim per group of the rows ``where`` selects, grouped by ``per``, in the order of
        the groups' ``per`` values (numbers first)."""
        df = _frame(rows)
        chosen = groups(self.where.select(df), self.per)
        return [self._claim(key, group, df, gate) for key, group in sorted(chosen, key=lambda kg: sort_key(kg[0]))]

    def _claim(self, key: tuple, group: pd.DataFrame, rows: pd.DataFrame, gate: InRange | None) -> Claim:
        """The claim on one group: its measured value, verdict and note."""
        fields = dict(zip(self.per, key, strict=False), n=len(group), seeds=len(set(_column(group, "seed"))))
        value = self.measure(group) if self.measure is not None else None
        note = self.note.format(**fields) if self.note else f"{fields['seeds']} seeds, {len(group)} rows"
        holds, na_kind, why = self._verdict(value, group, rows, gate)
        if why:
            note = f"n.a. ({why})" + (f"; {note}" if note else "")
        measured = value if not (self.percent and value is not None) else f"{100 * value:.1f}%"
        split = self._disagreement(group) if na_kind == "undecidable" else None
        if split is not None:  # the readings' span, as text, where they disagree
            measured = f"{split[0]} to {split[1]}"
        return Claim(name=self.name.format(**fields), paper=self.paper, measured=measured, holds=holds,
                     criterion=self.criterion(group), note=note, role=self.role, na_kind=na_kind)

    def _verdict(self, value: float | None, group: pd.DataFrame, rows: pd.DataFrame,
                 gate: InRange | None) -> tuple[bool | None, str | None, str]:
        """(holds, the n.a. kind, why it is n.a. in words): n.a. as declared; not learned where the
        study's gate finds the group's models below its line; undecidable where the 95% intervals
        reach both sides of the line; not run where nothing was measured."""
        if self.na:
            return None, self.na.kind, self.na.text
        holds = self.judge(value, group)
        span = None if holds is None else self.sides(group)
        if span is not None:
            holds = span[2]
        if gate is not None and self.trained and (holds is not None or value is None):
            learned = gate.score(group, rows)
            if _not_learned(holds, learned, gate.threshold):
                score = "not measured" if learned is None else f"{learned:.3f}"
                return None, "not-learned", f"did not learn in range: {gate.text} {score}, below {gate.threshold:g}"
        if span is not None and holds is None:
            return None, "undecidable", (f"the task cannot decide it: the 95% intervals span {span[0]:.3f} to "
                                         f"{span[1]:.3f}, both sides of {self.limit(group):g}")
        split = self._disagreement(group) if holds is None else None
        if split is not None and self.agree is not None:
            return None, "undecidable", f"the task cannot decide it: {self.agree.text.format(lo=split[0], hi=split[1])}"
        if holds is None:
            return None, "not-run", "not run: nothing measured"
        return holds, None, ""

    def _disagreement(self, group: pd.DataFrame) -> tuple[str, str] | None:
        """With ``agree``: the span of the group's disagreeing readings as shown (percent where the claim
        is), None where they agree or the claim declares no agreement."""
        split = self.agree.span(group) if self.agree is not None else None
        if split is None:
            return None
        lo, hi = (f"{100 * v:+.1f}%" if self.percent else f"{v:.3f}" for v in split)
        return lo, hi


def _not_learned(holds: bool | None, learned: float | None, threshold: float) -> bool:
    """Whether the gate takes the claim: a verdict whose models' in-range score is below the line or was not
    measured, or a claim with nothing measured whose models were measured below the line (the reason it has no
    value is that they did not learn, not that nothing ran)."""
    if holds is not None:
        return learned is None or learned < threshold
    return learned is not None and learned < threshold


def judge_all(specs: Iterable[ClaimSpec], rows: list[Row], gate: InRange | None = None) -> list[Claim]:
    """Every spec's claims on these rows, in declaration order; with the study's ``gate``, each claim
    that reads trained behaviour is n.a. where its models did not learn in range. Where a registry
    is active (the runner's, :mod:`poslab.experiments.registry`), a revised claim carries its first
    registered criterion and verdict."""
    specs, df = list(specs), frame(rows)
    claims = [c for spec in specs for c in spec.evaluate(df, gate)]
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
