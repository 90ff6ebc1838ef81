"""`stoker gateway`: the OpenAI-compatible caching proxy; point your OpenAI base URL at it.

Where it runs:
- STOKER_KAFKA_BOOTSTRAP set (production): the gateway alone; it publishes the request log
  there, and the workers run elsewhere (`stoker worker ...`), sharing Redis and a Qdrant server;
- STOKER_REDIS_URL set but no broker: the gateway alone, publishing nowhere (it says so once);
- neither: an embedded stack (Tansu, redis-server, Qdrant Edge), and every worker in this
  process beside the gateway: Qdrant Edge lives inside one process, so only workers of the
  same process can invalidate the vectors it serves. One command brings the system up; with no
  --upstream either, the stack runs the embedded model server (llama-server, SmolLM2) too.
SIGTERM (or Ctrl-C) drains: /readyz turns 503, in-flight requests finish (STOKER_GATEWAY_DRAIN_S),
the request log is flushed, the workers finish their batches; then it exits 0.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from stoker.app import app, console, examples
from stoker.connect import KafkaBootstrap, QdrantUrl, RedisUrl, Upstream
from stoker.connect import overrides as connection_overrides
from stoker.logs import configure as configure_logging
from stoker.metrics import serve_metrics
from stoker.runtime import WorkerGroup, embedded_settings
from stoker.settings import StokerSettings

if TYPE_CHECKING:
    from stoker.stack import Stack


@app.command(
    short_help="The OpenAI-compatible caching proxy in front of your model server.",
    epilog=examples(
        "stoker gateway     # all embedded: a real model, Kafka, Redis, Qdrant Edge",
        "stoker gateway --upstream http://127.0.0.1:8000/v1",
        "stoker gateway --upstream http://vllm:8000/v1 --host 0.0.0.0 \\",
        "    --kafka-bootstrap kafka:9092 --redis-url redis://cache:6379/0",
    ),
)
def gateway(
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65_535, help="listen port; default STOKER_GATEWAY_PORT (8080)"),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="listen address; default STOKER_GATEWAY_HOST (127.0.0.1)")
    ] = None,
    upstream: Upstream = None,
    kafka_bootstrap: KafkaBootstrap = None,
    redis_url: RedisUrl = None,
    qdrant_url: QdrantUrl = None,
) -> None:
    """Serve /v1/chat/completions, /v1/completions and /v1/embeddings through the cache, and
    /v1/models, /healthz, /readyz, /metrics. With neither Kafka nor Redis configured, runs an
    embedded stack and every worker in this process. Exit 0 after a SIGTERM drain, 1 if it
    failed, 2 for a bad option or setting (a malformed --upstream among them)."""
    overrides = connection_overrides(kafka_bootstrap, redis_url, qdrant_url)
    given = {"gateway_port": port, "gateway_host": host, "gateway_upstream_url": upstream}
    overrides |= {name: v for name, v in given.items() if v is not None}
    settings = StokerSettings(**overrides)
    embedded = not settings.kafka_bootstrap and not settings.redis_url
    configure_logging(settings.log_format, settings.log_level)
    with _stack(settings, embedded) as s, serve_metrics(s.metrics_port) as metrics_port:
        if metrics_port is not None:
            console.print(f"metrics also on :{metrics_port}/metrics")
        run_gateway(s, with_workers=embedded)


@contextlib.contextmanager
def _stack(settings: StokerSettings, embedded: bool) -> Iterator[StokerSettings]:
    if not embedded:
        yield settings
        return
    with embedded_settings(settings, console, what="stoker gateway") as s:
        yield s


def run_gateway(settings: StokerSettings, *, with_workers: bool) -> None:
    """Serve until SIGTERM/SIGINT; with_workers runs every worker in this process too."""
    from stoker.stack import Stack

    with Stack(settings) as stack:
        _serve(stack, with_workers=with_workers)


def _serve(stack: Stack, *, with_workers: bool) -> None:
    """The gateway (and the workers) on the parts of one Stack: one Redis client, one
    embedder and one semantic store for all of them."""
    from gateway.service import GatewayServer
    from stoker.registry import available

    settings = stack.settings
    workers = WorkerGroup(stack, available(settings)) if with_workers else None
    parts = stack.gateway()
    server = GatewayServer(parts, settings.gateway_host, settings.gateway_port)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        console.print(f"{signal.Signals(signum).name}: draining the gateway")
        server.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if workers is not None:
            from stoker.preflight import report_checks

            # the upstream itself is probed by the gateway (gateway/app.py), not again here
            report_checks(settings, workers.labels, console, skip=[parts.upstream.base.api])
            workers.start()
            console.print(f"workers in this process: {', '.join(workers.labels)}")
        if settings.gateway_default_tenant and not settings.gateway_api_keys:
            console.print(
                f"requests without an x-stoker-tenant header are tenant "
                f"{settings.gateway_default_tenant!r} (STOKER_GATEWAY_DEFAULT_TENANT)"
            )
        # the banner last: whoever waits for it (a script, a test) has read everything above;
        # one write, each URL whole on a line of its own, even in a log file (no terminal:
        # 80 columns), where a wrapped line broke the base URL in two
        banner = (
            f"gateway on {server.url}\n"
            f"  upstream:        {parts.upstream.base.api}\n"
            f"  OpenAI base URL: {server.url}/v1"
        )
        console.print(banner, soft_wrap=True, highlight=False)
        server.serve()
    finally:
        if workers is not None:
            workers.join()
            workers.report(console)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("gateway stopped")
    if workers is not None:
        workers.raise_first_error()
