"""The replay's cache and model server, in virtual time: what `stoker analyze --warming` serves from.

A request log replayed against the caches it would have met: each request is looked up by its
exact key (the one the gateway and the warmer build, caches/keys.py) at its own time; a miss
costs the GPU what the log says it cost (`gpu_ms`) and fills the entry for the TTL; a warm send
costs what the profile learned a miss of its query costs, and lands when the pacing sends it.
Entries expire on the virtual clock. No semantic layer: a paraphrase misses, with warming and
without alike (the figures are the exact cache's).

The planner reads it through the Freshness protocol (warmers/hotset/select.py) as it reads
Redis in production: the TTL left of each key, on the replay's clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from caches.keys import exact_prefix
from caches.request import CacheRequest

HOUR_S = 3600.0


@dataclass
class Entry:
    landed: float  # epoch seconds (virtual) when it became readable
    expires: float
    warm: bool  # put there by a warm send, not a live miss
    hit: bool = False  # served a request since it landed
    # a warm entry served a request that missed without warming: a hit it added
    added: bool = False
    docs: tuple[str, ...] = ()  # the documents its answer was built on (their ids)


class VirtualCache:
    """Exact entries by key, each readable from its landing until its expiry (virtual time)."""

    serves_paraphrases = False  # exact entries only

    def __init__(self, ttl_s: float, clock: Callable[[], datetime]) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self.entries: dict[str, Entry] = {}

    def get(self, key: str, t: float) -> Entry | None:
        e = self.entries.get(key)
        if e is None or not e.landed <= t < e.expires:
            return None
        return e

    def put(self, key: str, t: float, *, warm: bool, docs: tuple[str, ...] = ()) -> Entry:
        e = self.entries[key] = Entry(t, t + self.ttl_s, warm, docs=docs)
        return e

    def invalidate(self, tenant: str, doc_id: str) -> int:
        """Delete the tenant's entries built on `doc_id` (a knowledge-base change, as the
        invalidation worker deletes them by document); how many."""
        mine = exact_prefix(tenant)
        gone = [k for k, e in self.entries.items() if doc_id in e.docs and k.startswith(mine)]
        for k in gone:
            del self.entries[k]
        return len(gone)

    def ttl_left_ms(self, keys: Sequence[str]) -> list[int]:
        """As Redis's PTTL on the replay's clock: ms left, -2 absent or expired."""
        now = self.clock().timestamp()
        out = []
        for k in keys:
            e = self.entries.get(k)
            out.append(-2 if e is None or e.expires <= now else int((e.expires - now) * 1000))
        return out

    def serving_key(self, identity: CacheRequest) -> str | None:
        return None  # no semantic layer: only the exact entry serves (select._drop_fresh)

    def forget_expired(self, t: float) -> None:
        """Drop what expired before `t` (memory; nothing reads an expired entry)."""
        self.entries = {k: e for k, e in self.entries.items() if e.expires > t}


@dataclass
class Hour:
    """One virtual hour's tally."""

    requests: int = 0
    hits: int = 0
    warm_hits: int = 0  # first hits of warmed entries
    live_gpu_s: float = 0.0  # the misses' GPU time
    # ... of those no warm could have prevented: never cacheable, or never asked before
    fixed_gpu_s: float = 0.0
    sends: int = 0  # warm sends that went out in this hour
    send_gpu_s: float = 0.0


@dataclass
class Ledger:
    """Per virtual hour (epoch hour number): requests, hits, GPU time of misses and of warm
    sends; `busy_s` is what a model server's busy-seconds counter would say so far."""

    hours: dict[int, Hour] = field(default_factory=lambda: defaultdict(Hour))
    busy_s: float = 0.0

    def served(
        self, t: float, hit: bool, gpu_ms: float, warm_first: bool = False, fixed: bool = False
    ) -> None:
        """One request: a hit (`warm_first`: a warmed entry's first), or a miss costing
        `gpu_ms` (`fixed`: one no warm could have prevented)."""
        h = self.hours[int(t // HOUR_S)]
        h.requests += 1
        if hit:
            h.hits += 1
            h.warm_hits += warm_first
        else:
            h.live_gpu_s += gpu_ms / 1000.0
            h.fixed_gpu_s += gpu_ms / 1000.0 if fixed else 0.0
            self.busy_s += gpu_ms / 1000.0

    def sent(self, t: float, gpu_ms: float) -> None:
        h = self.hours[int(t // HOUR_S)]
        h.sends += 1
        h.send_gpu_s += gpu_ms / 1000.0
        self.busy_s += gpu_ms / 1000.0

    def busy(self) -> float:
        return self.busy_s
