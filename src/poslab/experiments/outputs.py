"""The report layer: tables and figures as declarations, one writer for every study's outputs.

A study declares its tables (:class:`Table`: which rows, grouped by which columns, which
measures, optionally one column per value of a pivot such as the evaluation length) and its
figures (:class:`Lines`: mean over seeds with a ±std band, one line per series, one panel per
value of a column; :class:`Heatmap`: a value on a grid of two columns, a panel per value of
others), and :func:`write_outputs` writes ``rows.csv``, ``table.md`` (tables, then
the claims beside the paper's words), ``claims.json`` and the figures. Studies keep only what
is genuinely theirs (a probe row layout, a derived quantity, a figure nothing else draws).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from poslab.experiments.claims import Claim, claims_markdown, markdown_table, write_claims
from poslab.experiments.rows import TAG, sort_key
from poslab.experiments.spec import EVERY, Measure, Where

if TYPE_CHECKING:
    from matplotlib.artist import Artist

Row = dict


def mean_std(values: Sequence[float | None], digits: int = 3, *, signed: bool = False, empty: str = "") -> str:
    """"mean ± std" (population std over seeds; ``signed``: the mean with its sign); ``empty`` for no values."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return empty
    return f"{np.mean(vals):{'+' if signed else ''}.{digits}f} ± {np.std(vals):.{digits}f}"


def groups(rows: list[Row], by: Sequence[str], where: Where = EVERY) -> dict[tuple, list[Row]]:
    """The rows meeting ``where``, grouped by the ``by`` columns, in sorted key order."""
    out: dict[tuple, list[Row]] = {}
    for r in rows:
        if where(r):
            out.setdefault(tuple(r.get(c) for c in by), []).append(r)
    return {k: out[k] for k in sorted(out, key=sort_key)}


@dataclass(frozen=True)
class Column:
    """One table column: a label and what fills it from a group of rows. A column name gives
    mean ± std over the group's rows; a Measure or a function its value."""

    label: str
    value: str | Measure | Callable[[list[Row]], object]
    digits: int = 3

    def cell(self, group: list[Row]) -> str:
        if isinstance(self.value, str):
            return mean_std([r.get(self.value) for r in group], self.digits)
        got = self.value(group)
        if got is None:
            return ""
        return f"{got:.{self.digits}f}" if isinstance(got, float) else str(got)


def most_common(column: str) -> Callable[[list[Row]], object]:
    """A :class:`Column` value: the most common value of ``column`` in the group."""
    def cell(rows: list[Row]) -> object:
        vals = [r[column] for r in rows]
        return max(set(vals), key=vals.count)
    return cell


def at_largest(column: str, of: str = "length") -> Callable[[list[Row]], str]:
    """A :class:`Column` value: mean ± std of ``column`` over the group's rows at its largest ``of``."""
    def cell(rows: list[Row]) -> str:
        largest = max(r[of] for r in rows)
        return mean_std([r[column] for r in rows if r[of] == largest and r.get(column) is not None])
    return cell


def value_range(column: str, digits: int = 2) -> Callable[[list[Row]], str]:
    """A :class:`Column` value: "min-max" of ``column`` over the group."""
    return lambda g: f"{min(r[column] for r in g):.{digits}f}-{max(r[column] for r in g):.{digits}f}"


def means(*columns: str, digits: int = 3) -> Callable[[list[Row]], str]:
    """A :class:`Column` value: the group's mean of each of ``columns``, joined by " / "."""
    return lambda g: " / ".join(f"{np.mean([r[c] for r in g]):.{digits}f}" for c in columns)


def mean_std_where(column: str, where: Callable[[dict], bool]) -> Callable[[list[dict]], str]:
    """A table cell: mean ± std of ``column`` over the group's rows meeting ``where``."""
    return lambda g: mean_std([r[column] for r in g if where(r)])


def joined(column: str, sep: str = " ", where: Callable[[dict], bool] = lambda r: True) -> Callable[[list[dict]], str]:
    """A table cell: the group's values of ``column`` (rows meeting ``where``) joined by ``sep``."""
    return lambda g: sep.join(str(r.get(column)) for r in g if where(r))


