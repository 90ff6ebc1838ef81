"""Running stoker's long-lived parts: the embedded stack when nothing is configured, and a group
of workers (one thread each) that `stoker worker` and `stoker gateway` both run.

WorkerGroup: start() a thread per worker or service; a worker that dies makes the group stop
the others (watch()); stop() asks all to finish their batch and commit; join() waits for them.
No thread outlives the group: join() is bounded only by each worker's own drain.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console

from schemas.errors import StokerError
from stoker.settings import StokerSettings

if TYPE_CHECKING:
    from stoker.embedded import LlamaServer
    from stoker.stack import Stack

# How often the watcher wakes to see whether a worker thread died: a dead worker is reported
# within this, and the others are stopped.
WATCH_S = 0.5


class Runnable(Protocol):
    """A Worker, or a Service that is not a Kafka consumer (the scheduler)."""

    def run(self) -> None: ...

    def stop(self) -> None: ...


# The tenant of requests without a header on an embedded stack (a trial on one machine).
EMBEDDED_TENANT = "default"


@contextlib.contextmanager
def embedded_settings(
    settings: StokerSettings, console: Console, *, what: str = "this process", model: bool = True
) -> Iterator[StokerSettings]:
    """The settings as given, or pointed at an embedded stack (Tansu, redis-server, a Qdrant
    Edge folder) when no Kafka is configured; the stack lives as long as the block, and its
    addresses are in the state folder's embedded.json meanwhile (stoker/embedded_state.py).

    With `model` and no model server configured (neither STOKER_GATEWAY_UPSTREAM_URL nor
    STOKER_WARM_BACKEND_URL), the stack runs the embedded model server too (llama.cpp's
    llama-server serving SmolLM2, built by `make setup`), and both point at it: `stoker gateway`
    with nothing set serves a real model."""
    if settings.kafka_bootstrap:
        yield settings
        return
    from stoker import embedded_state
    from stoker.embedded import EmbeddedStack

    with (
        EmbeddedStack(kafka=True, redis=not settings.redis_url) as stack,
        _model_server(settings, model) as llama,
    ):
        fields: dict[str, Any] = {"kafka_bootstrap": stack.kafka_bootstrap, "kafka_broker": "tansu"}
        if not settings.redis_url:
            fields["redis_url"] = stack.redis_url
        if settings.semantic_backend == "edge" and settings.qdrant_path is None:
            fields["qdrant_path"] = stack.qdrant_path  # one store for every part, removed at stop
        if llama is not None:
            fields["gateway_upstream_url"] = fields["warm_backend_url"] = llama.base_url
        if settings.gateway_default_tenant is None and not settings.gateway_api_keys:
            # a stack on this machine alone is a trial: its first request needs no header (one
            # configured with Kafka asks every request for its tenant)
            fields["gateway_default_tenant"] = EMBEDDED_TENANT
        s = settings.model_copy(update=fields)
        addresses = {"kafka_bootstrap": s.kafka_bootstrap, "redis_url": s.redis_url,
                     "qdrant_path": s.qdrant_path}  # fmt: skip
        if s.warm_backend_url or s.gateway_upstream_url:
            # the model server this stack's workers warm (the embedded one, or the one given),
            # so `stoker warm` beside it warms the same
            addresses["model_url"] = s.warm_url()
        path = embedded_state.state_path(settings.state_dir)
        with embedded_state.published(path, addresses, what):
            # one address a line, each whole: in a log file (80 columns to rich) the one long
            # line ran on, and a wrapped one would break an address in two
            model_line = "" if llama is None else f"\n  model server: {llama.base_url}"
            console.print(
                f"no STOKER_KAFKA_BOOTSTRAP: an embedded stack, for as long as {what} runs\n"
                f"  Kafka:        {s.kafka_bootstrap}\n"
                f"  Redis:        {s.redis_url}{model_line}\n"
                f"  addresses in: {path}",
                soft_wrap=True,
                highlight=False,
            )
            yield s


@contextlib.contextmanager
def _model_server(settings: StokerSettings, wanted: bool) -> Iterator[LlamaServer | None]:
    """The embedded llama-server, when wanted and no model server is configured."""
    if not wanted or settings.gateway_upstream_url or settings.warm_backend_url:
        yield None
        return
    from stoker.embedded import installed_llama

    server = installed_llama(settings)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class WorkerGroup:
    """The named workers of the registry, each on its own thread, all on the parts of one
    Stack (closed by its owner, after join())."""

    def __init__(self, stack: Stack, names: Sequence[str], group: str | None = None):
        from stoker.registry import build_handler, build_service, is_service
        from stoker.wiring import worker_config
        from streams.worker import Worker

        s = stack.settings
        handlers = [build_handler(n, stack) for n in names if not is_service(n)]
        self.workers = [Worker(h, worker_config(s, h, group)) for h in handlers]
        self.services = [build_service(n, stack) for n in names if is_service(n)]
        self.runnables: list[Runnable] = [*self.workers, *self.services]
        self.labels = [w.handler.name for w in self.workers] + [s.name for s in self.services]
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        def body(r: Runnable) -> None:
            try:
                r.run()
            except BaseException as exc:  # reported by whoever owns the exit code
                self.errors.append(exc)

        self._threads = [
            threading.Thread(target=body, args=(r,), name=f"worker-{label}")
            for r, label in zip(self.runnables, self.labels, strict=True)
        ]
        for t in self._threads:
            t.start()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def watch(self, until: threading.Event | None = None) -> None:
        """Block until every worker is done (or `until` is set); stop all when one fails."""
        while self.alive() and not (until is not None and until.is_set()):
            if self.errors:
                self.stop()
            for t in self._threads:
                t.join(WATCH_S)

    def stop(self) -> None:
        for r in self.runnables:
            r.stop()

    def join(self) -> None:
        self.stop()
        for t in self._threads:
            t.join()

    def report(self, console: Console) -> None:
        for sv in self.services:
            console.print(f"worker {sv.name}: {sv.report()}")
        for w in self.workers:
            s = w.stats
            console.print(
                f"worker {w.handler.name}: {s.events} events, {s.dead_lettered()}, "
                f"{s.retries} retries"
            )

    def raise_first_error(self) -> None:
        if self.errors:
            exc = self.errors[0]
            if isinstance(exc, StokerError):
                raise exc
            raise StokerError(f"worker failed: {type(exc).__name__}: {exc}") from exc
