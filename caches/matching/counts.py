"""The error budget's verdict counts in Redis, shared by every gateway replica and the monitor.

MemoryCounts (error_budget.py) keeps one process's verdicts: with N gateway replicas each would see
1/N of the evidence, and loosen N times later; a restart would forget it all. RedisCounts keeps
them per tenant, route and time bucket (caches/constants.py):

    stk:{t:<tenant>}:b:<route>:<bucket>   hash  c<strength> -> shadow checks, w<strength> ->
                                                  their wrong; ac<strength> -> audits,
                                                  aw<strength> -> their wrong

- the two strata (bounds.py: shadow checks of near misses, the monitor's audits of hits) are
  kept apart because they are sampled at different shares and weighed by them; audits got
  fields of their own (ac/aw) beside the fields every verdict used before (c/w). So an
  upgrade moves nothing: what was counted before reads as shadow checks (most of it was:
  every near miss against a fifth of the hits), which weighs it as it was weighed then, and it
  ages out within a window; an older reader skips ac/aw fields (no strength parses from them);
- one tenant's keys share its hash tag, so the read (all buckets of a window, summed) is one
  script on one slot, on a server and on Redis Cluster alike;
- a verdict lands in the current bucket (bucket = now // (window / BUDGET_BUCKETS)); a read sums
  the current bucket and the BUDGET_BUCKETS before it, so a verdict counts for a window to a
  window and a bucket, then ages out; each bucket key expires a window and a bucket after its
  last write, so nothing outlives its use;
- a write is one script (count and TTL together: no key is ever left without a TTL).
Redis errors become CacheUnavailable (retriable): the caller serves on at the level it had.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import redis

from caches import constants as C
from caches.boundary import redis_boundary
from caches.keys import enc, tenant_tag
from caches.matching.bounds import Strata

# KEYS: one bucket. ARGV: strength, wrong (0/1), ttl seconds, stratum ('' shadow, 'a' audit).
_ADD_LUA = """
redis.call('HINCRBY', KEYS[1], ARGV[4] .. 'c' .. ARGV[1], 1)
if ARGV[2] == '1' then redis.call('HINCRBY', KEYS[1], ARGV[4] .. 'w' .. ARGV[1], 1) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: one bucket, the request's mark. ARGV: strength, wrong (0/1), ttl seconds. 0: counted
# already (the mark was there), 1: counted now. Always an audit (ac/aw).
_ADD_ONCE_LUA = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[3]) then return 0 end
redis.call('HINCRBY', KEYS[1], 'ac' .. ARGV[1], 1)
if ARGV[2] == '1' then redis.call('HINCRBY', KEYS[1], 'aw' .. ARGV[1], 1) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: the window's buckets (one tenant: one slot). ARGV: levels. Returns per strength its
# Strata (c, w, ac, aw): c0, w0, ac0, aw0, c1, ...
_READ_LUA = """
local levels = tonumber(ARGV[1])
local at = {c = 1, w = 2, ac = 3, aw = 4}
local out = {}
for i = 1, 4 * levels do out[i] = 0 end
for _, k in ipairs(KEYS) do
  local vals = redis.call('HGETALL', k)
  for j = 1, #vals, 2 do
    local kind, num = string.match(vals[j], '^(%a+)(%d+)$')
    local off = kind and at[kind]
    local s = off and tonumber(num)
    if s and s < levels then out[4 * s + off] = out[4 * s + off] + tonumber(vals[j + 1]) end
  end
end
return out
"""


def budget_key(tenant: str, route: str, bucket: int) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_BUDGET}:{enc(route)}:{bucket}"


def audited_key(tenant: str, event_id: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_AUDITED}:{enc(event_id)}"


class RedisCounts:
    """VerdictCounts (error_budget.py) in Redis; thread-safe (redis-py pools connections)."""

    def __init__(
        self,
        r: redis.Redis,
        window_s: float = C.DEFAULT_BUDGET_WINDOW_S,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"budget window {window_s} s must be positive")
        self.r = r
        self.window_s = float(window_s)
        self.bucket_s = self.window_s / C.BUDGET_BUCKETS
        self.clock = clock
        # the key outlives its bucket by a window: as long as any read can still sum it
        self.ttl_s = math.ceil(self.window_s + self.bucket_s)
        self._add: Any = r.register_script(_ADD_LUA)
        self._add_once: Any = r.register_script(_ADD_ONCE_LUA)
        self._read: Any = r.register_script(_READ_LUA)

    def _bucket(self) -> int:
        return int(self.clock() // self.bucket_s)

    def add(
        self, tenant: str, route: str, strength: int, wrong: bool, *, audited: bool = False
    ) -> None:
        """Count a shadow check, or (`audited`) an audit."""
        if strength < 0:
            raise ValueError(f"strength {strength} is no level")
        key = budget_key(tenant, route, self._bucket())
        with redis_boundary("budget add"):
            self._add(keys=[key], args=[strength, int(wrong), self.ttl_s, "a" if audited else ""])

    def add_once(self, tenant: str, route: str, strength: int, wrong: bool, once: str) -> bool:
        """add an audit, unless one was counted for `once` (a request's event id) in this window:
        the monitor may re-ask a re-delivered record, its verdict counts once. True: counted."""
        if strength < 0:
            raise ValueError(f"strength {strength} is no level")
        keys = [budget_key(tenant, route, self._bucket()), audited_key(tenant, once)]
        with redis_boundary("budget add"):
            return bool(self._add_once(keys=keys, args=[strength, int(wrong), self.ttl_s]))

    def read_strata(self, tenant: str, route: str, levels: int) -> list[Strata]:
        now = self._bucket()
        keys = [budget_key(tenant, route, b) for b in range(now - C.BUDGET_BUCKETS, now + 1)]
        with redis_boundary("budget read"):
            flat = [int(x) for x in self._read(keys=keys, args=[levels])]
        return [Strata(*flat[4 * s : 4 * s + 4]) for s in range(levels)]

    def read(self, tenant: str, route: str, levels: int) -> list[tuple[int, int]]:
        """(checked, wrong) per strength, both strata together."""
        return [(c.checked, c.wrong) for c in self.read_strata(tenant, route, levels)]
