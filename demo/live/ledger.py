"""The live demo's ledger: every answer the real model wrote, and what it read to write it.

A relay on a loopback port stands in front of the one llama-server that runs. Every caller of
the model reaches it on a path of its own, so each generation says who asked for it:
`/live/v1` (the gateway's misses), `/warm/v1` (the scheduled warm), `/deploy/v1` (the deploy's
hot-set pre-warm), `/rewarm/v1` (the re-warm after a knowledge-base change), `/prefix/v1` (the
prefix warms) and `/probe/v1` (the TTFT probes). It forwards each request as it came, streams
chunk by chunk, and every other path (`/metrics`, `/v1/models`, `/health`) as is.

For each chat completion it keeps what the model read (the tenant whose system prompt opened
the request, the help-center articles by their revision markers, the user's question: see
demo.live.texts) and what it wrote (the text, its finish reason) with the server's own
`timings`. The scorer (demo.live.score) attributes every served text from these records
alone; nothing that serves or warms reads them. A relay hop costs ~1 ms on loopback against a
model's 0.3-30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from demo.live.texts import revisions_in, tenant_of
from stoker.embedded import LOOPBACK

SOURCES = ("live", "warm", "deploy", "rewarm", "prefix", "probe")
# Response headers a caller may need back (the rest are the hop's own).
_PASS_HEADERS = ("content-type", "retry-after", "x-request-id")
_START_S = 10.0


@dataclass(frozen=True)
class Generation:
    """One chat completion the model ran, as the relay saw it."""

    source: str  # one of SOURCES: who asked
    server: int  # which llama-server process answered (the demo numbers each start)
    tenant: str | None  # whose system prompt opened the request (None: no known tenant's)
    docs: tuple[tuple[str, int], ...]  # the articles it read: (doc id, revision)
    question: str  # the last user message
    text: str
    finish: str | None
    status: int  # the server's HTTP status; 0: it could not be reached
    started: float  # time.time() when the request reached the relay
    ended: float  # ... and when its last byte left
    prompt_ms: float = 0.0  # the server's own timings (llama.cpp's `timings`)
    predicted_ms: float = 0.0
    prompt_n: int = 0
    cache_n: int = 0

    @property
    def backend_ms(self) -> float:
        """What the model spent on it: prefill and decode, by its own clock."""
        return self.prompt_ms + self.predicted_ms

    @property
    def storable(self) -> bool:
        """Whether a cache could hold this answer: a whole one (finish stop), status 200."""
        return self.status == 200 and self.finish == "stop"


@dataclass
class Reading:
    """What a response said, fed as it arrives (a JSON body, or an SSE stream)."""

    parts: list[str] = field(default_factory=list)
    finish: str | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    _rest: bytes = b""

    def feed_sse(self, chunk: bytes) -> None:
        data = self._rest + chunk
        *lines, self._rest = data.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                try:
                    self.take(orjson.loads(line[5:]))
                except orjson.JSONDecodeError:
                    continue

    def take(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        for choice in obj.get("choices") or ():
            piece = (choice.get("delta") or choice.get("message") or {}).get("content")
            if isinstance(piece, str):
                self.parts.append(piece)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
        if isinstance(obj.get("timings"), dict):
            self.timings = obj["timings"]


def asked(body: Mapping[str, Any]) -> tuple[str | None, tuple[tuple[str, int], ...], str]:
    """(tenant, articles, question) of a chat body, from its messages alone."""
    messages = body.get("messages") or []
    system = next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    docs = tuple(sorted(revisions_in(system).items()))
    return tenant_of(system), docs, users[-1] if users else ""


class Ledger:
    """The relay and its records (module docstring). start() binds a free port; `url(source)`
    is the base URL a caller of that source is given; `server` is set by the demo at each
    start of llama-server, and stamped on what follows."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")  # the server's root: http://127.0.0.1:PORT
        self.server = 0
        self.generations: list[Generation] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    def url(self, source: str) -> str:
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}; one of {', '.join(SOURCES)}")
        return f"http://{LOOPBACK}:{self.port}/{source}/v1"

    def records(self) -> list[Generation]:
        with self._lock:
            return list(self.generations)

    # -- lifecycle --

    def start(self) -> Ledger:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="demo-ledger")
        self._thread.daemon = True
        self._thread.start()
        if not ready.wait(_START_S) or not self.port:
            raise RuntimeError("the demo's ledger relay did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and self._runner is not None:
            fut = asyncio.run_coroutine_threadsafe(self._close(), loop)
            fut.result(_START_S)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(_START_S)
        self._loop = self._thread = None

    def __enter__(self) -> Ledger:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._open())
        ready.set()
        loop.run_forever()
        loop.close()

    async def _open(self) -> None:
        # a fresh connection per request: llama-server is restarted on the same port, and a
        # kept-alive connection to the process before would fail the first request after
        connector = aiohttp.TCPConnector(force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=600)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        app = web.Application(client_max_size=8 << 20)
        app.router.add_post("/{source}/v1/chat/completions", self._chat)
        app.router.add_route("*", "/{source}/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((LOOPBACK, 0))  # bound here, so the port is known before serving starts
        self.port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- the relay --

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        source = request.match_info["source"]
        raw = await request.read()
        started = time.time()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = {}
        tenant, docs, question = asked(body if isinstance(body, dict) else {})
        reading = Reading()
        status = 0
        assert self._session is not None
        try:
            async with self._session.post(
                f"{self.upstream}/v1/chat/completions",
                data=raw,
                headers={"Content-Type": "application/json"},
            ) as up:
                status = up.status
                if body.get("stream") and status == 200:
                    resp: web.StreamResponse = await self._stream(request, up, reading)
                else:
                    data = await up.read()
                    if status == 200:
                        reading.take(orjson.loads(data))
                    resp = web.Response(body=data, status=status, headers=_kept(up.headers))
        except (aiohttp.ClientError, OSError) as e:
            msg = f"model server at {self.upstream} unreachable: {type(e).__name__}"
            err = {"error": {"message": msg, "type": "server_error", "code": "unreachable"}}
            resp = web.json_response(err, status=502)
        t = reading.timings
        gen = Generation(
            source=source, server=self.server, tenant=tenant, docs=docs, question=question,
            text="".join(reading.parts), finish=reading.finish, status=status,
            started=started, ended=time.time(),
            prompt_ms=float(t.get("prompt_ms") or 0.0),
            predicted_ms=float(t.get("predicted_ms") or 0.0),
            prompt_n=int(t.get("prompt_n") or 0), cache_n=int(t.get("cache_n") or 0),
        )  # fmt: skip
        with self._lock:
            self.generations.append(gen)
        return resp

    async def _stream(
        self, request: web.Request, up: aiohttp.ClientResponse, reading: Reading
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=up.status, headers=_kept(up.headers))
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            reading.feed_sse(chunk)
            try:
                await resp.write(chunk)
            except ConnectionResetError:  # the caller left; read on, so the record is whole
                continue
        reading.feed_sse(b"\n")
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    async def _other(self, request: web.Request) -> web.StreamResponse:
        tail = request.match_info["tail"]
        assert self._session is not None
        try:
            async with self._session.request(
                request.method,
                f"{self.upstream}/{tail}",
                params=request.query,
                data=await request.read() or None,
                headers={"Content-Type": request.headers.get("Content-Type", "text/plain")},
            ) as up:
                return web.Response(
                    body=await up.read(), status=up.status, headers=_kept(up.headers)
                )
        except (aiohttp.ClientError, OSError) as e:
            return web.Response(status=502, text=f"model server unreachable: {e}")


def _kept(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in _PASS_HEADERS}
