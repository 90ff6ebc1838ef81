"""docs/settings.md from stoker/settings.py: every field's variable, type, bounds, default, comment.

`make docs` writes it; `--check` exits 1 when the file is stale (tests/test_docs.py runs the same
comparison). What a field says comes from settings.py itself, read the way a person reads it:
- the `# -- section --` line above a run of fields names its section;
- the comment lines directly above a field (no blank line between) describe it; a comment that
  covers a run of fields ("Rate, in flight at once, and the run's deadline") sits on the first,
  and the rows below it follow in source order, so the table reads as the file does;
- a comment at the end of the field's own line, and `Field(description=...)`, add to it.
Types and bounds come from the model (pydantic's metadata), defaults from the model's defaults,
so a renamed constant or a computed default shows its value, not its expression.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "stoker" / "settings.py"
TARGET = ROOT / "docs" / "settings.md"
CLASS = "StokerSettings"

_SECTION = re.compile(r"^\s*#\s*--\s*(.+?)\s*--\s*$")
_BOUNDS = ("ge", "gt", "le", "lt", "min_length")
# how a type reads in the table (pydantic's names are the code's, not the user's)
_TYPE_WORDS = {
    "SecretStr": "secret",
    "Tenant": "str",
    "Path": "path",
    "Thresholds": "dict[str, float]",
}

INTRO = """\
# Settings

<!-- Generated from stoker/settings.py by `make docs`; edit the comments there, not this file. -->

Every setting is an environment variable `STOKER_<FIELD>`, read by every stoker process (the
gateway and each worker read the ones they use). A dict setting takes JSON
(`STOKER_TENANT_THRESHOLDS='{"acme": 0.95}'`) or one key at a time
(`STOKER_TENANT_THRESHOLDS__ACME=0.95`); a list setting takes JSON.

A setting that cannot work stops the process at start with one line naming it, and exit code 2:
a value out of range (`bad setting STOKER_SEMANTIC_THRESHOLD='2': Input should be less than or
equal to 1`) or a `STOKER_*` variable that is no setting, with the closest name
(`unknown setting STOKER_SEMANTIC_THRESHOLDS: did you mean STOKER_SEMANTIC_THRESHOLD?`).

