"""The upstream model server (vLLM, llama.cpp, TGI, any OpenAI-compatible endpoint), as the
gateway proxies to it: through the one backend client (backends/client.py: one pooled aiohttp
session per gateway, made on the serving loop at first use), raw, never retried.

The base URL is taken as users write it (schemas/baseurl.py: `http://host:8000`, `.../v1`,
`.../v1/`, `http://host/llm/v1`), parsed when the Upstream is built, so a malformed one stops the
gateway at start, never a request. The gateway serves the OpenAI API under /v1, and its route
/v1/X goes to <base>/X: /v1/chat/completions to http://host/llm/v1/chat/completions.

The client translates aiohttp's errors into stoker's tree; here they become what the gateway
answers, once: a timeout a 504, anything else that keeps the upstream from answering a 502
(errors.UpstreamFailed), and the log says which URL failed (at most one line per FAILURE_LOG_S,
with how many it left out: an outage at 1,000 requests/s is one line, not 1,000). An upstream
that answers with an error status is passed through as it answered: its body is already what
the client's SDK understands.

`probe` asks GET <base>/models on a connection of its own, so a check never queues behind the
requests that fill the pool (gateway/health.py keeps what the checks find).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import aclosing, asynccontextmanager, contextmanager
from dataclasses import dataclass

from yarl import URL

from backends.client import OpenAIBackend, Reply, Timeouts, model_ids, why
from backends.client import Stream as ClientStream
from gateway.errors import UpstreamFailed
from schemas.baseurl import route_of
from schemas.errors import BackendTimedOut, BackendUnavailable

log = logging.getLogger(__name__)

# At most one log line per this many seconds for failures to reach the upstream.
FAILURE_LOG_S = 10.0
# A probe's bound: it runs beside serving, and an upstream that cannot answer /models in this
# long is down for the gateway's readiness report.
PROBE_S = 5.0

# Hop-by-hop and gateway-owned headers are not forwarded upstream.
_DROP_REQUEST = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te",
     "upgrade", "proxy-authorization", "accept-encoding"}
)  # fmt: skip


class Stream:
    """An open streamed answer: its status and headers now, its body as it comes."""

    def __init__(self, inner: ClientStream, failures: FailureLog, url: URL) -> None:
        self._inner = inner
        self._failures = failures
        self._url = url
        self.status = inner.status
        self.headers = inner.headers

    async def read(self) -> bytes:
        with translated(self._failures, self._url):
            return await self._inner.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; UpstreamFailed if the upstream breaks off."""
        with translated(self._failures, self._url):
            async with aclosing(self._inner.chunks()) as body:
                async for chunk in body:
                    yield chunk


@dataclass(frozen=True)
class Probe:
    """One GET <base>/models: the status it answered (None: no answer), the models it lists
    (None: not listed, or not as the OpenAI list), and one line saying what it found."""

    status: int | None
    models: tuple[str, ...] | None
    line: str

    @property
    def answered(self) -> bool:
        return self.status is not None


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
        # No pool wait bound: a request waits for a connection as long as it would for the
        # answer; reads are bounded by timeout_s, connecting by 10 s.
        timeouts = Timeouts(connect_s=10.0, read_s=timeout_s, pool_s=None)
        self.client = OpenAIBackend(base_url, timeouts=timeouts, connections=connections)
        self.base = self.client.base
        self.shown = _shown(URL(self.base.api))  # for metrics, logs and /readyz: no credentials
        bound = Timeouts(connect_s=PROBE_S, read_s=PROBE_S, pool_s=PROBE_S)
        self._prober = OpenAIBackend(base_url, timeouts=bound, connections=1)
        self._urls: dict[str, URL] = {}
        self._failures = FailureLog()
        self._api_key = api_key
        self._forward_auth = forward_auth and api_key is None

    def url(self, path: str) -> URL:
        """The upstream URL of one of the gateway's own paths (/v1/chat/completions)."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = self.client.url(route_of(path))
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
        url = self.url(path)
        with translated(self._failures, url):
            return await self.client.post(url, body, headers)

    async def get(self, path: str, headers: Mapping[str, str]) -> Reply:
        url = self.url(path)
        with translated(self._failures, url):
            return await self.client.get(url, headers)

    @asynccontextmanager
    async def stream(
        self, path: str, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[Stream]:
        """The upstream's streamed response, open until the block ends."""
        url = self.url(path)
        with translated(self._failures, url):
            cm = self.client.stream(url, body, headers)
            inner = await cm.__aenter__()
        try:
            yield Stream(inner, self._failures, url)
        finally:
            await cm.__aexit__(None, None, None)

    def when_unreachable(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the serving loop) each time a request cannot reach the upstream."""
        self._failures.on_unreachable = callback

    async def probe(self, timeout_s: float = PROBE_S) -> Probe:
        """GET <base>/models once, bounded by `timeout_s`. Never raises: an upstream that starts
        after the gateway, or stops, is a state to report, not an error."""
        url = self.url("/v1/models")
        try:
            reply = await self._prober.get(url, self.headers_for({}), timeout_s=timeout_s)
        except BackendUnavailable as e:
            return Probe(None, None, f"upstream {self.base.api}: GET {url} failed ({_why(e)})")
        if reply.status != 200:
            hint = (
                " (is the base URL's path right? it should end where the openai SDK's base_url "
                "ends, often /v1)"
                if reply.status == 404
                else ""
            )
            line = f"upstream {self.base.api}: GET {url} answered {reply.status}{hint}"
            return Probe(reply.status, None, line)
        ids = model_ids(reply.content)
        models = None if ids is None else tuple(ids)
        return Probe(200, models, f"upstream {self.base.api}: serves {_models(models)}")

    async def aclose(self) -> None:
        await self.client.aclose()
        await self._prober.aclose()


class FailureLog:
    """Logs failures to reach the upstream, naming the URL: at most one line per `every_s`,
    which counts the failures it stands for (safe from any thread)."""

    def __init__(self, every_s: float = FAILURE_LOG_S) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._held = 0  # failures since the last line
        self.on_unreachable: Callable[[], None] = _nothing  # Upstream.when_unreachable

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
    """The client's errors as the gateway answers them: 504 for a timeout, 502 for the rest;
    each logged (throttled) with the URL it was for."""
    try:
        yield
    except BackendTimedOut as e:
        failures.failed(url, _why(e), 504)
        raise UpstreamFailed(
            f"the upstream {_shown(url)} did not answer in time: {e.__cause__}", 504
        ) from e
    except BackendUnavailable as e:
        failures.failed(url, _why(e), 502)
        failures.on_unreachable()
        raise UpstreamFailed(f"the upstream {_shown(url)} is unreachable: {_why(e)}") from e


def _shown(url: URL) -> str:
    """The URL a client may see in an error body: no user, password, query or fragment."""
    return str(url.with_user(None).with_query(None).with_fragment(None))


def _why(e: BaseException) -> str:
    """What failed, as the library said it (the client's message names the URL already)."""
    return why(e.__cause__ or e)


def _nothing() -> None:
    return None


def _models(ids: tuple[str, ...] | None) -> str:
    """The model ids of a /models answer, for a log line."""
    if ids is None:
        return "an answer to /models that is not the OpenAI list"
    if not ids:
        return "no models"
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return f"{len(ids)} model{'s' if len(ids) > 1 else ''}: {shown}"
