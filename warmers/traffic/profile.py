"""The traffic profile in Redis: the queries asked most each week, hour by hour, in bounded memory.

Key layout (built in caches/keys.py, kind "p" alone; every key carries the tenant hash tag, so
one tenant's profile lives in one Redis Cluster slot and one Lua script can update it
atomically; no key is shared across tenants):

    stk:{t:<tenant>}:p:n:<model>:<template>:<week>:<how>   hash  query key -> warmable requests
    stk:{t:<tenant>}:p:h:<model>:<template>:<week>         hash  "<how>" -> warmable, "u<how>" -> never cacheable
    stk:{t:<tenant>}:p:s:<model>:<template>:<week>         hash  query key -> requests (the week's summary)
    stk:{t:<tenant>}:p:k:<model>:<template>:<week>         hash  query key -> "<GPU requests> <gpu us> <tokens>"
    stk:{t:<tenant>}:p:r:<model>:<template>:<week>         hash  query key -> representative request (JSON)
    stk:{t:<tenant>}:p:w:<model>:<template>                zset  weeks seen (member = score = week number)
    stk:{t:<tenant>}:p:ns                                  set   "<model>\\x1f<template>" seen
    stk:{t:<tenant>}:p:wm                                  hash  "<topic>:<partition>" -> last applied offset
    stk:p:tenants                                          set   tenants seen (not atomic with the rest)

Bounded: the week's summary "s" holds at most `week_capacity` queries, a space-saving summary
merged one batch at a time (APPLY_LUA in warmers/traffic/delta.py). Only the queries it holds
get hourly counts ("n"), a cost ("k") and a representative ("r"); an evicted query loses its
cost and representative, and its hourly counts rank last among equals until their hour needs
the room. Each hour keeps at most `hour_capacity` queries, by the hour's count, then the
week's. So a week is at most week_capacity queries and 168 x hour_capacity hourly cells,
whatever the tail of one-offs. A query tracked since the week last
had room counts exactly, hour by hour; one that entered a full week is counted hourly from
then on (its summary count is an upper bound: the smallest count plus its own); any query
asked more than 1/capacity of the week is tracked. The hot set reads hourly counts, so its
candidates (the head) are exact. "h" stays exact. Heavy hitters are chosen per week, not per
hour: a day's hot set needs queries asked a few times a day, under once an hour, which an
hour's own summary cannot tell from one-offs (per-hour summaries of 250 queries kept 0.89 of
the exact coverage at K=200; benchmarks/bench_hot_set_bounded.py).

Per-query counts are hashes, not zsets, and a query's cost figures (misses, GPU us, tokens,
latency us) share one field: the write is a read-modify-write per field in APPLY_LUA, where a
hash field costs Redis about a third less than a zset member (no skiplist), and one packed cost
field less than three (bench_ingest; docs/benchmarks.md, "The traffic profile"); the smallest
count is found by reading the summary only when it overflows. The
kinds "n" and "k" replaced the first layout's "q" (zsets) and "c" (three fields per query), so
a profile written by an older stoker is never read as the new one; it ages out with its TTL.
A cost field written before latency was kept has three figures; its GPU time stands in for its
latency (the value model's earlier assumption) when it is read and when it is added to.

<week> counts Monday-based UTC weeks since the epoch; <how> is the hour of the week, 0 = Monday
00:00-01:00 UTC. The model *version* is left out on purpose: traffic learned under one version
is what the deploy worker pre-warms the next one with.

A batch is aggregated in memory first (warmers/traffic/delta.py: TenantDelta, APPLY_LUA).

Exactly-once counting: the per-partition watermark lives in the tenant's own slot (one hash per
tenant, not one global hash, which would sit in another slot and break atomicity on Cluster),
and APPLY_LUA checks it and adds the counts in one atomic step. A tenant's events of a batch
are applied only if every partition's watermark is below that partition's first offset in the
batch; otherwise the script applies nothing and returns the watermarks, and the caller drops
what they cover and retries. So an event is counted iff its offset is above the watermark,
once, whatever the batch boundaries of a redelivery are.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

import orjson
import redis

from caches import keys as K
from caches import slots
from caches.boundary import redis_boundary
from caches.constants import PROFILE_TENANTS
from schemas.common import utcnow
from schemas.errors import CacheUnavailable
from warmers.traffic.delta import APPLY_LUA, Observation, RepMemo, TenantDelta, aggregate

HOURS_PER_WEEK = 168
WEEK_S = 7 * 86_400
# 1970-01-01 was a Thursday: shifting by 3 days makes weeks start on Monday.
_EPOCH_SHIFT_DAYS = 3
# Representatives remembered as written: ~200 bytes each, so 500k bound it near 100 MB.
_REP_MEMO_MAX = 500_000
# Queries tracked a week (per namespace), most asked first. A day's hot set draws on the top
# ~2,000 (HotSetConfig.min_candidates), asked a few times a day each, often less than once an
# hour; 20,000 keep them all with room for the ones rising (benchmarks/bench_hot_set_bounded.py
# measures the coverage kept, bench_profile_memory.py the bytes).
WEEK_CAPACITY = 20_000
# Queries an hour keeps of those: its hourly counts are what the hot set sums, and the top
# queries are asked in every hour, so 168 x 20,000 cells would be ~250 MB a week. 1,000 an hour
# bound a week's cells at 168k, by the hour's count, then the week's.
HOUR_CAPACITY = 1_000
# Weeks kept (the keys expire after that): the forecast weighs recent weeks most.
RETENTION_WEEKS = 4
# A partial refusal needs one more round trip; more than 4 in a row means another worker keeps
# moving the same watermark (a rebalance storm), and the batch is retried as a whole later.
_MAX_REFUSALS = 4


def week_and_hour(ts: datetime) -> tuple[int, int]:
    """(Monday-based week number since the epoch, hour of week 0..167) of an aware time."""
    epoch_h = int(ts.timestamp()) // 3600
    days = epoch_h // 24 + _EPOCH_SHIFT_DAYS
    return days // 7, (days % 7) * 24 + epoch_h % 24


def week_start(week: int) -> date:
    return date(1970, 1, 1) + timedelta(days=week * 7 - _EPOCH_SHIFT_DAYS)


@dataclass(frozen=True)
class QueryStat:
    qkey: str
    count: int  # requests over the hours asked, summed over `weeks` weeks
    weeks: int


@dataclass(frozen=True)
class MissCost:
    misses: int  # requests that reached the GPU
    gpu_ms: float  # summed over those
    tokens: int
    latency_ms: float = 0.0  # summed over those: what their callers waited, end to end

    @property
    def gpu_ms_per_miss(self) -> float:
        return self.gpu_ms / self.misses if self.misses else 0.0

    @property
    def latency_ms_per_miss(self) -> float:
        return self.latency_ms / self.misses if self.misses else 0.0


@dataclass(frozen=True)
class HourlyCounts:
    warmable: list[int]  # 168 buckets
    uncacheable: list[int]


class TrafficProfile:
    """Writes batches of observations exactly once per offset, and answers the warmers' reads."""

    def __init__(
        self,
        r: redis.Redis,
        retention_weeks: int = RETENTION_WEEKS,
        clock: Callable[[], datetime] = utcnow,
        week_capacity: int = WEEK_CAPACITY,
        hour_capacity: int = HOUR_CAPACITY,
    ) -> None:
        if min(week_capacity, hour_capacity) < 1:
            raise ValueError(f"capacities must be >= 1, got {week_capacity}, {hour_capacity}")
        self.r = r
        self.retention_weeks = retention_weeks
        # The retained weeks end at the clock's week, never at the newest event's (weeks()).
        self.clock = clock
        self.capacity = (week_capacity, hour_capacity)
        # Keys live a week past retention: the oldest kept week stays whole until it ages out.
        self.ttl_s = (retention_weeks + 1) * WEEK_S
        self._script = r.register_script(APPLY_LUA)
        # Representatives this process wrote (see TenantDelta.script_args); forgotten on any
        # Redis error, because a Redis that went away may come back empty.
        self._rep_memo: RepMemo = {}

    # -- write side --
    def write(self, observations: Sequence[Observation]) -> int:
        """Apply observations (offset order per partition); returns how many were counted."""
        return self.write_deltas(aggregate(observations), lambda: observations)

    def write_deltas(
        self,
        deltas: dict[str, TenantDelta],
        observations: Callable[[], Sequence[Observation]],
    ) -> int:
        """Apply a batch aggregated in memory; returns how many events were counted.

        `deltas` must equal aggregate(observations()); observations() is called only when a
        tenant's watermark already covers part of the batch (after a crash or rebalance), to
        count what lies above it. One pipelined round trip for the whole batch, plus one per
        such refusal.
        """
        pending = deltas
        by_tenant: dict[str, list[Observation]] | None = None
        counted = 0
        for _ in range(_MAX_REFUSALS):
            stale = self._apply(pending)
            counted += sum(d.events for t, d in pending.items() if t not in stale)
            if not stale:
                return counted
            if by_tenant is None:
                by_tenant = {}
                for o in observations():
                    by_tenant.setdefault(o.tenant, []).append(o)
            pending = {}
            for tenant, marks in stale.items():
                fresh = [o for o in by_tenant[tenant] if o.offset > marks.get(o.part, -1)]
                pending.update(aggregate(fresh))
            if not pending:
                return counted
        raise CacheUnavailable(f"profile watermarks kept moving for tenants {sorted(pending)}")

    def _apply(self, deltas: dict[str, TenantDelta]) -> dict[str, dict[str, int]]:
        """One pipeline: every tenant's script; returns refused tenants with their watermarks."""
        if not deltas:
            return {}
        if len(self._rep_memo) > _REP_MEMO_MAX:
            self._rep_memo.clear()
        tenants = list(deltas)
        try:
            with redis_boundary("profile write"):
                results, remember = self._run_scripts(deltas, tenants)
        except CacheUnavailable:
            self._rep_memo.clear()
            raise
        stale: dict[str, dict[str, int]] = {}
        res: Any
        for t, res, mem in zip(tenants, results[1:], remember, strict=True):
            if _s(res[0]) == "stale":
                it = iter(res[1:])
                stale[t] = {_s(p): int(w) for p, w in zip(it, it, strict=True)}
            else:
                self._remember(mem, {_s(q) for q in res[1:]})
        return stale

    def _remember(self, mem: list[tuple[Any, object]], forget: set[str]) -> None:
        """Representatives the script kept are remembered; those it did not keep (their query
        is tracked by no hour), or found gone, are forgotten, so they are sent again."""
        memo = self._rep_memo
        for mk, fp in mem:
            if mk[4] in forget:
                memo.pop(mk, None)
            elif fp is not None:
                memo[mk] = fp

    def _run_scripts(
        self, deltas: dict[str, TenantDelta], tenants: list[str]
    ) -> tuple[list[Any], list[list[tuple[Any, object]]]]:
        for attempt in (0, 1):
            pipe = self.r.pipeline(transaction=False)
            pipe.sadd(PROFILE_TENANTS, *tenants)
            remember = []
            for t in tenants:
                keys, argv, mem = deltas[t].script_args(self.ttl_s, self.capacity, self._rep_memo)
                slots.evalsha_in(pipe, self._script.sha, keys, argv)  # one tenant: one slot
                remember.append(mem)
            try:
                return pipe.execute(), remember
            except redis.exceptions.NoScriptError:
                # A restarted or failed-over Redis lost its script cache (and maybe its data):
                # load once, redo; a script runs whole or not at all, so redoing is safe.
                if attempt:
                    raise
                self._rep_memo.clear()
                self._script.sha = self.r.script_load(APPLY_LUA)
        raise AssertionError("unreachable")

    # -- read side --
    def tenants(self) -> list[str]:
        with redis_boundary("profile tenants"):
            raw: Any = self.r.smembers(PROFILE_TENANTS)
        return sorted(_s(t) for t in raw)

    def namespaces(self, tenant: str) -> list[tuple[str, str]]:
        """(model_id, template_version) pairs seen for the tenant."""
        with redis_boundary("profile namespaces"):
            raw: Any = self.r.smembers(K.profile_namespaces_key(tenant))
        pairs = (_s(x).split("\x1f", 1) for x in raw)
        return sorted((m, t) for m, t in pairs)

    def weeks(self, tenant: str, model_id: str, template_version: str) -> list[int]:
        """Weeks with data, newest first, at most retention_weeks of them, none after the
        clock's week. The clock bounds them, not the newest event: events dated 2999 once made
        the newest weeks an attacker's, and the tenant's real weeks fell out of the reads.
        (The traffic worker refuses such events too: warmers/traffic/event_time.py.)"""
        key = K.profile_weeks_key(tenant, model_id, template_version)
        now_week = week_and_hour(self.clock())[0]
        with redis_boundary("profile weeks"):
            raw: Any = self.r.zrevrangebyscore(key, now_week, "-inf", 0, self.retention_weeks)
        return [int(w) for w in raw]

    def top_queries(
        self,
        tenant: str,
        model_id: str,
        template_version: str,
        hours_of_week: Iterable[int],
        limit: int,
        weeks: Iterable[int] | None = None,
    ) -> list[QueryStat]:
        """The most asked warmable queries in those hours, summed over the retained weeks
        (or over those of `weeks` that are retained: the hot set reads only matching days)."""
        retained = self.weeks(tenant, model_id, template_version)
        used = retained if weeks is None else sorted(set(weeks) & set(retained), reverse=True)
        hours = sorted(set(hours_of_week))
        if not used or not hours or limit <= 0:
            return []
        if any(not 0 <= h < HOURS_PER_WEEK for h in hours):
            raise ValueError(f"hours of week lie in 0..167, got {hours}")
        with redis_boundary("profile top queries"):
            pipe = self.r.pipeline(transaction=False)
            for w in used:
                for h in hours:
                    pipe.hgetall(K.profile_hour_key(tenant, model_id, template_version, w, h))
            per_hour: list[dict[bytes, bytes]] = pipe.execute()
        sums: dict[bytes, int] = {}
        for counts in per_hour:
            for q, c in counts.items():
                sums[q] = sums.get(q, 0) + int(c)
        # most asked first, ties by key: the same answer whatever order Redis returned
        best = heapq.nsmallest(limit, sums.items(), key=lambda row: (-row[1], row[0]))
        return [QueryStat(_s(q), n, len(used)) for q, n in best]

    def week_counts(self, tenant: str, model_id: str, template_version: str) -> dict[str, int]:
        """Each tracked query's requests summed over the retained weeks, from the weeks'
        summaries (one read per week; an upper bound for a query that entered a full week)."""
        weeks = self.weeks(tenant, model_id, template_version)
        with redis_boundary("profile week counts"):
            pipe = self.r.pipeline(transaction=False)
            for w in weeks:
                pipe.hgetall(K.profile_week_key(tenant, "s", model_id, template_version, w))
            raws: list[dict[bytes, bytes]] = pipe.execute()
        out: dict[str, int] = {}
        for raw in raws:
            for q, c in raw.items():
                k = _s(q)
                out[k] = out.get(k, 0) + int(c)
        return out

    def hour_cells(
        self, tenant: str, model_id: str, template_version: str, cells: Sequence[tuple[int, int]]
    ) -> list[dict[str, int]]:
        """Per (week, hour of week) cell, each warmable query's count there (one round trip);
        a cell of a week no longer retained reads empty."""
        if any(not 0 <= h < HOURS_PER_WEEK for _, h in cells):
            raise ValueError("hours of week lie in 0..167")
        with redis_boundary("profile hour cells"):
            pipe = self.r.pipeline(transaction=False)
            for w, h in cells:
                pipe.hgetall(K.profile_hour_key(tenant, model_id, template_version, w, h))
            raws: list[dict[bytes, bytes]] = pipe.execute()
        return [{_s(q): int(c) for q, c in raw.items()} for raw in raws]

    def hourly_counts(
        self, tenant: str, model_id: str, template_version: str
    ) -> dict[int, HourlyCounts]:
        """Per retained week: requests per hour of week (warmable and never cacheable)."""
        weeks = self.weeks(tenant, model_id, template_version)
        with redis_boundary("profile hourly counts"):
            pipe = self.r.pipeline(transaction=False)
            for w in weeks:
                pipe.hgetall(K.profile_week_key(tenant, "h", model_id, template_version, w))
            raws = pipe.execute()
        out: dict[int, HourlyCounts] = {}
        for w, raw in zip(weeks, raws, strict=True):
            hc = HourlyCounts([0] * HOURS_PER_WEEK, [0] * HOURS_PER_WEEK)
            for f, n in raw.items():
                name = _s(f)
                if name.startswith("u"):
                    hc.uncacheable[int(name[1:])] = int(n)
                else:
                    hc.warmable[int(name)] = int(n)
            out[w] = hc
        return out

    def daily_counts(
        self, tenant: str, model_id: str, template_version: str
    ) -> dict[date, list[int]]:
        """All requests per UTC day and hour (24 buckets), for clustering days into regimes."""
        return daily_from(self.hourly_counts(tenant, model_id, template_version))

    def miss_costs(
        self, tenant: str, model_id: str, template_version: str, qkeys: Sequence[str]
    ) -> dict[str, MissCost]:
        """GPU cost of each query's misses, summed over the retained weeks (absent: never missed)."""
        weeks = self.weeks(tenant, model_id, template_version)
        if not weeks or not qkeys:
            return {}
        with redis_boundary("profile miss costs"):
            pipe = self.r.pipeline(transaction=False)
            for w in weeks:
                key = K.profile_week_key(tenant, "k", model_id, template_version, w)
                pipe.hmget(key, list(qkeys))
            per_week = pipe.execute()
        out: dict[str, MissCost] = {}
        for i, q in enumerate(qkeys):
            m = g = t = lat = 0
            for vals in per_week:
                if vals[i]:
                    vm, vg, vt, vl = _cost_fields(vals[i])
                    m, g, t, lat = m + vm, g + vg, t + vt, lat + vl
            if m:
                out[q] = MissCost(m, g / 1000.0, t, lat / 1000.0)
        return out

    def miss_totals(
        self, tenant: str, model_id: str, template_version: str, weeks: Sequence[int]
    ) -> MissCost:
        """The misses of every tracked query of `weeks`, summed (the scheduler's headroom
        forecast: what a request that reaches the GPU costs, and how many do)."""
        with redis_boundary("profile miss totals"):
            pipe = self.r.pipeline(transaction=False)
            for w in weeks:
                pipe.hvals(K.profile_week_key(tenant, "k", model_id, template_version, w))
            per_week: list[list[bytes]] = pipe.execute()
        m = g = t = lat = 0
        for vals in per_week:
            for v in vals:
                vm, vg, vt, vl = _cost_fields(v)
                m, g, t, lat = m + vm, g + vg, t + vt, lat + vl
        return MissCost(m, g / 1000.0, t, lat / 1000.0)

    def representatives(
        self, tenant: str, model_id: str, template_version: str, qkeys: Sequence[str]
    ) -> dict[str, dict[str, Any]]:
        """The latest request seen for each query key (prompt, params, context_docs, ...)."""
        weeks = self.weeks(tenant, model_id, template_version)
        if not weeks or not qkeys:
            return {}
        with redis_boundary("profile representatives"):
            pipe = self.r.pipeline(transaction=False)
            for w in weeks:  # newest first: the first week that has it wins
                key = K.profile_week_key(tenant, "r", model_id, template_version, w)
                pipe.hmget(key, list(qkeys))
            per_week = pipe.execute()
        out: dict[str, dict[str, Any]] = {}
        for vals in per_week:
            for q, raw in zip(qkeys, vals, strict=True):
                if raw is not None and q not in out:
                    out[q] = orjson.loads(raw)
        return out

    def representative(
        self, tenant: str, model_id: str, template_version: str, qkey: str
    ) -> dict[str, Any] | None:
        return self.representatives(tenant, model_id, template_version, [qkey]).get(qkey)

    def watermarks(self, tenant: str) -> dict[str, int]:
        with redis_boundary("profile watermarks"):
            raw: Any = self.r.hgetall(K.profile_watermarks_key(tenant))
        return {_s(k): int(v) for k, v in raw.items()}


def daily_from(hourly: dict[int, HourlyCounts]) -> dict[date, list[int]]:
    """`hourly_counts`' weeks as days: all requests per UTC day and hour (24 buckets)."""
    out: dict[date, list[int]] = {}
    for w, hc in hourly.items():
        start = week_start(w)
        for d in range(7):
            hours = range(d * 24, d * 24 + 24)
            out[start + timedelta(days=d)] = [hc.warmable[h] + hc.uncacheable[h] for h in hours]
    return dict(sorted(out.items()))


def _cost_fields(v: bytes) -> tuple[int, int, int, int]:
    """One cost field, "<misses> <gpu us> <tokens> <latency us>" as APPLY_LUA writes it; a
    field from before latency was kept has three figures, and its GPU time stands in."""
    vm, vg, vt, *vl = v.split()
    return int(vm), int(vg), int(vt), int(vl[0]) if vl else int(vg)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
