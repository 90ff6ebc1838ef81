"""The one client of a model server (vLLM, llama.cpp, TGI, SGLang, OpenAI, the simulator).

Everything stoker sends to a model server goes through OpenAIBackend:
- the gateway's upstream proxy: raw `post`, `get` and `stream`, whatever status the server
  answers passed through as it came (gateway/upstream.py);
- the shadow warmer's and the wrong-hit monitor's `generate` (the Backend contract);
- the prefix warm: a `generate` of the prefix and a one-token user turn, max_tokens=1;
- the engine-metrics reader: a `get` of <root>/metrics (backends/engine.py).
So there is one of each of these, here:
1. HTTP stack: aiohttp, one pooled session per client, made on the event loop of its first
   use (a session belongs to one loop) and closed by `aclose`, after which the client can
   serve another loop. aiohttp, not httpx: httpx's pool checks every idle connection on every
   request, which made it an order of magnitude slower at 32 concurrent requests (the figures
   are in docs/benchmarks.md, "The gateway").
2. base URL: as users write it (schemas/baseurl.py: http://host:8000, .../v1, http://host/llm/v1);
   every error names the URL it was for.
3. error translation (`translated`): aiohttp's errors into schemas/errors.py's tree, a timeout
   as BackendTimedOut, anything else that kept the server from answering as
   BackendUnavailable; for `generate`, HTTP statuses too (`raise_for_status`: 429 overloaded,
   408 and 5xx unavailable, other 4xx rejected). Raw calls answer any status.
4. retry policy (RetryPolicy), for `generate` only: the gateway passes a failure on to its
   client, whose SDK retries by its own policy.
5. circuit: `circuit_refusals` refused connections in a row, across every generate of the
   client (a client serves one run), open it: that call and every later one raise
   BackendUnreachable at once, naming the URL (and the setting it came from), so a run against
   a backend that is not there stops in a second instead of retrying each of its items
   (docs/benchmarks.md, "The gateway", has the deploy that did not).
6. the cost of an answer (`backend_ms`): the server's own account first, wall time last.
A client built with `stream=True` asks for every generation as a stream and assembles it, so a
caller that cancels it stops the server's work at once: llama-server stops a streamed request
at its next token after the client went away (one decode step), and a plain one only at its next
look at the connection, tens of tokens later (bench_backend_protection: backend_protection_real;
docs/benchmarks.md, "The `_real` rows").
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson
from yarl import URL

from backends.base import Backend, FinishReason, Generation, GenerationRequest
from schemas.baseurl import BaseURL
from schemas.errors import (
    BackendOverloaded,
    BackendRejected,
    BackendTimedOut,
    BackendUnavailable,
    BackendUnreachable,
)

Mode = Literal["chat", "completions"]
_ROUTES: dict[Mode, str] = {"chat": "chat/completions", "completions": "completions"}
# Refused connections in a row that open the circuit: one item's retries (RetryPolicy's 3
# attempts), and a second or two at most, however many sends are in flight.
CIRCUIT_REFUSALS = 3
# What a raw reply keeps of the server's headers (hop-by-hop and framing ones are the
# gateway's own to write): what an OpenAI SDK reads.
KEEP_HEADERS = frozenset({"content-type", "retry-after", "x-request-id", "openai-processing-ms"})
# Errors that mean nothing answers at the URL: refused, no route, DNS, no SYN-ACK in time.
_CANNOT_CONNECT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
_JSON = {"content-type": "application/json"}
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "eos": "stop",
    "tool_calls": "tool_calls",
}


@dataclass(frozen=True)
class Timeouts:
    """Limits in seconds (None: none). `read_s` bounds each read, so for a plain answer the
    whole generation: 60 s is ~2k tokens at 30 ms/token, longer than any answer worth caching;
    `connect_s` fails fast so a dead replica costs 2 s, not a minute; `pool_s` bounds the wait
    for a pooled connection when every one is busy."""

    connect_s: float = 2.0
    read_s: float | None = 60.0
    pool_s: float | None = 5.0

    def to_aiohttp(self) -> aiohttp.ClientTimeout:
        pooled = None if self.pool_s is None else self.pool_s + self.connect_s
        return aiohttp.ClientTimeout(
            total=None, connect=pooled, sock_connect=self.connect_s, sock_read=self.read_s
        )


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries on timeouts, connect errors and 5xx, never on 429 or other 4xx.

    Delay before retry n (1-based) is uniform in [0, min(max_s, base_s * 2**(n-1))] ("full
    jitter"): replicas that failed together do not retry together."""

    attempts: int = 3
    base_s: float = 0.1
    max_s: float = 2.0

    def delay_s(self, retry: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_s, self.base_s * 2 ** (retry - 1)))