@dataclass(frozen=True)
class Pivot:
    """One column per value of ``column`` (e.g. length), each mean ± std of ``value``."""

    column: str
    value: str
    label: str = "{}"
    digits: int = 3
    empty: str = ""  # a cell with no value (e.g. "n.a." where rows carry None)
    missing: str | None = None  # a cell with no row at all (a point the study does not run); None: as ``empty``

    def cell(self, rows: list[Row]) -> str:
        """The cell of ``rows`` (those of one group at one column value)."""
        if not rows and self.missing is not None:
            return self.missing
        return mean_std([r.get(self.value) for r in rows], self.digits, empty=self.empty)


@dataclass(frozen=True)
class Table:
    title: str
    by: tuple[str, ...]
    columns: tuple[Column, ...] = ()
    where: Where = EVERY
    pivot: Pivot | None = None
    intro: str = ""

    def markdown(self, rows: list[Row]) -> str:
        grouped = groups(rows, self.by, self.where)
        if not grouped:
            return ""
        header = list(self.by)
        keys = []
        if self.pivot is not None:
            keys = sorted({r[self.pivot.column] for g in grouped.values() for r in g
                           if r.get(self.pivot.column) is not None}, key=lambda v: sort_key((v,)))
            header += [self.pivot.label.format(k) for k in keys]
        header += [c.label for c in self.columns]
        body = []
        for key, group in grouped.items():
            line = [*key]
            if self.pivot is not None:
                p = self.pivot
                line += [p.cell([r for r in group if r.get(p.column) == k]) for k in keys]
            line += [c.cell(group) for c in self.columns]
            body.append(line)
        parts = [f"## {self.title}", ""]
        if self.intro:
            parts += [self.intro, ""]
        return "\n".join([*parts, markdown_table(header, body)])


@dataclass(frozen=True)
class Lines:
    """A line figure: mean of ``y`` over seeds against ``x`` with a ±std band, one line per
    value of ``series`` and one panel per value of ``panel``; ``vline``/``hline`` mark values
    (a number, or a function of the rows)."""

    filename: str
    x: str
    y: str
    series: tuple[str, ...] = ()
    panel: str | None = None
    where: Where = EVERY
    xlabel: str = ""
    ylabel: str = ""
    ylim: tuple[float, float] | None = None
    vline: float | Callable[[list[Row]], float] | None = None
    hline: float | Callable[[list[Row]], float] | None = None
    logx: bool = False
    title: str = ""
    wrap: int | None = None  # at most this many panels to a line (None: every panel on one line)
    legend: bool = True  # False: no legend (too many series to name)
    hue: str | None = None  # a column: lines with one value of it share a colour in every panel
    dash: str | None = None  # a boolean column: lines whose rows have it true are dashed
    shared_legend: bool = False  # one legend for the figure, beside the panels, instead of one a panel

    def draw(self, rows: list[Row], out: Path) -> Path | None:
        plt = _pyplot()
        chosen = [r for r in rows if self.where(r) and r.get(self.y) is not None]
        if not chosen:
            return None
        panels = groups(chosen, (self.panel,)) if self.panel else {(None,): chosen}
        cols, lines = _layout(len(panels), self.wrap or len(panels))
        fig, axes = plt.subplots(lines, cols, figsize=(4.2 * cols, 3.3 * lines), squeeze=False, sharey=True)
        _hide_unused(axes, len(panels))
        hues = sorted({str(r.get(self.hue)) for r in chosen}) if self.hue else []
        palette = plt.get_cmap("tab10" if len(hues) <= 10 else "tab20")
        handles: dict[str, Artist] = {}
        for ax, ((pv,), prows) in zip(axes.flat, panels.items(), strict=False):
            for key, srows in groups(prows, self.series).items():
                self._plot_series(ax, key, srows, self._style(srows, hues, palette), handles)
            self._mark_values(ax, prows)
            self._dress(ax, pv)
        for row_axes in axes:
            row_axes[0].set_ylabel(self.ylabel or self.y)
        if self.series and self.legend and self.shared_legend:
            names = sorted(handles)
            fig.legend([handles[n] for n in names], names, loc="center left", bbox_to_anchor=(1.0, 0.5),
                       fontsize=7, frameon=False)
        return save(fig, out / self.filename)

    def _style(self, srows: list[Row], hues: list[str], palette) -> dict:
        """A line's colour (its ``hue`` value's, in every panel) and dashes (where ``dash`` is true)."""
        style: dict = {}
        if self.hue:
            style["color"] = palette(hues.index(str(srows[0].get(self.hue))) % palette.N)
        if self.dash and srows[0].get(self.dash):
            style["ls"] = "--"
        return style

    def _plot_series(self, ax, key: tuple, srows: list[Row], style: dict, handles: dict[str, Artist]) -> None:
        """One series: the mean over seeds at each x, with a ±std band (its line kept in ``handles`` by label)."""
        pts = groups(srows, (self.x,))
        xs = np.array([k[0] for k in pts], dtype=float)
        ys = [np.array([float(r[self.y]) for r in g]) for g in pts.values()]
        m, s = np.array([v.mean() for v in ys]), np.array([v.std() for v in ys])
        label = " ".join(f"{v}" for v in key) if key else None
        (line,) = ax.plot(xs, m, marker="o", ms=3, label=label, **style)
        handles.setdefault(str(label), line)
        ax.fill_between(xs, m - s, m + s, alpha=0.15, color=line.get_color())

    def _mark_values(self, ax, prows: list[Row]) -> None:
        """The ``vline`` (dashed) and ``hline`` (dotted) of a panel."""
        for value, rule in ((self.vline, "--"), (self.hline, ":")):
            if value is not None:
                v = value(prows) if callable(value) else value
                (ax.axvline if value is self.vline else ax.axhline)(v, color="grey", ls=rule, lw=1)

    def _dress(self, ax, pv) -> None:
        """A panel's x label, title, x scale, y limits and (unless shared) legend."""
        ax.set(xlabel=self.xlabel or self.x, title=f"{self.panel} = {pv}" if self.panel else self.title)
        if self.logx:
            ax.set_xscale("log")
        if self.ylim:
            ax.set_ylim(*self.ylim)
        if self.series and self.legend and not self.shared_legend:
            ax.legend(fontsize=6, ncol=2)


