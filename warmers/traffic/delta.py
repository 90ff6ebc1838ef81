"""One batch of the traffic profile, aggregated in memory, and the script that applies it.

TenantDelta is one tenant's share of a batch (counts per query and hour of week, miss costs,
representatives, the partition spans it covers); TenantDelta.script_args renders it for
APPLY_LUA, which TrafficProfile (warmers/traffic/profile.py, where the key layout is described) runs
once per tenant per batch: it checks the tenant's watermarks and adds everything in one atomic
step. aggregate() builds the deltas from per-event Observations; the traffic worker's batch
tally (warmers/traffic/count_batch.py) builds the same deltas without an object per event.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import orjson

from caches import keys as K

# KEYS = [watermark hash, data key 1..n]; ARGV = [ttl_s, JSON batch, queries kept a week, an hour]. The
# batch is one JSON argument, not thousands of ARGV items: redis-py packs each argument in Python
# (~3 us each), while cjson decodes in C; and the per-key maps go to JSON as the dicts they are,
# so Python builds no flat lists. Increments of one key are applied as one variadic read (HMGET)
# and one variadic write (HSET) per chunk: a batch of 20k events makes ~10k field increments but
# only a few hundred keys, and each redis.call from Lua costs about as much as the C work behind.
# Batch fields (k = index into KEYS; w, c, r = the week's summary, cost, representative keys):
#   p: [part, first offset, last offset, ...] (offsets as strings: Lua prints 1e+14 past 14 digits)
#   q: [w, c, r, {qkey: n}, [hour k, {qkey: n}, ...]] per week: add n to the week's heavy
#      hitters (space-saving, see below), then hourly counts of those it keeps
#   n: [k, {field: n}, ...] add n to fields     c: [k, w, {qkey: [misses, gpu us, tokens]}, ...] add
#   s: [k, w, {qkey: json}, ...] set fields     m: [k, w, [qkey, ...], ...] check they are still set
#   w: [k, week, ...] ZADD week   a: [k, member, ...] SADD
# c and s apply only to queries their week tracks; what is dropped, and what m
# finds gone, is returned ({"ok", qkey, ...}) so the writer's memo forgets it (TenantDelta).
APPLY_LUA = """
local ttl, cap, hcap = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
local b = cjson.decode(ARGV[2])
local p = b.p
local stale = {'stale'}
for i = 1, #p, 3 do
  local cur = redis.call('HGET', KEYS[1], p[i])
  if cur and tonumber(cur) >= tonumber(p[i + 1]) then
    stale[#stale + 1] = p[i]
    stale[#stale + 1] = cur
  end
end
if #stale > 1 then return stale end
for i = 1, #p, 3 do redis.call('HSET', KEYS[1], p[i], p[i + 2]) end
-- 1000 fields per call (2000 arguments to HSET): far below Lua's unpack limit (~8000)
local CHUNK = 1000
local function hmget(key, names)  -- values in the order of names, false where absent
  local out = {}
  for c = 1, #names, CHUNK do
    local last = math.min(c + CHUNK - 1, #names)
    local cur = redis.call('HMGET', key, unpack(names, c, last))
    for j = c, last do out[j] = cur[j - c + 1] end
  end
  return out
end
local function hset(key, args)  -- args: field, value, field, value, ...
  for c = 1, #args, 2 * CHUNK do
    redis.call('HSET', key, unpack(args, c, math.min(c + 2 * CHUNK - 1, #args)))
  end
end
local function hdel(key, names)
  for c = 1, #names, CHUNK do
    redis.call('HDEL', key, unpack(names, c, math.min(c + CHUNK - 1, #names)))
  end
end
local function fields(map)
  local names = {}
  for f in pairs(map) do names[#names + 1] = f end
  return names
end
-- merge(old value or false, delta) -> new value, for every field of `map`; names and cur,
-- when the caller has already read them (fields(map) and their values), are not read again
local function update(key, map, merge, names, cur)
  names = names or fields(map)
  cur = cur or hmget(key, names)
  local args = {}
  for j = 1, #names do
    args[#args + 1] = names[j]
    args[#args + 1] = merge(cur[j], map[names[j]])
  end
  hset(key, args)
end
local function add(old, n) return (tonumber(old) or 0) + n end
-- "<misses> <gpu us> <tokens> <latency us>"; a row written before latency was kept has three
-- fields, and its latency is taken to be its GPU time (what the value model assumed then)
local function add_cost(old, d)
  local m, g, t, l = d[1], d[2], d[3], d[4]
  if old then
    local om, og, ot, ol = string.match(old, '^(%d+) (%d+) (%d+) ?(%d*)$')
    og = tonumber(og) or 0
    m, g, t = m + (tonumber(om) or 0), g + og, t + (tonumber(ot) or 0)
    l = l + (tonumber(ol) or og)
  end
  return string.format('%d %d %d %d', m, g, t, l)
end
-- Rows in buckets by by[row], and the buckets' values in ascending order.
local function buckets_of(rows, by)
  local buckets, values = {}, {}
  for _, f in ipairs(rows) do
    local v = by[f]
    local bucket = buckets[v]
    if not bucket then
      bucket = {}
      buckets[v] = bucket
      values[#values + 1] = v
    end
    bucket[#bucket + 1] = f
  end
  table.sort(values)
  return buckets, values
end
-- Marks in `out` the n worst of rows (n < #rows when i > 1): the smallest levels[1][row]
-- first, its ties by levels[2], ..., the last ties going to the greater name. Bucketed level
-- by level, so only one boundary bucket is sorted, by name and without a Lua comparator: a
-- full sort of ~30k rows per batch with one was most of the script's time.
local function take_worst(rows, levels, i, n, out)
  if i > #levels then
    table.sort(rows)
    for j = #rows - n + 1, #rows do out[rows[j]] = true end
    return
  end
  local buckets, values = buckets_of(rows, levels[i])
  for _, v in ipairs(values) do
    local bucket = buckets[v]
    if #bucket > n then return take_worst(bucket, levels, i + 1, n, out) end
    for _, f in ipairs(bucket) do out[f] = true end
    n = n - #bucket
    if n == 0 then return end
  end
end
-- The n names of rows with the smallest counts, ties going to the greater name.
local function smallest(rows, count, n)
  local out = {}
  if n > 0 then take_worst(rows, {count}, 1, n, out) end
  return out
end
-- The n worst rows of an hour: by the hour's count, then the week's, then the greater name
-- (once an hour is full, every batch ranks its rows: a sort with a comparator ran there too).
local function worst(rows, count, weekly, n)
  local out = {}
  if n > 0 then take_worst(rows, {count, weekly}, 1, n, out) end
  return out
end
-- A week's heavy hitters, at most `cap` queries (space-saving, merged a batch at a time):
-- 1. tracked queries add their batch count (exact while the week never overflowed);
-- 2. once full, a new query enters at the smallest count plus its own (an upper bound: it may
--    have been asked that often before, then evicted);
-- 3. the `cap` largest stay (ties by name), the rest are evicted.
-- So count - (the smallest count) <= true count <= count, and any query asked more than 1/cap
-- of the week's requests is tracked. Returns a lookup of the batch's queries kept, and the
-- queries evicted.
local function summary(k, map)
  local names = fields(map)
  local cur, fresh = hmget(k, names), 0
  for j = 1, #names do if not cur[j] then fresh = fresh + 1 end end
  local size = redis.call('HLEN', k)
  if size + fresh <= cap then
    update(k, map, add, names, cur)
    return map, {}
  end
  local flat = redis.call('HGETALL', k)
  local count, stored, rows, floor = {}, {}, {}, nil
  for i = 1, #flat, 2 do
    local v = tonumber(flat[i + 1])
    count[flat[i]] = v
    stored[flat[i]] = true
    rows[#rows + 1] = flat[i]
    if floor == nil or v < floor then floor = v end
  end
  if size < cap then floor = 0 end  -- never evicted: an absent query was never asked
  for j = 1, #names do
    local f = names[j]
    if cur[j] then count[f] = count[f] + map[f] else
      count[f] = floor + map[f]
      rows[#rows + 1] = f
    end
  end
  local gone = smallest(rows, count, #rows - cap)
  local kept, args, evicted = {}, {}, {}
  for j = 1, #names do
    if not gone[names[j]] then
      kept[names[j]] = true
      args[#args + 1] = names[j]
      args[#args + 1] = count[names[j]]
    end
  end
  for i = 1, #rows do
    if stored[rows[i]] and gone[rows[i]] then evicted[#evicted + 1] = rows[i] end
  end
  hset(k, args)
  hdel(k, evicted)
  return kept, evicted
end
-- Add map's counts to one hour, which keeps at most hcap queries: by that hour's count, then
-- by the week's (a query asked under once an hour but often in the week outranks a one-off),
-- then by name. A query enters an hour at its own count.
local function hour(key, s, map)
  local names = fields(map)
  local cur, fresh = hmget(key, names), {}
  for j = 1, #names do if not cur[j] then fresh[#fresh + 1] = names[j] end end
  local size = redis.call('HLEN', key)
  if size + #fresh <= hcap then
    update(key, map, add, names, cur)
    return
  end
  local flat = redis.call('HGETALL', key)
  local count, stored, rows = {}, {}, {}
  for i = 1, #flat, 2 do
    count[flat[i]] = tonumber(flat[i + 1])
    stored[flat[i]] = true
    rows[#rows + 1] = flat[i]
  end
  for _, f in ipairs(fresh) do rows[#rows + 1] = f end
  for f, n in pairs(map) do count[f] = (count[f] or 0) + n end
  local week, weekly = hmget(s, rows), {}
  for i = 1, #rows do weekly[rows[i]] = tonumber(week[i]) or 0 end
  local gone = worst(rows, count, weekly, #rows - hcap)
  local args, evicted = {}, {}
  for j = 1, #names do
    if not gone[names[j]] then
      args[#args + 1] = names[j]
      args[#args + 1] = count[names[j]]
    end
  end
  for i = 1, #rows do
    if stored[rows[i]] and gone[rows[i]] then evicted[#evicted + 1] = rows[i] end
  end
  hset(key, args)
  hdel(key, evicted)
end
-- One week of a namespace: the summary first, then hourly counts of the queries it keeps.
-- An evicted query loses its cost and representative at once; its hourly counts stay until
-- their hours need the room (a week's count of 0 ranks them last among equals), so each hour
-- stays bounded without a list of the hours every query was asked in. Returns what is kept.
local function track(s, c, r, weekly, hours)
  local kept, evicted = summary(s, weekly)
  hdel(c, evicted)
  hdel(r, evicted)
  for i = 1, #hours, 2 do
    local map = {}
    for f, n in pairs(hours[i + 1]) do if kept[f] then map[f] = n end end
    hour(KEYS[hours[i]], s, map)
  end
  return kept
end
-- Queries each week keeps, by summary key: costs and representatives are written for those
local kept_by = {}
-- the entries of map whose query the week (summary key s) keeps; the names of the others
local function tracked(s, map)
  local names, keep, dropped = fields(map), {}, {}
  local kept = kept_by[s]
  if not kept then  -- a week this batch counted nothing in: ask its summary
    kept = {}
    local cur = hmget(s, names)
    for j = 1, #names do if cur[j] then kept[names[j]] = true end end
  end
  for _, f in ipairs(names) do
    if kept[f] then keep[f] = map[f] else dropped[#dropped + 1] = f end
  end
  return keep, dropped
end
local forget = {'ok'}
local function forget_all(names) for _, f in ipairs(names) do forget[#forget + 1] = f end end
local q, n, c, s, m, w, a = b.q, b.n, b.c, b.s, b.m, b.w, b.a
for i = 1, #q, 5 do
  kept_by[KEYS[q[i]]] = track(KEYS[q[i]], KEYS[q[i + 1]], KEYS[q[i + 2]], q[i + 3], q[i + 4])
end
for i = 1, #n, 2 do update(KEYS[n[i]], n[i + 1], add) end
for i = 1, #c, 3 do update(KEYS[c[i]], (tracked(KEYS[c[i + 1]], c[i + 2])), add_cost) end
for i = 1, #s, 3 do
  local keep, dropped = tracked(KEYS[s[i + 1]], s[i + 2])
  local args = {}
  for f, v in pairs(keep) do
    args[#args + 1] = f
    args[#args + 1] = v
  end
  hset(KEYS[s[i]], args)
  forget_all(dropped)
end
for i = 1, #m, 3 do
  local names = m[i + 2]
  local refd, have = hmget(KEYS[m[i + 1]], names), hmget(KEYS[m[i]], names)  -- s, r
  for j = 1, #names do
    if not (refd[j] and have[j]) then forget[#forget + 1] = names[j] end
  end
end
for i = 1, #w, 2 do redis.call('ZADD', KEYS[w[i]], w[i + 1], w[i + 1]) end
for i = 1, #a, 2 do redis.call('SADD', KEYS[a[i]], a[i + 1]) end
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return forget
"""


class Representative(Protocol):
    """A request that can be re-issued when warming; rendered once per query and batch."""

    def to_json(self) -> str: ...

    def fingerprint(self) -> object:
        """Hashable; equal when a rewrite would change nothing but the request's identity."""
        ...


class Observation(NamedTuple):
    """What the profile keeps of one request. Built ~150k times a second: make it with
    `observation(...)`, which skips NamedTuple's Python-level __new__ (bench_ingest)."""

    tenant: str
    model_id: str
    template_version: str
    qkey: str
    week: int
    how: int
    cacheable: bool  # False: temperature > 0 or no_cache; counted apart, never warmed
    gpu_ms: float  # > 0 only when the request reached the GPU (a miss or a bypass)
    latency_ms: float  # what that request took, end to end (0 unless it reached the GPU)
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
    # misses, gpu us, tokens, latency us
    costs: dict[Where, dict[str, list[int]]] = field(default_factory=dict)
    reps: dict[Where, dict[str, Representative]] = field(default_factory=dict)
    events: int = 0
    # Hits served from a warmed entry: (entry key digest, unix ts), for the forecast's
    # calibration (warmers/hotset/calibration.py); not part of the profile's write.
    warm_hits: list[tuple[str, float]] = field(default_factory=list)

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
        self,
        where: Where,
        qkey: str,
        misses: int,
        gpu_us: int,
        tokens: int,
        latency_us: int,
        rep: Representative,
    ) -> None:
        """GPU-reaching requests of a query; rep is the latest of them (it replaces older ones)."""
        per_q = self.costs.get(where)
        if per_q is None:
            per_q = self.costs[where] = {}
            self.reps[where] = {}
        cost = per_q.get(qkey)
        if cost is None:
            cost = per_q[qkey] = [0, 0, 0, 0]
        cost[0] += misses
        cost[1] += gpu_us
        cost[2] += tokens
        cost[3] += latency_us
        self.reps[where][qkey] = rep

    def script_args(
        self, ttl_s: int, capacity: tuple[int, int], memo: RepMemo
    ) -> tuple[list[str], list[Any], list[tuple[Any, object]]]:
        """KEYS and ARGV for APPLY_LUA (capacity: queries kept a week, and an hour), and what to
        tell the memo once it ran: (memo key,
        fingerprint) for a representative sent, (memo key, None) for one the memo held back.

        A representative already written by this process with the same fingerprint is not
        sent again: re-sending ~600 bytes per missed query per batch was a third of Redis's
        time. The script checks that those it was not sent are still there (the week may have
        evicted the query since), and names the ones to send again. The memo only saves
        writes; Redis holds the state (see TrafficProfile)."""
        tenant = self.tenant
        keys = [K.profile_watermarks_key(tenant)]
        wheres = {hk[:3] for hk in self.queries} | {hk[:3] for hk in self.uncacheable}
        wheres |= set(self.costs)
        w: list[Any] = []
        a: list[Any] = []
        weekly: dict[Where, int] = {}  # index of the week's summary key; k, r follow it
        for m, t, wk in wheres:
            keys += (K.profile_weeks_key(tenant, m, t), K.profile_namespaces_key(tenant))
            w += (len(keys) - 1, wk)
            a += (len(keys), f"{m}\x1f{t}")
            weekly[m, t, wk] = len(keys) + 1
            keys += (K.profile_week_key(tenant, part, m, t, wk) for part in ("s", "k", "r"))
        per_week: dict[Where, tuple[dict[str, int], list[Any]]] = {}
        totals: dict[Where, dict[str, int]] = {}
        for (m, t, wk, how), counts in self.queries.items():
            week_counts, hours = per_week.setdefault((m, t, wk), ({}, []))
            for qk, asked in counts.items():
                week_counts[qk] = week_counts.get(qk, 0) + asked
            keys.append(K.profile_hour_key(tenant, m, t, wk, how))
            hours += (len(keys), counts)
            totals.setdefault((m, t, wk), {})[str(how)] = sum(counts.values())
        q: list[Any] = []
        for (m, t, wk), (week_counts, hours) in per_week.items():
            i = weekly[m, t, wk]
            q += (i, i + 1, i + 2, week_counts, hours)
        for (m, t, wk, how), count in self.uncacheable.items():
            totals.setdefault((m, t, wk), {})[f"u{how - _UNCACHEABLE}"] = count
        n: list[Any] = []
        for (m, t, wk), fields in totals.items():
            keys.append(K.profile_week_key(tenant, "h", m, t, wk))
            n += (len(keys), fields)
        c: list[Any] = []
        for where, per_q in self.costs.items():  # per_q: qkey -> [misses, gpu us, tokens, lat us]
            c += (weekly[where] + 1, weekly[where], per_q)
        s, held, remember = self._rep_args(weekly, memo)
        p: list[Any] = []
        for part, (first, last) in self.parts.items():
            p += (part, str(first), str(last))
        batch = {"p": p, "q": q, "n": n, "c": c, "s": s, "m": held, "w": w, "a": a}
        return keys, [ttl_s, orjson.dumps(batch), *capacity], remember

    def _rep_args(
        self, weekly: dict[Where, int], memo: RepMemo
    ) -> tuple[list[Any], list[Any], list[tuple[Any, object]]]:
        s: list[Any] = []
        held: list[Any] = []
        remember: list[tuple[Any, object]] = []
        for where, per_q in self.reps.items():
            m, t, wk = where
            fields: dict[str, str] = {}
            same: list[str] = []
            for q, rep in per_q.items():
                mk, fp = (self.tenant, m, t, wk, q), rep.fingerprint()
                if memo.get(mk) != fp:
                    fields[q] = rep.to_json()
                    remember.append((mk, fp))
                else:
                    same.append(q)
                    remember.append((mk, None))
            if fields:
                s += (weekly[where] + 2, weekly[where], fields)
            if same:
                held += (weekly[where] + 2, weekly[where], same)
        return s, held, remember


def aggregate(observations: Iterable[Observation]) -> dict[str, TenantDelta]:
    """Sum observations per tenant (one pass; the hot loop of the traffic worker's write)."""
    deltas: dict[str, TenantDelta] = {}
    for (
        tenant,
        m,
        t,
        q,
        wk,
        how,
        cacheable,
        gpu_ms,
        lat_ms,
        tokens,
        rep,
        part,
        offset,
    ) in observations:
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
            d.add_cost((m, t, wk), q, 1, round(gpu_ms * 1000), tokens, round(lat_ms * 1000), rep)
    return deltas
