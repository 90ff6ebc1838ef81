"""One batch of the traffic profile, aggregated in memory, and the script that applies it.

TenantDelta is one tenant's share of a batch (counts per query and hour of week, miss costs,
representatives, the partition spans it covers); TenantDelta.script_args renders it for
APPLY_LUA, which TrafficProfile (warmers/profile.py, where the key layout is described) runs
once per tenant per batch: it checks the tenant's watermarks and adds everything in one atomic
step. aggregate() builds the deltas from per-event Observations; the traffic worker's batch
tally (warmers/tally.py) builds the same deltas without an object per event.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import orjson

from caches.keys import enc, tenant_tag

# KEYS = [watermark hash, data key 1..n]; ARGV = [ttl_s, JSON batch]. The batch is one JSON
# argument, not thousands of ARGV items: redis-py packs each argument in Python (~3 us each),
# while cjson decodes in C; and the per-key maps go to JSON as the dicts they are, so Python
# builds no flat lists. Increments of one key are applied as one variadic read (HMGET) and one
# variadic write (HSET) per chunk: a batch of 20k events makes ~10k field increments but only
# a few hundred keys, and each redis.call from Lua costs about as much as the C work behind it.
# Batch fields (k = index into KEYS):
#   p: [part, first offset, last offset, ...] (offsets as strings: Lua prints 1e+14 past 14 digits)
#   n: [k, {field: n}, ...] add n to fields     c: [k, {qkey: [misses, gpu us, tokens]}, ...] add
#   s: [k, {field: value}, ...] set fields      w: [k, week, ...] ZADD week   a: [k, member, ...] SADD
APPLY_LUA = """
local ttl = tonumber(ARGV[1])
local b = cjson.decode(ARGV[2])
local p = b.p
local stale = {}
for i = 1, #p, 3 do
  local cur = redis.call('HGET', KEYS[1], p[i])
  if cur and tonumber(cur) >= tonumber(p[i + 1]) then
    stale[#stale + 1] = p[i]
    stale[#stale + 1] = cur
  end
end
if #stale > 0 then return stale end
for i = 1, #p, 3 do redis.call('HSET', KEYS[1], p[i], p[i + 2]) end
-- 1000 fields per call (2000 arguments to HSET): far below Lua's unpack limit (~8000)
local CHUNK = 1000
-- merge(old value or nil, delta) -> new value, for every field of `map`, chunk by chunk
local function update(key, map, merge)
  local names, deltas = {}, {}
  for f, d in pairs(map) do
    names[#names + 1] = f
    deltas[#deltas + 1] = d
  end
  for c = 1, #names, CHUNK do
    local last = math.min(c + CHUNK - 1, #names)
    local cur = redis.call('HMGET', key, unpack(names, c, last))
    local args = {}
    for j = c, last do
      args[#args + 1] = names[j]
      args[#args + 1] = merge(cur[j - c + 1], deltas[j])
    end
    redis.call('HSET', key, unpack(args))
  end
end
local function add(old, n) return (tonumber(old) or 0) + n end
local function add_cost(old, d)
  local m, g, t = d[1], d[2], d[3]
  if old then
    local om, og, ot = string.match(old, '^(%d+) (%d+) (%d+)$')
    m, g, t = m + (tonumber(om) or 0), g + (tonumber(og) or 0), t + (tonumber(ot) or 0)
  end
  return string.format('%d %d %d', m, g, t)
end
local function set(key, map)
  local args = {}
  for f, v in pairs(map) do
    args[#args + 1] = f
    args[#args + 1] = v
    if #args >= 2 * CHUNK then
      redis.call('HSET', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('HSET', key, unpack(args)) end
end
local n, c, s, w, a = b.n, b.c, b.s, b.w, b.a
for i = 1, #n, 2 do update(KEYS[n[i]], n[i + 1], add) end
for i = 1, #c, 2 do update(KEYS[c[i]], c[i + 1], add_cost) end
for i = 1, #s, 2 do set(KEYS[s[i]], s[i + 1]) end
for i = 1, #w, 2 do redis.call('ZADD', KEYS[w[i]], w[i + 1], w[i + 1]) end
for i = 1, #a, 2 do redis.call('SADD', KEYS[a[i]], a[i + 1]) end
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return {}
"""


class Representative(Protocol):
    """A request that can be re-issued when warming; rendered once per query and batch."""

    def to_json(self) -> str: ...

    def fingerprint(self) -> object:
        """Hashable; equal when a rewrite would change nothing but the request's identity."""
        ...


class Observation(NamedTuple):
    """What the profile keeps of one request. Built ~150k times a second: make it with
    `observation(...)`, which skips NamedTuple's Python-level __new__ (0.8 us -> 0.1 us here)."""

    tenant: str
    model_id: str
    template_version: str
    qkey: str
    week: int
    how: int
    cacheable: bool  # False: temperature > 0 or no_cache; counted apart, never warmed
    gpu_ms: float  # > 0 only when the request reached the GPU (a miss or a bypass)
    tokens: int
    representative: Representative | None  # set on GPU-reaching cacheable requests
    part: str  # "<topic>:<partition>"
    offset: int


def observation(*fields: Any) -> Observation:
    return _tuple_new(Observation, fields)


_tuple_new = tuple.__new__

# Added to the hour of week of never-cacheable requests while aggregating (an int, not a
# "u<how>" string built per event); turned into the "u<how>" field when the batch is written.
_UNCACHEABLE = 1000


Where = tuple[str, str, int]  # (model_id, template_version, week)
RepMemo = dict[tuple[str, str, str, int, str], object]


@dataclass
class TenantDelta:
    """One tenant's share of a batch, aggregated in memory, as one APPLY_LUA call in its slot.

    Counts are nested per (model, template, week, hour) so each Redis key is built once per
    batch, not once per query."""

    tenant: str
    parts: dict[str, list[int]] = field(default_factory=dict)  # part -> [first, last] offset
    queries: dict[tuple[str, str, int, int], dict[str, int]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    uncacheable: dict[tuple[str, str, int, int], int] = field(default_factory=dict)
    costs: dict[Where, dict[str, list[int]]] = field(default_factory=dict)  # misses, gpu us, tokens
    reps: dict[Where, dict[str, Representative]] = field(default_factory=dict)
    events: int = 0

    def count(self, where: Where, how: int, qkey: str, cacheable: bool, n: int) -> None:
        """n requests of one query in one hour of week (aggregate does this inline)."""
        self.events += n
        m, t, wk = where
        if not cacheable:
            uk = (m, t, wk, how + _UNCACHEABLE)
            self.uncacheable[uk] = self.uncacheable.get(uk, 0) + n
            return
        counts = self.queries[m, t, wk, how]
        counts[qkey] = counts.get(qkey, 0) + n

    def add_cost(
        self, where: Where, qkey: str, misses: int, gpu_us: int, tokens: int, rep: Representative
    ) -> None:
        """GPU-reaching requests of a query; rep is the latest of them (it replaces older ones)."""
        per_q = self.costs.get(where)
        if per_q is None:
            per_q = self.costs[where] = {}
            self.reps[where] = {}
        cost = per_q.get(qkey)
        if cost is None:
            cost = per_q[qkey] = [0, 0, 0]
        cost[0] += misses
        cost[1] += gpu_us
        cost[2] += tokens
        self.reps[where][qkey] = rep

    def script_args(
        self, ttl_s: int, memo: RepMemo
    ) -> tuple[list[str], list[Any], list[tuple[Any, object]]]:
        """KEYS and ARGV for APPLY_LUA, and the representatives to remember once it ran.

        A representative already written by this process with the same fingerprint is not
        sent again: re-sending ~600 bytes per missed query per batch was a third of Redis's
        time. The memo only saves writes; Redis holds the state (see TrafficProfile)."""
        base = f"{tenant_tag(self.tenant)}:p"
        keys = [f"{base}:wm"]
        wheres = {hk[:3] for hk in self.queries} | {hk[:3] for hk in self.uncacheable}
        paths = {(m, t): f"{enc(m)}:{enc(t)}" for m, t, _ in wheres}
        w: list[Any] = []
        a: list[Any] = []
        for m, t, wk in wheres:
            keys += (f"{base}:w:{paths[m, t]}", f"{base}:ns")
            w += (len(keys) - 1, wk)
            a += (len(keys), f"{m}\x1f{t}")
        n: list[Any] = []
        totals: dict[Where, dict[str, int]] = {}
        for (m, t, wk, how), counts in self.queries.items():
            keys.append(f"{base}:n:{paths[m, t]}:{wk}:{how}")
            n += (len(keys), counts)
            totals.setdefault((m, t, wk), {})[str(how)] = sum(counts.values())
        for (m, t, wk, how), count in self.uncacheable.items():
            totals.setdefault((m, t, wk), {})[f"u{how - _UNCACHEABLE}"] = count
        for (m, t, wk), fields in totals.items():
            keys.append(f"{base}:h:{paths[m, t]}:{wk}")
            n += (len(keys), fields)
        c: list[Any] = []
        for (m, t, wk), per_q in self.costs.items():  # per_q: qkey -> [misses, gpu us, tokens]
            keys.append(f"{base}:k:{paths[m, t]}:{wk}")
            c += (len(keys), per_q)
        s, remember = self._rep_args(keys, paths, memo)
        p: list[Any] = []
        for part, (first, last) in self.parts.items():
            p += (part, str(first), str(last))
        batch = {"p": p, "n": n, "c": c, "s": s, "w": w, "a": a}
        return keys, [ttl_s, orjson.dumps(batch)], remember

    def _rep_args(
        self, keys: list[str], paths: dict[tuple[str, str], str], memo: RepMemo
    ) -> tuple[list[Any], list[tuple[Any, object]]]:
        s: list[Any] = []
        remember: list[tuple[Any, object]] = []
        base = f"{tenant_tag(self.tenant)}:p"
        for (m, t, wk), per_q in self.reps.items():
            fields: dict[str, str] = {}
            for q, rep in per_q.items():
                mk, fp = (self.tenant, m, t, wk, q), rep.fingerprint()
                if memo.get(mk) != fp:
                    fields[q] = rep.to_json()
                    remember.append((mk, fp))
            if fields:
                keys.append(f"{base}:r:{paths[m, t]}:{wk}")
                s += (len(keys), fields)
        return s, remember


def aggregate(observations: Iterable[Observation]) -> dict[str, TenantDelta]:
    """Sum observations per tenant (one pass; the hot loop of the traffic worker's write)."""
    deltas: dict[str, TenantDelta] = {}
    for tenant, m, t, q, wk, how, cacheable, gpu_ms, tokens, rep, part, offset in observations:
        d = deltas.get(tenant)
        if d is None:
            d = deltas[tenant] = TenantDelta(tenant)
        span = d.parts.get(part)
        if span is not None:  # offsets of one partition arrive in order within a batch
            span[1] = offset
        elif part:  # "" = no offset known (TrafficHandler.apply): no watermark
            d.parts[part] = [offset, offset]
        d.events += 1
        if not cacheable:
            uk = (m, t, wk, how + _UNCACHEABLE)
            d.uncacheable[uk] = d.uncacheable.get(uk, 0) + 1
            continue
        hk = (m, t, wk, how)
        counts = d.queries.get(hk)
        if counts is None:
            counts = d.queries[hk] = {}
        counts[q] = counts.get(q, 0) + 1
        if rep is not None:  # integer us: summed exactly, no float drift
            d.add_cost((m, t, wk), q, 1, round(gpu_ms * 1000), tokens, rep)
    return deltas
