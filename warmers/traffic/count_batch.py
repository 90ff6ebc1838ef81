"""The traffic worker's batch tally: RequestLogged bytes straight into the profile's TenantDeltas.

At 100k events/s one core has 10 us per event, consume and the Redis write included. An
Observation per event (FastDecoder.observe) and aggregate() over them afterwards spent nearly
all of it, so this loop does the same work fused (bench_ingest: ingest_traffic; the cost of
each step is in docs/benchmarks.md, "Ingest"):
- aggregate() is inlined into the decode loop: no Observation and no second pass;
- the hour of week comes from comparing the time with the current hour's bounds (a batch
  spans a few hours), not from converting every datetime;
- the tenant's brace ban is checked once per tenant and batch, not by a regex per event;
- query keys are memoised per (prompt, params, docs, cluster key): traffic is Zipf.
What the fast path refuses goes to observe_slow (decode_event): counted if valid, else poison.
The result equals aggregate() of the per-event path (a property test holds them together), and
TrafficProfile re-reads a batch per event (observe_batch) only after a watermark refusal.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from confluent_kafka import Message
from msgspec import UNSET

from schemas.codec import MAX_EVENT_BYTES
from schemas.errors import EventDecodeError
from streams.base import Decoded, Poison, message_value
from warmers.traffic.decode import (
    DECODE_ERRORS,
    DECODER,
    GPU_OUTCOMES,
    MEMO_MAX,
    FastDecoder,
    Request,
    cluster_query_key,
    observe_slow,
    params_canon,
    query_key_canon,
    shape_ok,
    tenant_ok,
)
from warmers.traffic.delta import Observation, TenantDelta
from warmers.traffic.event_time import TimeWindow, aware
from warmers.traffic.profile import week_and_hour

_HOUR: Final = timedelta(hours=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE: Final = datetime(1970, 1, 1)
# Decode errors, and TypeError: len() of a tombstone's None value.
_REFUSED: Final = (*DECODE_ERRORS, TypeError)


def _hour_window(ts: datetime) -> tuple[int, int, datetime | None, datetime | None]:
    """(week, hour of week) of ts (naive = UTC), and the bounds of its UTC hour, of ts's own
    kind (naive or aware) so the next request's time compares with them."""
    aware = ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    week, how = week_and_hour(aware)
    hour = int(aware.timestamp()) // 3600
    if hour < 0:  # int() truncates before 1970, floor division would not: no window, exact
        return week, how, None, None
    lo = (_EPOCH if ts.tzinfo else _EPOCH_NAIVE) + hour * _HOUR
    return week, how, lo, lo + _HOUR


def _hour_of(
    ts: datetime, times: TimeWindow | None
) -> tuple[int, int, datetime | None, datetime | None, bool]:
    """_hour_window, and whether the whole hour lies inside the accepted times (then no event
    of that hour needs its own check)."""
    week, how, lo, hi = _hour_window(ts)
    return week, how, lo, hi, times is None or times.covers(lo, hi)


def _fast(value: bytes | None) -> Request | None:
    """The request, or None when the fast path is unsure (decode_event decides)."""
    try:
        r = DECODER.decode(value) if len(value) <= MAX_EVENT_BYTES else None  # type: ignore[arg-type]
    except _REFUSED:
        return None
    return None if r is None or r.ts is UNSET or not shape_ok(r) else r


