"""Invalidation metrics: purge keys deleted and progress per job, invalidations and their lag.

Invalidation lag is event time (the event's `ts`, stamped by its producer) to applied (the
worker's batch done): it covers the producer's delay, Kafka and the worker's queue, which is
what a user waiting for a stale answer to go away experiences. Alert: p99 over 5 s.

Labels are bounded: kind is one of KINDS; the purge progress gauge is labelled by job id, and a
job's series is removed when the job ends, so only running purges (a handful) have one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Final, Protocol

from prometheus_client import Counter, Gauge, Histogram

from schemas.events import Event, Invalidate, KnowledgeBaseChanged, PromptTemplateChanged

KINDS: Final = ("kb_changed", "template_changed", "doc", "context_hash", "namespace", "entity")
# Seconds: ~5-50 ms when the worker keeps up, seconds when it is behind; the alert sits at 5 s.
LAG_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

PURGE_DELETED = Counter("stoker_purge_keys_deleted", "Cache keys deleted by staggered purges")
PURGE_PROGRESS = Gauge(
    "stoker_purge_progress_ratio",
    "Share of the keyspace a running purge has scanned (0..1), per job",
    ["job"],
)
INVALIDATIONS = Counter("stoker_invalidations", "Invalidation events applied, by kind", ["kind"])
INVALIDATION_LAG = Histogram(
    "stoker_invalidation_lag_seconds",
    "Event time to applied, per invalidation event",
    ["kind"],
    buckets=LAG_BUCKETS,
)


class _Progress(Protocol):
    """The part of purge.PurgeProgress the gauge reads."""

    job_id: str
    fraction: float
    state: str


def kind_of(ev: Event) -> str | None:
    """The kind label of an invalidation event, None for other events."""
    if isinstance(ev, KnowledgeBaseChanged):
        return "kb_changed"
    if isinstance(ev, PromptTemplateChanged):
        return "template_changed"
    if isinstance(ev, Invalidate):
        return ev.by
    return None


def applied(events: Iterable[Event], now: float | None = None) -> None:
    """A batch of invalidation events is applied: count them and observe their lag."""
    now = time.time() if now is None else now
    for ev in events:
        kind = kind_of(ev)
        if kind is None:
            continue
        INVALIDATIONS.labels(kind).inc()
        INVALIDATION_LAG.labels(kind).observe(max(0.0, now - ev.ts.timestamp()))


def purge_reported(p: _Progress) -> None:
    """A purge's progress callback: set its gauge while it runs, drop the series when it ends."""
    if p.state == "running":
        PURGE_PROGRESS.labels(p.job_id).set(p.fraction)
        return
    with contextlib.suppress(KeyError):  # a run that ended before its first batch
        PURGE_PROGRESS.remove(p.job_id)
