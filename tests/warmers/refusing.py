"""A backend that refuses most sends: a real HTTP proxy in front of the simulated backend that
forwards only the requests `allow` accepts and answers the rest 503, as an overloaded or
half-broken fleet does."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def refusing_proxy(upstream: str, allow: Callable[[bytes], bool]) -> Starlette:
    """Forwards POSTs whose raw body `allow` accepts to `upstream`; counts what it refused."""
    refused: list[bytes] = []

    async def forward(request: Request) -> Response:
        body = await request.body()
        if not allow(body):
            refused.append(body)
            return Response(b'{"error": {"message": "refused", "type": "server_error"}}', 503)
        async with httpx.AsyncClient(base_url=upstream, timeout=30) as c:
            up = await c.post(
                request.url.path, content=body, headers={"content-type": "application/json"}
            )
        return Response(up.content, up.status_code, media_type="application/json")

    app = Starlette(routes=[Route(p, forward, methods=["POST"])
                            for p in ("/v1/chat/completions", "/v1/completions")])  # fmt: skip
    app.state.refused = refused
    return app
