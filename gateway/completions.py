"""POST /v1/chat/completions and /v1/completions through the cache.

One request, in order:
1. read the body (bounded), resolve its cache identity (identity.py): a bad request is a 400
   before anything else happens; a model the upstream does not list is vetted (health.py:
   a warning header, or a 404 with strict models);
2. look the cache up within the budget (cachegate.py); a failure or timeout is a bypass;
3. a hit is replayed: JSON, or the SSE stream the upstream would have sent, with
   X-Stoker-Cache / -Rule / -Score / -Key and Age; a negative entry answers 503 (paused);
4. a miss joins the flight of identical misses in progress (flights.py) or leads one: the
   leader calls upstream, streams through to its client while keeping the chunks, and stores
   the answer only if it ended on its own (finish_reason stop or tool_calls, and the stream
   reached [DONE]); an upstream that fails leaves a short negative entry (retry storms);
5. the request goes to the request log (requestlog.py) as RequestLogged v2.
The cache being down never fails a request: it becomes a bypass.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway import metrics as M
from gateway.answers import (
    Assembler,
    SSEReader,
    answer_of,
    answer_of_entry,
    completion_body,
    replay_chunks,
    sse,
    usage_only,
)
from gateway.cachegate import Answer, CacheGate, Decision
from gateway.errors import NegativeCached, PayloadTooLarge, UpstreamFailed
from gateway.flights import Flight, Flights
from gateway.health import UpstreamHealth, warned
from gateway.identity import Api, Resolved, parse_body, resolve
from gateway.options import GatewayOptions
from gateway.requestlog import RequestLog
from gateway.upstream import Stream, Upstream

PATHS: dict[Api, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
_JSON = "application/json"
Shared = tuple[Answer, Decision]  # what a flight's leader hands its followers
_SSE = "text/event-stream"


@dataclass
class Served:
    """What one request got, for its response headers and its log event."""

    outcome: str
    answer: Answer | None = None
    latency_ms: float = 0.0
    coalesced: bool = False


class Completions:
    def __init__(
        self,
        gate: CacheGate,
        upstream: Upstream,
        health: UpstreamHealth,
        log: RequestLog,
        opts: GatewayOptions,
    ) -> None:
        self.gate, self.upstream, self.health, self.log = gate, upstream, health, log
        self.opts = opts
        self.flights: Flights[Shared] = Flights()

    async def handle(self, request: Request, api: Api) -> Response:
        t0 = time.perf_counter()
        raw = await read_body(request, self.opts.max_body_bytes)
        r = resolve(
            api, parse_body(raw, self.opts.max_body_bytes), request.headers, PATHS[api], self.opts
        )
        warning = self.health.vet(r.model_id)  # a 404 before the cache, with strict models
        return warned(await self._answer(request, r, t0), warning)

    async def _answer(self, request: Request, r: Resolved, t0: float) -> Response:
        auth = {"authorization": request.headers.get("authorization", "")}
        key = self._flight_key(r)
        if key is None:
            return await self._serve(r, t0, auth, None, None)
        flight = self.flights.follow(key)
        if flight is None:
            return await self._serve(r, t0, auth, key, self.flights.start(key))
        shared = await flight.wait(self.opts.herd_wait_s)
        if shared is None:  # the leader had nothing to share: on our own
            return await self._serve(r, t0, auth, None, None)
        return self._coalesced(r, shared, t0)

    def _flight_key(self, r: Resolved) -> str | None:
        """Identical requests in flight share one lookup and one upstream call: the key is
        the exact entry key (computed here, no Redis: the live version as last seen). None
        for what is answered alone (sampling, no-cache)."""
        if r.bypass is not None or not r.read:
            return None
        version = r.version_override or self.gate.live.peek(r.model_id, r.tenant)
        return r.cache_request(version).key().exact()

    async def _serve(
        self,
        r: Resolved,
        t0: float,
        auth: dict[str, str],
        key: str | None,
        flight: Flight[Shared] | None,
    ) -> Response:
        """Look up, then answer from the cache or upstream. A leader's flight ends here, or,
        for a streamed miss, when its stream does (the relay owns it then)."""
        try:
            d = await self.gate.lookup(r)
            M.LOOKUP_SECONDS.observe(time.perf_counter() - t0)
            if d.result.hit:
                return self._hit(r, d, t0, flight)
            if d.outcome == "negative":
                raise NegativeCached(
                    "this request failed upstream a few seconds ago; retrying it is paused",
                    self.gate.cache.policy.negative_ttl_s,
                )
            return await self._call(r, d, t0, auth, flight)
        finally:
            if flight is not None and key is not None and not flight.keep:
                self.flights.end(key, flight)

    # -- hits --

    def _hit(self, r: Resolved, d: Decision, t0: float, flight: Flight[Shared] | None) -> Response:
        entry = d.result.entry
        assert entry is not None
        a = answer_of_entry(entry)
        if flight is not None:
            flight.land((a, d))
        headers = self._headers(d) | {
            "age": str(max(0, int(time.time() - entry.provenance.cached_at)))
        }
        self._done(r, d, Served(d.outcome, a, (time.perf_counter() - t0) * 1000))
        return self._render(r, a, d.result.key, headers)

    def _render(self, r: Resolved, a: Answer, seed: str, headers: dict[str, str]) -> Response:
        model = r.model_id
        if r.stream:
            return Response(
                replay_chunks(a, r.api, model, r.include_usage, seed),
                media_type=_SSE,
                headers=headers,
            )
        return Response(completion_body(a, r.api, model, seed), media_type=_JSON, headers=headers)

    def _coalesced(self, r: Resolved, shared: Shared, t0: float) -> Response:
        """Another request's answer (its hit, or its upstream call), as if it were ours."""
        a, d = shared
        M.COALESCED.inc()
        out = self._headers(d) | {"x-stoker-coalesced": "true"}
        self._done(r, d, Served(d.outcome, a, (time.perf_counter() - t0) * 1000, coalesced=True))
        return self._render(r, a, d.result.key, out)

    # -- upstream --

    async def _call(
        self,
        r: Resolved,
        d: Decision,
        t0: float,
        client_headers: dict[str, str],
        flight: Flight[Shared] | None,
    ) -> Response:
        """Call upstream (streamed or not); `flight` (a leader's) is ended by this call."""
        headers = self.upstream.headers_for({k: v for k, v in client_headers.items() if v})
        path = PATHS[r.api]
        try:
            if r.stream:
                return await self._stream(r, d, t0, path, headers, flight)
            return await self._plain(r, d, t0, path, headers, flight)
        except UpstreamFailed:
            self.gate.store_negative_later(d)
            raise

    async def _plain(
        self,
        r: Resolved,
        d: Decision,
        t0: float,
        path: str,
        headers: dict[str, str],
        flight: Flight[Shared] | None,
    ) -> Response:
        reply = await self.upstream.post(path, r.upstream_body, headers)
        M.UPSTREAM_SECONDS.observe(reply.elapsed_ms / 1000)
        a = None
        if reply.status == 200:
            try:
                a = answer_of(r.api, orjson.loads(reply.content), reply.elapsed_ms)
            except orjson.JSONDecodeError:
                raise UpstreamFailed("the upstream answered something that is not JSON") from None
            stored = self._settle(r, d, a, flight)
            if stored is not None:  # read your writes: the next request, or paraphrase, finds it
                await _wait(stored, self.opts.index_wait_s)
        elif reply.status >= 500:
            self.gate.store_negative_later(d)
        self._done(r, d, Served(d.outcome, a, (time.perf_counter() - t0) * 1000))
        return Response(
            reply.content, status_code=reply.status, headers=reply.headers | self._headers(d)
        )

    def _settle(
        self, r: Resolved, d: Decision, a: Answer | None, flight: Flight[Shared] | None
    ) -> asyncio.Event | None:
        """Store a complete answer (a miss, unless no-store) and hand it to the flight's
        followers, also when the cache was bypassed for being slow or down: the request was
        cacheable (else it would have no flight), so its answer is theirs too. The event (set
        once the entry, or the answer's not-stored mark, is searchable) when a store started;
        with a flight, the flight then ends with the exact write (flight.keep), so requests
        arriving before the entry lands still get this answer, not another upstream call."""
        if a is None:
            return None
        shared = flight is not None and a.finish_reason in _SHAREABLE
        if shared:
            flight.land((a, d))  # type: ignore[union-attr]
        if not (r.write and d.outcome == "miss"):
            return None
        if not shared:
            return self.gate.store_later(d, a)
        assert flight is not None

        def landed() -> None:  # on the loop, when the write is over
            self.flights.end(flight.key, flight)

        written = self.gate.store_later(d, a, on_done=landed)
        flight.keep = written is not None
        return written

    async def _stream(
        self,
        r: Resolved,
        d: Decision,
        t0: float,
        path: str,
        headers: dict[str, str],
        flight: Flight[Shared] | None,
    ) -> Response:
        cm = self.upstream.stream(path, _asking_usage(r), headers)
        up = await cm.__aenter__()
        if up.status != 200:
            try:
                content = await up.read()
            finally:
                await cm.__aexit__(None, None, None)
            if up.status >= 500:
                self.gate.store_negative_later(d)
            self._done(r, d, Served(d.outcome, None, (time.perf_counter() - t0) * 1000))
            return Response(content, up.status, up.headers | self._headers(d))
        if flight is not None:
            flight.keep = True  # the relay ends it, when the stream ends
        body = self._relay(r, d, t0, cm, up, flight)
        return StreamingResponse(body, media_type=_SSE, headers=self._headers(d))

    async def _relay(
        self,
        r: Resolved,
        d: Decision,
        t0: float,
        cm: Any,
        up: Stream,
        flight: Flight[Shared] | None,
    ) -> AsyncIterator[bytes]:
        """The upstream's events to the client as they come, kept; at the end (or when the
        client goes away) the stream is closed, stored if whole and logged.

        Whole is what the stream said (a finish_reason, then [DONE]; Assembler.answer), not
        how it ended: the openai SDK closes its connection as soon as it reads [DONE], which
        cancels this generator while it still waits for the upstream's end of body (a streamed
        miss ended so would be dropped: not stored, logged at 0 ms; docs/benchmarks.md, "The
        gateway").
        An upstream that breaks off before [DONE] (killed, its connection lost) ends the stream
        with an OpenAI-shaped error event, which the SDKs raise: an early end alone reads as
        an answer."""
        asm, reader = Assembler(r.api), SSEReader()
        settled: list[asyncio.Event | None] = []  # once settled at [DONE]: the store's event
        try:
            async for events, rest in _reads(up, reader):
                head, tail = _forwarded(r, asm, events)
                if head:
                    yield head
                if tail:  # [DONE]: the answer is whole; its last byte waits for the store
                    settled.append(self._settle(r, d, asm.answer(_ms_since(t0)), flight))
                    if settled[0] is not None:
                        await _wait(settled[0], self.opts.index_wait_s)
                if tail + rest:
                    yield tail + rest
        except UpstreamFailed as e:
            if not asm.done:
                why = f"the upstream stopped mid-answer ({e.message}); nothing was cached, retry"
                yield sse(UpstreamFailed(why, e.status).body())
        finally:
            with anyio.CancelScope(shield=True):  # a client that left cancels us: close anyway
                await cm.__aexit__(None, None, None)
            elapsed = _ms_since(t0)
            M.UPSTREAM_SECONDS.observe(elapsed / 1000)
            a = asm.answer(elapsed)
            if not settled:  # no [DONE] came in a read: whatever the end holds, settle it now
                settled.append(self._settle(r, d, a, flight))
            if settled[0] is None and flight is not None:
                self.flights.end(flight.key, flight)
            self._done(r, d, Served(d.outcome, a, elapsed))

    # -- bookkeeping --

    def _headers(self, d: Decision) -> dict[str, str]:
        res = d.result
        h: dict[str, str] = {"x-stoker-cache": res.outcome}
        if res.key:
            h["x-stoker-key"] = res.key.rsplit(":", 1)[-1]
        if res.hit:
            h["x-stoker-rule"] = res.rule
            if res.entry is not None:  # who filled it: a warm, or a live miss before
                h["x-stoker-source"] = res.entry.provenance.source
        if res.score is not None:  # a hit's, or on a miss the best candidate's
            h["x-stoker-score"] = f"{res.score:.4f}"
        # Why it did not hit: a bypass's reason, or a miss's (semantic_deadline, semantic_unsure
        # with the best candidate's score, semantic_none, ...); an exact-only miss: not cached.
        reason = res.reason or ("" if res.hit or res.outcome != "miss" else _NOT_CACHED)
        if reason:
            h["x-stoker-reason"] = reason[:200]
        if d.model_version:
            h["x-stoker-model-version"] = d.model_version
        return h

    def _done(self, r: Resolved, d: Decision, s: Served) -> None:
        M.served(s.outcome, r.api)
        self.log.offer(log_event(r, d, s, self.opts, self.gate.live.peek(r.model_id, r.tenant)))


