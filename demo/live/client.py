"""The live demo's users: each row of the day as a streamed OpenAI chat request to `stoker
gateway`, timed from the client (time to first token, time to the end).

A request is what a RAG support app sends: the tenant's system prompt with the retrieved
help-center articles inlined at their current revisions (demo.live.texts), the user's
question, greedy decoding, a short answer; the tenant and template version as headers, and the
articles by id alone in the `stoker` extension, so an article's edit does not change the key:
only the invalidation worker keeps answers fresh.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from demo.live.scenario import LiveScenario, doc_ids
from demo.live.texts import system_message
from gateway.identity import resolve
from gateway.options import GatewayOptions
from stoker.modelserver import MODEL_ALIAS

_PATH = "/chat/completions"
TEMPLATE = "t1"
_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


@dataclass(frozen=True)
class Served:
    """One request as the client saw it."""

    index: int  # the row's place in the day
    tenant: str
    hour: int
    status: int
    outcome: str  # x-stoker-cache: exact, semantic, miss, bypass (error: no answer)
    text: str
    at: float  # time.time() when the last byte arrived
    ttft_ms: float | None  # to the first content token
    total_ms: float
    key: str  # x-stoker-key: the served entry's digest
    model_version: str  # x-stoker-model-version
    coalesced: bool = False
    reason: str = ""  # x-stoker-reason: why it did not hit (up to its first ':')

    @property
    def hit(self) -> bool:
        return self.outcome in ("exact", "semantic")


def request_of(
    row: dict[str, Any], sc: LiveScenario, revisions: Mapping[tuple[str, str], int]
) -> tuple[dict[str, Any], dict[str, str]]:
    """(body, headers) of the row's request; `revisions`: (tenant, doc) -> current revision
    (absent: 1)."""
    docs = {d: revisions.get((row["tenant"], d), 1) for d in doc_ids(row)}
    body: dict[str, Any] = {
        "model": MODEL_ALIAS,
        "messages": [
            {
                "role": "system",
                "content": system_message(row["tenant"], docs, sc.titles, short=sc.short_prompts),
            },
            {"role": "user", "content": row["prompt"]},
        ],
        **sc.params(row["params"]),
    }
    if docs:
        body["stoker"] = {"docs": [{"doc_id": d} for d in sorted(docs)]}
    headers = {"x-stoker-tenant": row["tenant"], "x-stoker-template-version": TEMPLATE}
    return body, headers


def digest_of(body: dict[str, Any], headers: Mapping[str, str]) -> str:
    """The cache key digest the gateway builds for this request, with its own identity code
    (the scorer's map from a served entry to the question it answered)."""
    opts = GatewayOptions(upstream_url="http://scorer", default_temperature=0.0)
    r = resolve("chat", body, dict(headers), "/v1/chat/completions", opts)
    return r.cache_request("any").key().digest


async def stream_chat(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: Mapping[str, str]
) -> tuple[httpx.Response, str, float | None, float]:
    """POST a streamed chat request: (response, text, ms to the first token, ms in all)."""
    t0 = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    req = http.build_request("POST", url, content=orjson.dumps({**body, "stream": True}))
    req.headers.update({"content-type": "application/json", **headers})
    resp = await http.send(req, stream=True)
    try:
        if resp.status_code != 200:
            await resp.aread()
            return resp, "", None, (time.perf_counter() - t0) * 1000
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() in ("", "[DONE]"):
                continue
            for choice in orjson.loads(line[5:]).get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = (time.perf_counter() - t0) * 1000
                    parts.append(piece)
    finally:
        await resp.aclose()
    return resp, "".join(parts), ttft, (time.perf_counter() - t0) * 1000


class LiveClient:
    """Sends rows through the gateway at `sc.concurrency`, streamed, and keeps what came back."""

    def __init__(self, gateway_url: str, sc: LiveScenario) -> None:
        self.url = gateway_url.rstrip("/") + "/v1" + _PATH
        self.sc = sc
        self.revisions: dict[tuple[str, str], int] = {}  # the retriever's view
        self.served: list[Served] = []

    def serve(self, rows: list[tuple[int, dict[str, Any]]], hour: int) -> list[Served]:
        got = asyncio.run(self._serve(rows, hour))
        self.served.extend(got)
        return got

    async def _serve(self, rows: list[tuple[int, dict[str, Any]]], hour: int) -> list[Served]:
        gate = asyncio.Semaphore(self.sc.concurrency)
        limits = httpx.Limits(max_connections=self.sc.concurrency)
        async with httpx.AsyncClient(timeout=_TIMEOUT, limits=limits) as http:

            async def one(i: int, row: dict[str, Any]) -> Served:
                async with gate:
                    body, headers = request_of(row, self.sc, self.revisions)
                    try:
                        resp, text, ttft, total = await stream_chat(http, self.url, body, headers)
                    except (httpx.HTTPError, orjson.JSONDecodeError):
                        return Served(i, row["tenant"], hour, 0, "error", "", time.time(),
                                      None, 0.0, "", "")  # fmt: skip
                    h = resp.headers
                    return Served(
                        index=i, tenant=row["tenant"], hour=hour, status=resp.status_code,
                        outcome=h.get("x-stoker-cache", "miss") if resp.status_code == 200
                        else "error",
                        text=text, at=time.time(), ttft_ms=ttft, total_ms=total,
                        key=h.get("x-stoker-key", ""),
                        model_version=h.get("x-stoker-model-version", ""),
                        coalesced=h.get("x-stoker-coalesced") == "true",
                        reason=h.get("x-stoker-reason", "").split(":", 1)[0].split(" ", 1)[0],
                    )  # fmt: skip

            return list(await asyncio.gather(*(one(i, r) for i, r in rows)))


@dataclass(frozen=True)
class Probe:
    """One TTFT probe: a request sent straight to the model server, as the gateway forwards
    a miss."""

    tenant: str
    ttft_ms: float | None
    total_ms: float
    status: int


def probe(
    base_url: str, rows: list[dict[str, Any]], sc: LiveScenario, revisions: Any
) -> list[Probe]:
    """The rows in order, `sc.probe_concurrency` at a time, streamed; TTFT from this client."""

    async def run() -> list[Probe]:
        gate = asyncio.Semaphore(sc.probe_concurrency)
        async with httpx.AsyncClient(timeout=_TIMEOUT) as http:

            async def one(row: dict[str, Any]) -> Probe:
                async with gate:
                    body, _ = request_of(row, sc, revisions)
                    body.pop("stoker", None)  # the gateway's extension: not for the server
                    try:
                        resp, _, ttft, total = await stream_chat(
                            http, base_url.rstrip("/") + _PATH, body, {}
                        )
                    except httpx.HTTPError:
                        return Probe(row["tenant"], None, 0.0, 0)
                    return Probe(row["tenant"], ttft, total, resp.status_code)

            return list(await asyncio.gather(*(one(r) for r in rows)))

    return asyncio.run(run())
