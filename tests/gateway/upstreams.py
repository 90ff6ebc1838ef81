"""Real HTTP upstreams for the gateway tests: any ASGI app served by uvicorn on loopback in a
thread, and a scripted OpenAI-compatible server that records what it was sent."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.waiting import wait_for


class _Quiet(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # pragma: no cover - older uvicorn
        return None


class Served:
    """`with Served(app) as s: s.url ...`: uvicorn on a free loopback port in a thread."""

    def __init__(self, app: Any, port: int = 0) -> None:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        cfg = uvicorn.Config(app, log_level="warning", lifespan="off", loop="asyncio")
        self._server = _Quiet(cfg)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])), daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        wait_for(lambda: self._server.started or not self._thread.is_alive(), 10,
                 "the upstream to start", 0.005)  # fmt: skip
        assert self._server.started, "upstream did not start"
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.should_exit = True
        self._thread.join(10)


@dataclass
class Script:
    """What the scripted upstream answers (every field may be changed by a test)."""

    text: str = "the scripted answer"
    finish_reason: str = "stop"
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    status: int = 200
    delay_s: float = 0.0
    cut_stream_after: int | None = None  # stop the stream after this many chunks (no [DONE])
    hold_after_done_s: float = 0.0  # keep the body open this long after [DONE]
    seen: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def calls(self) -> int:
        return len(self.seen)


def scripted_app(script: Script) -> Starlette:
    """An OpenAI-compatible upstream that answers as `script` says and records every body."""

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        script.seen.append(body)
        script.headers.append(dict(request.headers))
        if script.delay_s:
            await asyncio.sleep(script.delay_s)
        if script.status != 200:
            err = {"error": {"message": "scripted failure", "type": "server_error"}}
            return Response(orjson.dumps(err), script.status, media_type="application/json")
        if body.get("stream"):
            return StreamingResponse(_chunks(script, body), media_type="text/event-stream")
        msg: dict[str, Any] = {"role": "assistant", "content": script.text}
        if script.reasoning is not None:
            msg["reasoning_content"] = script.reasoning
        if script.tool_calls:
            msg["tool_calls"] = script.tool_calls
        answer = {
            "id": "up-1", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": msg, "finish_reason": script.finish_reason}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
        }  # fmt: skip
        return Response(orjson.dumps(answer), media_type="application/json")

    async def models(_: Request) -> Response:
        return Response(orjson.dumps({"object": "list", "data": [{"id": "scripted"}]}))

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


async def _chunks(script: Script, body: dict[str, Any]) -> AsyncIterator[bytes]:
    base = {"id": "up-s", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
    first: dict[str, Any] = {"role": "assistant", "content": ""}
    if script.reasoning is not None:
        first["reasoning_content"] = script.reasoning
    deltas: list[dict[str, Any]] = [first]
    words = script.text.split(" ")
    deltas += [{"content": (" " if i else "") + w} for i, w in enumerate(words)]
    for i, call in enumerate(script.tool_calls or ()):
        fn = call["function"]
        deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                       "function": {"name": fn["name"], "arguments": ""}}]})  # fmt: skip
        half = len(fn["arguments"]) // 2
        for part in (fn["arguments"][:half], fn["arguments"][half:]):
            deltas.append({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
    for n, d in enumerate(deltas):
        if script.cut_stream_after is not None and n >= script.cut_stream_after:
            return
        yield _sse({**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]})
        await asyncio.sleep(0)
    yield _sse(
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": script.finish_reason}]}
    )
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
        yield _sse({**base, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"
    await asyncio.sleep(script.hold_after_done_s)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"
