"""OpenAI-compatible backend client (vLLM, TGI, SGLang, the simulator): chat or completions."""

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

from schemas.errors import BackendOverloaded, BackendRejected, BackendUnavailable
from warmers.backends.base import Backend, FinishReason, Generation, GenerationRequest

Mode = Literal["chat", "completions"]
_PATHS: dict[Mode, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
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
        raise BackendUnavailable(f"{op}: {type(e).__name__}: {e}") from e


class OpenAIBackend(Backend):
    """One pooled httpx.AsyncClient. `model` overrides the served model name (default: the
    request's model_id); `transport` lets tests pass httpx.MockTransport."""

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
    ) -> None:
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.mode: Mode = mode
        self.model = model
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
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
            t0 = time.perf_counter()
            try:
                data = await self._post(body, mode)
            except BackendOverloaded:
                raise  # the caller paces itself on 429s; retrying here would hide them
            except BackendUnavailable:
                retries += 1
                if retries >= self.retry.attempts:
                    raise
                await asyncio.sleep(self.retry.delay_s(retries, self._rng))
                continue
            return self._parse(data, mode, (time.perf_counter() - t0) * 1000.0, retries)

    def _mode_of(self, req: GenerationRequest) -> Mode:
        if req.body is not None and req.api is not None:
            return "chat" if req.api == "chat" else "completions"
        return self.mode

    async def _post(self, body: bytes, mode: Mode) -> dict[str, Any]:
        op = f"POST {_PATHS[mode]}"
        with transport_boundary(op):
            resp = await self._http.post(_PATHS[mode], content=body)
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
