"""POST /v1/embeddings through the embedding cache: one vector per (tenant, model, text).

Vectors are kept as float32 bytes under the embedding key of caches/keys.py (embedder id
"upstream:<model>[:<dimensions>]"), with the policy's embedding TTL. A request's texts are
read in one MGET on the event loop (within the lookup budget; a failure reads as all misses),
the misses are asked upstream in one call, and written back without holding the response.
Token inputs (lists of ints) go upstream untouched: they are not texts to key. A model the
upstream does not list is vetted as a completion's is (health.py).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from caches import keys as K
from caches.boundary import REDIS_ERRORS, as_bytes
from gateway import metrics as M
from gateway.cachegate import CacheGate
from gateway.completions import read_body
from gateway.errors import BadRequest, UpstreamFailed
from gateway.health import UpstreamHealth, warned
from gateway.identity import parse_body, resolve_tenant
from gateway.options import GatewayOptions
from gateway.upstream import Upstream

PATH = "/v1/embeddings"
# Redis down or slow: every text is a miss (fail open).
_DOWN: tuple[type[Exception], ...] = (TimeoutError, *REDIS_ERRORS)


class Embeddings:
    def __init__(
        self, gate: CacheGate, upstream: Upstream, health: UpstreamHealth, opts: GatewayOptions
    ) -> None:
        self.gate, self.upstream, self.health, self.opts = gate, upstream, health, opts
        self._writes: set[asyncio.Task[None]] = set()

    async def handle(self, request: Request) -> Response:
        body = parse_body(
            await read_body(request, self.opts.max_body_bytes), self.opts.max_body_bytes
        )
        tenant = resolve_tenant(request.headers, body, self.opts)
        texts, model = _texts(body), body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model must be a non-empty string", param="model")
        warning = self.health.vet(model)
        headers = self.upstream.headers_for(dict(request.headers))
        return warned(await self._embed(body, tenant, texts, model, headers), warning)

    async def _embed(
        self,
        body: dict[str, Any],
        tenant: str,
        texts: list[str] | None,
        model: str,
        headers: dict[str, str],
    ) -> Response:
        fmt = body.get("encoding_format") or "float"
        if texts is None or fmt not in ("float", "base64"):
            return await self._passthrough(body, headers)
        embedder = f"upstream:{model}" + (
            f":{body['dimensions']}" if body.get("dimensions") else ""
        )
        keys = [K.embedding_key(tenant, embedder, t) for t in texts]
        vectors = await self._cached(keys)
        missing = [i for i, v in enumerate(vectors) if v is None]
        tokens = 0
        if missing:
            try:
                fresh, tokens = await self._ask(body, [texts[i] for i in missing], headers)
            except _Passed as e:
                return Response(e.content, e.status, media_type="application/json")
            for i, v in zip(missing, fresh, strict=True):
                vectors[i] = v
            self._write_later([keys[i] for i in missing], fresh)
        M.served("exact" if not missing else "miss", "embeddings")
        return Response(
            orjson.dumps(_reply(model, vectors, fmt, tokens)),
            media_type="application/json",
            headers={"x-stoker-cache": "exact" if not missing else f"miss:{len(missing)}"},
        )

    async def _cached(self, keys: list[str]) -> list[np.ndarray | None]:
        try:
            raw = await asyncio.wait_for(self.gate.exact.ar.mget(keys), self.opts.lookup_budget_s)
        except _DOWN:  # down or slow: all misses (fail open)
            M.bypass("cache_down")
            return [None] * len(keys)
        return [None if b is None else np.frombuffer(as_bytes(b), dtype=np.float32) for b in raw]

    async def _ask(
        self, body: dict[str, Any], texts: list[str], headers: dict[str, str]
    ) -> tuple[list[np.ndarray], int]:
        ask = {**body, "input": texts, "encoding_format": "float"}
        reply = await self.upstream.post(PATH, orjson.dumps(ask), headers)
        if reply.status != 200:
            raise _Passed(reply.status, reply.content)
        try:
            data = orjson.loads(reply.content)
            rows = sorted(data["data"], key=lambda d: d["index"])
            vecs = [np.asarray(row["embedding"], dtype=np.float32) for row in rows]
            tokens = int((data.get("usage") or {}).get("prompt_tokens") or 0)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise UpstreamFailed(f"the upstream's embeddings are malformed: {e}") from e
        if len(vecs) != len(texts):
            raise UpstreamFailed(f"the upstream embedded {len(vecs)} of {len(texts)} inputs")
        return vecs, tokens

    def _write_later(self, keys: list[str], vecs: list[np.ndarray]) -> None:
        ttl = self.gate.cache.policy.embedding_ttl_s

        async def write() -> None:
            try:
                pipe = self.gate.exact.ar.pipeline(transaction=False)
                for k, v in zip(keys, vecs, strict=True):
                    pipe.set(k, v.astype(np.float32).tobytes(), ex=ttl)
                await pipe.execute()
            except REDIS_ERRORS:  # a lost write costs one upstream call later
                M.stored("failed")

        task = asyncio.get_running_loop().create_task(write())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _passthrough(self, body: dict[str, Any], headers: dict[str, str]) -> Response:
        M.bypass("token input")
        reply = await self.upstream.post(PATH, orjson.dumps(body), headers)
        return Response(reply.content, reply.status, reply.headers | {"x-stoker-cache": "bypass"})


class _Passed(Exception):
    """The upstream refused the misses: its answer goes to the client as it came."""

    def __init__(self, status: int, content: bytes) -> None:
        super().__init__(status)
        self.status, self.content = status, content


def _texts(body: dict[str, Any]) -> list[str] | None:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        return value
    if isinstance(value, list) and value:
        return None  # token arrays: passed through
    raise BadRequest("input must be a string or a non-empty list of strings", param="input")


def _reply(model: str, vectors: list[Any], fmt: str, tokens: int) -> dict[str, Any]:
    def enc(v: np.ndarray) -> Any:
        if fmt == "base64":
            return base64.b64encode(v.astype("<f4").tobytes()).decode()
        return v.tolist()

    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": enc(v)} for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
