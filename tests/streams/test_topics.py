"""Topic creation with partition counts, and a produce/consume round trip on the embedded broker."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from schemas.errors import BrokerUnavailable, ConfigError
from stoker.embedded import free_port
from streams.kafkalog import KAFKA_LOG
from streams.topics import (
    TOPICS,
    _raise_for,
    admin_config,
    consumer_config,
    ensure_topics,
    producer_config,
    topic_name,
)


def _partitions(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=5)
    return len(metadata.topics[topic].partitions)


def test_topics__default_partition_counts() -> None:
    assert dict(TOPICS) == {
        "inference.requests": 6,
        "inference.deploys": 1,
        "inference.kb-changes": 3,
        "inference.invalidations": 3,
        "stoker.status": 1,
        "stoker.dlq": 1,
        "stoker.audit": 1,
    }


def test_topic_name__prefix_and_unknown_name() -> None:
    assert topic_name("stoker.dlq", "") == "stoker.dlq"
    assert topic_name("inference.deploys", "staging.") == "staging.inference.deploys"
    with pytest.raises(ValueError, match="unknown topic"):
        topic_name("inference.request", "")


def test_ensure_topics__creates_with_partition_count(kafka_bootstrap: str, unique: str) -> None:
    topic = f"t3-{unique}"
    ensure_topics(kafka_bootstrap, {topic: 3})
    assert _partitions(kafka_bootstrap, topic) == 3


def test_ensure_topics__existing_topic_is_success(kafka_bootstrap: str, unique: str) -> None:
    topic = f"twice-{unique}"
    ensure_topics(kafka_bootstrap, {topic: 2})
    ensure_topics(kafka_bootstrap, {topic: 2})
    assert _partitions(kafka_bootstrap, topic) == 2


def test_ensure_topics__all_logical_topics_with_prefix(kafka_bootstrap: str, unique: str) -> None:
    prefix = f"p{unique}."
    ensure_topics(kafka_bootstrap, {topic_name(t, prefix): n for t, n in TOPICS.items()})
    for logical, n in TOPICS.items():
        assert _partitions(kafka_bootstrap, topic_name(logical, prefix)) == n


def test_ensure_topics__bad_partition_count_is_config_error(
    kafka_bootstrap: str, unique: str
) -> None:
    with pytest.raises(ConfigError):
        ensure_topics(kafka_bootstrap, {f"zero-{unique}": 0})


def test_ensure_topics__no_broker_is_broker_unavailable(unique: str) -> None:
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable):
        ensure_topics(f"127.0.0.1:{free_port()}", {f"x-{unique}": 1}, timeout_s=1)
    assert time.monotonic() - started < 5


def test_ensure_topics__librdkafkas_own_timeout_says_what_the_deadline_says() -> None:
    """The request timeout inside librdkafka and the wait's deadline are the same length: the
    futures may resolve with a local timeout just before the wait gives up (a CI flake gave
    "Failed while waiting for controller: Local: Timed out"). Either way: one line, the same."""
    late = "Kafka at 127.0.0.1:1 did not create topics within 10 s"
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
    with pytest.raises(BrokerUnavailable) as info:
        _raise_for("127.0.0.1:1", "stoker.status", future, late)
    assert str(info.value) == late
    exists: concurrent.futures.Future[None] = concurrent.futures.Future()
    exists.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
    _raise_for("127.0.0.1:1", "stoker.status", exists, late)  # success


def test_configs__embedded_defaults_and_overrides() -> None:
    c = consumer_config("b:9092", "g", embedded=True, **{"session.timeout.ms": 6000})
    assert c["group.id"] == "g"
    assert c["enable.auto.commit"] is False
    assert c["auto.offset.reset"] == "earliest"
    assert c["session.timeout.ms"] == 6000
    assert c["fetch.wait.max.ms"] == 10
    assert "group.protocol" not in c
    prod = consumer_config("b:9092", "g", embedded=False)
    assert "session.timeout.ms" not in prod
    assert "fetch.wait.max.ms" not in prod
    p = producer_config("b:9092", embedded=True, **{"linger.ms": 5})
    assert p == {"bootstrap.servers": "b:9092", "linger.ms": 5, "logger": KAFKA_LOG}
    assert c["logger"] is KAFKA_LOG and admin_config("b:9092")["logger"] is KAFKA_LOG


def test_round_trip__100_messages_produced_are_consumed(kafka_bootstrap: str, unique: str) -> None:
    topic = f"rt-{unique}"
    ensure_topics(kafka_bootstrap, {topic: 3})
    producer = Producer(producer_config(kafka_bootstrap, embedded=True))
    sent = {f"m{i}".encode() for i in range(100)}
    for value in sent:
        producer.produce(topic, key=value, value=value)
    assert producer.flush(10) == 0

    consumer = Consumer(consumer_config(kafka_bootstrap, f"g-{unique}", embedded=True))
    consumer.subscribe([topic])
    got: set[bytes] = set()
    deadline = time.monotonic() + 30
    try:
        while got != sent and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                assert msg.error() is None, msg.error()
                payload = msg.value()
                assert payload is not None
                got.add(payload)
    finally:
        consumer.close()
    assert got == sent
