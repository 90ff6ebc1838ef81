"""The user docs (README.md, docs/*.md): the settings reference matches stoker/settings.py, no
tracker numbers or "in progress", and every relative link (and its #anchor) resolves."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# '#17', '(#15)': a tracker's numbers mean nothing to a user; '&#123;' is an HTML entity
TRACKER = re.compile(r"(?<![\w&/])#\d+\b|\bin progress\b", re.IGNORECASE)
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_settings_doc", ROOT / "scripts" / "gen_settings_doc.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


def tracker_marks(text: str) -> list[str]:
    """Each line (numbered) that carries a tracker number or 'in progress'."""
    return [
        f"{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), start=1)
        if TRACKER.search(line)
    ]


def slugs(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(text):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of `doc` whose file, or whose #anchor in it, does not exist in `root`."""
    bad = []
    for line in _prose(doc.read_text(encoding="utf-8")):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:, ...
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.is_relative_to(root):  # a clone has nothing beside it
                bad.append(f"{target}: outside the repository")
            elif not dest.exists():
                bad.append(f"{target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in slugs(dest.read_text("utf-8")):
                bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def test_settings_doc__matches_settings_py() -> None:
    current = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert current == _generator().render(), (
        "docs/settings.md is stale (stoker/settings.py changed): run `make docs`"
    )


SAMPLE_SETTINGS = """
from typing import Literal
from pydantic import BaseModel, Field


class StokerSettings(BaseModel):
    # -- services --
    # Where the cache lives;
    # two lines of comment.
    redis_url: str | None = None
    host: str = "127.0.0.1"  # 0.0.0.0 in a container

    # -- policy --
    share: float = Field(default=0.2, ge=0.0, le=1.0)
    mode: Literal["static", "verified"] = "verified"
    rate: float = Field(default=5.0, gt=0, description="sends a second")
"""


def test_settings_doc__reads_sections_comments_bounds_and_defaults() -> None:
    namespace: dict[str, object] = {}
    exec(SAMPLE_SETTINGS, namespace)  # a settings class of its own: the mechanism, not the text
    model = namespace["StokerSettings"]
    rows = _generator().read_rows(SAMPLE_SETTINGS, model.model_fields)  # type: ignore[attr-defined]
    got = [(r.section, r.name, r.type, r.default, r.text) for r in rows]
    assert got == [
        (
            "Services",
            "STOKER_REDIS_URL",
            "`str`",
            "unset",
            "Where the cache lives; two lines of comment.",
        ),
        ("Services", "STOKER_HOST", "`str`", "`127.0.0.1`", "0.0.0.0 in a container"),
        ("Policy", "STOKER_SHARE", "`float` in [0, 1]", "`0.2`", ""),
        ("Policy", "STOKER_MODE", "`static` or `verified`", "`verified`", ""),
        ("Policy", "STOKER_RATE", "`float` > 0", "`5`", "sends a second"),
    ]


def test_settings_doc__shows_every_setting() -> None:
    from stoker.settings import StokerSettings

    text = _generator().render()
    missing = [n for n in StokerSettings.model_fields if f"`STOKER_{n.upper()}`" not in text]
    assert not missing


def test_user_docs__carry_no_tracker_numbers() -> None:
    found = {
        str(doc.relative_to(ROOT)): marks
        for doc in USER_DOCS
        if (marks := tracker_marks(doc.read_text(encoding="utf-8")))
    }
    assert not found, f"tracker numbers or 'in progress' in user docs: {found}"


def test_user_docs__relative_links_resolve() -> None:
    found = {str(d.relative_to(ROOT)): bad for d in USER_DOCS if (bad := broken_links(d))}
    assert not found, f"broken links: {found}"


@pytest.mark.parametrize(
    ("line", "flagged"),
    [
        ("### What `stoker warm` plans (#17, in progress)", True),
        ("Semantic hits that are right (#15)", True),
        ("work In Progress", True),
        ("## Warming (in progress)", True),
        ("see [warming](warming.md#what-a-warm-is-worth) and &#123;", False),
        ("issue 17 of 20, 17# left", False),
    ],
)
def test_tracker_marks__finds_numbers_and_in_progress(line: str, flagged: bool) -> None:
    assert bool(tracker_marks(line)) is flagged


def test_broken_links__finds_missing_files_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The `stoker warm` plan: (why)\n")
    doc = tmp_path / "page.md"
    doc.write_text(
        "# Page\n"
        "[ok](other.md) [ok](other.md#the-stoker-warm-plan-why) [ok](#page)\n"
        "[web](https://example.com/x.md) `[code](gone.md)`\n"
        "```\n[fenced](gone.md)\n```\n"
        "[gone](gone.md) [anchor](other.md#nowhere) [self](#nowhere)\n"
        "[outside](../../x.md)\n"
    )
    assert broken_links(doc, root=tmp_path) == [
        "gone.md: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
        "#nowhere: no heading #nowhere in page.md",
        "../../x.md: outside the repository",
    ]


def test_readme__is_a_landing_page_of_at_most_150_lines() -> None:
    """Design notes and measurements go to docs/; the README says what stoker is and the way in."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the details to docs/"


def test_model_server_doc__names_the_cache_folders_the_build_uses() -> None:
    from stoker import modelserver

    doc = (ROOT / "docs" / "model-server.md").read_text(encoding="utf-8")
    server = modelserver.server_path(Path("<cache>"))
    model = modelserver.model_path(Path("<cache>"))
    # the folders a user is told to look in (or delete) are the ones setup writes
    assert f"{server.parent}/llama-server" in doc and f"{server.parent}/build.log" in doc
    assert str(model) in doc


BENCH = ROOT / "benchmarks"
NAMED = re.compile(r"`([a-z][A-Za-z0-9_<>]*[A-Za-z0-9>])`")  # `hot_set_k<K>_l3`: a family


def measured_rows(doc: str) -> list[tuple[str, str]]:
    """(line name, script) of each row of docs/benchmarks.md's "What `make bench` measures"
    table: the first backticked name of its first cell and the file of its second."""
    table = doc.split("## What `make bench` measures", 1)[1].split("\n## ", 1)[0]
    out = []
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 2 or not row.startswith("| `"):
            continue
        name, script = NAMED.search(cells[0]), re.search(r"`(bench_[a-z0-9_]+\.py)", cells[1])
        head = name.group(1).split("<")[0] if name else cells[0]  # a family: its fixed head
        out.append((head, script.group(1) if script else ""))
    return out


def test_benchmarks_doc__every_documented_figure_names_the_command_that_makes_it() -> None:
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    rows = measured_rows(doc)
    assert len(rows) >= 20
    for name, script in rows:
        assert script and (BENCH / script).is_file(), f"{name}: names no benchmark script"
        source = (BENCH / script).read_text()
        # the line's name as the script emits it (an f-string's fixed head for a family)
        heads = {name, *(name[:i] for i in range(len(name), 0, -1) if name[i - 1] == "_")}
        assert any(f'"{h}' in source or f'f"{h}' in source for h in heads), (name, script)
        assert f"benchmarks/{script}" in doc, f"{script}: no command on the page runs it"


def test_benchmarks_doc__the_recorded_run_table_is_its_results_file_s() -> None:
    import subprocess

    results = sorted((ROOT / "docs" / "results").glob("results-*.jsonl"))
    assert results, "docs/results holds the results file the recorded-run table comes from"
    got = subprocess.run(
        [sys.executable, str(BENCH / "_tables.py"), *map(str, results), "--check"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