Leave `STOKER_KAFKA_BOOTSTRAP` and `STOKER_REDIS_URL` unset to run on the embedded stack (Tansu,
a redis-server subprocess, Qdrant Edge in-process).
"""


@dataclass(frozen=True)
class Row:
    """One setting as the table shows it."""

    section: str
    name: str
    type: str
    default: str
    text: str


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/settings.md is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not TARGET.exists() or TARGET.read_text(encoding="utf-8") != text:
            print("docs/settings.md is stale: run `make docs`", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


def render() -> str:
    """The whole page: the intro, then one table per section in source order."""
    sys.path.insert(0, str(ROOT))
    from stoker import settings

    fields = settings.StokerSettings.model_fields
    rows = read_rows(SOURCE.read_text(encoding="utf-8"), fields)
    out = [INTRO]
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            out.append(f"\n## {section}\n\n| variable | type | default | what it does |")
            out.append("|---|---|---|---|")
        cells = (f"`{row.name}`", row.type, row.default, row.text)
        out.append("| " + " | ".join(cells) + " |")
    others = sorted(settings.NOT_SETTINGS)
    if others:
        names = ", ".join(f"`{n}`" for n in others)
        what = _comment_above(SOURCE.read_text(encoding="utf-8"), "NOT_SETTINGS")
        out.append(f"\n## Other variables\n\n{_cell(what.rstrip('.'))}: {names}.")
    return "\n".join(out) + "\n"


def read_rows(source: str, fields: dict[str, Any]) -> list[Row]:
    """Every field of the settings class, in source order, with its section and comments."""
    lines = source.splitlines()
    inline = _inline_comments(source)
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    rows = []
    section = "General"
    last_line = cls.lineno
    for node in cls.body:
        section = _last_section(lines[last_line : node.lineno - 1], section)
        last_line = node.end_lineno or node.lineno
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if name not in fields:
            raise SystemExit(f"{CLASS}.{name} is in settings.py but not a model field")
        info = fields[name]
        parts = [_block_above(lines, node.lineno)]
        parts += [inline[n] for n in range(node.lineno, last_line + 1) if n in inline]
        if info.description:
            parts.append(info.description)
        rows.append(
            Row(
                section=section,
                name="STOKER_" + name.upper(),
                type=_type(ast.unparse(node.annotation), info.metadata),
                default=_default(info),
                text=_cell(" ".join(p for p in parts if p)),
            )
        )
    missing = set(fields) - {r.name.removeprefix("STOKER_").lower() for r in rows}
    if missing:
        raise SystemExit(f"fields not found in settings.py's source: {sorted(missing)}")
    return rows


def _last_section(lines: list[str], current: str) -> str:
    for line in lines:
        m = _SECTION.match(line)
        if m:
            title = m.group(1)
            current = title[0].upper() + title[1:]
    return current


def _block_above(lines: list[str], lineno: int) -> str:
    """The comment lines directly above line `lineno` (1-based), stopping at a section line."""
    block: list[str] = []
    i = lineno - 2
    while i >= 0:
        stripped = lines[i].strip()
        if not stripped.startswith("#") or _SECTION.match(lines[i]):
            break
        block.insert(0, stripped.lstrip("#").strip())
        i -= 1
    return " ".join(block)


def _comment_above(source: str, name: str) -> str:
    lines = source.splitlines()
    for i, line in enumerate(lines, start=1):
        if line.startswith(f"{name}:") or line.startswith(f"{name} ="):
            return _block_above(lines, i)
    return ""


def _inline_comments(source: str) -> dict[int, str]:
    """Line number -> the comment that ends a line holding code."""
    out = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in code_lines:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    return out


def _type(annotation: str, metadata: list[Any]) -> str:
    """`float` in [0, 1]; `static` or `verified`; an optional type without its None."""
    literal = re.fullmatch(r"Literal\[(.*)\]", annotation)
    if literal:
        choices = [c.strip().strip("'\"") for c in literal.group(1).split(",")]
        text = " or ".join(f"`{c}`" for c in choices)
    else:
        bare = re.sub(r"\s*\|\s*None$", "", annotation)
        for word, plain in _TYPE_WORDS.items():
            bare = re.sub(rf"\b{word}\b", plain, bare)
        text = f"`{bare}`"
    bounds = {attr: getattr(m, attr) for m in metadata for attr in _BOUNDS if hasattr(m, attr)}
    return _cell(f"{text} {_bounds(bounds)}".strip())


def _bounds(b: dict[str, Any]) -> str:
    """Interval notation where both ends are bounded, else one inequality."""
    low = ("[", b["ge"]) if "ge" in b else ("(", b["gt"]) if "gt" in b else None
    high = ("]", b["le"]) if "le" in b else (")", b["lt"]) if "lt" in b else None
    if low and high:
        return f"in {low[0]}{_value(low[1])}, {_value(high[1])}{high[0]}"
    if low:
        return f"{'≥' if low[0] == '[' else '>'} {_value(low[1])}"
    if high:
        return f"{'≤' if high[0] == ']' else '<'} {_value(high[1])}"
    if b.get("min_length") == 1:
        return "not empty"
    if "min_length" in b:
        return f"at least {b['min_length']} characters"
    return ""


def _default(info: Any) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
    elif info.is_required():
        return "required"
    else:
        value = info.default
    if value is None:
        return "unset"
    if value == "":
        return '`""`'
    return _cell(f"`{_value(value)}`")


def _value(value: Any) -> str:
    """As one would write it in the environment."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, dict | list):
        import json

        return json.dumps(value)
    return str(value)


def _cell(text: str) -> str:
    """Safe inside a Markdown table cell: no pipe ends it, no `<x>` vanishes as an HTML tag,
    no pair of `*` turns the text between them italic."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans only: inside them these show as is
        parts[i] = parts[i].replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts).replace("|", "\\|")


if __name__ == "__main__":
    raise SystemExit(main())
