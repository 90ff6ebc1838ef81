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
    # click's own help and error format, not rich's panels: at 80 columns rich's option table
    # cut names and defaults to fit ("--prefill-ms-per-tok…"), and a usage error came as a
    # boxed paragraph; click never cuts an option (a long one gets its own line) and a usage
    # error is one "Error: ..." line, at a terminal or not.
    rich_markup_mode=None,
)
# Progress and reports go to stderr; stdout is kept for machine output (--json).
console = Console(stderr=True)
