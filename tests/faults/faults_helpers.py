"""Helpers for the fault suite: a producer that can send what a hostile producer sends, a
worker run until a condition, and a reader of the dead-letter topic."""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from streams.base import Handler
from streams.topics import consumer_config, producer_config
from streams.worker import Worker, WorkerConfig, WorkerStats
from tests.streams.conftest import read_topic

# Up to 10 MB (and a little room for a key and headers): what a hostile producer's client may
# send when its broker takes it (Tansu does; Kafka's default broker limit is ~1 MB).
BIG = 11 * 1024 * 1024
TIMEOUT_S = 90


def produce_raw(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, list[tuple[str, bytes]] | None]],
) -> None:
    """Each (value, headers) in order to partition 0, as is: no encoding, any size up to BIG."""
    p = Producer(producer_config(bootstrap, embedded=True, **{"message.max.bytes": BIG}))
    for i, (value, headers) in enumerate(records):
        p.produce(topic, value=value, key=f"k{i}".encode(), headers=headers, partition=0)
        p.poll(0)
    assert p.flush(60) == 0


def run_worker(handler: Handler, config: WorkerConfig, until: Any) -> Worker:
    """Run a worker in a thread until `until(stats)` holds (bounded); it must not die."""
    worker = Worker(handler, config)
    result: list[bool] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            result.append(worker.run_until(until, TIMEOUT_S))
        except BaseException as exc:  # the failure this suite looks for: reported, not hidden
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(TIMEOUT_S + 30)
    assert not thread.is_alive(), "the worker did not stop"
    assert not errors, f"the worker died: {errors[0]!r}"
    assert result == [True], f"timed out: {worker.stats}"
    return worker


def dead_letters(bootstrap: str, topic: str, n: int) -> list[Message]:
    got = read_topic(bootstrap, topic, n, timeout_s=TIMEOUT_S)
    assert len(got) == n, f"{len(got)} dead letters, expected {n}"
    return got


def headers(msg: Message) -> dict[str, bytes]:
    return {k: v for k, v in (msg.headers() or []) if v is not None}


def committed(bootstrap: str, group: str, topic: str, partition: int = 0) -> int:
    c = Consumer(consumer_config(bootstrap, group, embedded=True))
    try:
        [tp] = c.committed([TopicPartition(topic, partition)], timeout=10)
    finally:
        c.close()
    return int(tp.offset)


def done_after(events: int, dlq: int) -> Any:
    def until(s: WorkerStats) -> bool:
        return s.events >= events and s.dlq >= dlq

    return until
