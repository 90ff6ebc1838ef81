"""The gateway's way into the cache: synchronous cache calls on threads, a deadline, fail-open.

The cache client (caches.client) is synchronous, so lookups and stores run on a bounded thread
pool, never on the event loop. A lookup that does not answer within the budget (default 50 ms),
or fails (Redis, Qdrant or the embedder down), becomes a bypass: the request goes straight
upstream and the bypass is counted. The thread it ran on finishes on its own, bounded by the
client's socket timeouts; nothing waits for it. Stores are fire-and-forget on the same pool:
an answer reaches the client before its write lands, and a failed write costs one miss.

The live model version (caches/live.py) is read on the lookup thread too, at most once per
`live_version_ttl_s` per model, so `stoker deploy` moves every replica to the new namespace
within a second without a restart; when Redis cannot say, the last version seen serves.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from caches.client import AnswerExtras, CacheClient, CacheRequest, LookupResult
from caches.live import LiveVersions, version_for
from gateway import metrics as M
from gateway.identity import Resolved
from gateway.options import GatewayOptions
from schemas.errors import StokerError

log = logging.getLogger(__name__)


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
    """model id -> {scope: version}, refreshed at most every ttl_s; thread-safe."""

    def __init__(self, live: LiveVersions, default: str, ttl_s: float) -> None:
        self._live, self._default, self._ttl_s = live, default, ttl_s
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, dict[str, str]]] = {}

    def version(self, model_id: str, tenant: str) -> str:
        now = time.monotonic()
        with self._lock:
            at, scopes = self._seen.get(model_id, (0.0, {}))
        if now - at >= self._ttl_s:
            try:
                scopes = self._live.get(model_id)
            except StokerError as e:  # keep serving the last version seen
                log.debug("live version of %s unreadable: %s", model_id, e)
            with self._lock:
                self._seen[model_id] = (now, scopes)
        return version_for(scopes, tenant) or self._default

    def peek(self, model_id: str, tenant: str) -> str:
        """The version last seen, never asking Redis (safe on the event loop)."""
        with self._lock:
            _, scopes = self._seen.get(model_id, (0.0, {}))
        return version_for(scopes, tenant) or self._default


class CacheGate:
    def __init__(self, cache: CacheClient, opts: GatewayOptions) -> None:
        self.cache = cache
        self.opts = opts
        self.live = LiveVersionCache(
            LiveVersions(cache.redis), opts.default_model_version, opts.live_version_ttl_s
        )
        self.pool = ThreadPoolExecutor(opts.lookup_threads, thread_name_prefix="gateway-cache")
        self._stores = 0  # stores queued or running (bounded: see store_later)
        self._lock = threading.Condition()

    async def lookup(self, r: Resolved) -> Decision:
        """Ask the cache within the budget; every failure is a bypass with its reason."""
        started = time.time()
        if r.bypass is not None:
            M.bypass(r.bypass)
            return Decision(LookupResult("bypass", reason=r.bypass), None, "", started)
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.pool, self._lookup, r)
        try:
            version, req, res = await asyncio.wait_for(fut, self.opts.lookup_budget_s)
        except TimeoutError:
            M.bypass("deadline")
            return self._bypassed("deadline", started)
        except StokerError as e:
            reason = "rejected" if e.kind == "poison" else "cache_down"
            M.bypass(reason)
            log.debug("lookup bypassed (%s): %s", reason, e)
            return self._bypassed(f"{reason}: {e}", started)
        return Decision(res, req, version, started)

    def _lookup(self, r: Resolved) -> tuple[str, CacheRequest, LookupResult]:
        version = r.version_override or self.live.version(r.model_id, r.tenant)
        req = r.cache_request(version)
        res = self.cache.lookup(req) if r.read else self.cache.ticket(req)
        return version, req, res

    @staticmethod
    def _bypassed(reason: str, started: float) -> Decision:
        return Decision(LookupResult("bypass", reason=reason), None, "", started)

    def store_later(self, d: Decision, answer: Answer) -> bool:
        """Queue the write; False when it is not worth a thread (no ticket) or the pool is
        backed up (more than 4 stores a thread waiting: the cache is slow, serve on)."""
        if d.result.ticket is None:
            return False
        with self._lock:
            if self._stores >= 4 * self.opts.lookup_threads:
                M.stored("skipped_busy")
                return False
            self._stores += 1
        self.pool.submit(self._store, d, answer)
        return True

    def _store(self, d: Decision, a: Answer) -> None:
        try:
            out = self.cache.store(
                d.result, a.text, tokens_in=a.tokens_in, tokens_out=a.tokens_out,
                gpu_ms=a.gpu_ms, generated_at=d.started_at, finish_reason=a.finish_reason,
                extras=AnswerExtras(a.reasoning, a.tool_calls),
            )  # fmt: skip
            M.stored("landed" if out.landed else "refused")
            if not out.landed:
                log.debug("answer not stored: %s", out.reason)
        except StokerError as e:
            M.stored("failed")
            log.debug("answer not stored: %s", e)
        finally:
            with self._lock:
                self._stores -= 1
                self._lock.notify_all()

    def store_negative_later(self, d: Decision) -> None:
        if d.result.ticket is not None:
            self.pool.submit(self._store_negative, d)

    def _store_negative(self, d: Decision) -> None:
        try:
            self.cache.store_negative(d.result)
        except StokerError as e:
            log.debug("negative entry not stored: %s", e)

    def ping(self) -> bool:
        """Redis answers (for /readyz; the gateway serves either way)."""
        try:
            return bool(self.cache.redis.ping())
        except Exception:
            return False

    def close(self, timeout_s: float = 10.0) -> None:
        """Let queued stores land (bounded), then stop the pool."""
        with self._lock:
            self._lock.wait_for(lambda: self._stores == 0, timeout_s)
        self.pool.shutdown(wait=False, cancel_futures=True)
