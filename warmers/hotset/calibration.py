"""The forecast calibrated online against the landed warms' hits.

A plan expects each warm to be asked, in its window, with some chance p: PlanItem.p_asked when
valued by the miss it prevents, 1 - e^-hits when valued by hits. When a run's warms land, the
runner notes each (`landed`): its entry's key digest, p and the window's end, and adds p to the
tenant's expected count for the day. The gateway logs every hit with the served entry's digest
and where the entry came from (`cache_source`, warm or live); the traffic worker hands the warm
hits to `hits`, which counts a warmed entry's first hit inside its window as realised, once (the
note is consumed, so a re-delivered batch counts nothing twice).

`factor` is (realised + prior) / (expected + prior) over the tenant's last `days` days, clipped
to [1/4, 4]: the planner scales the forecast rates of that tenant by it when it values a warm by
the miss it prevents (warmers/hotset/select.py), so a forecast that keeps promising hits the traffic
does not deliver warms less, and one that is too shy warms more. Expected and realised are
counted on the days they happened (landed, hit); over a week the split at midnight is noise.

Keys, in the tenant's slot: `stk:{t:<tenant>}:cl:<digest>` (a note, until its window ends) and
`stk:{t:<tenant>}:cd:<day>` (a hash: e = expected, r = realised; kept `DAY_TTL_S`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

import redis

from caches import keys as K
from caches.boundary import as_bytes, redis_boundary

if TYPE_CHECKING:  # the traffic worker imports this module, and never the planner
    from warmers.hotset.plan import Plan, PlanItem

DAY_TTL_S = 9 * 86_400
# A note outlives its window by this much: a hit logged at the window's last second reaches the
# traffic worker a little later.
NOTE_SLACK_S = 3_600
FACTOR_BOUNDS = (0.25, 4.0)

# KEYS = [day, note_1..note_n]; ARGV = [ts_1..ts_n, day ttl]. A note holds "<p> <window end>".
_HITS_LUA = """
local n = #KEYS - 1
local realised = 0
for i = 1, n do
  local v = redis.call('GET', KEYS[i + 1])
  if v then
    local _, stop = string.match(v, '^(%S+) (%S+)$')
    if tonumber(ARGV[i]) <= tonumber(stop) then
      realised = realised + 1
      redis.call('DEL', KEYS[i + 1])
    end
  end
end
if realised > 0 then
  redis.call('HINCRBY', KEYS[1], 'r', realised)
  redis.call('EXPIRE', KEYS[1], ARGV[n + 1])
end
return realised
"""


@dataclass(frozen=True)
class Calibrated:
    """A tenant's forecast factor, and the counts behind it."""

    factor: float
    expected: float
    realised: int

    def __str__(self) -> str:
        return (
            f"forecast x{self.factor:.2f} (landed warms: {self.realised} asked of "
            f"{self.expected:.1f} expected)"
        )


class Calibration:
    def __init__(
        self,
        r: redis.Redis,
        *,
        days: int = 7,
        prior: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.r, self.days, self.prior, self.clock = r, days, prior, clock
        self._hits = r.register_script(_HITS_LUA)

    def landed(self, plan: Plan, keys: Iterable[str]) -> int:
        """Note the plan's items whose entries landed (exact keys, as the warmer reports
        them); the count noted."""
        landed = set(keys)
        now = self.clock()
        stop = plan.window.end.timestamp()
        per_tenant: dict[str, list[tuple[str, float]]] = {}
        for i in plan.items:
            key = i.item.identity.key()
            if key.exact() in landed:  # the digest is what the gateway logs as cache_key
                per_tenant.setdefault(i.tenant, []).append((key.digest, expected_p(i)))
        if not per_tenant or stop <= now:
            return 0
        ttl = int(stop - now) + NOTE_SLACK_S
        with redis_boundary("calibration landed"):
            pipe = self.r.pipeline(transaction=False)
            for tenant, rows in per_tenant.items():  # each tenant's keys in its own slot
                for digest, p in rows:
                    pipe.set(K.calibration_note_key(tenant, digest), f"{p:.6f} {stop:.0f}", ex=ttl)
                day = K.calibration_day_key(tenant, _day(now))
                pipe.hincrbyfloat(day, "e", sum(p for _, p in rows))
                pipe.expire(day, DAY_TTL_S)
            pipe.execute()
        return sum(map(len, per_tenant.values()))

    def hits(self, warm_hits: Mapping[str, Sequence[tuple[str, float]]]) -> int:
        """Credit warm hits (tenant -> [(entry key digest, unix ts)]) to the notes they fall
        inside; the count newly realised."""
        realised = 0
        with redis_boundary("calibration hits"):
            for tenant, rows in warm_hits.items():
                by_day: dict[date, dict[str, float]] = {}
                for digest, ts in rows:  # the first hit of an entry is the one that counts
                    by_day.setdefault(_day(ts), {}).setdefault(digest, ts)
                for day, first in by_day.items():
                    notes = [K.calibration_note_key(tenant, d) for d in first]
                    realised += int(
                        self._hits(
                            keys=[K.calibration_day_key(tenant, day), *notes],
                            args=[*(f"{ts:.3f}" for ts in first.values()), DAY_TTL_S],
                        )
                    )
        return realised

    def factor(self, tenant: str) -> Calibrated:
        today = _day(self.clock())
        days = [today - timedelta(days=n) for n in range(self.days)]
        with redis_boundary("calibration factor"):
            pipe = self.r.pipeline(transaction=False)
            for d in days:
                pipe.hmget(K.calibration_day_key(tenant, d), ["e", "r"])
            rows = pipe.execute()
        expected = sum(float(as_bytes(e)) for e, _ in rows if e is not None)
        realised = sum(int(as_bytes(r)) for _, r in rows if r is not None)
        lo, hi = FACTOR_BOUNDS
        f = min(hi, max(lo, (realised + self.prior) / (expected + self.prior)))
        return Calibrated(f, expected, realised)


def expected_p(i: PlanItem) -> float:
    """The chance the plan gave an item's entry of being asked in its window."""
    if i.p_asked is not None:
        return i.p_asked
    return -math.expm1(-i.expected_hits)


def _day(ts: float) -> date:
    return datetime.fromtimestamp(ts, UTC).date()
