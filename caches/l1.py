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
2. before reading Redis, a lookup `reserve`s the key and gets the key's reservation token;
   lookups of the same key that overlap share one token, so concurrent readers of a hot key
   never cancel each other (one token per reader did: each new reader's token made the
   previous reader's fill fail, so under steady concurrency no fill ever landed);
3. an invalidation message for the key drops its entry *and* its reservation;
4. `fill` lands only if the key's reservation is still that token: a change after the read
   produced a message that removed it (the read saw a change before it; never both missed).
A message can arrive late, after the reserve, for a change that came before the read: that
fill is refused although the value was fresh. It costs one more Redis read and nothing else:
the refused reservation is gone, so the next lookup's reservation is new and fills.
`sync()` is a round trip on the tracking connection: once it returns, every message for a
change made before the call has been applied (tests and benchmarks use it instead of sleeps).
The TTL (default 5 s) bounds staleness if the server ever drops the tracking state silently.

On a Redis Cluster each primary reports changes of its own keys only, so there is one tracking
connection per primary (caches/tracking.py), and the L1 is on only while every primary that
serves slots has a tracking connection that the server said OK to. Losing any of them empties
the L1 and turns it off, as one server's did. Every TOPOLOGY_S the L1 asks the cluster which
primaries serve the slots (CLUSTER SLOTS): a failover is seen at once (the dead primary's
connection drops), a resharding or a promotion with the old primary alive within TOPOLOGY_S;
any change empties the L1 and it turns on again once the new set of connections is tracking.
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
from pydantic import BaseModel, ConfigDict, Field

from caches import keys as K
from caches.tracking import Listener, Sync, Topology
from schemas.entries import CacheEntry

log = logging.getLogger(__name__)

# 10,000 answers of ~2 KB: ~20 MB per serving process, enough for a tenant's hot set.
DEFAULT_MAX_ENTRIES = 10_000
# A safety net, not the mechanism: invalidation messages drop entries within a millisecond on
# loopback; the TTL only bounds what a silently lost tracking session could leave behind.
DEFAULT_TTL_S = 5.0
# How often a cluster's primaries are asked for (one CLUSTER SLOTS per process): bounds how
# long a resharding, or a promotion whose old primary stays up, goes unseen.
TOPOLOGY_S = 1.0
# Reservations outstanding at most, as a multiple of max_entries: a lookup that missed and was
# never followed by a write leaves one behind; past the cap they are all dropped (safe: a fill
# without its reservation is refused, which costs only a Redis read).
_PENDING_FACTOR = 4


class L1Options(BaseModel):
    """The owner of the l1_* settings' defaults and bounds (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = False  # off by default: each serving process then holds no copy
    max_entries: int = Field(default=DEFAULT_MAX_ENTRIES, ge=1)
    ttl_s: float = Field(default=DEFAULT_TTL_S, gt=0)


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
        self.prefixes = [K.exact_prefix(t) for t in tenants] if tenants else [K.TENANT_KEYS_PREFIX]
        self._topology = Topology(r)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, CacheEntry]] = OrderedDict()
        self._pending: dict[str, int] = {}
        self._tokens = itertools.count(1)
        self._tracking = False
        self._listeners: dict[str, Listener] = {}  # primary (host:port) -> its connection
        self._serving: list[str] = []  # the primaries the last topology check found
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="l1-topology", daemon=True)
        # For tests and metrics: keys dropped by messages, fills kept and refused.
        self.invalidations = 0
        self.fills = 0
        self.refused_fills = 0

    # -- lifecycle --

    def start(self, timeout_s: float = 5.0) -> L1Cache:
        """Start a listener per primary and wait (bounded) until every one is tracking."""
        self._follow()
        if self._topology.cluster:
            self._watcher.start()
        if not self._ready.wait(timeout_s):
            log.warning("L1: tracking not on after %.1f s; the L1 stays off until it is", timeout_s)
        return self

    def close(self) -> None:
        self._stop.set()
        if self._watcher.is_alive():
            self._watcher.join(TOPOLOGY_S + 2.0)
        with self._lock:
            listeners, self._listeners = list(self._listeners.values()), {}
        for listener in listeners:
            listener.stop()
        self._set_tracking(False)

    def __enter__(self) -> L1Cache:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def tracking(self) -> bool:
        return self._tracking

    def sync(self, timeout_s: float = 5.0) -> bool:
        """A PING round trip on the tracking connection: True once every invalidation message
        the server queued for us before this call has been applied; False if tracking is off
        or the round trip did not complete within timeout_s."""
        with self._lock:
            if not self._tracking:
                return False
            listeners = list(self._listeners.values())
        asks = [Sync() for _ in listeners]
        for listener, ask in zip(listeners, asks, strict=True):
            listener.ask_sync(ask)
        deadline = time.monotonic() + timeout_s
        return all(a.done.wait(max(0.0, deadline - time.monotonic())) and a.ok for a in asks)

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
        """Call before reading Redis; None while tracking is off (then never fill). Overlapping
        reservations of one key share its token (see the protocol, step 2)."""
        with self._lock:
            if not self._tracking:
                return None
            token = self._pending.get(key)
            if token is None:
                if len(self._pending) >= _PENDING_FACTOR * self.max_entries:
                    self._pending.clear()
                token = self._pending[key] = next(self._tokens)
            return token

    def fill(self, key: str, token: int | None, entry: CacheEntry) -> bool:
        """Keep what Redis returned, unless a change of the key was reported since reserve()."""
        with self._lock:
            if token is None or self._pending.get(key) != token:
                self.refused_fills += token is not None
                return False
            del self._pending[key]
            self._entries[key] = (time.monotonic() + self.ttl_s, entry)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            self.fills += 1
            return True

    def release(self, key: str, token: int | None) -> None:
        """The read found nothing to fill: drop the reservation (if it is still this one)."""
        with self._lock:
            if token is not None and self._pending.get(key) == token:
                del self._pending[key]

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def pending(self) -> int:
        """Reservations outstanding (lookups between reserve and fill or release)."""
        return len(self._pending)

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
            self._set_tracking_locked(on)

    def _set_tracking_locked(self, on: bool) -> None:
        self._tracking = on
        if on:
            self._ready.set()
        else:  # messages may have been lost: nothing cached can be trusted
            self._entries.clear()
            self._pending.clear()

    # -- one listener per primary --

    def _on_state(self, listener: Listener, on: bool) -> None:
        with self._lock:
            if self._listeners.get(listener.name) is not listener:
                return  # stopped after a topology change; _follow turned the L1 off then
            self._set_tracking_locked(on and self._all_tracking())

    def _all_tracking(self) -> bool:
        return set(self._listeners) == set(self._serving) and all(
            lst.tracking for lst in self._listeners.values()
        )

    def _watch(self) -> None:
        while not self._stop.wait(TOPOLOGY_S):
            try:
                self._follow()
            except Exception:  # the watcher must outlive any one bad answer
                log.exception("L1: topology check failed; trying again in %.1f s", TOPOLOGY_S)

    def _follow(self) -> None:
        """Listen to exactly the primaries that serve slots now; a change empties the L1."""
        now = self._topology.primaries_now()
        if now is None or now == self._serving:
            return  # nobody answered (keep what we have: lost connections turn the L1 off)
        with self._lock:
            if self._stop.is_set():
                return
            if self._serving:
                log.info("L1: primaries now %s (were %s)", now, self._serving)
            self._serving = now
            gone = [self._listeners.pop(n) for n in list(self._listeners) if n not in now]
            new = [
                Listener(n, self._topology.connect_kwargs(n), self.prefixes, self._on_push,
                         self._on_state)
                for n in now if n not in self._listeners
            ]  # fmt: skip
            self._listeners.update((lst.name, lst) for lst in new)
            self._set_tracking_locked(False)
        for lst in gone:
            lst.stop()
        for lst in new:
            lst.start()
