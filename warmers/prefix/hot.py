"""Hot prompt prefixes per tenant and model, learned from the request log, kept in Redis.

A prefix is what vLLM's automatic prefix caching can share between requests: the leading
system (and developer) messages of a chat request, exactly as the gateway sent them upstream
(`RequestLogged.request.body`, schema v2), which is the system prompt and its template. Only
requests that reached the backend count (a miss or a bypass): a cache hit costs no prefill.

Storage (caches/keys.py; every key of a tenant in its `{t:<tenant>}` slot, so one script per
tenant and model is atomic on Redis Cluster):
- `prefix_counts_key(tenant, model)`: zset digest -> requests, at most `capacity` members, kept
  by the space-saving rule: a new prefix entering a full set evicts the least counted one and
  starts at its count plus its own (an over-estimate, so a template that turns hot gets in);
- `prefix_meta_key(tenant, model)`: hash digest -> {"model", "messages", "tokens", "last_seen"},
  the upstream model name and messages a warm sends;
- `prefix_index_key(model)`: the set of tenants with prefixes of the model (its own slot), so
  the warmer reaches every tenant without a SCAN on every primary.
Counts are approximate by design: a batch delivered twice counts twice (they rank, nothing
bills by them); the keys expire PREFIX_TTL_S after their last write.

Counts kept by an older stoker under `prefix_counts_key_before` (the kind the profile owns,
where a model named "ns" or "wm" was one of the profile's keys) are moved, not lost: the first
read or write of a tenant and model in a process runs MOVE_LUA, which renames a sorted set
found there (a set or hash there is the profile's) or adds it into the new one. Both keys
carry the tenant's tag: one slot, one atomic script, on Redis Cluster too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import orjson
import redis

from caches import constants as C
from caches.boundary import as_bytes, redis_boundary
from caches.keys import (
    prefix_counts_key,
    prefix_counts_key_before,
    prefix_index_key,
    prefix_meta_key,
)
from schemas.events import RequestLogged

# Roles whose leading run is the prefix (OpenAI's "developer" is the newer name of "system").
PREFIX_ROLES: Final = frozenset({"system", "developer"})
# Outcomes whose request ran on the backend, so paid its prefill.
GPU_OUTCOMES: Final = frozenset({"miss", "bypass"})
# Below one KV block (vLLM's 16 tokens) nothing of a prefix can be cached: not worth a warm.
MIN_PREFIX_TOKENS: Final = 16
# System prompts tracked per tenant and model: a deployment has a few templates per model, and
# the space-saving count keeps the hottest among the one-offs.
DEFAULT_CAPACITY: Final = 200

# KEYS = [counts, meta]; ARGV = [capacity, ttl_s, then (digest, count, meta JSON) triples].
ADD_LUA = """
local cap = tonumber(ARGV[1])
for i = 3, #ARGV, 3 do
  local d, n = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('ZSCORE', KEYS[1], d) then
    redis.call('ZINCRBY', KEYS[1], n, d)
  elseif redis.call('ZCARD', KEYS[1]) < cap then
    redis.call('ZADD', KEYS[1], n, d)
  else
    local low = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    redis.call('ZREM', KEYS[1], low[1])
    redis.call('HDEL', KEYS[2], low[1])
    redis.call('ZADD', KEYS[1], tonumber(low[2]) + n, d)
  end
  redis.call('HSET', KEYS[2], d, ARGV[i + 2])
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""

# KEYS = [counts, meta, counts before]; ARGV = [capacity]. Moves counts of the old layout:
# a rename keeps their TTL; beside counts of the new layout they add up (an old writer ran on
# during a rolling upgrade), keep the longer TTL, and the least counted beyond capacity go.
MOVE_LUA = """
if redis.call('TYPE', KEYS[3]).ok ~= 'zset' then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('RENAME', KEYS[3], KEYS[1])
  return 1
end
local ttl = math.max(redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[3]))
redis.call('ZUNIONSTORE', KEYS[1], 2, KEYS[1], KEYS[3])
redis.call('DEL', KEYS[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if over > 0 then
  for _, d in ipairs(redis.call('ZRANGE', KEYS[1], 0, over - 1)) do
    redis.call('HDEL', KEYS[2], d)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
end
return 1
"""
# (tenant, model) pairs a process has moved, at most this many (then it forgets and moves
# again: a no-op costing one round trip per pair).
_MOVED_MAX: Final = 100_000


@dataclass(frozen=True)
class Prefix:
    """The leading system/developer messages of a request, and the served model it went to."""

    model: str  # the upstream request's `model` (what a warm sends)
    messages: tuple[tuple[str, str], ...]  # (role, content)
    tokens: int  # whitespace tokens, as the simulator counts them; a size to budget by

    @property
    def digest(self) -> str:
        raw = orjson.dumps([self.model, self.messages])
        return hashlib.sha256(raw).hexdigest()[: C.DIGEST_HEX]

    def as_messages(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]