class BatchTally:
    """Turns batches of records into TenantDeltas; keeps only memos between batches."""

    def __init__(self) -> None:
        # (prompt, params, context_docs, cluster_key) -> (query key, cacheable)
        self._queries: dict[tuple[Any, ...], tuple[str, bool]] = {}

    def add(
        self, messages: Sequence[Message], out: Decoded, times: TimeWindow | None = None
    ) -> tuple[dict[str, TenantDelta], int]:
        """(deltas, good events) of a batch; poison and cache outcomes go into `out`. Events
        outside `times` are poison (warmers/traffic/event_time.py).

        The hot loop: aggregate() inlined into the decode loop (~1.5 us an event besides
        msgspec's decode), so it stays one function; a call per event costs ~0.1 us."""
        outcomes, queries = out.tally, self._queries
        deltas: dict[str, TenantDelta] = {}
        runs: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        firsts: dict[str, int] = {}
        lasts: dict[str, int] = {}
        topic: str | None = None
        partition: int | None = -1
        lo: datetime | None = None
        hi: datetime | None = None
        week = how = 0
        inside = False  # the current hour lies wholly inside `times`
        for msg in messages:
            p, t = msg.partition(), msg.topic()
            if p != partition or t != topic:  # records come in runs per partition
                partition, topic = p, t
                firsts, lasts = runs.setdefault(f"{t}:{p}", ({}, {}))
            r = _fast(msg.value())
            if r is None:
                self._slow(msg, deltas, runs, out, times)
                continue
            try:
                if not lo <= r.ts < hi:  # type: ignore[operator]
                    week, how, lo, hi, inside = _hour_of(r.ts, times)  # type: ignore[arg-type]
            except TypeError:  # naive against aware bounds (or the reverse), or no bounds
                week, how, lo, hi, inside = _hour_of(r.ts, times)  # type: ignore[arg-type]
            memo_key = (r.prompt, r.params, r.context_docs, r.cluster_key)
            q, cacheable = queries.get(memo_key) or self._query(memo_key, r)
            tenant = r.tenant
            d = deltas.get(tenant)
            if d is None and (d := _new_delta(tenant, deltas)) is None:
                self._slow(msg, deltas, runs, out, times)  # a bad tenant id: poison
                continue
            if not inside and _refused(msg, r.ts, times, out):  # type: ignore[arg-type]
                continue  # checked after the fields, as observe_slow does
            offset = msg.offset() or 0
            firsts.setdefault(tenant, offset)
            lasts[tenant] = offset
            outcome = r.cache_outcome
            outcomes[outcome] += 1
            if not cacheable:  # count() adds the event
                d.count((r.model_id, r.template_version, week), how, q, False, 1)
                continue
            d.events += 1
            counts = d.queries[r.model_id, r.template_version, week, how]
            counts[q] = counts.get(q, 0) + 1
            if outcome in GPU_OUTCOMES:  # integer us, rounded per event as aggregate() does
                where = (r.model_id, r.template_version, week)
                gpu_us, lat_us = round(r.gpu_ms * 1000), round(r.latency_ms * 1000)
                d.add_cost(where, q, 1, gpu_us, r.tokens_in + r.tokens_out, lat_us, r)
            elif r.cache_source == "warm" and r.cache_key is not None:  # the calibration's
                d.warm_hits.append((r.cache_key, aware(r.ts).timestamp()))  # type: ignore[arg-type]
        return _with_spans(deltas, runs)

    def _query(self, memo_key: tuple[Any, ...], r: Request) -> tuple[str, bool]:
        if len(self._queries) >= MEMO_MAX:
            self._queries.clear()  # bounded memory; only costs a re-hash
        qkey = (
            cluster_query_key(r.cluster_key)
            if r.cluster_key is not None
            else query_key_canon(
                r.prompt, params_canon(r.params), [d.doc_id for d in r.context_docs]
            )
        )
        found = self._queries[memo_key] = (qkey, r.params.cacheable)
        return found

    @staticmethod
    def _slow(
        msg: Message,
        deltas: dict[str, TenantDelta],
        runs: dict[str, tuple[dict[str, int], dict[str, int]]],
        out: Decoded,
        times: TimeWindow | None,
    ) -> None:
        """decode_event decides: poison for the dead-letter topic, or one more count."""
        part, offset = f"{msg.topic()}:{msg.partition()}", msg.offset() or 0
        try:
            o, outcome, warm = observe_slow(message_value(msg), part, offset, times)
        except EventDecodeError as exc:
            out.poison.append(Poison(msg, exc))
            return
        out.tally[outcome] += 1
        d = deltas.get(o.tenant)
        if d is None:
            d = deltas[o.tenant] = TenantDelta(o.tenant)
        firsts, lasts = runs.setdefault(part, ({}, {}))
        firsts.setdefault(o.tenant, offset)
        lasts[o.tenant] = offset
        where = (o.model_id, o.template_version, o.week)
        d.count(where, o.how, o.qkey, o.cacheable, 1)
        if o.representative is not None:
            gpu_us, lat_us = round(o.gpu_ms * 1000), round(o.latency_ms * 1000)
            d.add_cost(where, o.qkey, 1, gpu_us, o.tokens, lat_us, o.representative)
        if warm is not None:
            d.warm_hits.append(warm)


def _refused(msg: Message, ts: datetime, times: TimeWindow | None, out: Decoded) -> bool:
    """True (and the record is poison) when ts lies outside the accepted times."""
    refusal = None if times is None else times.refusal(ts)
    if refusal is not None:
        out.poison.append(Poison(msg, refusal))
    return refusal is not None


def _new_delta(tenant: str, deltas: dict[str, TenantDelta]) -> TenantDelta | None:
    if not tenant_ok(tenant):
        return None
    d = deltas[tenant] = TenantDelta(tenant)
    return d


def _with_spans(
    deltas: dict[str, TenantDelta], runs: dict[str, tuple[dict[str, int], dict[str, int]]]
) -> tuple[dict[str, TenantDelta], int]:
    for part, (firsts, lasts) in runs.items():
        for tenant, first in firsts.items():
            deltas[tenant].parts[part] = [first, lasts[tenant]]
    # a tenant whose every event was refused for its time has a delta with nothing in it
    counted = {t: d for t, d in deltas.items() if d.events}
    return counted, sum(d.events for d in counted.values())


def observe_batch(
    messages: Sequence[Message], times: TimeWindow | None = None
) -> list[Observation]:
    """The good events of a batch one by one (the per-event reference; and what
    TrafficProfile.write_deltas reads after a watermark refusal). Poison is left out."""
    fast = FastDecoder()  # its own memo: this may run in the apply thread
    out: list[Observation] = []
    for msg in messages:
        part = f"{msg.topic()}:{msg.partition()}"
        value, offset = message_value(msg), msg.offset() or 0
        obs = fast.observe(value, part, offset, times) if len(value) <= MAX_EVENT_BYTES else None
        if obs is None:
            try:
                obs = observe_slow(value, part, offset, times)[0]
            except EventDecodeError:
                continue
        out.append(obs)
    return out
