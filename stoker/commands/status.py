"""`stoker status`: running and recent jobs (deploy cutovers, purges, warm runs), from Redis."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Annotated, Any, Final

import orjson
import typer
from rich.console import Console
from rich.text import Text

from stoker.app import app, examples
from stoker.connect import RedisUrl, connected
from stoker.tables import Column, Grid, render

# The --json shape: bump when a key changes meaning or goes away (adding keys is compatible).
SCHEMA_VERSION: Final = 1
_TITLES: Final = {
    "deploy": "Deploy cutovers",
    "purge": "Purges",
    "warm": "Warm runs",
    "invalidate": "Invalidations",
}
_STATE_STYLE: Final = {
    "running": "yellow",
    "pending": "yellow",
    "ready": "green",
    "done": "green",
    "failed": "red",
    "interrupted": "red",
}


@app.command(
    short_help="Running and recent jobs: cutovers, purges, warm runs.",
    epilog=examples("stoker status", "stoker status --json --redis-url redis://cache:6379/0"),
)
def status(
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON object on stdout, for scripts")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, max=500, help="most recent jobs shown")] = 20,
    redis_url: RedisUrl = None,
) -> None:
    """Show running and recent jobs: cutovers with their phase, purge progress, warm figures,
    on stdout: a table, or one block a job when the table would not fit the terminal (a pipe
    counts as 80 columns; COLUMNS sets it). Exit 2 when no Redis is configured and no embedded
    stack runs."""
    from invalidators.jobs import all_jobs
    from schemas.errors import ConfigError
    from stoker import embedded_state
    from stoker.stack import Stack

    settings = connected(redis_url=redis_url)  # quietly: --json's reader wants no banner
    embedded = embedded_state.read(embedded_state.state_path(settings.state_dir))
    if not settings.redis_url:
        raise ConfigError(
            "stoker status reads job state from Redis: set STOKER_REDIS_URL or --redis-url "
            "(or run it beside `stoker worker all` or `stoker gateway` on the embedded stack)"
        )
    with Stack(settings) as stack:
        jobs = [j.to_dict() for j in all_jobs(stack.redis, limit)]
    doc = status_document(jobs) | {"embedded": embedded}
    if as_json:
        typer.echo(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode())
        return
    show(doc, Console(highlight=False))  # the table is the verb's output: stdout


def status_document(jobs: list[dict[str, Any]], now: float | None = None) -> dict[str, Any]:
    """The --json shape: {"schema", "generated_at", "running", "jobs": [record, ...]}; the
    command adds "embedded": the addresses of a running embedded stack, or null."""
    return {
        "schema": SCHEMA_VERSION,
        "generated_at": time.time() if now is None else now,
        "running": sum(1 for j in jobs if j["state"] in ("pending", "running")),
        "jobs": jobs,
    }


def show(doc: dict[str, Any], out: Console) -> None:
    jobs: list[dict[str, Any]] = doc["jobs"]
    if not jobs:
        out.print("no running or recent jobs (records are kept a week)")
        return
    now = float(doc["generated_at"])
    for job_type, title in _TITLES.items():
        mine = [j for j in jobs if j["job_type"] == job_type]
        if mine:
            out.print(render(_grid(title, mine, now), out.width, narrow="records"))


# A job's name, state, progress and age lead: they are a record's first line.
_COLUMNS: Final = (
    Column("job"), Column("state"), Column("progress", "right"), Column("updated"),
    Column("about"), Column("figures"), Column("detail"),
)  # fmt: skip


def _grid(title: str, jobs: Iterable[dict[str, Any]], now: float) -> Grid:
    g = Grid(title, _COLUMNS, keep=4)
    for j in jobs:
        g.add_row(
            j["job_id"],
            Text(j["state"], style=_STATE_STYLE.get(j["state"], "")),
            f"{100 * j['progress']:.0f}%",
            _ago(now - j["updated_at"]),
            " ".join(f"{k}={v}" for k, v in j["labels"].items()),
            _figures(j),
            j["detail"],
        )
    return g


def _figures(j: dict[str, Any]) -> str:
    parts = [f"{k}={v:,}" for k, v in j["counts"].items()]
    parts += [f"{k}={v:,.2f}" for k, v in j["figures"].items() if k != "grace_until"]
    return " ".join(parts)


def _ago(seconds: float) -> str:
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"
