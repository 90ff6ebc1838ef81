"""In-process L1 in front of exact lookups: a bounded LRU with TTL that Redis itself invalidates.

Invalidation is Redis client-side caching (CLIENT TRACKING, RESP3, broadcast mode), not a
channel the invalidators publish to: the server reports every change to a tracked key prefix,
so every way an entry can go (KB change, context or namespace flush, version purge, TTL expiry,
eviction, a hand-typed DEL, FLUSHDB) drops it from every L1, and no invalidation path can forget
to tell the L1s. Broadcast mode (BCAST PREFIX) is used because the L1 fills from the ordinary
connection pool: the server need not have seen the read on the tracking connection.

Protocol (why a fill can never resurrect a deleted entry):
1. the listener connection turns tracking on for the exact-entry prefixes; until the server
   says OK (and after any disconnect, which clears everything) the L1 is off: get/reserve miss;
2. before reading Redis, a lookup `reserve`s the key (a token per reservation);
3. an invalidation message for the key drops its entry *and* its reservation;
4. `fill` lands only if the reservation is still the lookup's own: a change after the read
   produced a message that removed it (the read saw a change before it; never both missed).
The TTL (default 5 s) bounds staleness if the server ever drops the tracking state silently.
Standalone Redis only: on a cluster, tracking is per node (one listener per primary; not built).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import redis
from redis.connection import Connection

from caches import constants as C
from caches import keys as K
from schemas.entries import CacheEntry

log = logging.getLogger(__name__)

# 10,000 answers of ~2 KB: ~20 MB per serving process, enough for a tenant's hot set.
DEFAULT_MAX_ENTRIES = 10_000
# A safety net, not the mechanism: invalidation messages drop entries within a millisecond on
# loopback; the TTL only bounds what a silently lost tracking session could leave behind.
DEFAULT_TTL_S = 5.0
# How long the listener blocks for a message before checking stop(): stop() takes at most this.
_READ_S = 0.1
# Reconnect back-off after the listener connection dropped (the L1 is off meanwhile).
_RECONNECT_S = 0.5


class L1Cache:
    """Thread-safe. start() before use (or use as a context manager); close() stops the listener."""

    def __init__(
        self,
        r: redis.Redis,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl_s: float = DEFAULT_TTL_S,
        tenants: Sequence[str] | None = None,
    ) -> None:
        if max_entries < 1 or ttl_s <= 0:
            raise ValueError("max_entries must be >= 1 and ttl_s > 0")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        # One prefix per tenant served (only its exact entries), or every tenant's keys.
        self.prefixes = (
            [f"{K.tenant_tag(t)}:{C.KIND_EXACT}:" for t in tenants]
            if tenants
            else [f"{C.KEY_ROOT}:{{t:"]
        )
        kwargs = dict(r.connection_pool.connection_kwargs)
        kwargs["protocol"] = 3  # invalidations arrive as RESP3 pushes on the tracking connection
        self._conn_kwargs: dict[str, Any] = kwargs
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, CacheEntry]] = OrderedDict()
        self._pending: dict[str, int] = {}
        self._tokens = itertools.count(1)
        self._tracking = False
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="l1-invalidations", daemon=True)
        self.invalidations = 0  # keys dropped by messages, for tests and metrics

    # -- lifecycle --

    def start(self, timeout_s: float = 5.0) -> L1Cache:
        """Start the listener and wait (bounded) until tracking is on."""
        self._thread.start()
        if not self._ready.wait(timeout_s):
            log.warning("L1: tracking not on after %.1f s; the L1 stays off until it is", timeout_s)
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5 * _READ_S + 1.0)
        self._set_tracking(False)

    def __enter__(self) -> L1Cache:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def tracking(self) -> bool:
        return self._tracking

    # -- the read path --

    def get(self, key: str) -> CacheEntry | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            if hit[0] < time.monotonic():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return hit[1]

    def reserve(self, key: str) -> int | None:
        """Call before reading Redis; None while tracking is off (then never fill)."""
        with self._lock:
            if not self._tracking:
                return None
            token = next(self._tokens)
            self._pending[key] = token
            return token

    def fill(self, key: str, token: int | None, entry: CacheEntry) -> bool:
        """Keep what Redis returned, unless a change of the key was reported since reserve()."""
        with self._lock:
            if token is None or self._pending.get(key) != token:
                return False
            del self._pending[key]
            self._entries[key] = (time.monotonic() + self.ttl_s, entry)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return True

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self._entries)

    # -- invalidation --

    def _on_push(self, msg: list[Any]) -> None:
        keys = msg[1] if len(msg) > 1 else None
        with self._lock:
            if keys is None:  # FLUSHDB / FLUSHALL: everything goes
                self._entries.clear()
                self._pending.clear()
                return
            for k in keys:
                key = k.decode() if isinstance(k, bytes) else str(k)
                self._pending.pop(key, None)
                if self._entries.pop(key, None) is not None:
                    self.invalidations += 1

    def _set_tracking(self, on: bool) -> None:
        with self._lock:
            self._tracking = on
            if not on:  # messages may have been lost: nothing cached can be trusted
                self._entries.clear()
                self._pending.clear()

    def _listen(self) -> None:
        while not self._stop.is_set():
            conn = Connection(**self._conn_kwargs)  # type: ignore[no-untyped-call]
            try:
                self._track(conn)
                while not self._stop.is_set():
                    if conn.can_read(timeout=_READ_S):
                        conn.read_response(push_request=True)  # calls _on_push
            except redis.RedisError as exc:
                log.warning("L1: tracking connection lost (%s); L1 off until it is back", exc)
            finally:
                self._set_tracking(False)
                conn.disconnect()  # type: ignore[no-untyped-call]
            self._stop.wait(_RECONNECT_S)

    def _track(self, conn: Connection) -> None:
        conn.connect()  # type: ignore[no-untyped-call]
        conn._parser.set_invalidation_push_handler(self._on_push)
        args = ("CLIENT", "TRACKING", "ON", "BCAST", *_prefix_args(self.prefixes))
        conn.send_command(*args)  # type: ignore[no-untyped-call]
        reply = conn.read_response()
        if reply not in (b"OK", "OK"):
            raise redis.ResponseError(f"CLIENT TRACKING answered {reply!r}")
        self._set_tracking(True)
        self._ready.set()


def _prefix_args(prefixes: Sequence[str]) -> list[str]:
    return [a for p in prefixes for a in ("PREFIX", p)]
