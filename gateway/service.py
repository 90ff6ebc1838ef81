"""The gateway as a server: uvicorn (uvloop, httptools) around the app, with a drain on stop.

stop() (SIGTERM in `stoker gateway`) does, in order:
1. mark the gateway draining: /readyz answers 503, and for drain_notice_s the gateway still
   serves, so a load balancer takes it out before its listener closes;
2. stop accepting connections and let in-flight requests finish, for at most drain_s;
3. shut the app down: close the upstream pool, flush the request log, let queued cache writes
   land, and stop whatever the shell handed over (workers, the embedded stack).
Signals are the caller's business (stoker/commands/gateway.py): uvicorn's own handlers re-raise
the signal after a graceful stop, which would turn a clean SIGTERM into exit code 143.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Self

import uvicorn

from gateway.app import GatewayParts, build_app, wrap
from schemas.errors import ServiceStartError
from schemas.lifecycle import Startable

# How long a thread-hosted server may take to come up.
_START_S = 10.0
_BACKLOG = 2048


class _WhileServing:
    """Process-wide settings held while any gateway in the process serves: the first server to
    start applies them and the last to stop undoes them. One process may host several (the
    tests do, each on a thread), and the collector and the GIL belong to the process: a server
    that stopped first would otherwise thaw, or reset, what another one still serves with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._serving = 0
        self._interval_before = 0.0

    @contextlib.contextmanager
    def hold(self, interval_s: float) -> Iterator[None]:
        with self._lock:
            self._serving += 1
            if self._serving == 1:
                self._apply(interval_s)
        try:
            yield
        finally:
            with self._lock:
                self._serving -= 1
                if self._serving == 0:
                    self._undo()

    def _apply(self, interval_s: float) -> None:
        # The objects alive at start (the embedding model, torch, transformers: ~520k of them)
        # sit in the collector's permanent generation while serving. A full collection walks
        # every tracked object, and with the model loaded one took far longer than the 50 ms
        # lookup budget, while the process runs no Python: every lookup in flight missed it
        # (bench_gateway_semantic: gateway_semantic_load; docs/benchmarks.md). Frozen, a full
        # collection walks only what serving made. The young generations are collected first
        # (~1 ms), so little garbage is frozen; what is, is collected after serving.
        gc.collect(1)
        gc.freeze()
        self._interval_before = sys.getswitchinterval()
        sys.setswitchinterval(interval_s)

    def _undo(self) -> None:
        gc.unfreeze()
        sys.setswitchinterval(self._interval_before)


# The GIL's switch interval while serving (CPython's default: 5 ms). A semantic lookup runs on
# a thread beside the event loop, and each of its blocking calls (Redis round trips, the wait
# for its embedding pass, the vector search) gives the GIL away; to get it back the thread
# waits until the loop, running Python, is asked to let go, one interval later. Six short
# waits beside a busy Python thread took p50/p90 17/41 ms at 5 ms here, 12/15 ms at 1 ms,
# against a 50 ms lookup budget; gateway_semantic_load: within_budget_share 0.973 at 1 ms
# (load average 2.5 -> 1.5) against 0.931 at 5 ms (3.2 -> 2.8).
SWITCH_INTERVAL_S = 0.001
WHILE_SERVING = _WhileServing()


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # see the module docstring


class GatewayServer(Startable):
    def __init__(self, parts: GatewayParts, host: str = "127.0.0.1", port: int = 0) -> None:
        self.parts = parts
        # Bound and listening here, so the port is known before serving starts, and a client
        # told the URL (the CLI's banner) may connect at once: the kernel queues it until
        # uvicorn accepts. Bound alone, it refused connections until then.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(_BACKLOG)
        self.host, self.port = host, int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            wrap(build_app(parts)),
            loop="uvloop",
            http="httptools",
            lifespan="on",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=int(max(1, parts.opts.drain_s)),
            timeout_keep_alive=30,
            backlog=_BACKLOG,
        )
        self._server = _Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serve(self) -> None:
        """Serve until stop() (blocks; run it on the main thread or in start())."""
        with WHILE_SERVING.hold(SWITCH_INTERVAL_S):
            self._server.run(sockets=[self._sock])

    def stop(self) -> None:
        """Begin the drain (safe from any thread or a signal handler)."""
        self.parts.draining = True
        notice = self.parts.opts.drain_notice_s
        if notice <= 0:
            self._server.should_exit = True
            return
        timer = threading.Timer(notice, self._close_listener)
        timer.daemon = True
        timer.start()

    def _close_listener(self) -> None:
        self._server.should_exit = True

    # -- in a thread (tests, the demo) --

    def start(self) -> Self:
        self._thread = threading.Thread(target=self.serve, name="stoker-gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + _START_S
        tick = threading.Event()
        while not self._server.started:  # bounded: the thread died, or the deadline passed
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ServiceStartError(f"the gateway did not start on {self.url}")
            tick.wait(0.01)
        return self

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def close(self) -> None:
        """Drain and wait for the thread (bounded by the drain and 10 s more)."""
        self.stop()
        self.join(self.parts.opts.drain_s + 10)