@dataclass(frozen=True)
class Heatmap:
    """A grid figure: the mean over seeds of ``value`` with one row per value of ``y`` and one
    column per value of ``x`` (sorted; a missing cell is blank), one panel per value of the
    ``panel`` columns (titled by the last of them), ``wrap`` panels to a line."""

    filename: str
    value: str
    y: str
    x: str
    panel: tuple[str, ...] = ()
    where: Where = EVERY
    vmin: float = 0.0
    vmax: float = 1.0
    annotate: float | None = None  # write each cell's value, dark text from this value up
    colorbar: str = ""
    title: str = ""
    wrap: int = 7

    def draw(self, rows: list[Row], out: Path) -> Path | None:
        plt = _pyplot()
        chosen = [r for r in rows if self.where(r) and r.get(self.value) is not None]
        if not chosen:
            return None
        panels = groups(chosen, self.panel)
        ys, xs = (sorted({r[c] for r in chosen}) for c in (self.y, self.x))
        cols, lines = _layout(len(panels), self.wrap)
        fig, axes = plt.subplots(lines, cols, figsize=(1.9 * cols + 1.2, 2.6 * lines + 0.4), squeeze=False)
        _hide_unused(axes, len(panels))
        for ax, (key, prows) in zip(axes.flat, panels.items(), strict=False):
            grid = self._grid(prows, ys, xs)
            im = ax.imshow(grid, vmin=self.vmin, vmax=self.vmax, cmap="viridis", aspect="auto")
            if self.annotate is not None:
                self._annotate(ax, grid, self.annotate)
            ax.set_xticks(range(len(xs)), _tick_labels(xs), fontsize=6)
            ax.set_yticks(range(len(ys)), _tick_labels(ys), fontsize=6)
            ax.set_title(str(key[-1]) if key else "", fontsize=7)
            ax.set_xlabel(self.x, fontsize=7)
        axes[0][0].set_ylabel(self.y, fontsize=7)
        if self.colorbar:
            fig.colorbar(im, ax=axes[0, -1], shrink=0.8, label=self.colorbar)
        if self.title:
            fig.suptitle(self.title, fontsize=9)
        return save(fig, out / self.filename)

    def _grid(self, prows: list[Row], ys: list, xs: list) -> np.ndarray:
        """A panel's cells: the mean of ``value`` per (y, x), NaN where no row has it."""
        cells = groups(prows, (self.y, self.x))
        return np.array([[np.mean([float(r[self.value]) for r in cells[(a, b)]]) if (a, b) in cells else np.nan
                          for b in xs] for a in ys])

    @staticmethod
    def _annotate(ax, grid: np.ndarray, dark_from: float) -> None:
        """Each cell's value written on it, dark text from ``dark_from`` up."""
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                    color="black" if v >= dark_from else "white")


