"""The gateway's way into the cache: Redis on the event loop, CPU work on threads, a deadline,
fail-open.

A lookup has one budget (default 50 ms) and two steps:
1. exact (and negative), and on a miss the write ticket: redis.asyncio on the loop
   (asynccache.py: no thread hop and no GIL handoff on the hit path);
2. the semantic search (embedding, vector search) on a thread, with what is left of the budget
   as the embedder's deadline (caches/embedders.py: lookups go before background embeds, and a
   late one is dropped, not computed).
A failure or timeout in 1 (Redis down or slow) is a bypass: the request goes straight upstream
and the bypass is counted. In 2 only the semantic layer is skipped: the miss keeps its ticket,
so its answer is still stored, and its reason says so (semantic_deadline, semantic_down).
Stores are tasks (the script on the loop, the semantic index on a thread), bounded in number;
the response waits for one, up to `index_wait_ms`, before its last byte (completions.py), so that
a paraphrase asked the moment the answer is read finds it; a failed write costs one miss. An
answer refused for itself (cut at max_tokens) leaves a not-stored mark instead, in Redis and in
the semantic store, so its repeat and its look-alikes say why they missed (not_stored).

The live model version (caches/live.py) is read at most once per `live_version_ttl_s` per model,
so `stoker deploy` moves every replica to the new namespace within a second without a restart;
when Redis cannot say, the last version seen serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec
import redis.asyncio as aredis

from caches import keys as K
from caches.boundary import REDIS_ERRORS
from caches.client import OVER_LIMIT, CacheClient
from caches.embedders import EmbedDeadlinePassed, embed_deadline
from caches.generations import WriteTicket
from caches.live import scopes_of, version_for
from caches.request import AnswerExtras, CacheRequest, LookupResult, StoreResult
from gateway import metrics as M
from gateway.asynccache import AsyncExact, count_store
from gateway.identity import Resolved
from gateway.options import GatewayOptions
from schemas.errors import StokerError

log = logging.getLogger(__name__)

# Redis down, or a live-version hash that does not parse.
_UNREADABLE: tuple[type[Exception], ...] = (*REDIS_ERRORS, ValueError, KeyError)


@dataclass(frozen=True)
class Decision:
    """What the cache said about one request, and under which identity it asked."""

    result: LookupResult
    request: CacheRequest | None  # None: the cache was not asked (a bypass before the lookup)
    model_version: str
    started_at: float  # time.time() when the lookup began: a write began no earlier

    @property
    def outcome(self) -> str:
        return self.result.outcome


@dataclass(frozen=True)
class Answer:
    """An answer to store: the text and what a replay must carry besides it."""

    text: str
    finish_reason: str
    tokens_in: int = 0
    tokens_out: int = 0
    gpu_ms: float = 0.0
    reasoning: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()


class LiveVersionCache:
    """model id -> {scope: version}, refreshed at most every ttl_s (one event loop)."""

    def __init__(self, ar: aredis.Redis, default: str, ttl_s: float) -> None:
        self._ar, self._default, self._ttl_s = ar, default, ttl_s
        self._seen: dict[str, tuple[float, dict[str, str]]] = {}

    async def version(self, model_id: str, tenant: str) -> str:
        now = time.monotonic()
        at, scopes = self._seen.get(model_id, (0.0, {}))
        if now - at >= self._ttl_s:
            self._seen[model_id] = (now, scopes)  # one refresh at a time per model
            try:
                scopes = scopes_of(await self._ar.hgetall(K.live_versions_key(model_id)))
            except _UNREADABLE as e:  # serve the last one seen
                log.debug("live version of %s unreadable: %s", model_id, e)
            self._seen[model_id] = (now, scopes)
        return version_for(scopes, tenant) or self._default

    def peek(self, model_id: str, tenant: str) -> str:
        """The version last seen, never asking Redis."""
        _, scopes = self._seen.get(model_id, (0.0, {}))
        return version_for(scopes, tenant) or self._default


class CacheGate:
    def __init__(self, cache: CacheClient, ar: aredis.Redis, opts: GatewayOptions) -> None:
        self.cache = cache
        self.opts = opts
        self.exact = AsyncExact(cache, ar)
        self.live = LiveVersionCache(ar, opts.default_model_version, opts.live_version_ttl_s)
        # What costs CPU or blocks: semantic searches, indexing, the embedding cache's reads.
        self.pool = ThreadPoolExecutor(opts.lookup_threads, thread_name_prefix="gateway-cache")
        # Indexing a stored answer waits for the embedder's background passes, which lookups go
        # before: on a pool of its own it never holds a lookup's thread (sharing one, 32
        # clients' stores held all 16 and 843 of 906 lookups found none within the budget).
        self.index_pool = ThreadPoolExecutor(
            max(1, opts.lookup_threads // 4), thread_name_prefix="gateway-index"
        )
        self._stores: set[asyncio.Task[None]] = set()  # in flight, bounded (see store_later)

    async def lookup(self, r: Resolved) -> Decision:
        """Ask the cache within the budget (the module docstring has the two steps)."""
        started, t0 = time.time(), time.perf_counter()
        if r.bypass is not None:
            M.bypass(r.bypass)
            return Decision(LookupResult("bypass", reason=r.bypass), None, "", started)
        budget = self.opts.lookup_budget_s
        try:
            version, req, res = await asyncio.wait_for(self._exact(r), budget)
        except TimeoutError:
            M.bypass("deadline")
            return self._bypassed("deadline", started)
        except StokerError as e:
            reason = "rejected" if e.kind == "poison" else "cache_down"
            M.bypass(reason)
            log.debug("lookup bypassed (%s): %s", reason, e)
            return self._bypassed(f"{reason}: {e}", started)
        if res.outcome == "bypass":  # the cache's own: over its limit, an empty prompt, ...
            M.bypass("over_limit" if res.reason.startswith(OVER_LIMIT) else res.reason)
        if res.outcome == "miss" and r.read and self.cache.semantic is not None:
            res = await self._semantic(req, res, budget - (time.perf_counter() - t0))
        self.cache.observe(res, time.perf_counter() - t0)
        return Decision(res, req, version, started)

    async def _exact(self, r: Resolved) -> tuple[str, CacheRequest, LookupResult]:
        version = r.version_override or await self.live.version(r.model_id, r.tenant)
        req = r.cache_request(version)
        res = await (self.exact.lookup_exact(req) if r.read else self.exact.ticket(req))
        return version, req, res

    async def _semantic(self, req: CacheRequest, miss: LookupResult, left_s: float) -> LookupResult:
        """The semantic half on a thread, with what is left of the budget. The deadline goes
        along (embed_deadline): the embedder serves this lookup before background work, and
        drops it rather than compute it late."""
        loop = asyncio.get_running_loop()
        left_s = max(left_s, 0.0)
        deadline = time.monotonic() + left_s
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self.pool, self._semantic_by, req, miss, deadline), left_s
            )
        except TimeoutError:  # the wait, or the embedder giving up at the deadline
            M.bypass("semantic_deadline")
            ms = round(self.opts.lookup_budget_s * 1000)
            reason = f"semantic_deadline: the semantic lookup took over the {ms} ms lookup budget"
        except StokerError as e:
            M.bypass("semantic_down")
            log.debug("semantic lookup skipped: %s", e)
            reason = f"semantic_down: {e}"
        return msgspec.structs.replace(miss, reason=miss.reason or reason)  # not_stored first

    def _semantic_by(self, req: CacheRequest, miss: LookupResult, deadline: float) -> LookupResult:
        if time.monotonic() >= deadline:  # queued for a thread past its budget: do nothing
            raise EmbedDeadlinePassed("no lookup thread free within the budget")
        with embed_deadline(deadline):
            return self.cache.lookup_semantic(req, miss)

    @staticmethod
    def _bypassed(reason: str, started: float) -> Decision:
        return Decision(LookupResult("bypass", reason=reason), None, "", started)

    # -- writes --

    def store_later(
        self, d: Decision, a: Answer, on_done: Callable[[], None] | None = None
    ) -> asyncio.Event | None:
        """Start the write as a task. The event is set once it is over: the entry written and
        indexed for semantic search, or an answer refused for itself remembered as not stored
        (both searchable then), or the write refused or failed. on_done runs once the exact
        entry is written (at once for a refused answer), before indexing.
        None when there is nothing to write or too many writes are in flight already (the
        cache is slow: serve on)."""
        t = d.result.ticket
        if t is None:
            return None
        if len(self._stores) >= 4 * self.opts.lookup_threads:
            M.stored("skipped_busy")
            return None
        w = self.cache.prepare_store(
            d.result, a.text, tokens_in=a.tokens_in, tokens_out=a.tokens_out, gpu_ms=a.gpu_ms,
            generated_at=d.started_at, finish_reason=a.finish_reason,
            extras=AnswerExtras(a.reasoning, a.tool_calls),
        )  # fmt: skip
        if isinstance(w, StoreResult):
            count_store(w)
            M.stored("refused")
            if not w.unstored:
                return None
            if on_done is not None:
                on_done()
            return self._spawn(self._remember(t, w.unstored))
        return self._spawn(self._store(w, on_done))

    def _spawn(self, write: Awaitable[None]) -> asyncio.Event:
        """Run `write` as a task the gate tracks (aclose waits for it); the event is set when
        it ends, however it ends."""
        over = asyncio.Event()
        task = asyncio.get_running_loop().create_task(_setting(over, write))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)
        return over

    async def _store(self, w: Any, on_done: Callable[[], None] | None) -> None:
        try:
            try:
                refused_by = await self.exact.write(w)
            finally:
                if on_done is not None:
                    on_done()
            if refused_by is None and self.cache.semantic is not None:  # indexing embeds
                loop = asyncio.get_running_loop()
                out = await loop.run_in_executor(self.index_pool, self.cache.finish_store, w, None)
            else:
                out = self.cache.finish_store(w, refused_by)
            count_store(out)
            M.stored("landed" if out.landed else "refused")
            if not out.landed:
                log.debug("answer not stored: %s", out.reason)
        except StokerError as e:
            M.stored("failed")
            log.debug("answer not stored: %s", e)

    async def _remember(self, t: WriteTicket, why: str) -> None:
        """The not-stored mark, in Redis (the repeat's miss) and in the semantic store (its
        look-alikes'); a lost one only costs a reason."""
        try:
            await self.exact.mark_unstored(t, why)
            if self.cache.semantic is not None:  # indexing embeds
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self.index_pool, self.cache.index_unstored, t, why)
        except StokerError as e:
            log.debug("not-stored mark not written: %s", e)

    def store_negative_later(self, d: Decision) -> None:
        if d.result.ticket is None:
            return
        task = asyncio.get_running_loop().create_task(self._store_negative(d))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    async def _store_negative(self, d: Decision) -> None:
        try:
            await self.exact.store_negative(d.result)
        except StokerError as e:
            log.debug("negative entry not stored: %s", e)

    async def ping(self) -> bool:
        """Redis answers (for /readyz; the gateway serves either way)."""
        return await self.exact.ping()

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Let writes in flight land (bounded), then release the Redis pool and the threads."""
        if self._stores:
            await asyncio.wait(set(self._stores), timeout=timeout_s)
        await self.exact.aclose()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.index_pool.shutdown(wait=False, cancel_futures=True)


async def _setting(over: asyncio.Event, write: Awaitable[None]) -> None:
    try:
        await write
    finally:
        over.set()
