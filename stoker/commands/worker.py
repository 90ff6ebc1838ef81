"""`stoker worker NAME`: run one stream worker (or all of them, one thread each) until SIGTERM."""

from __future__ import annotations

import signal
from enum import StrEnum
from types import FrameType
from typing import Annotated

import typer

from stoker.app import app, console, examples
from stoker.connect import KafkaBootstrap, QdrantUrl, RedisUrl
from stoker.connect import overrides as connection_overrides
from stoker.logs import configure as configure_logging
from stoker.metrics import serve_metrics
from stoker.preflight import report_checks
from stoker.runtime import WorkerGroup, embedded_settings
from stoker.settings import StokerSettings


class WorkerName(StrEnum):
    traffic = "traffic"
    deploy = "deploy"
    invalidation = "invalidation"
    rewarm = "rewarm"
    scheduler = "scheduler"
    monitor = "monitor"
    prefixes = "prefixes"
    all = "all"


@app.command(
    short_help="Run a stream worker (or all of them) until SIGTERM.",
    epilog=examples(
        "stoker worker all",
        "stoker worker deploy --kafka-bootstrap kafka:9092 \\",
        "    --redis-url redis://cache:6379/0 --qdrant-url http://qdrant:6333",
    ),
)
def worker(
    name: Annotated[WorkerName, typer.Argument(help="which worker to run")],
    kafka_bootstrap: KafkaBootstrap = None,
    redis_url: RedisUrl = None,
    qdrant_url: QdrantUrl = None,
    broker: Annotated[
        str | None, typer.Option(help="kafka or tansu (embedded-broker consumer settings)")
    ] = None,
    group: Annotated[
        str | None, typer.Option(help="consumer group; default <prefix>stoker.<name>")
    ] = None,
) -> None:
    """Consume the worker's topics and apply them; SIGTERM finishes the batch, commits, exits 0.
    With no Kafka configured, runs on an embedded stack of its own (Kafka, Redis, Qdrant Edge).
    At start it says which of the URLs it will call (Kafka, Redis, the model server) do not
    answer."""
    overrides = connection_overrides(kafka_bootstrap, redis_url, qdrant_url)
    if broker:
        if broker not in ("kafka", "tansu"):
            raise typer.BadParameter("must be kafka or tansu", param_hint="--broker")
        overrides["kafka_broker"] = broker
    if group and name is WorkerName.all:
        raise typer.BadParameter("one group cannot serve several workers", param_hint="--group")
    settings = StokerSettings(**overrides)
    configure_logging(settings.log_format, settings.log_level)
    what = f"stoker worker {name.value}"
    with (
        embedded_settings(settings, console, what=what) as s,
        serve_metrics(s.metrics_port) as port,
    ):
        if port is not None:
            console.print(f"metrics on :{port}/metrics")
        run_workers(s, _names(name, s), group)


def _names(name: WorkerName, settings: StokerSettings) -> list[str]:
    from stoker.registry import available, factory_for, is_service, opted_out

    if name is not WorkerName.all:
        if not is_service(name.value):
            factory_for(name.value)  # fails now, with exit 1, if it is not built yet
        return [name.value]
    names = available(settings)
    off = opted_out(settings)
    if off:
        console.print(f"off with STOKER_SEMANTIC_MATCHER=static: {', '.join(off)}")
    missing = [
        n.value for n in WorkerName
        if n is not WorkerName.all and n.value not in names and n.value not in off
    ]  # fmt: skip
    if missing:
        console.print(f"not available yet, skipped: {', '.join(missing)}")
    return names


def run_workers(settings: StokerSettings, names: list[str], group: str | None = None) -> None:
    """One Worker thread per name; SIGTERM/SIGINT stop them all; any worker's failure is ours."""
    from stoker.stack import Stack

    with Stack(settings) as stack:  # closed once every worker has stopped
        _run_group(settings, names, WorkerGroup(stack, names, group))


def _run_group(settings: StokerSettings, names: list[str], workers: WorkerGroup) -> None:
    """Run the group until a signal or a failure; report, and raise the first failure."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        console.print(f"{signal.Signals(signum).name}: finishing the current batches")
        workers.stop()

    # Built before the handler goes in: a SIGTERM right after the banner (what a test or an
    # orchestrator sends as soon as it sees it) must find the workers, not a NameError.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    for w in workers.workers:
        console.print(f"worker {w.handler.name}: group {w.config.group_id}, topics {w.topics}")
    for sv in workers.services:
        console.print(f"worker {sv.name}: no topics (a leader-elected schedule)")
    report_checks(settings, names, console)
    try:
        workers.start()
        workers.watch()
    finally:
        workers.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    workers.report(console)
    workers.raise_first_error()
