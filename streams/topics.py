"""Topic names and partition counts, explicit topic creation, and client configs per broker kind.

Every config carries `logger`: librdkafka's log lines go through logging (streams/kafkalog.py).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from schemas.errors import BrokerUnavailable, ConfigError
from streams.kafkalog import KAFKA_LOG

# Logical name -> default partition count. Partitions bound consumer parallelism per group.
TOPICS: Final[Mapping[str, int]] = MappingProxyType(
    {
        # The one high-rate topic (an event per served request): 6 traffic workers can share it.
        "inference.requests": 6,
        # A handful a day, and a deploy must be seen after the one before it: one partition.
        "inference.deploys": 1,
        # Keyed by doc id, so a doc's changes stay ordered; 3 workers are plenty at CDC rates.
        "inference.kb-changes": 3,
        "inference.invalidations": 3,
        # Progress for `stoker deploy --wait` and dead letters: low rate, read in order.
        "stoker.status": 1,
        "stoker.dlq": 1,
        # The wrong-hit monitor's verdicts (HitAudited), one per re-asked hit: at its capped
        # QPS, a few a second; keyed by tenant.
        "stoker.audit": 1,
    }
)

# Errors a retry cannot fix: the request itself is wrong, so they are config errors, not outages.
_CONFIG_ERRORS: Final = frozenset(
    {
        KafkaError.INVALID_PARTITIONS,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.INVALID_REPLICA_ASSIGNMENT,
        KafkaError.INVALID_CONFIG,
        KafkaError.INVALID_REQUEST,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)

# How long librdkafka's fetcher pauses a partition whose prefetch queue is over its thresholds
# (default 1000 ms). A worker drains a whole batch at once (50k records for the traffic worker),
# so with the default the queue filled, fetching paused for a second, the worker emptied the
# queue in a fraction of it and then waited: consumes came back short after their timeout every
# few batches. A client-side setting, so it holds for any broker (bench_ingest: ingest_traffic;
# the figures are in docs/benchmarks.md, "Ingest").
FETCH_QUEUE_BACKOFF_MS: Final = 10

# Embedded-broker (Tansu 0.6) consumer settings, measured here: with librdkafka's defaults
# (45 s session, 3 s heartbeat) a consumer takes seconds to join; with these it joins in ~1.5 s,
# and a 10 ms fetch wait gives ~4 ms end-to-end latency. Tansu holds every fetch for the whole
# wait, data or not (it does not long-poll), so a longer wait would delay every batch by as
# much: idle consumers rest between fetches instead (streams/idle.py). Real Kafka keeps its
# defaults.
_EMBEDDED_CONSUMER: Final[Mapping[str, Any]] = MappingProxyType(
    {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 10}
)
# Tansu needs no producer tuning (100 messages flush in ~2 ms at librdkafka's defaults).
_EMBEDDED_PRODUCER: Final[Mapping[str, Any]] = MappingProxyType({})


def topic_name(logical: str, prefix: str = "") -> str:
    """The broker-side name: prefix + logical name (the prefix carries its own separator)."""
    if logical not in TOPICS:
        raise ValueError(f"unknown topic {logical!r}; known: {sorted(TOPICS)}")
    return f"{prefix}{logical}"


def ensure_topics(
    bootstrap: str, names_partitions: Mapping[str, int], timeout_s: float = 10
) -> None:
    """Create each topic with its partition count; a topic that already exists is left as is.

    Explicit creation matters on Tansu, which auto-creates a topic on first use with 4
    partitions. Raises BrokerUnavailable when the broker does not answer within timeout_s and
    ConfigError when it refuses the request (bad partition count, policy, authorization).
    """
    if not names_partitions:
        return
    bad = {name: n for name, n in names_partitions.items() if n < 1}
    if bad:  # checked here because Tansu accepts 0 partitions where Kafka refuses them
        raise ConfigError(f"partition counts must be >= 1, got {bad}")
    admin = AdminClient(admin_config(bootstrap))
    new = [NewTopic(name, num_partitions=n) for name, n in names_partitions.items()]
    futures = admin.create_topics(new, request_timeout=timeout_s, operation_timeout=timeout_s)
    # One deadline for all: the futures resolve together from a single CreateTopics request.
    _, pending = concurrent.futures.wait(futures.values(), timeout=timeout_s)
    admin.poll(0)  # hand librdkafka's log lines to logging (streams/kafkalog.py)
    # Drop the client now: a raised error's traceback would keep it, and its reconnect loop
    # against a dead broker, alive (destroying it also cancels what is still pending).
    del admin
    late = f"Kafka at {bootstrap} did not create topics within {timeout_s} s"
    if pending:
        raise BrokerUnavailable(late)
    for name, future in futures.items():
        _raise_for(bootstrap, name, future, late)


def _raise_for(
    bootstrap: str, name: str, future: concurrent.futures.Future[None], late: str
) -> None:
    try:
        future.result(timeout=0)
    except KafkaException as exc:
        err: KafkaError = exc.args[0]
        if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        # librdkafka's own request timeout (the same timeout_s) can resolve the futures just
        # before the wait above gives up: the same outcome, so the same one line.
        if err.code() == KafkaError._TIMED_OUT:
            raise BrokerUnavailable(late) from exc
        message = f"creating topic {name!r} on {bootstrap}: {err.str()}"
        if err.code() in _CONFIG_ERRORS:
            raise ConfigError(message) from exc
        raise BrokerUnavailable(message) from exc


def consumer_config(
    bootstrap: str, group_id: str, *, embedded: bool, **overrides: Any
) -> dict[str, Any]:
    """A confluent_kafka Consumer config; pass dotted keys as **{"max.poll.interval.ms": ...}.

    Offsets are committed by hand, after the effect is applied; a new group reads from the
    start. The classic group protocol stays (librdkafka's default): Tansu hangs on "consumer".
    """
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "logger": KAFKA_LOG,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    }
    if embedded:
        config.update(_EMBEDDED_CONSUMER)
    config.update(overrides)
    return config


def producer_config(bootstrap: str, *, embedded: bool, **overrides: Any) -> dict[str, Any]:
    """A confluent_kafka Producer config; overrides win, as in consumer_config."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": KAFKA_LOG}
    if embedded:
        config.update(_EMBEDDED_PRODUCER)
    config.update(overrides)
    return config


def admin_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """A confluent_kafka AdminClient config. Its log lines wait for poll(): call it."""
    return {"bootstrap.servers": bootstrap, "logger": KAFKA_LOG} | overrides
