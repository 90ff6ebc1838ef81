"""Fixtures for the backend client and the engine reader: a scripted OpenAI-compatible server
on loopback (real HTTP, answers given in order) and the simulated backend (llama-servers:
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.gateway.upstreams import Served


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # JSON-encoded unless bytes
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Scripted:
    """What the scripted server answers, in order (the last one again once they run out), and
    what it was sent."""

    answers: list[Answer]
    paths: list[str] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> Starlette:
        async def any_route(request: Request) -> Response:
            import asyncio

            raw = await request.body()
            self.paths.append(request.url.path)
            self.bodies.append(orjson.loads(raw) if raw else None)
            self.headers.append(dict(request.headers))
            a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            if a.delay_s:
                await asyncio.sleep(a.delay_s)
            content = a.body if isinstance(a.body, bytes) else orjson.dumps(a.body)
            return Response(content, a.status, headers=a.headers, media_type="application/json")

        return Starlette(routes=[Route("/{path:path}", any_route, methods=["GET", "POST"])])


@pytest.fixture
def scripted() -> Iterator[Callable[..., tuple[str, Scripted]]]:
    """scripted(*answers) -> (the server's URL, its script); every server stopped at the end."""
    running: list[Served] = []

    def start(*answers: Answer) -> tuple[str, Scripted]:
        script = Scripted(list(answers) or [Answer(body={})])
        served = Served(script.app()).__enter__()
        running.append(served)
        return served.url, script

    yield start
    for s in running:
        s.__exit__(None, None, None)
