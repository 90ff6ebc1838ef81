"""The simulator's OpenAI-compatible HTTP face: a small HTTP/1.1 keep-alive server on asyncio.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
GET /metrics (the prefix cache's vllm:prefix_cache_queries_total / _hits_total, in tokens, and
its size in vllm:cache_config_info, as vLLM exports them), POST /sim/slots {"slots": n} (change
capacity at run time), POST /sim/restart (empty the prefix cache, as a restart or a deploy of
new weights does). Usage carries `gpu_ms`, an extension field, so the cache can record what a
miss costs.

`"stream": true` answers Server-Sent Events as OpenAI and vLLM do: `data: <chunk JSON>\n\n`
events (chat: a role delta, content deltas of a few tokens, an empty delta with finish_reason;
completions: text chunks, then an empty one with finish_reason), one usage chunk with no
choices if `stream_options.include_usage`, then `data: [DONE]`. The body is chunked so the
connection stays alive (close-delimited when the client asked for close). Chunks arrive as the
simulated GPU decodes them (simulator.py); the slot is held until the last one, a 429 comes
before any event, and a client that hangs up mid-stream frees its slot (SimStats.aborted).

Run it as a task of your loop (`SimServer.start/stop`), in a background thread
(`SimulatorThread`, a context manager) or as `stoker sim-backend --port P`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, Self

import orjson

from schemas.codec import NotJsonObject, json_object
from schemas.lifecycle import Startable
from simulation.backend.prefix_cache import PrefixCacheStats
from simulation.backend.simulator import QueueFull, SimAnswer, SimConfig, SimStats, Simulator

LOOPBACK = "127.0.0.1"
MAX_BODY_BYTES = 4 * 1024 * 1024  # 4 MB: a 32k-char prompt is ~128 KB of JSON even escaped
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
}
Reply = tuple[int, Any]
_DONE = b"data: [DONE]\n\n"


class _Text(str):
    """A reply body sent as plain text (Prometheus exposition), not as JSON."""


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str, kind: str) -> Reply:
    return status, {"error": {"message": message, "type": kind, "code": status}}


def _prompt_of(path: str, body: dict[str, Any]) -> str:
    if path.endswith("/chat/completions"):
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("messages must be a non-empty list")
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
            raise BadRequest("every message needs a string content")
        return "\n".join(m["content"] for m in msgs)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string")
    return prompt


def _max_tokens_of(body: dict[str, Any]) -> int | None:
    mt = body.get("max_tokens")
    if mt is None:
        return None
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise BadRequest("max_tokens must be an integer >= 1")
    return mt


def _stream_options_of(body: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage). null means absent, as OpenAI reads it; stream_options without
    stream is ignored (OpenAI would 400) so non-streamed requests behave as they always did."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean")
    opts = body.get("stream_options")
    if opts is None or not stream:
        return bool(stream), False
    if not isinstance(opts, dict):
        raise BadRequest("stream_options must be an object")
    include = opts.get("include_usage", False)
    if not isinstance(include, bool):
        raise BadRequest("stream_options.include_usage must be a boolean")
    return True, include


def _usage(a: SimAnswer) -> dict[str, Any]:
    return {
        "prompt_tokens": a.tokens_in,
        "completion_tokens": a.tokens_out,
        "total_tokens": a.tokens_in + a.tokens_out,
        "gpu_ms": a.gpu_ms,
    }


def _completion_id(a: SimAnswer) -> str:
    return "simcmpl-" + hashlib.sha256(a.text.encode()).hexdigest()[:16]


def _completion(path: str, model: str, a: SimAnswer) -> dict[str, Any]:
    usage = _usage(a)
    chat = path.endswith("/chat/completions")
    choice: dict[str, Any] = {"index": 0, "finish_reason": a.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": a.text}
    else:
        choice["text"] = a.text
    return {
        "id": _completion_id(a),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


@dataclass(frozen=True)
class StreamJob:
    """A validated `"stream": true` request, to be answered as events by SimServer._stream."""

    chat: bool
    model: str
    answer: SimAnswer
    include_usage: bool


class _Events:
    """The event bytes of one streamed answer, in OpenAI's chunk shapes: every chunk carries the
    same id and created. With include_usage every chunk but the last has usage null, as OpenAI."""

    def __init__(self, job: StreamJob) -> None:
        self.job = job
        self._head: dict[str, Any] = {
            "id": _completion_id(job.answer),
            "object": "chat.completion.chunk" if job.chat else "text_completion",
            "created": int(time.time()),
            "model": job.model,
        }
        if job.include_usage:
            self._head["usage"] = None

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**self._head, "choices": choices, **extra}) + b"\n\n"

    def _choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        if self.job.chat:  # None: the closing chunk, whose delta is empty
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "finish_reason": finish}
        return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}

    def first(self) -> bytes | None:
        if not self.job.chat:
            return None  # completions have no role to announce
        delta = {"role": "assistant", "content": ""}
        return self._event([{"index": 0, "delta": delta, "finish_reason": None}])

    def content(self, text: str) -> bytes:
        return self._event([self._choice(text, None)])

    def last(self, ran: SimAnswer) -> list[bytes]:
        """The finish chunk, the usage chunk if asked for (of the answer as it ran), and [DONE]."""
        out = [self._event([self._choice(None, ran.finish_reason)])]
        if self.job.include_usage:
            out.append(self._event([], usage=_usage(ran)))
        return [*out, _DONE]


class _EventWriter:
    """Writes the event-stream head and events; chunked on keep-alive, raw when closing."""

    def __init__(self, w: asyncio.StreamWriter, close: bool) -> None:
        self._w = w
        self._chunked = not close

    async def head(self) -> None:
        framing = "transfer-encoding: chunked\r\n" if self._chunked else "connection: close\r\n"
        self._w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            + framing.encode("latin-1")
            + b"\r\n"
        )
        await self._w.drain()

    async def send(self, event: bytes) -> None:
        # drain after every event: a client that hung up shows here as ConnectionError, so the
        # stream stops at once instead of writing into a dead socket until the answer ends
        self._w.write(b"%x\r\n%b\r\n" % (len(event), event) if self._chunked else event)
        await self._w.drain()

    async def end(self) -> None:
        if self._chunked:
            self._w.write(b"0\r\n\r\n")
            await self._w.drain()


class SimServer:
    """The HTTP server around one Simulator. start/stop on the caller's loop."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.sim = Simulator(config)
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def start(self, host: str = LOOPBACK, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, host, port, backlog=1024)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, cancel every open connection and wait for them: nothing lingers."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        conns = list(self._conns)
        for t in conns:
            t.cancel()
        await asyncio.gather(*conns, return_exceptions=True)

    async def serve_forever(self) -> None:
        assert self._server is not None, "start() first"
        await self._server.serve_forever()

    # -- connections --

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while await self._one_exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away or sent garbage: drop the connection
        except asyncio.CancelledError:
            # stop() cancels open connections. Ending normally here matters: asyncio's
            # start_server callback calls task.exception() on the finished task, which raises
            # (and logs an error) when the task itself ended cancelled.
            pass
        finally:
            # Still in _conns while the socket closes, so stop() waits for this too: removed
            # before, a handler closing when the loop stopped was left pending ("Task was
            # destroyed but it is pending" at exit). A cancel here ends it, as above.
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()
            self._conns.discard(task)

    async def _one_exchange(self, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        line = await reader.readline()
        if not line.strip():
            return False
        parts = line.decode("latin-1").split()
        headers: dict[str, str] = {}
        while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if len(parts) != 3:
            await self._write(w, *_error(400, "bad request line", "invalid_request"), close=True)
            return False
        method, target, version = parts
        reply = await self._read_and_route(reader, headers, method, target)
        close = version != "HTTP/1.1" or headers.get("connection", "").lower() == "close"
        if isinstance(reply, StreamJob):
            await self._stream(w, reply, close)
        else:
            await self._write(w, *reply, close=close)
        return not close

    async def _read_and_route(
        self, reader: asyncio.StreamReader, headers: dict[str, str], method: str, target: str
    ) -> Reply | StreamJob:
        if "chunked" in headers.get("transfer-encoding", ""):
            return _error(411, "send Content-Length, not chunked bodies", "invalid_request")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return _error(400, "bad Content-Length", "invalid_request")
        if length > MAX_BODY_BYTES:
            return _error(413, f"body over {MAX_BODY_BYTES} bytes", "invalid_request")
        body = await reader.readexactly(length) if length else b""
        try:
            return await self._route(method, target.split("?", 1)[0], body)
        except BadRequest as e:
            return _error(e.status, str(e), "invalid_request")

    async def _write(self, w: asyncio.StreamWriter, status: int, payload: Any, close: bool) -> None:
        text = isinstance(payload, _Text)
        data = payload.encode() if text else orjson.dumps(payload)
        kind = "text/plain; version=0.0.4" if text else "application/json"
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"content-type: {kind}\r\ncontent-length: {len(data)}\r\n"
            + ("retry-after: 1\r\n" if status == 429 else "")
            + ("connection: close\r\n" if close else "")
            + "\r\n"
        )
        w.write(head.encode("latin-1") + data)
        await w.drain()

    # -- routes --

    async def _stream(self, w: asyncio.StreamWriter, job: StreamJob, close: bool) -> None:
        try:
            await self._send_events(_EventWriter(w, close), job)
        except QueueFull as e:  # raised on taking the slot, before the head: a plain 429
            await self._write(w, *_error(429, f"overloaded: {e}", "overloaded"), close=close)
        except ConnectionError:
            self.sim.stats.aborted += 1  # the slot is already back (streaming's own finally)
            raise  # _handle drops the connection

    async def _send_events(self, out: _EventWriter, job: StreamJob) -> None:
        events = _Events(job)
        async with self.sim.streaming(job.answer) as run:
            await out.head()
            if (first := events.first()) is not None:
                await out.send(first)
            async for text in run.chunks:
                await out.send(events.content(text))
        # the generation is over and its slot free: the closing events cost no GPU time
        for event in events.last(run.answer):
            await out.send(event)
        await out.end()

    async def _route(self, method: str, path: str, body: bytes) -> Reply | StreamJob:
        if path in ("/v1/chat/completions", "/v1/completions"):
            if method != "POST":
                return _error(405, "use POST", "invalid_request")
            return await self._generate(path, self._json(body))
        if path == "/sim/slots" and method == "POST":
            slots = self._json(body).get("slots")
            if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
                raise BadRequest("slots must be an integer >= 0")
            self.sim.set_slots(slots)
            return 200, asdict(self.sim.stats)
        if path == "/sim/restart" and method == "POST":
            self.sim.restart()
            return 200, asdict(self.sim.stats)
        if path == "/metrics" and method == "GET":
            return 200, _Text(self._metrics())
        if path == "/health" and method == "GET":
            return 200, {"status": "ok", **asdict(self.sim.stats)}
        if path == "/v1/models" and method == "GET":
            models = [{"id": m, "object": "model", "owned_by": "stoker-sim"} for m in self.models]
            return 200, {"object": "list", "data": models}
        return _error(404, f"no route {method} {path}", "not_found")

    @property
    def models(self) -> tuple[str, ...]:
        return self.sim.config.models

    def _metrics(self) -> str:
        """Prometheus text: the prefix-cache counters under the names vLLM V1 exports, so a
        dashboard or a test reads the hit rate here as it would of vLLM."""
        st = self.sim.prefix_cache.stats
        lines = []
        for name, value, what in (
            ("prefix_cache_queries", st.queries, "Prefix cache queries, in tokens."),
            ("prefix_cache_hits", st.hits, "Prefix cache hits, in tokens."),
        ):
            lines += [
                f"# HELP vllm:{name}_total {what}",
                f"# TYPE vllm:{name}_total counter",
                f'vllm:{name}_total{{model_name="{self.models[0]}"}} {value}',
            ]
        # The engine's cache config, as vLLM exports it: what a prefix warm sizes itself to.
        pc = self.sim.prefix_cache
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{pc.block_tokens}",'
            f'enable_prefix_caching="{pc.enabled}",num_gpu_blocks="{pc.capacity_blocks}"}} 1.0',
        ]
        # The engine's state, under vLLM V1's names: requests in a batch slot and waiting for
        # one, and the KV cache in use. The simulator keeps no per-request KV, so each busy
        # slot stands for an equal share of the cache (a full batch: the whole cache).
        st2 = self.sim.stats
        usage = st2.busy / st2.slots if st2.slots else 1.0
        gauges: tuple[tuple[str, float, str], ...] = (
            ("num_requests_running", st2.busy, "Number of requests in model execution batches."),
            ("num_requests_waiting", st2.queued, "Number of requests waiting to be processed."),
            ("kv_cache_usage_perc", min(1.0, usage), "KV-cache usage. 1 means 100 percent."),
        )
        # The time spent on the answers served, as vLLM V1's histogram of it (one bucket).
        name = "vllm:request_inference_time_seconds"
        lines += [
            f"# HELP {name} Histogram of time spent in RUNNING phase for request.",
            f"# TYPE {name} histogram",
            f'{name}_bucket{{le="+Inf",model_name="{self.models[0]}"}} {st2.served}',
            f'{name}_sum{{model_name="{self.models[0]}"}} {st2.busy_s!r}',
            f'{name}_count{{model_name="{self.models[0]}"}} {st2.served}',
        ]
        lines += [
            "# HELP process_start_time_seconds Start time of the process since unix epoch.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.sim.started_at!r}",
        ]
        for gauge, level, help_ in gauges:
            lines += [
                f"# HELP vllm:{gauge} {help_}",
                f"# TYPE vllm:{gauge} gauge",
                f'vllm:{gauge}{{model_name="{self.models[0]}"}} {level}',
            ]
        return "\n".join(lines) + "\n"

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            return json_object(body)
        except NotJsonObject as e:
            raise BadRequest(f"body {e}") from e

    async def _generate(self, path: str, body: dict[str, Any]) -> Reply | StreamJob:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model must be a non-empty string")
        prompt = _prompt_of(path, body)
        stream, include_usage = _stream_options_of(body)
        if stream:  # the slot is taken by _stream, which owns the connection from here
            answer = self.sim.answer_for(model, prompt, _max_tokens_of(body))
            chat = path.endswith("/chat/completions")
            return StreamJob(chat, model, answer, include_usage)
        try:
            answer = await self.sim.generate(model, prompt, _max_tokens_of(body))
        except QueueFull as e:
            return _error(429, f"overloaded: {e}", "overloaded")
        return 200, _completion(path, model, answer)