@dataclass(frozen=True)
class Reply:
    """A whole answer as the server gave it: status, the kept headers, body, wall time."""

    status: int
    headers: dict[str, str]
    content: bytes
    elapsed_ms: float


class Stream:
    """An open streamed answer: its status and kept headers now, its body as it comes."""

    def __init__(self, resp: aiohttp.ClientResponse, keep: frozenset[str]) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = _kept(resp.headers, keep)

    async def read(self) -> bytes:
        with translated(f"POST {self._resp.url}"):
            return await self._resp.read()

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives; BackendUnavailable (BackendTimedOut) if the server breaks
        off (or stalls)."""
        with translated(f"POST {self._resp.url}"):
            async for chunk in self._resp.content.iter_any():
                yield chunk


@contextmanager
def translated(op: str) -> Iterator[None]:
    """aiohttp's errors as the tree's, the one place that knows them: a timeout (to connect,
    to read, a whole call's) is BackendTimedOut, anything else BackendUnavailable; the message
    names the call and its URL, and the cause stays chained (`cannot_connect` reads it)."""
    try:
        yield
    except TimeoutError as e:  # aiohttp's ServerTimeoutErrors are TimeoutErrors too
        raise BackendTimedOut(f"{op}: {why(e)}") from e
    except aiohttp.ClientError as e:
        raise BackendUnavailable(f"{op}: {why(e)}") from e


def cannot_connect(e: BaseException) -> bool:
    """Whether a translated error means nothing answers at the URL (the circuit counts it)."""
    return isinstance(e.__cause__, _CANNOT_CONNECT)


def raise_for_status(reply: Reply, op: str) -> None:
    """Translate an HTTP status into the error tree (the one place that knows the codes)."""
    code = reply.status
    if code < 400:
        return
    if code == 429:
        raise BackendOverloaded(f"{op}: HTTP 429", retry_after_s=_retry_after(reply))
    if code >= 500 or code == 408:
        raise BackendUnavailable(f"{op}: HTTP {code}")
    text = reply.content[:200].decode(errors="replace")
    raise BackendRejected(f"{op}: HTTP {code}: {text}", status=code)


def backend_ms(usage: Mapping[str, Any], timings: Any, elapsed_ms: float) -> float:
    """What an answer cost the model server, by the server's own account, first found of:
    1. `usage.gpu_ms`, the simulated backend's extension field;
    2. llama.cpp's `timings`: prompt_ms + predicted_ms, prefill of the tokens its prompt cache
       did not hold plus decode, without the time the request queued for a slot (SmolLM2 on
       one core here: 0.1-0.25 s for an 8-token answer, 0.8 s for 24 tokens prefilled cold);
    3. neither (vLLM, TGI and OpenAI report no time): the call's wall time as the client saw
       it, which also counts queueing and the network, so on a loaded server it overstates
       what a hit saves."""
    own = usage.get("gpu_ms")
    if isinstance(own, int | float) and own > 0:
        return float(own)
    if isinstance(timings, dict):
        try:
            spent = float(timings["prompt_ms"]) + float(timings["predicted_ms"])
        except (KeyError, TypeError, ValueError):
            spent = 0.0
        if spent > 0:
            return spent
    return elapsed_ms


def model_ids(content: bytes) -> list[str] | None:
    """The model ids of a /models answer; None if it is not the OpenAI list."""
    try:
        data = orjson.loads(content).get("data") or []
        return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return None


class OpenAIBackend(Backend):
    """One OpenAI-compatible server over one pooled aiohttp session (module docstring).

    `model` overrides the served model name a generate sends (default: the request's own);
    `headers` go with every call (an API key as `api_key`); `source` names where the URL came
    from (a setting), in errors; `keep_headers` are the response headers raw calls keep;
    `stream`: generate streams (module docstring). ConfigError for a malformed base_url."""

    def __init__(
        self,
        base_url: str,
        *,
        mode: Mode = "chat",
        model: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        connections: int = 64,
        circuit_refusals: int = CIRCUIT_REFUSALS,
        keep_headers: frozenset[str] = KEEP_HEADERS,
        seed: int | None = None,
        source: str | None = None,
        stream: bool = False,
    ) -> None:
        if circuit_refusals < 1 or connections < 1:
            raise ValueError("circuit_refusals and connections must be >= 1")
        self.base = BaseURL.parse(base_url)
        self.mode: Mode = mode
        self.model = model
        self.source = source
        self.stream_answers = stream
        self.retry = retry or RetryPolicy()
        self.circuit_refusals = circuit_refusals
        self.unreachable: str | None = None  # the open circuit's message
        self._refused = 0  # connections refused in a row, by any generate
        self._refusal = ""  # the last refusal, as aiohttp said it
        self._rng = random.Random(seed)
        self._headers = dict(headers or {})
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeout = (timeouts or Timeouts()).to_aiohttp()
        self._connections = connections
        self._keep = keep_headers
        self._urls: dict[str, URL] = {}
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # on the calling loop: a session belongs to one loop
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers=self._headers or None,
                connector=aiohttp.TCPConnector(limit=self._connections, ttl_dns_cache=300),
            )
        return self._session

    # -- URLs --

    def url(self, route: str) -> URL:
        """An API route's URL (route("chat/completions")), parsed once: yarl's parse is ~10 us,
        paid on every call otherwise."""
        url = self._urls.get(route)
        if url is None:
            url = self._urls[route] = URL(self.base.route(route))
        return url

    def server_url(self, path: str) -> URL:
        """One of the server's own endpoints, at its root: server_url("metrics")."""
        key = "/" + path
        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = URL(self.base.server(path))
        return url

    # -- raw calls: any status, errors translated, never retried --

    async def post(self, url: URL, body: bytes, headers: Mapping[str, str] | None = None) -> Reply:
        t0 = time.perf_counter()
        with translated(f"POST {url}"):
            async with self._http().post(url, data=body, headers=headers) as r:
                content = await r.read()
        return Reply(r.status, _kept(r.headers, self._keep), content, _ms_since(t0))

    async def get(
        self,
        url: URL,
        headers: Mapping[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Reply:
        """`timeout_s` bounds the whole call (a probe), beside the client's own limits."""
        t0 = time.perf_counter()
        bound = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None
        with translated(f"GET {url}"):
            async with self._http().get(url, headers=headers, timeout=bound) as r:
                content = await r.read()
        return Reply(r.status, _kept(r.headers, self._keep), content, _ms_since(t0))

    @asynccontextmanager
    async def stream(
        self, url: URL, body: bytes, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Stream]:
        """The server's streamed answer, open until the block ends."""
        with translated(f"POST {url}"):
            resp = await self._http().post(url, data=body, headers=headers)
        try:
            yield Stream(resp, self._keep)
        finally:
            resp.release()

    async def models(self, timeout_s: float) -> list[str] | None:
        """The ids GET <base>/models lists (None: an answer that is not the OpenAI list);
        the tree's errors for a status that is not 2xx and for no answer in `timeout_s`."""
        url = self.url("models")
        reply = await self.get(url, timeout_s=timeout_s)
        raise_for_status(reply, f"GET {url}")
        return model_ids(reply.content)

    # -- generate --

    async def generate(self, req: GenerationRequest) -> Generation:
        body = orjson.dumps(self._body(req))
        mode = self._mode_of(req)
        url = self.url(_ROUTES[mode])
        retries = 0
        while True:
            if self.unreachable is not None:  # the circuit is open: not one more connection
                raise BackendUnreachable(self.unreachable)
            t0 = time.perf_counter()
            try:
                data = await self._ask(url, body)
            except BackendOverloaded:
                raise  # the caller paces itself on 429s; retrying here would hide them
            except BackendUnavailable:
                if self._refused >= self.circuit_refusals:
                    self._open()
                    continue
                retries += 1
                if retries >= self.retry.attempts:
                    raise
                await asyncio.sleep(self.retry.delay_s(retries, self._rng))
                continue
            return self._parse(data, mode, _ms_since(t0), retries)

    async def _ask(self, url: URL, body: bytes) -> dict[str, Any]:
        """One attempt: the answer as a plain answer's JSON object, streamed or not."""
        op = f"POST {url}"
        try:
            if self.stream_answers:
                return await self._ask_streamed(url, body, op)
            reply = await self.post(url, body, _JSON)
        except BackendUnavailable as e:
            if cannot_connect(e):
                self._refused += 1
                self._refusal = why(e.__cause__ or e)
            raise
        self._refused = 0  # it answered: whatever it said, something listens there
        raise_for_status(reply, op)
        try:
            data = orjson.loads(reply.content)
        except orjson.JSONDecodeError as e:
            raise BackendUnavailable(f"{op}: answer is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise BackendUnavailable(f"{op}: answer is not a JSON object")
        return data

    async def _ask_streamed(self, url: URL, body: bytes, op: str) -> dict[str, Any]:
        async with self.stream(url, body, _JSON) as st:
            self._refused = 0
            if st.status != 200:
                content = await st.read()
                raise_for_status(Reply(st.status, st.headers, content, 0.0), op)
                raise BackendUnavailable(f"{op}: HTTP {st.status} is not a stream")
            chunks = Chunks()
            try:
                async for data in st.chunks():
                    if chunks.feed(data):
                        break
                return chunks.answer()
            except (ValueError, TypeError, AttributeError) as e:  # orjson's errors are ValueErrors
                raise BackendUnavailable(f"{op}: malformed stream: {e}") from e

    def _open(self) -> None:
        if self.unreachable is None:
            named = f" ({self.source})" if self.source else ""
            n = self._refused
            self.unreachable = (
                f"cannot connect to {self.base.api}{named}: {self._refusal}; "
                f"{n} attempt{'s' if n != 1 else ''} in a row, so this run sends no more"
            )

    def _mode_of(self, req: GenerationRequest) -> Mode:
        if req.body is not None and req.api is not None:
            return "chat" if req.api == "chat" else "completions"
        return self.mode

    def _body(self, req: GenerationRequest) -> dict[str, Any]:
        if req.body is not None:  # the logged request, replayed as it was sent
            replay = {k: v for k, v in req.body.items() if k not in ("stream", "stream_options")}
            body = replay | {"model": self.model or replay.get("model") or req.model_id}
        else:
            body = {"model": self.model or req.model_id, **req.params.upstream_dict()}
            if self.mode == "chat":
                body["messages"] = [{"role": "user", "content": req.prompt}]
            else:
                body["prompt"] = req.prompt
        if self.stream_answers:  # counted as a plain answer is: usage in the last chunk
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return body

    def _parse(
        self, data: dict[str, Any], mode: Mode, latency_ms: float, retries: int
    ) -> Generation:
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] if mode == "chat" else choice["text"]
            usage = data.get("usage") or {}
            tokens_in = int(usage.get("prompt_tokens", 0))
            tokens_out = int(usage.get("completion_tokens", 0))
            gpu_ms = backend_ms(usage, data.get("timings"), latency_ms)
            finish = _FINISH.get(str(choice.get("finish_reason")), "unknown")
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise BackendUnavailable(f"malformed {mode} answer: {type(e).__name__}") from e
        if not isinstance(text, str):
            raise BackendUnavailable(f"malformed {mode} answer: text is not a string")
        return Generation(text, tokens_in, tokens_out, latency_ms, gpu_ms, finish, retries)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class Chunks:
    """A streamed answer's SSE events (`data: <json>`, then `data: [DONE]`) assembled into the
    JSON object a plain answer would have been: the first choice's text (chat deltas or
    completion text), its finish_reason, the usage chunk, llama.cpp's timings. Events are
    one line each, as every OpenAI-compatible server writes them; a line may end in \r\n."""

    def __init__(self) -> None:
        self._buf = b""
        self.text: list[str] = []
        self.chat = True
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}
        self.timings: Any = None
        self.done = False

    def feed(self, data: bytes) -> bool:
        """Take the bytes read; True once [DONE] came. ValueError (TypeError, AttributeError)
        for an event that is not an answer's chunk."""
        *lines, self._buf = (self._buf + data).split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank lines between events, comments, keep-alives
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return True
            self._add(orjson.loads(payload))
        return False

    def _add(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise ValueError("a stream event that is not a JSON object")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("timings") is not None:
            self.timings = chunk["timings"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
            if "delta" in choice:
                self.text.append((choice["delta"] or {}).get("content") or "")
            else:
                self.chat = False
                self.text.append(choice.get("text") or "")

    def answer(self) -> dict[str, Any]:
        """The plain answer's shape; ValueError if the stream broke off before it ended."""
        if not self.done or self.finish is None:
            raise ValueError("the stream broke off before its end")
        text = "".join(self.text)
        choice = {"message": {"content": text}} if self.chat else {"text": text}
        out = {"choices": [choice | {"finish_reason": self.finish}], "usage": self.usage}
        return out | ({"timings": self.timings} if self.timings is not None else {})


def list_models(base_url: str, timeout_s: float) -> list[str] | None:
    """OpenAIBackend.models from code that runs no event loop (start-up checks)."""

    async def ask() -> list[str] | None:
        t = Timeouts(connect_s=timeout_s, read_s=timeout_s)
        async with OpenAIBackend(base_url, timeouts=t, connections=1) as c:
            return await c.models(timeout_s)

    return asyncio.run(ask())


def why(e: BaseException) -> str:
    """An error in one line, its class first. The two ways a connection fails keep the names
    they had before aiohttp, whatever the library says: ConnectError (refused, no route, no
    such host) and ConnectTimeout (no answer to connect), since runbooks and the first lines a
    user sees ("cannot connect to ...: ConnectError") read them."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"ConnectError: {e.os_error}"
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return f"ConnectTimeout: {e}" if str(e) else "ConnectTimeout"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _retry_after(reply: Reply) -> float | None:
    try:
        return float(reply.headers["retry-after"])
    except (KeyError, ValueError):
        return None


def _kept(headers: Mapping[str, str], keep: frozenset[str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() in keep}


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0
