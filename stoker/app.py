"""The typer app and the console every command shares (commands live in stoker/commands/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from typer.models import CommandFunctionType

from stoker.usage import PlainCommand


def examples(*lines: str) -> str:
    """An --help epilog of example commands, each line printed as written: click keeps a
    paragraph that starts with \\b unwrapped, so a command is never broken mid-way. Keep a
    line under 78 columns (tests/stoker/test_help.py reads every verb's help at 80)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


class Typer(typer.Typer):
    """typer's app whose verbs default to PlainCommand: values in --help as a person writes
    them (`LOG`, `TEXT`), not `{log}` and `<list[str]>`."""

    def command(
        self, name: str | None = None, *, cls: Any = None, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or PlainCommand, **kwargs)


app = Typer(
    name="stoker",
    help="Keeps ML-inference caches hot and correct.",
    epilog=examples(
        "stoker gateway --upstream http://127.0.0.1:8000/v1   # cache in front of it",
        "stoker worker all                # the workers, on an embedded stack",
        "stoker status                    # what they are doing",
        "stoker COMMAND --help            # each command, with its examples",
    ),
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
