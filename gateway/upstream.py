"""The upstream model server (vLLM, TGI, any OpenAI-compatible endpoint) over aiohttp.

aiohttp, not httpx: 32 concurrent requests to the simulated backend on loopback ran at ~5,900/s
through an aiohttp ClientSession against ~315/s through an httpx AsyncClient (the same process,
measured here); httpx's pool checks every idle connection on every request. One pooled session
per gateway (keep-alive), made on the serving loop at first use. Errors are translated here,
once: a timeout is a 504, anything else that keeps the upstream from answering a 502
(errors.UpstreamFailed). An upstream that answers with an error status is passed through as it
answered: its body is already what the client's SDK understands.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import aiohttp

from gateway.errors import UpstreamFailed

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

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = _kept(resp.headers)

    async def read(self) -> bytes:
        with translated():
            return await self._resp.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; UpstreamFailed if the upstream breaks off."""
        with translated():
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
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._forward_auth = forward_auth and api_key is None
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout_s)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # on the serving loop: a session belongs to one loop
            self._session = aiohttp.ClientSession(
                base_url=self.base_url,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._connections, ttl_dns_cache=300),
                auto_decompress=True,
            )
        return self._session

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
        t0 = time.perf_counter()
        with translated():
            async with self._http().post(path, data=body, headers=dict(headers)) as r:
                content = await r.read()
        return Reply(r.status, _kept(r.headers), content, (time.perf_counter() - t0) * 1000)

    async def get(self, path: str, headers: Mapping[str, str]) -> Reply:
        t0 = time.perf_counter()
        with translated():
            async with self._http().get(path, headers=dict(headers)) as r:
                content = await r.read()
        return Reply(r.status, _kept(r.headers), content, (time.perf_counter() - t0) * 1000)

    @asynccontextmanager
    async def stream(
        self, path: str, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[Stream]:
        """The upstream's streamed response, open until the block ends."""
        with translated():
            resp = await self._http().post(path, data=body, headers=dict(headers))
        try:
            yield Stream(resp)
        finally:
            resp.release()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


@contextmanager
def translated() -> Iterator[None]:
    """aiohttp's errors as the gateway answers them: 504 for a timeout, 502 for the rest."""
    try:
        yield
    except TimeoutError as e:
        raise UpstreamFailed(f"the upstream did not answer in time: {e}", 504) from e
    except aiohttp.ClientError as e:
        raise UpstreamFailed(f"the upstream is unreachable: {type(e).__name__}: {e}") from e


def _kept(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() in _KEEP_RESPONSE}
