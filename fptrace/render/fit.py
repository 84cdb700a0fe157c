"""Tables that fit the terminal without cutting a number: columns are chosen by priority.

A cut number is a wrong number, so no column of figures is ever shrunk below its natural width.
Each table declares its columns with a priority (0: always shown); `fit_table` keeps the most
important columns that fit in `width` and says in one dim line which ones it left out. Columns
marked `wrap` (formulas, sentences) may wrap onto several lines instead of being left out.
`width=None` is `--wide`: every column, at its natural width.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box as boxes
from rich.console import Console, JustifyMethod, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

WIDE_HINT = "--wide, a wider terminal or --json shows them"


@dataclass(frozen=True)
class Col:
    header: str | Text
    priority: int = 0  # 0: always; larger numbers are left out first
    justify: JustifyMethod = "left"
    style: str | None = None
    wrap: bool = False  # may wrap (text); columns of numbers never wrap and are never cut
    min_width: int | None = None


@dataclass
class Fitted:
    """A table and the columns left out to make it fit."""

    table: Table
    left_out: list[str] = field(default_factory=list)
    width: int | None = None

    def note(self) -> Text | None:
        if not self.left_out:
            return None
        return Text(f"left out at {self.width} columns: {', '.join(self.left_out)} "
                    f"({WIDE_HINT})", style="dim")

    def __rich__(self) -> RenderableType:
        from rich.console import Group

        note = self.note()
        return self.table if note is None else Group(self.table, note)


_MEASURE = Console(width=10_000, color_system=None, file=io.StringIO(), legacy_windows=False)


def measure(renderable: RenderableType) -> Measurement:
    """(minimum, maximum) width of a renderable, as rich lays it out."""
    return Measurement.get(_MEASURE, _MEASURE.options, renderable)


def _name(c: Col) -> str:
    return " ".join(str(c.header).split())


def _natural(col: Col, cells: list[Any]) -> int:
    """The width a column needs to show every cell whole."""
    head = col.header if isinstance(col.header, Text) else Text(col.header)
    return max([measure(head).maximum] + [measure(c if not isinstance(c, str) else Text(c))
                                           .maximum for c in cells])


def _build(cols: Sequence[Col], rows: Sequence[Sequence[Any] | RowStyle], keep: list[int],
           table_kw: dict, sections: Sequence[int], widths: list[int]) -> Table:
    t = Table(**table_kw)
    for i in keep:
        c = cols[i]
        # a column that must not wrap is never narrower than its widest cell
        floor = c.min_width if c.wrap else max(widths[i], c.min_width or 0)
        t.add_column(c.header, justify=c.justify, style=c.style, no_wrap=not c.wrap,
                     overflow="fold", min_width=floor)
    for r, row in enumerate(rows):
        if r in sections:
            t.add_section()
        cells, row_style = (row.cells, row.style) if isinstance(row, RowStyle) else (row, None)
        t.add_row(*[cells[i] for i in keep], style=row_style)
    return t


@dataclass(frozen=True)
class RowStyle:
    """A row with a style for all its cells (e.g. a non-finite layer in red)."""

    cells: Sequence[Any]
    style: str | None


def fit_table(cols: Sequence[Col], rows: Sequence[Sequence[Any] | RowStyle], width: int | None,
              *, sections: Sequence[int] = (), **table_kw: Any) -> Fitted:
    """The table with the most important columns that fit in `width` (all when width is None).

    Columns are added in order of priority (ties: left to right) until one would push the
    table's minimum width past `width`: that one and every column after it are left out, so a
    narrow unimportant column never displaces an important wide one."""
    table_kw.setdefault("box", boxes.SIMPLE_HEAD)
    every = list(range(len(cols)))
    plain = [r.cells if isinstance(r, RowStyle) else r for r in rows]
    widths = [_natural(c, [r[i] for r in plain]) for i, c in enumerate(cols)]
    if width is None:
        return Fitted(_build(cols, rows, every, table_kw, sections, widths))
    order = sorted(every, key=lambda i: (cols[i].priority, i))
    bare = {**table_kw, "title": None, "caption": None}

    def minimum(keep: list[int]) -> int:
        return measure(_build(cols, rows, keep, bare, sections, widths)).minimum

    keep = _chosen(order, cols, width, minimum)
    left_out = [_name(cols[i]) for i in every if i not in keep]
    return Fitted(_build(cols, rows, keep, table_kw, sections, widths), left_out, width)


def _chosen(order: list[int], cols: Sequence[Col], width: int, minimum: Any) -> list[int]:
    """The columns kept: in `order`, each while the table's minimum width stays within `width`
    (a column of priority 0 always). A table's minimum width is the sum of its columns' own
    (each with its padding) and of the rules between them, so it is predicted from each
    column measured alone and one pair; the prediction is checked against rich on the set
    chosen and on the first column refused, and where it misses, every trial is measured."""
    alone = {i: minimum([i]) for i in order}
    rule = alone[order[0]] + alone[order[1]] - minimum(sorted(order[:2])) \
        if len(order) > 1 else 0

    def predicted(keep: list[int]) -> int:
        return sum(alone[i] for i in keep) - rule * (len(keep) - 1)

    for guess in (predicted, minimum):
        keep: list[int] = []
        refused: list[int] | None = None
        for i in order:
            trial = sorted([*keep, i])
            if guess(trial) > width and cols[i].priority > 0:
                refused = trial
                break
            keep = trial
        if guess is minimum or all(minimum(s) == predicted(s)
                                   for s in (keep, refused) if s):
            return keep
    raise AssertionError("unreachable")


def natural_width(renderable: RenderableType, at_least: int = 80) -> int:
    """The width that shows a renderable (with every column) without wrapping a table."""
    return max(at_least, min(measure(renderable).maximum, 1000))
