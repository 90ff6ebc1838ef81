"""The gateway's ASGI app: routes, OpenAI-shaped errors, health, readiness and /metrics.

Routes: POST /v1/chat/completions, /v1/completions (through the cache), /v1/embeddings (through
the embedding cache), GET /v1/models (passed through), /healthz (the process answers),
/readyz (503 while draining; the body says which dependency answers, and whether the upstream
does), /metrics (Prometheus).
Every error is {"error": {message, type, param, code}} with its status (errors.py).
From start to shutdown the upstream is watched (health.py: GET <base>/models, beside serving,
never blocking it): the log says what answered at start, the models it serves or why it did not
(an upstream that starts after the gateway is not an error; its requests answer 502 meanwhile),
and then each time it goes down or comes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics as M
from gateway.cachegate import CacheGate
from gateway.completions import Completions
from gateway.embeddings import Embeddings
from gateway.errors import GatewayError, MethodNotAllowed, NotFound, error_response
from gateway.health import UpstreamHealth
from gateway.options import GatewayOptions
from gateway.requestlog import RequestLog
from gateway.upstream import Upstream

log = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]
_CONNECT_S = 3.0  # the start-up connect's bound (below the server's start deadline)


@dataclass
class GatewayParts:
    """What the shell builds and hands the app; the app closes them at shutdown."""

    gate: CacheGate
    upstream: Upstream
    health: UpstreamHealth
    log: RequestLog
    opts: GatewayOptions
    on_shutdown: list[Callable[[], None]] = field(default_factory=list)
    draining: bool = False


def build_app(parts: GatewayParts) -> Starlette:
    completions = Completions(parts.gate, parts.upstream, parts.health, parts.log, parts.opts)
    embeddings = Embeddings(parts.gate, parts.upstream, parts.health, parts.opts)

    async def chat(request: Request) -> Response:
        return await completions.handle(request, "chat")

    async def completion(request: Request) -> Response:
        return await completions.handle(request, "completion")

    async def models(request: Request) -> Response:
        reply = await parts.upstream.get(
            "/v1/models", parts.upstream.headers_for(dict(request.headers))
        )
        return Response(reply.content, reply.status, reply.headers)

    async def healthz(_: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(_: Request) -> Response:
        redis_up = await parts.gate.ping()
        doc = {
            "status": "draining" if parts.draining else "ready",
            "redis": redis_up,
            "upstream": parts.health.state,  # not readiness: cached answers are served without
            "upstream_url": parts.upstream.shown,
            "upstream_detail": parts.health.detail,
        }
        return _json(doc, 503 if parts.draining else 200)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> Any:
        # Connect before the first request, so it does not pay for the handshake (a cluster's
        # slot map too) inside its lookup budget. Bounded: a gateway whose Redis is down still
        # starts, and serves failed open.
        with suppress(TimeoutError):
            await asyncio.wait_for(parts.gate.ping(), _CONNECT_S)
        watch = asyncio.create_task(parts.health.watch())
        yield
        watch.cancel()
        with suppress(asyncio.CancelledError):
            await watch
        parts.draining = True
        await parts.upstream.aclose()
        await parts.gate.aclose()
        parts.log.close()
        for stop in parts.on_shutdown:
            stop()

    routes = [
        Route("/v1/chat/completions", _guarded(chat), methods=["POST"]),
        Route("/v1/completions", _guarded(completion), methods=["POST"]),
        Route("/v1/embeddings", _guarded(embeddings.handle), methods=["POST"]),
        Route("/v1/models", _guarded(models), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},  # type: ignore[dict-item]
    )
    return app


def wrap(app: ASGIApp) -> ASGIApp:
    """The app with the response counter (a plain ASGI callable, as Starlette's middleware)."""
    return CountResponses(app)


def _guarded(endpoint: Endpoint) -> Endpoint:
    """A GatewayError becomes its OpenAI-shaped response; anything else a 500 of that shape."""

    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except GatewayError as e:
            return error_response(e)
        except Exception:
            log.exception("gateway: %s %s failed", request.method, request.url.path)
            return error_response(GatewayError("internal error in the gateway"))

    return run


async def _http_error(_: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        return error_response(NotFound("no such route"))
    if exc.status_code == 405:
        return error_response(MethodNotAllowed("method not allowed on this route"))
    err = GatewayError(str(exc.detail))
    err.status = exc.status_code
    return error_response(err)


def _json(doc: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status, media_type="application/json")


class CountResponses:
    """Counts responses by route and status class, and requests in flight."""

    _ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self._ROUTES else "other"

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                M.HTTP.labels(route=route, status=f"{message['status'] // 100}xx").inc()
            await send(message)

        M.IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, counted)
        finally:
            M.IN_FLIGHT.dec()