# A miss with no semantic layer to ask (or not asked: Cache-Control: no-cache reads nothing).
_NOT_CACHED = "not_cached: no entry for this request"
# Answers a follower may be handed: they ended on their own, as a stored one would have.
_SHAREABLE = frozenset({"stop", "tool_calls"})


def _forwarded(
    r: Resolved, asm: Assembler, events: list[tuple[bytes, bytes | None]]
) -> tuple[bytes, bytes]:
    """The events of one read, kept by `asm`, as the client gets them: all of them, but the
    usage chunk it did not ask for (_asking_usage); split at [DONE] (the events before it,
    then [DONE] and any after it: b"" when this read holds none)."""
    out: list[bytes] = []
    head = None
    for event, payload in events:
        if payload is not None:
            was_done = asm.done
            asm.add(payload)
            if asm.done and not was_done:
                head, out = b"".join(out), []
            elif not r.include_usage and usage_only(payload):
                continue
        out.append(event)
    return (b"".join(out), b"") if head is None else (head, b"".join(out))


async def _reads(
    up: Stream, reader: SSEReader
) -> AsyncIterator[tuple[list[tuple[bytes, bytes | None]], bytes]]:
    """The upstream's events read by read; at the end, a last event the reads held back and
    any unterminated tail, as it came."""
    async for raw in up.chunks():
        yield reader.events(raw), b""
    yield reader.events(b"", last=True), reader.rest()


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def _asking_usage(r: Resolved) -> bytes:
    """A streamed request as sent upstream: with stream_options.include_usage, also when the
    client did not ask. Servers (OpenAI, vLLM, llama.cpp) count a stream's tokens only when
    asked, and an answer stored without them would replay 0 tokens to every later client that
    asks; the relay keeps that chunk from a client that did not."""
    opts = r.body.get("stream_options")
    if r.include_usage or not isinstance(opts, dict | None):
        return r.upstream_body
    return orjson.dumps(r.body | {"stream_options": (opts or {}) | {"include_usage": True}})