class SimulatorThread(Startable):
    """A SimServer on its own event loop in a daemon thread, for tests and benchmarks.

    `with SimulatorThread(cfg) as sim: ... sim.url ...`; exit stops the server, the loop
    and joins the thread (bounded waits), so nothing outlives the block."""

    START_TIMEOUT_S = 10.0

    def __init__(self, config: SimConfig | None = None, port: int = 0) -> None:
        self.server = SimServer(config)
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="stoker-sim", daemon=True)
        self._started: Future[None] = Future()

    @property
    def url(self) -> str:
        return self.server.url

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start(port=self._port))
        except BaseException as e:  # hand the failure to start(), then end the thread
            self._started.set_exception(e)
            self._loop.close()
            return
        self._started.set_result(None)
        self._loop.run_forever()
        self._loop.run_until_complete(self.server.stop())
        self._loop.close()

    def start(self) -> Self:
        self._thread.start()
        self._started.result(timeout=self.START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=self.START_TIMEOUT_S)

    def _call(self, fn: Any, *args: Any) -> Any:
        """Run fn on the simulator's loop and wait for its result (bounded)."""
        fut: Future[Any] = Future()

        def run() -> None:
            try:
                fut.set_result(fn(*args))
            except Exception as e:
                fut.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return fut.result(timeout=self.START_TIMEOUT_S)

    def set_slots(self, n: int) -> None:
        self._call(self.server.sim.set_slots, n)

    def set_answer(self, prompt: str, answer: str) -> None:
        self._call(self.server.sim.set_answer, prompt, answer)

    def restart(self) -> None:
        self._call(self.server.sim.restart)

    def prefix_stats(self) -> PrefixCacheStats:
        st = self.server.sim.prefix_cache.stats
        s: PrefixCacheStats = self._call(lambda: PrefixCacheStats(st.queries, st.hits))
        return s

    def stats(self) -> SimStats:
        s: SimStats = self._call(lambda: SimStats(**asdict(self.server.sim.stats)))
        return s
