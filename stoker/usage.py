"""Every verb's usage line and option list name values as a person writes them.

typer's plain help wrote a required argument as `{log}` in the usage line, `log <path>` in the
list, and each option's type the way Python spells it: `--tenant <list[str]>`,
`--limit <int range>`. Here an argument is `LOG` (`[LOG]` when optional), an option's value
`TEXT`, `INTEGER`, `NUMBER`, `PATH` or its choices `ready|done`, as click's own help writes
them; a metavar a verb sets itself (`URL`, `HOST:PORT`) is kept.
"""

from __future__ import annotations

from typing import Any, Final

from typer.core import TyperArgument, TyperCommand, TyperOption

# typer's type names (`<int range>` without its brackets) in the words of click's help.
_WORDS: Final = {
    "str": "TEXT",
    "int": "INTEGER",
    "int range": "INTEGER",
    "float": "NUMBER",
    "float range": "NUMBER",
    "path": "PATH",
    "bool": "BOOLEAN",
    "datetime": "DATETIME",
}


class PlainCommand(TyperCommand):
    """A verb whose help reads as a person would write it (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ctx = self.context_class(self)
        for p in self.params:
            if isinstance(p, TyperArgument) and p.metavar is None:
                p.metavar = (p.name or "value").upper()
            elif isinstance(p, TyperOption) and p.metavar is None and not p.is_flag:
                p.metavar = _value_word(p.display_type(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if isinstance(p, TyperArgument):
                pieces.append(_argument(p) if p.required else f"[{_argument(p)}]")
            else:
                pieces.extend(p.get_usage_pieces(ctx))
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        # ctx and formatter are typer's own copies of click's classes
        arguments, options = [], []
        for p in self.get_params(ctx):
            record = p.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(p, TyperArgument):
                arguments.append((_argument(p), _with_choices(record[1], p.display_type(ctx))))
            else:
                options.append(record)
        for title, records in (("Arguments", arguments), ("Options", options)):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def _value_word(shown: str) -> str:
    """`<list[str]>` -> TEXT, `<int range>` -> INTEGER, `<ready|done>` -> ready|done."""
    inner = shown.strip("<>")
    if inner.startswith("list[") and inner.endswith("]"):
        inner = inner[len("list[") : -1]  # a repeatable option takes one value each time
    return inner if "|" in inner else _WORDS.get(inner, inner.upper())


def _argument(p: TyperArgument) -> str:
    return f"{p.metavar}..." if p.nargs != 1 else str(p.metavar)


def _with_choices(help_text: str, shown: str) -> str:
    """An argument's help with its choices, before the `[required]` that ends it."""
    inner = shown.strip("<>")
    if "|" not in inner:
        return help_text
    text, sep, extra = help_text.partition("  [")
    return f"{text} (one of: {', '.join(inner.split('|'))}){sep}{extra}"
