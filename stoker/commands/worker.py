"""`stoker worker NAME`: run one stream worker (or all of them, one thread each) until SIGTERM."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from enum import StrEnum
from types import FrameType
from typing import Annotated, Any, Protocol

import typer

from schemas.errors import StokerError
from stoker.app import app, console
from stoker.logs import configure as configure_logging
from stoker.metrics import serve_metrics
from stoker.settings import StokerSettings


class _Runnable(Protocol):
    """A Worker, or a Service that is not a Kafka consumer (the scheduler)."""

    def run(self) -> None: ...

    def stop(self) -> None: ...


# How often the main thread wakes to see whether a worker thread died: a dead worker is
# reported within this, and the others are stopped.
_WATCH_S = 0.5


class WorkerName(StrEnum):
    traffic = "traffic"
    deploy = "deploy"
    invalidation = "invalidation"
    scheduler = "scheduler"
    all = "all"


@app.command()
def worker(
    name: Annotated[WorkerName, typer.Argument(help="which worker to run")],
    bootstrap: Annotated[
        str | None,
        typer.Option(
            help="Kafka bootstrap; default STOKER_KAFKA_BOOTSTRAP, else an embedded stack"
        ),
    ] = None,
    redis_url: Annotated[str | None, typer.Option(help="default STOKER_REDIS_URL")] = None,
    broker: Annotated[
        str | None, typer.Option(help="kafka or tansu (embedded-broker consumer settings)")
    ] = None,
    group: Annotated[
        str | None, typer.Option(help="consumer group; default <prefix>stoker.<name>")
    ] = None,
) -> None:
    """Consume the worker's topics and apply them; SIGTERM finishes the batch, commits, exits 0."""
    overrides: dict[str, Any] = {}
    if bootstrap:
        overrides["kafka_bootstrap"] = bootstrap
    if redis_url:
        overrides["redis_url"] = redis_url
    if broker:
        if broker not in ("kafka", "tansu"):
            raise typer.BadParameter("must be kafka or tansu", param_hint="--broker")
        overrides["kafka_broker"] = broker
    if group and name is WorkerName.all:
        raise typer.BadParameter("one group cannot serve several workers", param_hint="--group")
    settings = StokerSettings(**overrides)
    configure_logging(settings.log_format, settings.log_level)
    with _services(settings) as s, serve_metrics(s.metrics_port) as port:
        if port is not None:
            console.print(f"metrics on :{port}/metrics")
        run_workers(s, _names(name), group)


@contextlib.contextmanager
def _services(settings: StokerSettings) -> Iterator[StokerSettings]:
    """The settings as given, or pointed at an embedded stack when no Kafka is configured."""
    if settings.kafka_bootstrap:
        yield settings
        return
    from stoker.embedded import EmbeddedStack

    with EmbeddedStack(kafka=True, redis=not settings.redis_url) as stack:
        fields: dict[str, Any] = {"kafka_bootstrap": stack.kafka_bootstrap, "kafka_broker": "tansu"}
        if settings.semantic_backend == "edge" and settings.qdrant_path is None:
            fields["qdrant_path"] = stack.qdrant_path  # one store for every worker, removed at stop
        if not settings.redis_url:
            fields["redis_url"] = stack.redis_url
        console.print(
            "no STOKER_KAFKA_BOOTSTRAP: running on an embedded stack "
            f"(Kafka at {fields['kafka_bootstrap']}, Redis at {fields.get('redis_url', settings.redis_url)}); "
            "it lives as long as this process"
        )
        yield settings.model_copy(update=fields)


def _names(name: WorkerName) -> list[str]:
    from stoker.registry import available, factory_for, is_service

    if name is not WorkerName.all:
        if not is_service(name.value):
            factory_for(name.value)  # fails now, with exit 1, if it is not built yet
        return [name.value]
    names = available()
    missing = [n.value for n in WorkerName if n is not WorkerName.all and n.value not in names]
    if missing:
        console.print(f"not available yet, skipped: {', '.join(missing)}")
    return names


def run_workers(settings: StokerSettings, names: list[str], group: str | None = None) -> None:
    """One Worker thread per name; SIGTERM/SIGINT stop them all; any worker's failure is ours."""
    from stoker.registry import build_handler, build_service, is_service
    from stoker.wiring import worker_config
    from streams.worker import Worker

    handlers = [build_handler(n, settings) for n in names if not is_service(n)]
    workers = [Worker(h, worker_config(settings, h, group)) for h in handlers]
    services = [build_service(n, settings) for n in names if is_service(n)]
    errors: list[BaseException] = []
    # Bound before the handler is installed: a SIGTERM right after the banner (what a test or
    # an orchestrator sends as soon as it sees it) must find them, not a NameError.
    runnables: list[_Runnable] = [*workers, *services]
    labels = [w.handler.name for w in workers] + [sv.name for sv in services]

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        console.print(f"{signal.Signals(signum).name}: finishing the current batches")
        for r in runnables:
            r.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    for w in workers:
        console.print(f"worker {w.handler.name}: group {w.config.group_id}, topics {w.topics}")
    for sv in services:
        console.print(f"worker {sv.name}: no topics (a leader-elected schedule)")
    try:
        _run_threads(runnables, labels, errors)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for sv in services:
        console.print(f"worker {sv.name}: {sv.report()}")
    for w in workers:
        s = w.stats
        console.print(
            f"worker {w.handler.name}: {s.events} events, {s.dlq} dead-lettered, "
            f"{s.retries} retries"
        )
    if errors:
        exc = errors[0]
        if isinstance(exc, StokerError):
            raise exc
        raise StokerError(f"worker failed: {type(exc).__name__}: {exc}") from exc


def _run_threads(
    runnables: Sequence[_Runnable], labels: list[str], errors: list[BaseException]
) -> None:
    """Start a thread per worker or service; when one fails, stop the rest; return when all
    are done."""

    def body(w: _Runnable) -> None:
        try:
            w.run()
        except BaseException as exc:  # reported by the main thread, which owns the exit code
            errors.append(exc)

    threads = [
        threading.Thread(target=body, args=(w,), name=f"worker-{label}")
        for w, label in zip(runnables, labels, strict=True)
    ]
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            if errors:
                for w in runnables:
                    w.stop()
            for t in threads:
                t.join(_WATCH_S)
    finally:
        for w in runnables:
            w.stop()
        for t in threads:
            if t.is_alive():
                t.join()