@dataclass(frozen=True)
class HotPrefix:
    tenant: str
    model_id: str
    prefix: Prefix
    count: float
    last_seen: float


def prefix_of(ev: RequestLogged, min_tokens: int = MIN_PREFIX_TOKENS) -> Prefix | None:
    """The prefix of a v2 chat request that reached the backend; None for anything else (v1,
    completions, hits, no system message, or one shorter than a KV block)."""
    if ev.request is None or ev.request.api != "chat" or ev.cache_outcome not in GPU_OUTCOMES:
        return None
    body = ev.request.body
    msgs = body.get("messages")
    model = body.get("model")
    if not isinstance(msgs, list) or not isinstance(model, str):
        return None
    lead: list[tuple[str, str]] = []
    for m in msgs[:-1]:  # the last message is the question, never part of the prefix
        if not isinstance(m, dict) or m.get("role") not in PREFIX_ROLES:
            break
        content = m.get("content")
        if not isinstance(content, str):
            break
        lead.append((str(m["role"]), content))
    tokens = sum(len(c.split()) for _, c in lead)
    if not lead or tokens < min_tokens:
        return None
    return Prefix(model, tuple(lead), tokens)


class HotPrefixes:
    """The store (see the module docstring). Every Redis failure is CacheUnavailable."""

    def __init__(
        self, r: redis.Redis, capacity: int = DEFAULT_CAPACITY, ttl_s: int = C.PREFIX_TTL_S
    ) -> None:
        if capacity < 1 or ttl_s < 1:
            raise ValueError("capacity and ttl_s must be >= 1")
        self.r = r
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._add = r.register_script(ADD_LUA)
        self._move = r.register_script(MOVE_LUA)
        self._moved: set[tuple[str, str]] = set()

    def _move_before(self, tenant: str, model_id: str) -> None:
        """Counts of the old layout into the new key, once per tenant and model a process."""
        if (tenant, model_id) in self._moved:
            return
        keys = [
            prefix_counts_key(tenant, model_id),
            prefix_meta_key(tenant, model_id),
            prefix_counts_key_before(tenant, model_id),
        ]
        self._move(keys=keys, args=[self.capacity])
        if len(self._moved) >= _MOVED_MAX:
            self._moved.clear()
        self._moved.add((tenant, model_id))

    def add(
        self, tenant: str, model_id: str, counts: Iterable[tuple[Prefix, int]], now: float
    ) -> int:
        """Count prefixes of one tenant and model (one script, one slot); the set's size."""
        args: list[Any] = [self.capacity, self.ttl_s]
        for p, n in counts:
            meta = {"model": p.model, "messages": p.messages, "tokens": p.tokens, "last_seen": now}
            args += [p.digest, n, orjson.dumps(meta)]
        if len(args) == 2:
            return 0
        keys = [prefix_counts_key(tenant, model_id), prefix_meta_key(tenant, model_id)]
        with redis_boundary("count prefixes"):
            self._move_before(tenant, model_id)
            size = int(self._add(keys=keys, args=args))
            idx = prefix_index_key(model_id)
            self.r.sadd(idx, tenant)
            self.r.expire(idx, self.ttl_s)
        return size

    def tenants(self, model_id: str) -> list[str]:
        with redis_boundary("read prefix tenants"):
            members = self.r.smembers(prefix_index_key(model_id))
        return sorted(as_bytes(m).decode() for m in members)

    def top(
        self,
        model_id: str,
        n: int,
        tenants: Sequence[str] | None = None,
        *,
        not_before: float = 0.0,
    ) -> list[HotPrefix]:
        """The n most counted prefixes of the model over `tenants` (None: every tenant), most
        first; prefixes last seen before `not_before` are left out."""
        out: list[HotPrefix] = []
        for tenant in tenants if tenants is not None else self.tenants(model_id):
            out += self._top_of(tenant, model_id, n, not_before)
        out.sort(key=lambda h: (-h.count, -h.prefix.tokens, h.tenant, h.prefix.digest))
        return out[:n]

    def _top_of(self, tenant: str, model_id: str, n: int, not_before: float) -> list[HotPrefix]:
        with redis_boundary("read prefixes"):
            self._move_before(tenant, model_id)
            key = prefix_counts_key(tenant, model_id)
            ranked = cast(
                "list[tuple[bytes, float]]", self.r.zrevrange(key, 0, n - 1, withscores=True)
            )
            if not ranked:
                return []
            metas = cast(
                "list[bytes | None]",
                self.r.hmget(prefix_meta_key(tenant, model_id), [d for d, _ in ranked]),
            )
        out = []
        for (_, count), raw in zip(ranked, metas, strict=True):
            if raw is None:
                continue  # evicted between the two reads
            meta = orjson.loads(raw)
            if meta["last_seen"] < not_before:
                continue
            msgs = tuple((str(r), str(c)) for r, c in meta["messages"])
            prefix = Prefix(str(meta["model"]), msgs, int(meta["tokens"]))
            out.append(HotPrefix(tenant, model_id, prefix, float(count), meta["last_seen"]))
        return out
