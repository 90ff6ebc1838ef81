"""Stream worker metrics: events, batches, dead letters, retries, consumer lag, gateway outcomes.

Every series is labelled by worker name (4 values); lag adds topic and partition (bounded by
the partition counts in streams.topics); dead letters add the decode reason (a fixed list in
schemas.codec). The gateway's hit rate comes from RequestLogged.cache_outcome, counted by the
traffic worker per committed batch: exact vs semantic share =
    rate(stoker_gateway_requests_total{outcome="exact"}[5m]) / sum(rate(...[5m]))

Consumer lag = high watermark - committed offset, per owned partition, refreshed at most every
LAG_EVERY_S from librdkafka's cached watermarks (no broker round trip). It is informational
only: the embedded broker (Tansu) reports a wrong high watermark (the last batch's base offset
+ 1), so there lag reads low; on real Kafka it is right. Nothing in stoker decides on it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from confluent_kafka import TopicPartition
from prometheus_client import Counter, Gauge

from streams.base import Poison

# Lag is for dashboards and autoscaling (KEDA reads the broker itself): every 5 s is plenty.
LAG_EVERY_S: Final = 5.0

EVENTS = Counter("stoker_worker_events", "Events applied and committed", ["worker"])
BATCHES = Counter("stoker_worker_batches", "Batches applied and committed", ["worker"])
DEAD_LETTERS = Counter(
    "stoker_worker_dead_letters", "Records sent to stoker.dlq, by reason", ["worker", "reason"]
)
RETRIES = Counter(
    "stoker_worker_retries", "Batches re-read after a retriable failure (outages)", ["worker"]
)
LAST_BATCH = Gauge(
    "stoker_worker_last_batch_timestamp_seconds",
    "Unix time of the last committed batch",
    ["worker"],
)
CONSUMER_LAG = Gauge(
    "stoker_consumer_lag",
    "High watermark minus committed offset (informational: wrong on Tansu)",
    ["worker", "topic", "partition"],
)
GATEWAY_REQUESTS = Counter(
    "stoker_gateway_requests",
    "Requests the serving gateway logged, by its cache outcome (RequestLogged.cache_outcome)",
    ["outcome"],
)


class _Watermarks(Protocol):
    """The part of confluent_kafka.Consumer lag needs."""

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...


class WorkerMetrics:
    """One worker's series; called from its worker thread only (lag state is unlocked)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._events = EVENTS.labels(worker)
        self._batches = BATCHES.labels(worker)
        self._retries = RETRIES.labels(worker)
        self._last = LAST_BATCH.labels(worker)
        self._committed: dict[tuple[str, int], int] = {}
        self._lag_at = 0.0
        self.lag_every_s = LAG_EVERY_S

    def committed(self, offsets: Sequence[TopicPartition]) -> None:
        """Offsets just committed (the next offset to read, per partition), for lag."""
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset

    def settled(self, events: int, poison: Sequence[Poison]) -> None:
        """A batch is applied, dead-lettered and committed: count it."""
        self._events.inc(events)
        self._batches.inc()
        for p in poison:
            DEAD_LETTERS.labels(self.worker, p.error.reason).inc()
        self._last.set(time.time())

    def retried(self) -> None:
        self._retries.inc()

    def revoked(self, partitions: Sequence[TopicPartition]) -> None:
        """Drop the lag series of partitions another member owns now."""
        for tp in partitions:
            self._committed.pop((tp.topic, tp.partition), None)
            with contextlib.suppress(KeyError):  # never set: nothing committed there yet
                CONSUMER_LAG.remove(self.worker, tp.topic, str(tp.partition))

    def maybe_update_lag(self, consumer: _Watermarks, now: float | None = None) -> None:
        """At most every LAG_EVERY_S: lag of each partition this worker has committed on."""
        now = time.monotonic() if now is None else now
        if now - self._lag_at < self.lag_every_s:
            return
        self._lag_at = now
        for (topic, partition), committed in list(self._committed.items()):
            marks = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            if not marks or marks[1] < 0:  # not known yet (no fetch response cached)
                continue
            lag = max(0, marks[1] - committed)
            CONSUMER_LAG.labels(self.worker, topic, str(partition)).set(lag)


def count_gateway_outcomes(tally: Mapping[str, int]) -> None:
    """Add a committed batch's cache outcomes (outcome -> requests)."""
    for outcome, n in tally.items():
        if n:
            GATEWAY_REQUESTS.labels(outcome).inc(n)
