"""Which version of a model is live: written by the deploy cutover at READY, read by gateways.

One hash per model (caches/constants.py LIVE_PREFIX): field "*" holds the version every tenant
is served, a tenant's own field the version of a deploy that named tenants. Each value is JSON
{"version", "deploy_id", "at"}, `at` being when the deploy was accepted: SET_LUA never lets an
older deploy's READY (one that was superseded while it pre-warmed) replace a newer one's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import redis

from caches import keys as K
from caches.boundary import as_bytes, redis_boundary

ALL_TENANTS = "*"

# KEYS = [the model's hash]; ARGV = [at, value, field...]. Sets each field unless it holds a
# deploy accepted later.
SET_LUA = """
local at = tonumber(ARGV[1])
local n = 0
for i = 3, #ARGV do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if not cur or tonumber(cjson.decode(cur).at) <= at then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[2])
    n = n + 1
  end
end
return n
"""


class LiveVersions:
    def __init__(self, r: redis.Redis) -> None:
        self._r = r
        self._set = r.register_script(SET_LUA)

    def set(
        self,
        model_id: str,
        version: str,
        *,
        deploy_id: str,
        accepted_at: float,
        tenants: Sequence[str] | None = None,
    ) -> int:
        """Make `version` live (for `tenants`, or all); returns the fields it set."""
        value = orjson.dumps({"version": version, "deploy_id": deploy_id, "at": accepted_at})
        fields = list(tenants) if tenants else [ALL_TENANTS]
        with redis_boundary("set live version"):
            keys = [K.live_versions_key(model_id)]
            return int(self._set(keys=keys, args=[accepted_at, value, *fields]))

    def get(self, model_id: str) -> dict[str, str]:
        """Scope ("*" or a tenant) -> live version; {} when no deploy ever went READY."""
        with redis_boundary("read live versions"):
            raw = self._r.hgetall(K.live_versions_key(model_id))
        return scopes_of(raw)


def scopes_of(raw: Mapping[Any, Any]) -> dict[str, str]:
    """The HGETALL of a model's live hash as scope -> version (any Redis client's reply)."""
    return {as_bytes(f).decode(): str(orjson.loads(as_bytes(v))["version"]) for f, v in raw.items()}


def version_for(scopes: dict[str, str], tenant: str) -> str | None:
    """The tenant's own live version, else the one for every tenant, else None."""
    return scopes.get(tenant) or scopes.get(ALL_TENANTS)
