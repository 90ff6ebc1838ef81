"""The upstream model server (vLLM, TGI, any OpenAI-compatible endpoint) over httpx.

One AsyncClient per gateway, pooled (keep-alive). httpx errors are translated here, once:
a timeout is a 504, anything else that keeps the upstream from answering a 502 (gateway
errors.UpstreamFailed). An upstream that answers with an error status is passed through as
it answered: its body is already what the client's SDK understands.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import httpx

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


class Upstream:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        connections: int = 256,
        forward_auth: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._forward_auth = forward_auth and api_key is None
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            transport=transport,
        )

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
        elif self._forward_auth and "authorization" in client:
            out["authorization"] = client["authorization"]
        out["content-type"] = "application/json"
        return out

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> Reply:
        t0 = time.perf_counter()
        with translated():
            r = await self._http.post(path, content=body, headers=dict(headers))
        return Reply(r.status_code, _kept(r.headers), r.content, (time.perf_counter() - t0) * 1000)

    async def get(self, path: str, headers: Mapping[str, str]) -> Reply:
        t0 = time.perf_counter()
        with translated():
            r = await self._http.get(path, headers=dict(headers))
        return Reply(r.status_code, _kept(r.headers), r.content, (time.perf_counter() - t0) * 1000)

    @asynccontextmanager
    async def stream(
        self, path: str, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[httpx.Response]:
        """The upstream's streamed response, open; read it with aiter_raw / aread."""
        req = self._http.build_request("POST", path, content=body, headers=dict(headers))
        with translated():
            resp = await self._http.send(req, stream=True)
        try:
            yield resp
        finally:
            await resp.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()


@contextmanager
def translated() -> Iterator[None]:
    """httpx's errors as the gateway answers them: 504 for a timeout, 502 for the rest."""
    try:
        yield
    except httpx.TimeoutException as e:
        raise UpstreamFailed(f"the upstream did not answer in time: {e}", 504) from e
    except httpx.HTTPError as e:
        raise UpstreamFailed(f"the upstream is unreachable: {type(e).__name__}: {e}") from e


def _kept(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in _KEEP_RESPONSE}


def kept_headers(resp: httpx.Response) -> dict[str, str]:
    return _kept(resp.headers)
