"""When each tenant's cached answers last went stale: the time of its latest invalidation.

The invalidation worker notes the change event's time per tenant (`note`); the wrong-hit
monitor reads it (`read`) to tell which exact hits were served soon after a change, when a
missed or late deletion would serve a stale answer. One key per tenant, in its slot, kept for
`CHANGED_TTL_S` after the last change; a replayed older event never moves it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import redis

from caches import keys as K
from caches import slots
from caches.boundary import as_bytes, redis_boundary

CHANGED_TTL_S = 7 * 86_400

# Keep the later of the two times; refresh the TTL either way.
_NOTE_LUA = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
local at = tonumber(ARGV[1])
if at > cur then cur = at end
redis.call('SET', KEYS[1], string.format('%.3f', cur), 'EX', ARGV[2])
return 1
"""


def note(r: redis.Redis, changed: Mapping[str, float], ttl_s: int = CHANGED_TTL_S) -> None:
    """Record, per tenant, that its answers may have gone stale at that time (unix seconds)."""
    if not changed:
        return
    with redis_boundary("note change"):
        script = r.register_script(_NOTE_LUA)
        for tenant, at in changed.items():  # one key, one slot each
            script(keys=[K.changed_key(tenant)], args=[f"{at:.3f}", ttl_s])


def read(r: redis.Redis, tenants: Iterable[str]) -> dict[str, float]:
    """The last change time of each tenant that had one within the TTL."""
    names = sorted(set(tenants))
    with redis_boundary("read changes"):
        got = slots.mget(r, [K.changed_key(t) for t in names])
    return {t: float(as_bytes(v)) for t, v in zip(names, got, strict=True) if v is not None}
