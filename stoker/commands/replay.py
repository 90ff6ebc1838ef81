"""`stoker replay LOG`: a request log (jsonl / csv / parquet) into inference.requests."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from schemas.errors import StokerError, UsageError
from stoker.app import app, console, examples
from stoker.connect import KafkaBootstrap, connected

if TYPE_CHECKING:
    from streams.replay import Replayer, ReplaySummary

# Bad rows listed in the summary table; the count is always complete.
_SHOW_BAD = 20


def parse_speed(value: str) -> float | None:
    """ "max" = as fast as possible (None); else a positive factor (1 = real time)."""
    if value == "max":
        return None
    try:
        speed = float(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r}: use a number > 0 or max") from None
    if not speed > 0 or speed == float("inf"):
        raise typer.BadParameter(f"{value!r}: use a number > 0 or max")
    return speed


def parse_time(value: str | None, hint: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an ISO 8601 time", param_hint=hint) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)  # naive = UTC, as in the events


@app.command(
    short_help="Replay a request log into Kafka, paced by its timestamps.",
    epilog=examples(
        "stoker replay requests.jsonl --speed 60",
        "stoker replay requests.parquet --speed max --kafka-bootstrap kafka:9092",
    ),
)
def replay(
    # No exists=True: a missing file is reported like any unreadable one (one line, exit 2).
    log: Annotated[Path, typer.Argument(help="request log: .jsonl, .csv or .parquet")],
    kafka_bootstrap: KafkaBootstrap = None,
    speed: Annotated[
        str, typer.Option(help="1 = real time, 60 = 60x faster, max = no pacing")
    ] = "max",
    from_: Annotated[
        str | None, typer.Option("--from", help="skip events before this ISO time")
    ] = None,
    to: Annotated[str | None, typer.Option(help="skip events at or after this ISO time")] = None,
    strict: Annotated[bool, typer.Option(help="fail (exit 1) on the first bad row")] = False,
    fmt: Annotated[
        str | None, typer.Option("--format", help="jsonl, csv or parquet; default from the suffix")
    ] = None,
) -> None:
    """Send every valid row as a RequestLogged event, paced by its timestamps; report bad rows.
    Exits 2 when the log cannot be read or holds no valid row, 1 when the broker failed."""
    from confluent_kafka import Producer

    from streams.replay import FORMATS, Replayer, count_rows, detect_format
    from streams.topics import ensure_topics, producer_config, topic_name

    pace = parse_speed(speed)
    since, until = parse_time(from_, "--from"), parse_time(to, "--to")
    if since and until and since >= until:
        raise typer.BadParameter("--from must be before --to")
    if fmt is not None and fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r}: use one of {', '.join(FORMATS)}", param_hint="--format")
    settings = connected(console, kafka_bootstrap=kafka_bootstrap)
    if not settings.kafka_bootstrap:
        raise typer.BadParameter(
            "give --kafka-bootstrap or set STOKER_KAFKA_BOOTSTRAP (or run it beside "
            "`stoker worker all` on the embedded stack)",
            param_hint="--kafka-bootstrap",
        )
    fmt = fmt or detect_format(log)
    total = count_rows(log, fmt)  # before any broker work: an unreadable log fails at once
    topic = topic_name("inference.requests", settings.topic_prefix)
    ensure_topics(settings.kafka_bootstrap, {topic: 6})
    embedded = settings.kafka_broker == "tansu"
    producer = Producer(
        producer_config(settings.kafka_bootstrap, embedded=embedded, **{"linger.ms": 5})
    )
    replayer = Replayer(producer, topic, pace, since, until, strict)
    summary = _run_with_progress(replayer, log, fmt, total)
    _print_summary(summary, topic)
    if summary.failed:
        raise StokerError(f"{summary.failed} events were not confirmed by the broker")
    if summary.valid == 0:
        why = f"all {summary.rows} rows are bad" if summary.rows else "it holds no rows"
        raise UsageError(f"nothing sent from {log.name}: {why}")


def _run_with_progress(replayer: Replayer, log: Path, fmt: str, total: int) -> ReplaySummary:
    columns = (
        TextColumn("replay {task.fields[name]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sent {task.fields[sent]}, bad {task.fields[bad]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(
            "replay", total=total if total >= 0 else None, name=log.name, sent=0, bad=0
        )

        def on_row(s: ReplaySummary) -> None:
            if s.rows % 1000 == 0:  # a refresh per row would cost more than the produce
                progress.update(task, completed=s.rows, sent=s.sent, bad=s.bad)

        replayer.on_row = on_row
        summary = replayer.run(log, fmt)
        progress.update(
            task, completed=summary.rows, total=summary.rows, sent=summary.sent, bad=summary.bad
        )
    return summary


def _print_summary(s: ReplaySummary, topic: str) -> None:
    table = Table(title=f"replay into {topic}")
    table.add_column("rows read", justify="right")
    table.add_column("sent", justify="right")
    table.add_column("skipped (--from/--to)", justify="right")
    table.add_column("bad", justify="right")
    table.add_column("not confirmed", justify="right")
    table.add_row(*(str(x) for x in (s.rows, s.sent - s.failed, s.skipped, s.bad, s.failed)))
    console.print(table)
    if s.ignored_columns:  # once per replay, not per row
        names = ", ".join(sorted(s.ignored_columns))
        console.print(f"ignored column(s) that RequestLogged does not have: {names}")
    if s.bad_rows:
        bad = Table(title=f"bad rows (first {min(_SHOW_BAD, len(s.bad_rows))} of {s.bad})")
        bad.add_column("line", justify="right")
        bad.add_column("reason")
        bad.add_column("detail", overflow="fold")
        for row in s.bad_rows[:_SHOW_BAD]:
            bad.add_row(str(row.line), row.reason, row.detail)
        console.print(bad)
