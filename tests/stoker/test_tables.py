"""The three layouts of a report table at a given width, every word of every cell whole."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from stoker.tables import Column, Grid, Narrow, render


def drawn(grid: Grid, width: int, narrow: Narrow = "split") -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width)  # a pipe: no terminal
    console.print(render(grid, width, narrow))
    return out.getvalue().splitlines()


def cells(lines: list[str]) -> str:
    """The text inside a table's borders, words in order per column lost: a bag of words."""
    return " ".join(" ".join(ln.replace("│", " ").replace("┃", " ").split()) for ln in lines)


def test_render__a_narrow_column_gives_way_to_no_word() -> None:
    g = Grid("jobs", [Column("job"), Column("about")])
    g.add_row("d-1", "model_id=smollm2-135m-instruct version=v2 " * 3)
    lines = drawn(g, 50)
    assert all(len(ln) <= 50 for ln in lines), lines
    assert cells(lines).split().count("model_id=smollm2-135m-instruct") == 3
    assert "┃ job" in "\n".join(lines)  # still a table


def test_render__too_many_columns_split_repeating_the_first() -> None:
    g = Grid(
        "near duplicates", [Column("tenant"), *(Column(f"≥0.{n}", "right") for n in range(80, 99))]
    )
    g.add_row("initech", *(f"{n}.5%" for n in range(80, 99)))
    lines = drawn(g, 80)
    assert all(len(ln) <= 80 for ln in lines), lines
    words = cells(lines).split()
    assert words.count("initech") >= 2 and "≥0.98" in words and "98.5%" in words
    assert sum("near duplicates" in ln for ln in lines) == 1  # the title once, above the first


def test_render__records_when_asked_and_the_row_cannot_fit() -> None:
    g = Grid("Deploy cutovers", [Column(h) for h in ("job", "state", "about", "detail")], keep=2)
    g.add_row("d-1", "ready", "model_id=smollm2-135m-instruct " * 4, "grace: keeping v1 for 3600 s")
    lines = drawn(g, 50, narrow="records")  # its narrowest table: 57 columns
    assert lines[:2] == ["Deploy cutovers", "d-1  ready"]
    assert lines[2].split()[:2] == ["about", "model_id=smollm2-135m-instruct"]
    assert all(len(ln) <= 50 for ln in lines), lines


@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(st.text("abcdefghij-=.", min_size=1, max_size=18), min_size=1, max_size=30),
    width=st.integers(40, 160),
    ncols=st.integers(1, 8),
)
def test_render__never_wider_than_asked_and_never_a_cut_word(
    words: list[str], width: int, ncols: int
) -> None:
    g = Grid("t", [Column(f"c{i}") for i in range(ncols)])
    for start in range(0, len(words), ncols):
        row = words[start : start + ncols]
        g.add_row(*(row + [""] * (ncols - len(row))))
    lines = drawn(g, width)
    assert all(len(ln) <= width for ln in lines), lines
    shown = cells(lines).split()
    assert "…" not in "".join(lines)
    for w in words:
        assert w in shown, (w, lines)
