"""OpenAI-compatible backend client (vLLM, TGI, SGLang, the simulator): chat or completions.

The base URL is taken as users write it (schemas/baseurl.py: http://host:8000, .../v1,
http://host/llm/v1), and every error names the URL it was for. A refused connection is retried
like any outage, but CIRCUIT_REFUSALS of them in a row, across every send of the client (a
client serves one warm run), open its circuit: that send and every later one raise
BackendUnreachable at once, naming the URL (and the setting it came from), so a run against a
backend that is not there stops in a second instead of retrying each of its items (measured
before: a deploy's pre-warm logged 174 failed sends and failed after 183 s).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson

from schemas.baseurl import BaseURL
from schemas.errors import (
    BackendOverloaded,
    BackendRejected,
    BackendUnavailable,
    BackendUnreachable,
)
from warmers.backends.base import Backend, FinishReason, Generation, GenerationRequest

Mode = Literal["chat", "completions"]
_ROUTES: dict[Mode, str] = {"chat": "chat/completions", "completions": "completions"}
# Refused connections in a row that open the circuit: one item's retries (RetryPolicy's 3
# attempts), and a second or two at most, however many sends are in flight.
CIRCUIT_REFUSALS = 3
# Transport errors that mean nothing answers at the URL: refused, no route, DNS, no SYN-ACK.
_CANNOT_CONNECT = (httpx.ConnectError, httpx.ConnectTimeout)
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "eos": "stop",
    "tool_calls": "tool_calls",
}


@dataclass(frozen=True)
class Timeouts:
    """Per-phase limits in seconds. Read covers the whole generation: 60 s is ~2k tokens at
    30 ms/token, longer than any answer worth caching; connect fails fast so a dead replica
    costs 2 s, not a minute."""

    connect_s: float = 2.0
    read_s: float = 60.0
    write_s: float = 5.0
    pool_s: float = 5.0

    def to_httpx(self) -> httpx.Timeout:
        return httpx.Timeout(
            connect=self.connect_s, read=self.read_s, write=self.write_s, pool=self.pool_s
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


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return float(resp.headers["retry-after"])
    except (KeyError, ValueError):
        return None


def raise_for_status(resp: httpx.Response, op: str) -> None:
    """Translate an HTTP status into the error tree (the one place that knows the codes)."""
    code = resp.status_code
    if code < 400:
        return
    if code == 429:
        raise BackendOverloaded(f"{op}: HTTP 429", retry_after_s=_retry_after(resp))
    if code >= 500 or code == 408:
        raise BackendUnavailable(f"{op}: HTTP {code}")
    raise BackendRejected(f"{op}: HTTP {code}: {resp.text[:200]}", status=code)


@contextmanager
def transport_boundary(op: str) -> Iterator[None]:
    """httpx transport errors (timeouts, refused connections, broken streams) are retriable."""
    try:
        yield
    except httpx.HTTPError as e:
        raise BackendUnavailable(f"{op}: {_why(e)}") from e


def _why(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class OpenAIBackend(Backend):
    """One pooled httpx.AsyncClient. `model` overrides the served model name (default: the
    request's model_id); `source` names where the URL came from (a setting), in errors;
    `transport` lets tests pass httpx.MockTransport. ConfigError for a malformed base_url."""

    def __init__(
        self,
        base_url: str,
        *,
        mode: Mode = "chat",
        model: str | None = None,
        api_key: str | None = None,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
        seed: int | None = None,
        source: str | None = None,
    ) -> None:
        self.base = BaseURL.parse(base_url)
        self.source = source
        self._urls = {mode: self.base.route(route) for mode, route in _ROUTES.items()}
        self._refused = 0  # connections refused in a row, by any send
        self._refusal = ""  # the last refusal, as httpx said it
        self.unreachable: str | None = None  # the open circuit's message
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.mode: Mode = mode
        self.model = model
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=(timeouts or Timeouts()).to_httpx(),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
        )

    async def generate(self, req: GenerationRequest) -> Generation:
        body = orjson.dumps(self._body(req))
        mode = self._mode_of(req)
        retries = 0
        while True:
            if self.unreachable is not None:  # the circuit is open: not one more connection
                raise BackendUnreachable(self.unreachable)
            t0 = time.perf_counter()
            try:
                data = await self._post(body, mode)
            except BackendOverloaded:
                raise  # the caller paces itself on 429s; retrying here would hide them
            except BackendUnavailable:
                if self._refused >= CIRCUIT_REFUSALS:
                    self._open()
                    continue
                retries += 1
                if retries >= self.retry.attempts:
                    raise
                await asyncio.sleep(self.retry.delay_s(retries, self._rng))
                continue
            return self._parse(data, mode, (time.perf_counter() - t0) * 1000.0, retries)

    def _open(self) -> None:
        if self.unreachable is None:
            named = f" ({self.source})" if self.source else ""
            self.unreachable = (
                f"cannot connect to {self.base.api}{named}: {self._refusal}; "
                f"{self._refused} attempts in a row, so this run sends no more"
            )

    def _mode_of(self, req: GenerationRequest) -> Mode:
        if req.body is not None and req.api is not None:
            return "chat" if req.api == "chat" else "completions"
        return self.mode

    async def _post(self, body: bytes, mode: Mode) -> dict[str, Any]:
        url = self._urls[mode]
        op = f"POST {url}"
        try:
            resp = await self._http.post(url, content=body)
        except _CANNOT_CONNECT as e:
            self._refused, self._refusal = self._refused + 1, _why(e)
            raise BackendUnavailable(f"{op}: {self._refusal}") from e
        except httpx.HTTPError as e:
            raise BackendUnavailable(f"{op}: {_why(e)}") from e
        self._refused = 0  # it answered: whatever it said, something listens there
        raise_for_status(resp, op)
        try:
            data = orjson.loads(resp.content)
        except orjson.JSONDecodeError as e:
            raise BackendUnavailable(f"{op}: answer is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise BackendUnavailable(f"{op}: answer is not a JSON object")
        return data

    def _body(self, req: GenerationRequest) -> dict[str, Any]:
        if req.body is not None:  # the logged request, replayed as it was sent
            replay = {k: v for k, v in req.body.items() if k not in ("stream", "stream_options")}
            return replay | {"model": self.model or replay.get("model") or req.model_id}
        body: dict[str, Any] = {"model": self.model or req.model_id, **req.params.upstream_dict()}
        if self.mode == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            body["prompt"] = req.prompt
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
            gpu_ms = float(usage.get("gpu_ms", latency_ms))  # extension field; else wall time
            finish = _FINISH.get(str(choice.get("finish_reason")), "unknown")
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendUnavailable(f"malformed {mode} answer: {type(e).__name__}") from e
        if not isinstance(text, str):
            raise BackendUnavailable(f"malformed {mode} answer: text is not a string")
        return Generation(text, tokens_in, tokens_out, latency_ms, gpu_ms, finish, retries)

    async def aclose(self) -> None:
        await self._http.aclose()
