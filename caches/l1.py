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
Standalone Redis only: on a cluster, tracking is per node (one listener per primary; not built).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
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
# How long the listener blocks for a message before checking stop() and sync requests: stop()
# takes at most this, and a sync() one round trip more.
_READ_S = 0.05
# Reconnect back-off after the listener connection dropped (the L1 is off meanwhile).
_RECONNECT_S = 0.5
# Reservations outstanding at most, as a multiple of max_entries: a lookup that missed and was
# never followed by a write leaves one behind; past the cap they are all dropped (safe: a fill
# without its reservation is refused, which costs only a Redis read).
_PENDING_FACTOR = 4


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
        self._syncs: list[_Sync] = []  # round trips asked for, not yet sent
        self._thread = threading.Thread(target=self._listen, name="l1-invalidations", daemon=True)
        # For tests and metrics: keys dropped by messages, fills kept and refused.
        self.invalidations = 0
        self.fills = 0
        self.refused_fills = 0

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

    def sync(self, timeout_s: float = 5.0) -> bool:
        """A PING round trip on the tracking connection: True once every invalidation message
        the server queued for us before this call has been applied; False if tracking is off
        or the round trip did not complete within timeout_s."""
        if not self._tracking:
            return False
        ask = _Sync(f"l1-sync-{uuid.uuid4().hex}")
        with self._lock:
            self._syncs.append(ask)
        return ask.done.wait(timeout_s) and ask.ok

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
            self._tracking = on
            if not on:  # messages may have been lost: nothing cached can be trusted
                self._entries.clear()
                self._pending.clear()
                asked, self._syncs = self._syncs, []
                for ask in asked:
                    ask.finish(ok=False)

    def _listen(self) -> None:
        while not self._stop.is_set():
            conn = Connection(**self._conn_kwargs)  # type: ignore[no-untyped-call]
            sent: dict[str, _Sync] = {}
            try:
                self._track(conn)
                while not self._stop.is_set():
                    self._send_syncs(conn, sent)
                    if conn.can_read(timeout=_READ_S):
                        reply = conn.read_response(push_request=True)  # pushes call _on_push
                        self._on_reply(reply, sent)
            except redis.RedisError as exc:
                log.warning("L1: tracking connection lost (%s); L1 off until it is back", exc)
            finally:
                self._set_tracking(False)
                for ask in sent.values():  # their answers are lost with the connection
                    ask.finish(ok=False)
                conn.disconnect()  # type: ignore[no-untyped-call]
            self._stop.wait(_RECONNECT_S)

    def _send_syncs(self, conn: Connection, sent: dict[str, _Sync]) -> None:
        with self._lock:
            asked, self._syncs = self._syncs, []
        for ask in asked:
            sent[ask.payload] = ask
            conn.send_command("PING", ask.payload)  # type: ignore[no-untyped-call]

    @staticmethod
    def _on_reply(reply: Any, sent: dict[str, _Sync]) -> None:
        """A non-push reply on the tracking connection can only answer a sync PING: the server
        wrote every message it queued for us before it."""
        if reply is None:
            return
        payload = reply.decode() if isinstance(reply, bytes) else str(reply)
        ask = sent.pop(payload, None)
        if ask is not None:
            ask.finish(ok=True)

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


class _Sync:
    """One sync() round trip: the PING payload, and whether its answer came back."""

    __slots__ = ("done", "ok", "payload")

    def __init__(self, payload: str) -> None:
        self.payload = payload
        self.ok = False
        self.done = threading.Event()

    def finish(self, *, ok: bool) -> None:
        self.ok = ok
        self.done.set()


def _prefix_args(prefixes: Sequence[str]) -> list[str]:
    return [a for p in prefixes for a in ("PREFIX", p)]
