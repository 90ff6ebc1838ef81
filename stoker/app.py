"""The typer app and the console every command shares (commands live in stoker/commands/)."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    name="stoker",
    help="Keeps ML-inference caches hot and correct.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Progress and reports go to stderr; stdout is kept for machine output (--json).
console = Console(stderr=True)
