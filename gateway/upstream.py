"""The upstream model server (vLLM, TGI, any OpenAI-compatible endpoint) over aiohttp.

aiohttp, not httpx: 32 concurrent requests to the simulated backend on loopback ran at ~5,900/s
through an aiohttp ClientSession against ~315/s through an httpx AsyncClient (the same process,
measured here); httpx's pool checks every idle connection on every request. One pooled session
per gateway (keep-alive), made on the serving loop at first use.

The base URL is taken as users write it (schemas/baseurl.py: `http://host:8000`, `.../v1`,
`.../v1/`, `http://host/llm/v1`), parsed when the Upstream is built, so a malformed one stops the
gateway at start, never a request. The gateway serves the OpenAI API under /v1, and its route
/v1/X goes to <base>/X: /v1/chat/completions to http://host/llm/v1/chat/completions.

Errors are translated here, once: a timeout is a 504, anything else that keeps the upstream from
answering a 502 (errors.UpstreamFailed), and the log says which URL failed (at most one line per
FAILURE_LOG_S, with how many it left out: an outage at 1,000 requests/s is one line, not 1,000).
An upstream that answers with an error status is passed through as it answered: its body is
already what the client's SDK understands.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import aiohttp
import orjson
from yarl import URL

from gateway.errors import UpstreamFailed
from schemas.baseurl import BaseURL, route_of

log = logging.getLogger(__name__)

# At most one log line per this many seconds for failures to reach the upstream.
FAILURE_LOG_S = 10.0
# The start-up probe's bound: it runs beside serving, and a slow answer is only logged.
PROBE_S = 5.0

# Hop-by-hop and gateway-owned headers are not forwarded either way.
_DROP_REQUEST = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te",
     "upgrade", "proxy-authorization", "accept-encoding"}
)  # fmt: skip
_KEEP_RESPONSE = frozenset({"content-type", "retry-after", "x-request-id", "openai-processing-ms"})


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    content: bytes
    elapsed_ms: float


class Stream:
    """An open streamed answer: its status and headers now, its body as it comes."""

    def __init__(self, resp: aiohttp.ClientResponse, failures: FailureLog) -> None:
        self._resp = resp
        self._failures = failures
        self.status = resp.status
        self.headers = _kept(resp.headers)

    async def read(self) -> bytes:
        with translated(self._failures, self._resp.url):
            return await self._resp.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; UpstreamFailed if the upstream breaks off."""
        with translated(self._failures, self._resp.url):
            async for chunk in self._resp.content.iter_any():
                yield chunk


class Upstream:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        connections: int = 256,
        forward_auth: bool = True,
    ) -> None:
        """ConfigError (one line) for a malformed base_url: the shell stops before serving."""
        self.base = BaseURL.parse(base_url)
        self._urls: dict[str, URL] = {}
        self._failures = FailureLog()
        self._api_key = api_key
        self._forward_auth = forward_auth and api_key is None
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout_s)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # on the serving loop: a session belongs to one loop
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._connections, ttl_dns_cache=300),
                auto_decompress=True,
            )
        return self._session

    def url(self, path: str) -> URL:
        """The upstream URL of one of the gateway's own paths (/v1/chat/completions), parsed
        once per path: yarl's parse is ~10 us, paid on every request otherwise."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.base.route(route_of(path)))
        return url

    def headers_for(self, client: Mapping[str, str]) -> dict[str, str]:
        """What the upstream gets: the client's headers without hop-by-hop and X-Stoker-*;
        the configured key, else the client's own Authorization (unless it is the gateway's)."""
        out = {
            k: v
            for k, v in client.items()
            if k not in _DROP_REQUEST and not k.startswith("x-stoker-") and k != "authorization"
        }
        if self._api_key is not None:
            out["authorization"] = f"Bearer {self._api_key}"
        elif self._forward_auth and client.get("authorization"):
            out["authorization"] = client["authorization"]
        out["content-type"] = "application/json"
        return out

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> Reply:
        t0, url = time.perf_counter(), self.url(path)
        with translated(self._failures, url):
            async with self._http().post(url, data=body, headers=dict(headers)) as r:
                content = await r.read()
        return Reply(r.status, _kept(r.headers), content, (time.perf_counter() - t0) * 1000)

    async def get(self, path: str, headers: Mapping[str, str]) -> Reply:
        t0, url = time.perf_counter(), self.url(path)
        with translated(self._failures, url):
            async with self._http().get(url, headers=dict(headers)) as r:
                content = await r.read()
        return Reply(r.status, _kept(r.headers), content, (time.perf_counter() - t0) * 1000)

    @asynccontextmanager
    async def stream(
        self, path: str, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[Stream]:
        """The upstream's streamed response, open until the block ends."""
        url = self.url(path)
        with translated(self._failures, url):
            resp = await self._http().post(url, data=body, headers=dict(headers))
        try:
            yield Stream(resp, self._failures)
        finally:
            resp.release()

    async def probe(self, timeout_s: float = PROBE_S) -> tuple[bool, str]:
        """GET <base>/models once: (answered 200, one line saying what it found). Never
        raises: an upstream that starts after the gateway is not an error."""
        url = self.url("/v1/models")
        headers = self.headers_for({})
        try:
            async with self._http().get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                status, content = r.status, await r.read()
        except (TimeoutError, aiohttp.ClientError) as e:
            return False, (
                f"upstream {self.base.api}: GET {url} failed ({_why(e)}); requests answer 502 "
                "until it does (an upstream that starts later is fine)"
            )
        if status != 200:
            hint = (
                " (is the base URL's path right? it should end where the openai SDK's base_url "
                "ends, often /v1)"
                if status == 404
                else ""
            )
            return False, f"upstream {self.base.api}: GET {url} answered {status}{hint}"
        return True, f"upstream {self.base.api}: serves {_models(content)}"

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class FailureLog:
    """Logs failures to reach the upstream, naming the URL: at most one line per `every_s`,
    which counts the failures it stands for (safe from any thread)."""

    def __init__(self, every_s: float = FAILURE_LOG_S) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._held = 0  # failures since the last line

    def failed(self, url: URL, why: str, status: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._held += 1
            if now - self._last < self.every_s:
                return
            n, self._held, self._last = self._held, 0, now
        more = f" (and {n - 1} more failures in the last {self.every_s:.0f} s)" if n > 1 else ""
        log.warning("upstream %s failed: %s; answered %d%s", url, why, status, more)


@contextmanager
def translated(failures: FailureLog, url: URL) -> Iterator[None]:
    """aiohttp's errors as the gateway answers them: 504 for a timeout, 502 for the rest; each
    logged (throttled) with the URL it was for."""
    try:
        yield
    except TimeoutError as e:
        failures.failed(url, _why(e), 504)
        raise UpstreamFailed(f"the upstream did not answer in time: {e}", 504) from e
    except aiohttp.ClientError as e:
        failures.failed(url, _why(e), 502)
        raise UpstreamFailed(f"the upstream is unreachable: {type(e).__name__}") from e


def _why(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _models(content: bytes) -> str:
    """The model ids of a /models answer, for the start-up line."""
    try:
        data = orjson.loads(content).get("data") or []
        ids = [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return "an answer to /models that is not the OpenAI list"
    if not ids:
        return "no models"
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return f"{len(ids)} model{'s' if len(ids) > 1 else ''}: {shown}"


def _kept(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() in _KEEP_RESPONSE}
