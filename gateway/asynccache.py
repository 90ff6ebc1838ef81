"""The cache's Redis reads and writes on the gateway's event loop (redis.asyncio).

The synchronous client on threads lost to the GIL: under load every Redis call on a thread
waited for the busy event loop to hand the GIL over (a switch interval, 5 ms, each time), so a
miss's four round trips outgrew a 50 ms budget and the gateway bypassed its own cache
(bench_gateway; docs/benchmarks.md, "The gateway", has the figures). These calls run on the
loop instead, between the I/O-free steps of caches.client (probe, found, prepare_store,
finish_store) and of caches.generations (gen_keys, ticket_of, write_call, write_outcome), so the
key scheme, the generation snapshot and the write script stay one implementation. What costs
CPU (embedding, vector search, indexing) still runs on threads.
"""

from __future__ import annotations

from typing import Any

import msgspec
import redis.asyncio as aredis

from caches import constants as C
from caches import metrics as CM
from caches import slots
from caches.boundary import REDIS_ERRORS
from caches.client import CacheClient, not_stored
from caches.generations import (
    WRITE_LUA,
    WriteTicket,
    gen_keys,
    ticket_of,
    write_call,
    write_outcome,
)
from caches.keys import retired_marker_key
from caches.request import CacheRequest, LookupResult, PreparedWrite, Probe
from schemas.errors import CacheUnavailable


class AsyncExact:
    """lookup_exact, ticket and the write of CacheClient, awaited instead of blocking."""

    def __init__(self, cache: CacheClient, ar: aredis.Redis) -> None:
        self.cache = cache
        self.ar = ar
        self._write = ar.register_script(WRITE_LUA)

    async def lookup_exact(self, req: CacheRequest) -> LookupResult:
        """An exact / negative hit, a bypass, or a miss holding its write ticket."""
        p = self.cache.probe(req)
        if not isinstance(p, Probe):
            return p
        try:
            hit = self.cache.found(p, await self.ar.get(p.exact_key))
            if hit is not None:
                return hit
            key = p.cache_key()
            negative, unstored = await self.ar.mget([key.negative(), key.unstored()])  # one slot
            if negative:
                return self.cache.negative(p)
            miss = await self._snapshot(p.req, p.exact_key)
            return msgspec.structs.replace(miss, reason=not_stored(unstored))
        except REDIS_ERRORS as e:
            raise CacheUnavailable(f"redis lookup failed: {type(e).__name__}: {e}") from e

    async def ticket(self, req: CacheRequest) -> LookupResult:
        """CacheClient.ticket: a write ticket without reading (Cache-Control: no-cache)."""
        p = self.cache.probe(req)
        if isinstance(p, LookupResult) and p.outcome == "bypass":
            return p
        try:
            return await self._snapshot(req, req.key().exact())
        except REDIS_ERRORS as e:
            raise CacheUnavailable(f"redis snapshot failed: {type(e).__name__}: {e}") from e

    async def _snapshot(self, req: CacheRequest, exact_key: str) -> LookupResult:
        gens = self.cache.generations
        key = req.key()
        tenant = key.ns.tenant
        if not gens.registered(tenant):  # the retirement protocol: register, then snapshot
            await self.ar.sadd(C.TENANT_REGISTRY, tenant)
            gens.note_registered(tenant)
        names = gen_keys(key, req.docs)
        pipe = self.ar.pipeline(transaction=False)
        pipe.exists(retired_marker_key(key.ns.model_id, key.ns.model_version))
        slots.mget_in(pipe, names)  # one tenant: one slot
        retired, vals = await pipe.execute()
        ticket = ticket_of(key, req.docs, names, bool(retired), vals)
        return LookupResult("miss", ticket=ticket, key=exact_key)

    async def write(self, w: PreparedWrite) -> str | None:
        """Run the write script: None when the entry landed, else the key that refused it."""
        if w.ticket.retired:
            return "retired"
        keys, argv = write_call(w.ticket, w.payload, self.cache.policy.exact_ttl_s)
        try:
            reply: Any = await self._write(keys=keys, args=argv)
        except REDIS_ERRORS as e:
            raise CacheUnavailable(f"redis write failed: {type(e).__name__}: {e}") from e
        return write_outcome(reply)

    async def store_negative(self, res: LookupResult) -> None:
        if res.ticket is None:
            return
        try:
            await self.ar.set(res.ticket.key.negative(), b"1", ex=self.cache.policy.negative_ttl_s)
        except REDIS_ERRORS as e:
            raise CacheUnavailable(f"redis negative write failed: {e}") from e

    async def mark_unstored(self, t: WriteTicket, why: str) -> None:
        """CacheClient.unstored_mark, set: the request's next misses say `why`."""
        key, value, ttl_s = self.cache.unstored_mark(t, why)
        try:
            await self.ar.set(key, value, ex=ttl_s)
        except REDIS_ERRORS as e:
            raise CacheUnavailable(f"redis not-stored mark failed: {e}") from e

    async def ping(self) -> bool:
        try:
            return bool(await self.ar.ping())
        except REDIS_ERRORS:
            return False

    async def aclose(self) -> None:
        await self.ar.aclose()


count_store = CM.count_store
