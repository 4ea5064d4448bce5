"""Results as typed tables: a study declares its kinds of row once, and reads rows through queries.

A run's rows are records: one per measurement, tagged by the probe that made it (``probe``).
Each study declares the kinds it writes, with their columns and types, and makes its rows through
them, so a missing or mistyped column fails where the row is made, with one message naming the
kind, the column and the type wanted::

    DEPTH = RowKind("depth", {"bos": str, "seed": int, "slope_full": float | None})
    DEPTH(bos="with BOS", seed=0, slope_full=0.25)   # {"probe": "depth", "bos": ..., ...}

Rows are read as a pandas DataFrame (:func:`frame`): derived rows, claims and tables select,
group, aggregate and join there instead of filtering lists of dicts by hand. pandas, not polars:
users open ``rows.csv`` in pandas, it keeps each cell's Python object (``dtype=object``), so an
int stays an int and a missing cell stays ``None`` where polars would cast a column to one type,
and it is the dataframe library the field's analysis notebooks already use.

A frame keeps what the rows hold, exactly: every cell is the row's own object (an int stays an
int, a float the same float) and a column a row lacks is ``None``, so :func:`records` gives
back rows that write the same CSV bytes.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from poslab.lazy import pandas as pd

TAG = "probe"  # the column naming a row's kind


class RowError(TypeError):
    """A row made through a :class:`RowKind` lacks a column, has one it does not declare, or holds a
    value of another type."""

    def __init__(self, kind: str, column: str, problem: str):
        self.kind, self.column, self.problem = kind, column, problem
        super().__init__(f"row kind {kind!r}, column {column!r}: {problem}")

    def __reduce__(self):
        return (type(self), (self.kind, self.column, self.problem))


def _type_name(t: Any) -> str:
    if isinstance(t, types.UnionType):
        return " | ".join(_type_name(a) for a in t.__args__)
    return "None" if t is type(None) else getattr(t, "__name__", str(t))


def _accepts(want: Any, value: object) -> bool:
    """Whether ``value`` is of the declared type; a NumPy scalar counts as the Python type it stands for
    (a count read off an array is an ``np.int64``; it writes the same CSV cell)."""
    if isinstance(value, want):
        return True
    wanted = set(want.__args__) if isinstance(want, types.UnionType) else {want}
    return any(isinstance(value, np_type) and py in wanted
               for np_type, py in ((np.bool_, bool), (np.integer, int), (np.floating, float)))


@dataclass(frozen=True)
class RowKind:
    """One kind of row: its ``probe`` tag and its columns with their types (``float | None`` where a
    value may be missing). Calling it makes a row, checked; the columns keep the order they are
    given in (so ``rows.csv`` keeps its column order), the tag first."""

    name: str
    columns: Mapping[str, Any]
    optional: tuple[str, ...] = ()  # columns a row may leave out (e.g. a contrast with a variant not run)

    def __call__(self, **values) -> dict:
        for column, want in self.columns.items():
            if column not in values:
                if column in self.optional:
                    continue
                raise RowError(self.name, column, f"missing (declared {_type_name(want)})")
            value = values[column]
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                raise RowError(self.name, column, f"got int {value!r}; declared float (write float(...))")
            if not _accepts(want, value):
                raise RowError(self.name, column, f"got {type(value).__name__} {value!r}; declared "
                                                  f"{_type_name(want)}")
        for column in values:
            if column not in self.columns:
                raise RowError(self.name, column, f"not declared (declared: {', '.join(self.columns)})")
        return {TAG: self.name, **values}


def frame(rows: Iterable[Mapping]) -> pd.DataFrame:
    """The rows as a DataFrame of the rows' own objects (``dtype=object``), columns in order of first
    appearance, ``None`` where a row lacks a column."""
    rows = list(rows)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return pd.DataFrame([[r.get(c) for c in columns] for r in rows], columns=columns, dtype=object)


def has(df: pd.DataFrame, column: str) -> pd.Series:
    """Which rows hold a value (not ``None``) in ``column``; none where the frame lacks it."""
    if column not in df.columns:
        return pd.Series(False, index=df.index)
    return df[column].map(lambda v: v is not None).astype(bool)


def column(df: pd.DataFrame, name: str, default: object = None) -> pd.Series:
    """Column ``name``, ``default`` where a row lacks it (``row.get(name, default)`` for every row)."""
    if name not in df.columns:
        return pd.Series([default] * len(df), index=df.index, dtype=object)
    return pd.Series([default if v is None else v for v in df[name]], index=df.index, dtype=object)


def where_is(df: pd.DataFrame, name: str, value: object, default: object = None) -> pd.DataFrame:
    """The rows whose ``name`` equals ``value`` (a row lacking the column reads ``default``)."""
    return df[column(df, name, default).map(lambda v: v == value).astype(bool)]


def lookup(df: pd.DataFrame, keys: Iterable[str], value: str) -> dict[tuple, Any]:
    """``value`` of each row keyed by its ``keys`` columns (a join's right side; the last row of a key wins)."""
    return dict(zip(zip(*(column(df, k) for k in keys), strict=True), column(df, value), strict=True))


def pick(rows: list[dict], df: pd.DataFrame) -> list[dict]:
    """The rows themselves (the same dicts) that a selection of ``frame(rows)`` kept, in its order."""
    return [rows[i] for i in df.index]


def of_kind(df: pd.DataFrame, *kinds: str) -> pd.DataFrame:
    """The rows of these kinds (``probe`` tags)."""
    return df[df[TAG].isin(kinds)] if TAG in df.columns else df.iloc[:0]


def values(df: pd.DataFrame, column: str) -> np.ndarray:
    """``column``'s values (``None`` dropped) as floats, in row order: what ``np.mean`` and friends read."""
    if column not in df.columns:
        return np.empty(0)
    return df.loc[has(df, column), column].to_numpy(dtype=float)


def sort_key(key: tuple) -> tuple:
    """A group key's place in sorted order: numbers first (by value), then everything else by its text."""
    return tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in key)


def groups(df: pd.DataFrame, by: Iterable[str], sort: bool = False) -> list[tuple[tuple, pd.DataFrame]]:
    """The rows grouped by the values of ``by`` (a missing column reads ``None``), in order of each
    group's first row (``sort``: in :func:`sort_key` order of the keys); each group keeps its rows' order."""
    by = list(by)
    if df.empty:
        return []
    if not by:
        return [((), df)]
    keys = list(zip(*(df[c] if c in df.columns else [None] * len(df) for c in by), strict=True))
    code = {key: k for k, key in enumerate(dict.fromkeys(keys))}  # a group per distinct key, as a dict keys them
    parts = dict(iter(df.groupby(pd.Series([code[k] for k in keys], index=df.index), sort=True)))
    out = [(key, parts[k]) for key, k in code.items()]
    return sorted(out, key=lambda key_part: sort_key(key_part[0])) if sort else out


def records(df: pd.DataFrame) -> list[dict]:
    """The frame back as rows, each without the columns it lacked (``None`` cells dropped)."""
    return [{k: v for k, v in r.items() if v is not None} for r in df.to_dict("records")]
