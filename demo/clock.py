"""Cache TTLs on the demo's simulated clock.

An hour of week 2 takes a few wall seconds, so Redis' own expiry (wall time) would never let an
entry expire within the demo: a 1-day TTL would mean forever, and the regime where warming
matters (short TTLs) could not be shown. The demo stores entries with the regime's TTL in
seconds, and each time its clock passes an hour boundary `SimTTL.advance` takes an hour off
every entry's remaining TTL: entries whose TTL runs out are deleted (their vectors too), the
rest keep the rest. Redis' countdown moves a few wall seconds per simulated hour, so PTTL reads
the simulated time left to within those seconds, and whatever reads it (the planner's and the
warmer's "cached with enough TTL left" checks) works unchanged.

Hour steps expire an entry at the first boundary after its TTL ran out; entries are stored with
half an hour more (`stored_ttl_s`), so that on average they live the TTL.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from caches.keys import entries_pattern
from caches.semantic.base import SemanticStore

HOUR_MS = 3_600_000
# One script per SCAN batch: PTTL, then DEL or PEXPIRE by the step; returns the deleted keys.
_ADVANCE_LUA = """
local step = tonumber(ARGV[1])
local gone = {}
for _, k in ipairs(KEYS) do
  local t = redis.call('PTTL', k)
  if t >= 0 then
    if t <= step then
      redis.call('DEL', k)
      gone[#gone + 1] = k
    else
      redis.call('PEXPIRE', k, t - step)
    end
  end
end
return gone
"""


def stored_ttl_s(ttl_s: int) -> int:
    """The TTL to store entries with, so that hour steps give them `ttl_s` on average."""
    return ttl_s + 1800


@dataclass
class Advanced:
    expired: int = 0  # entries deleted by this step
    kept: int = 0  # entries whose TTL moved on


class SimTTL:
    """Moves the cache's TTLs along with the demo's clock (standalone Redis: the embedded
    stack; one script per SCAN batch, keys of any slot)."""

    def __init__(
        self, r: redis.Redis, store: SemanticStore | None, model_ids: list[str], batch: int = 500
    ) -> None:
        self.r, self.store, self.batch = r, store, batch
        self.patterns = [entries_pattern(m) for m in sorted(set(model_ids))]
        self._advance = r.register_script(_ADVANCE_LUA)
        self.expired_total = 0

    def advance(self, hours: int = 1) -> Advanced:
        out = Advanced()
        step = hours * HOUR_MS
        # collected first: SCAN may return a key twice, and a key must step once
        keys = sorted(
            {
                k.decode() if isinstance(k, bytes) else k
                for pattern in self.patterns
                for k in self.r.scan_iter(match=pattern, count=1000)
            }
        )
        for i in range(0, len(keys), self.batch):
            self._step(keys[i : i + self.batch], step, out)
        self.expired_total += out.expired
        return out

    def _step(self, keys: list[str], step_ms: int, out: Advanced) -> None:
        gone = [k.decode() if isinstance(k, bytes) else k for k in self._advance(keys, [step_ms])]
        out.expired += len(gone)
        out.kept += len(keys) - len(gone)
        if gone and self.store is not None:
            self.store.delete_entries(gone)
