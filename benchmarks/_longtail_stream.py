"""A week of one tenant's traffic with a long tail, built column-wise, fed to a TrafficProfile.

The stream for D distinct queries a week: 60% of them are asked once (one-offs); the other 40%
are asked max(2, round(D / 50 / rank)) times (Zipf, s = 1: the top query ~2% of a D-query week).
Each query has an hour of day it peaks at: half of its requests fall within ~1.5 h of it, the
rest follow a diurnal curve, on any day of the week. One-offs get new ids every week; repeated
queries keep theirs (rank r is the same query in every week), as a real service's head does.

The profile is written through its real batch path (TenantDelta + TrafficProfile.write_deltas,
with offsets and watermarks), in time order, BATCH events at a time. A query's first request of
the week reaches the GPU (a cost and a representative); later ones are hits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import redis

from caches import keys as K
from warmers.traffic.delta import TenantDelta
from warmers.traffic.profile import TrafficProfile

TENANT, MODEL, TEMPLATE = "big", "llama", "t1"
# 10k events a batch: a tenant's share of the worker's 50k-event batch when it is one of a few;
# several merges per hour of week, so the space-saving path is exercised, not just one sort.
BATCH = 10_000
SINGLETON_SHARE = 0.6
_DIURNAL = np.array([1, 1, 1, 1, 1, 2, 4, 7, 9, 10, 10, 9, 8, 9, 10, 10, 9, 8, 6, 5, 4, 3, 2, 1])


@dataclass(frozen=True)
class Week:
    query: npt.NDArray[np.int64]  # query id per request (ids >= repeated count are one-offs)
    how: npt.NDArray[np.int64]  # hour of week per request, ascending

    def qkeys(self, ids: npt.NDArray[np.int64]) -> list[str]:
        return [qkey(i) for i in ids.tolist()]


def qkey(i: int) -> str:
    """A query key as the worker makes them: no order that follows popularity (ties break
    by key in the profile and in the exact reference alike)."""
    return f"q:{(i * _SCRAMBLE) & _MASK:032x}"


_SCRAMBLE, _MASK = 0x9E3779B97F4A7C15, (1 << 64) - 1


class Rep:
    """A representative as the profile stores it (~230 bytes of JSON; the worker's are ~600)."""

    __slots__ = ("q",)

    def __init__(self, q: int) -> None:
        self.q = q

    def to_json(self) -> str:
        return (
            f'{{"prompt":"how do I do thing number {self.q} with my account today",'
            '"params":{"temperature":0.0,"max_tokens":512},"context_docs":[],'
            '"model_version":"v1","request_id":"r-0000000000000000"}'
        )

    def fingerprint(self) -> object:
        return self.q


def week(distinct: int, seed: int, week_no: int = 0) -> Week:
    """One week of the stream; `week_no` picks the one-offs' ids (new every week)."""
    rng = np.random.default_rng(seed)
    repeated = int(distinct * (1 - SINGLETON_SHARE))
    ranks = np.arange(1, repeated + 1)
    counts = np.maximum(2, np.round(distinct / 50 / ranks)).astype(np.int64)
    singles = distinct - repeated
    first_single = repeated + week_no * singles
    query = np.concatenate(
        [np.repeat(np.arange(repeated), counts), np.arange(first_single, first_single + singles)]
    )
    peak = np.random.default_rng(seed + 1).integers(0, 24, size=first_single + singles)
    diurnal = rng.choice(24, size=len(query), p=_DIURNAL / _DIURNAL.sum())
    near = (peak[query] + rng.normal(0, 1.5, len(query))) % 24
    hod = np.where(rng.random(len(query)) < 0.5, diurnal, near.astype(np.int64))
    how = rng.integers(0, 7, size=len(query)) * 24 + hod
    order = np.argsort(how, kind="stable")
    return Week(query[order], how[order])


def batches(w: Week, week_number: int, first_offset: int) -> Iterator[tuple[TenantDelta, int]]:
    """(delta, events) per BATCH events, as the traffic tally would aggregate them."""
    _, first_idx = np.unique(w.query, return_index=True)
    misses = np.zeros(len(w.query), dtype=np.bool_)
    misses[first_idx] = True
    where = (MODEL, TEMPLATE, week_number)
    for start in range(0, len(w.query), BATCH):
        q, how = w.query[start : start + BATCH], w.how[start : start + BATCH]
        span = [first_offset + start, first_offset + start + len(q) - 1]
        d = TenantDelta(TENANT, parts={"inference.requests:0": span})
        pairs, n = np.unique(how * (1 << 40) + q, return_counts=True)
        ids = pairs & ((1 << 40) - 1)
        keys = w.qkeys(ids)
        for h, key, c in zip((pairs >> 40).tolist(), keys, n.tolist(), strict=True):
            d.queries[MODEL, TEMPLATE, week_number, h][key] = c
        d.events = len(q)
        for i in np.flatnonzero(misses[start : start + BATCH]).tolist():
            d.add_cost(where, qkey(int(q[i])), 1, 250_000, 600, 270_000, Rep(int(q[i])))
        yield d, len(q)


def feed(profile: TrafficProfile, w: Week, week_number: int, first_offset: int = 0) -> int:
    """Write the week into the profile; returns the events counted."""
    counted = 0
    for delta, _ in batches(w, week_number, first_offset):
        counted += profile.write_deltas({TENANT: delta}, list)
    return counted


def tenant_bytes(r: redis.Redis) -> int:
    """Redis's own measure (MEMORY USAGE, every element sampled) of the tenant's keys."""
    total = 0
    for key in r.scan_iter(match=f"{K.tenant_tag(TENANT)}:*", count=1000):
        total += int(r.memory_usage(key, samples=0) or 0)
    return total
