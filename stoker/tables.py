"""Report tables that fit the width they are printed at, every word of every cell whole.

rich shrinks a table that is too wide by narrowing its widest columns with no regard to their
words, then cuts what no longer fits: at 80 columns `stoker analyze` printed `tena…` and `≥0.…`,
and `stoker status` split `smollm2-135m-instruct` over three lines. A pipe or a log file is 80
columns to rich, so that was every CI log. Here a table is laid out in one of three ways:

1. as a table, when each column can be as narrow as its longest word: the widest columns give
   way first, and a cell wraps between words;
2. otherwise `split`: the columns dealt into several tables that each fit, each repeating the
   leading key columns (for grids of numbers: a row is still read across);
3. otherwise `records`: each row as a block, its leading cells on one line and the others
   below it as `header  value` (for rows of text, and the last resort of a split).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final, Literal

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

Justify = Literal["left", "right"]
Narrow = Literal["split", "records"]

# What rich's default table adds to its cells' widths: a space each side of every cell, and a
# border between and around the columns.
_PAD: Final = 2


def _overhead(columns: int) -> int:
    return _PAD * columns + columns + 1


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    justify: Justify = "left"


@dataclasses.dataclass
class Grid:
    """A report table as data: its layout is chosen when it is drawn (`render`).

    `keep`: the leading columns that name a row (a tenant, a job): repeated in every table of
    a split, and on the first line of a record."""

    title: str
    columns: Sequence[Column]
    keep: int = 1
    rows: list[list[Text]] = dataclasses.field(default_factory=list)

    def add_row(self, *cells: str | Text) -> None:
        """Cells are plain text (a `[` in a tenant name is not markup), or Text for style."""
        assert len(cells) == len(self.columns), (len(cells), self.title)
        self.rows.append([c if isinstance(c, Text) else Text(c) for c in cells])


def render(grid: Grid, width: int, narrow: Narrow = "split") -> RenderableType:
    """The grid as a table at most `width` columns wide, or its `narrow` layout (module doc)."""
    mins, maxs = _measure(grid)
    everything = range(len(grid.columns))
    widths = _fit(mins, maxs, everything, width)
    if widths is not None:
        return _table(grid, everything, widths)
    if narrow == "split":
        groups = _split(mins, maxs, grid.keep, width)
        if groups:
            parts = [_table(grid, g, _fit(mins, maxs, g, width) or []) for g in groups]
            for part in parts[1:]:
                part.title = None  # it goes on from the table above it
            return Group(*parts)
    return _records(grid)


def _measure(grid: Grid) -> tuple[list[int], list[int]]:
    """Each column's narrowest width (its longest word) and its natural one (its longest cell)."""
    console = Console(width=10_000)  # a measure of text alone: no terminal is asked
    mins, maxs = [], []
    for i, col in enumerate(grid.columns):
        cells = [Text(col.header), *(row[i] for row in grid.rows)]
        sizes = [Measurement.get(console, console.options, c) for c in cells]
        mins.append(max(s.minimum for s in sizes))
        maxs.append(max(s.maximum for s in sizes))
    return mins, maxs


def _fit(mins: list[int], maxs: list[int], cols: Sequence[int], width: int) -> list[int] | None:
    """Widths for `cols` within `width`, none under its longest word, or None. The widest
    column gives way first, down to the next widest, as rich does, but never past a word."""
    room = width - _overhead(len(cols))
    lo, hi = [mins[i] for i in cols], [maxs[i] for i in cols]
    if sum(lo) > room:
        return None
    cap = max(hi, default=0)
    while sum(max(a, min(b, cap)) for a, b in zip(lo, hi, strict=True)) > room:
        cap -= 1
    return [max(a, min(b, cap)) for a, b in zip(lo, hi, strict=True)]


def _split(mins: list[int], maxs: list[int], keep: int, width: int) -> list[list[int]]:
    """The columns after the `keep` leading ones, dealt in order into groups that each fit
    beside the leading ones; [] when one column cannot."""
    lead = list(range(keep))
    groups: list[list[int]] = []
    for i in range(keep, len(mins)):
        if groups and _fit(mins, maxs, [*groups[-1], i], width) is not None:
            groups[-1].append(i)
        elif _fit(mins, maxs, [*lead, i], width) is not None:
            groups.append([*lead, i])
        else:
            return []
    return groups


def _table(grid: Grid, cols: Sequence[int], widths: Sequence[int]) -> Table:
    t = Table(title=grid.title, title_justify="left")
    for i, w in zip(cols, widths, strict=True):
        col = grid.columns[i]
        t.add_column(col.header, justify=col.justify, width=w)
    for row in grid.rows:
        t.add_row(*(row[i] for i in cols))
    return t


def _records(grid: Grid) -> RenderableType:
    """Each row as a block: its `keep` leading cells on a line, then `header  value` lines
    for the other cells that hold something."""
    label = max((len(c.header) for c in grid.columns[grid.keep :]), default=0)
    parts: list[RenderableType] = [Text(grid.title, style="italic")]
    for row in grid.rows:
        parts.append(Text("  ").join(row[: grid.keep]))
        body = Table.grid(padding=(0, 2, 0, 0))
        body.add_column(width=label, no_wrap=True, style="dim")
        body.add_column(overflow="fold")  # a word longer than the line: folded, not cut
        for col, cell in zip(grid.columns[grid.keep :], row[grid.keep :], strict=True):
            if cell.plain:
                body.add_row(col.header, cell)
        parts.append(Padding(body, (0, 0, 0, 2)))
    return Group(*parts)