def _pyplot():
    """matplotlib.pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _layout(panels: int, wrap: int) -> tuple[int, int]:
    """(columns, lines) of a figure of ``panels`` panels, at most ``wrap`` to a line."""
    cols = min(panels, wrap)
    return cols, -(-panels // cols)


def _hide_unused(axes, panels: int) -> None:
    """Hide the axes past the last panel."""
    for ax in axes.flat[panels:]:
        ax.set_visible(False)


def _tick_labels(values: list) -> list[str]:
    return [f"{v:g}" if isinstance(v, float) else str(v) for v in values]


def select(rows: list[dict], probe: str | tuple[str, ...], **where) -> list[dict]:
    """The rows of kind ``probe`` (or of any of several kinds) whose ``where`` columns hold these values, in order."""
    kinds = (probe,) if isinstance(probe, str) else probe
    return [r for r in rows if r.get(TAG) in kinds and all(r.get(k) == v for k, v in where.items())]


def group_stats(rows: list[dict], by: tuple[str, ...], value: str) -> dict[tuple, tuple[float, float, int]]:
    """(mean, std over seeds, n) of ``value`` for each combination of the ``by`` columns."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r.get(value) is not None:
            groups[tuple(r[k] for k in by)].append(float(r[value]))
    return {k: (float(np.mean(v)), float(np.std(v)), len(v)) for k, v in sorted(groups.items())}


def write_csv(rows: list[dict], path: Path, columns: list[str] | None = None) -> Path:
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def save(fig, path: Path) -> Path:
    """Write a figure as PNG and release it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight" if fig.legends else None)  # a figure legend sits outside
    plt.close(fig)
    return path


@dataclass
class Outputs:
    """What :func:`write_outputs` wrote."""

    files: list[Path] = field(default_factory=list)


# max-args: keyword-only, one per part of a study's outputs (docs/complexity.md)
def write_outputs(out: Path, *, title: str, rows: list[Row], claims: list[Claim], intro: str = "",  # noqa: PLR0913
                  tables: Sequence[Table] = (), figures: Sequence[Lines | Heatmap] = (),
                  csv_rows: list[Row] | None = None, columns: list[str] | None = None, sections: Sequence[str] = (),
                  more_figures: Callable[[list[Row], Path], list[Path]] | None = None,
                  csvs: dict[str, str] | None = None) -> list[Path]:
    """rows.csv, table.md (intro, tables, extra sections, claims), claims.json, figures and, last,
    one CSV per ``csvs`` entry (file name -> probe: the rows of that probe)."""
    out.mkdir(parents=True, exist_ok=True)
    files = [write_csv(csv_rows if csv_rows is not None else rows, out / "rows.csv", columns)]
    text = [f"# {title}", ""]
    if intro:
        text += [intro, ""]
    for t in tables:
        md = t.markdown(rows)
        if md:
            text += [md, ""]
    text += [s for s in sections for s in (s, "")]
    text += ["## The paper's claims beside this run", "", claims_markdown(claims), ""]
    (out / "table.md").write_text("\n".join(text))
    files += [out / "table.md", write_claims(claims, out / "claims.json")]
    for fig in figures:
        path = fig.draw(rows, out)
        if path is not None:
            files.append(path)
    if more_figures is not None:
        files += more_figures(rows, out)
    return files + [write_csv(select(rows, probe), out / name) for name, probe in (csvs or {}).items()]