async def _wait(ev: asyncio.Event, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(ev.wait(), timeout_s)
    except TimeoutError:
        return  # a slow cache delays no answer past its budget


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it passes `limit` (a chunked upload has no length)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def log_event(
    r: Resolved, d: Decision, s: Served, opts: GatewayOptions, live_version: str
) -> dict[str, Any]:
    """The RequestLogged (schema_version 2) this request publishes, as a dict (schemas/events.py
    has the model; the test suite holds this to it)."""
    res = d.result
    replay = {k: v for k, v in r.body.items() if k not in ("stream", "stream_options")}
    hit = res.hit
    a = s.answer
    event: dict[str, Any] = {
        "type": "request_logged",
        "schema_version": 2,
        "event_id": uuid.uuid4().hex,
        "ts": datetime.now(UTC).isoformat(),
        "request_id": uuid.uuid4().hex,
        "tenant": r.tenant,
        "model_id": r.model_id,
        "model_version": d.model_version or r.version_override or live_version,
        "template_version": r.template_version,
        "prompt": r.question,
        "params": r.params.model_dump(),
        "context_docs": [x.model_dump() for x in r.docs],
        "cache_outcome": s.outcome,
        "latency_ms": round(s.latency_ms, 3),
        "gpu_ms": 0.0 if hit or s.coalesced or a is None else round(a.gpu_ms, 3),
        "tokens_in": a.tokens_in if a else 0,
        "tokens_out": 0 if hit or s.coalesced or a is None else a.tokens_out,
        "route": r.route,
        "request": {"api": r.api, "body": replay},
        "cache_key": res.key.rsplit(":", 1)[-1] if res.key else None,
        "cache_rule": res.rule or None,
        "cache_source": res.entry.provenance.source if hit and res.entry is not None else None,
        "cache_score": None if res.score is None or not hit else max(-1.0, min(1.0, res.score)),
        "doc_generations": res.ticket.doc_generations() if res.ticket is not None else None,
    }
    if a is not None:
        event["answer"] = _logged_answer(a, res.key if hit else None, opts, with_text=not hit)
    return event


def _logged_answer(
    a: Answer, vector_id: str | None, opts: GatewayOptions, *, with_text: bool
) -> dict[str, Any]:
    text = a.text if with_text and len(a.text.encode()) <= opts.log_answer_max_bytes else None
    return {
        "text": text,
        "digest": hashlib.sha256(a.text.encode()).hexdigest(),
        "finish_reason": a.finish_reason,
        "vector_id": vector_id,
    }
