"""What the cache holds, as the planner asks it: the TTL left of exact entries, and which entry a
request would be served from. The cache's own Redis in production; a replay's virtual cache
(warmers/replay/cache.py) in `stoker analyze --warming`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import redis

from caches.boundary import redis_boundary
from caches.client import CacheClient
from caches.request import CacheRequest
from schemas.errors import RequestRejected


class Freshness(Protocol):
    """What the cache holds, as the planner asks it (step 5): the TTL left of exact entries
    (ms; -2 absent, -1 no expiry), and which entry a request would be served from."""

    serves_paraphrases: bool  # serving_key looks beyond the exact entry (a semantic store)

    def ttl_left_ms(self, keys: Sequence[str]) -> list[int]: ...

    def serving_key(self, identity: CacheRequest) -> str | None: ...


class CacheFreshness:
    """Freshness from the cache itself: PTTLs pipelined on its Redis; the serving entry by the
    lookup a request would make (exact, then semantic), with `cache`, else the exact one."""

    def __init__(self, r: redis.Redis, cache: CacheClient | None = None) -> None:
        self.redis, self.cache = r, cache
        self.serves_paraphrases = cache is not None

    def ttl_left_ms(self, keys: Sequence[str]) -> list[int]:
        if not keys:
            return []
        with redis_boundary("hot set freshness"):
            pipe = self.redis.pipeline(transaction=False)
            for k in keys:
                pipe.pttl(k)
            return [int(x) for x in pipe.execute()]

    def serving_key(self, identity: CacheRequest) -> str | None:
        if self.cache is None:
            return None
        try:
            return self.cache.serving_key(identity)
        except RequestRejected:
            return None
