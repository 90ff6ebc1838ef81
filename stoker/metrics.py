"""The /metrics endpoint of a stoker process, with every package's metrics registered.

Each package defines its own series in its metrics module (caches, streams, warmers,
invalidators); importing all of them here means a worker exposes every stoker series from its
first scrape, at zero until it moves, so dashboards and alerts see "0", not "no data".
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from prometheus_client import start_http_server

METRICS_MODULES: Final = (
    "caches.metrics",
    "streams.metrics",
    "warmers.metrics",
    "audits.metrics",
    "invalidators.metrics",
    "gateway.metrics",
)


def register_all() -> None:
    for name in METRICS_MODULES:
        importlib.import_module(name)


@contextmanager
def serve_metrics(port: int, addr: str = "0.0.0.0") -> Iterator[int | None]:
    """Serve /metrics on `port` while the block runs (0: serve nothing); yields the port.

    0.0.0.0 by default: Prometheus scrapes from another container or pod.
    """
    register_all()
    if port == 0:
        yield None
        return
    server, thread = start_http_server(port, addr)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
