"""Helpers for the stream tests: producing and reading a topic (payloads: tests/events.py)."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, Message, Producer

from streams.topics import consumer_config, producer_config
from tests.events import encode, request  # noqa: F401  (the stream tests import them from here)
from tests.waiting import wait_for  # noqa: F401  (the stream tests import it from here)


def produce(
    bootstrap: str,
    topic: str,
    values: list[bytes],
    headers: list[tuple[str, bytes]] | None = None,
    partition: int | None = None,
) -> None:
    p = Producer(producer_config(bootstrap, embedded=True, **{"linger.ms": 2}))
    for i, v in enumerate(values):
        kwargs: dict[str, Any] = {"key": str(i).encode(), "headers": headers}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                p.produce(topic, value=v, **kwargs)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0


def read_topic(bootstrap: str, topic: str, n: int, timeout_s: float = 30) -> list[Message]:
    """Read n messages from the start of topic (bounded), with a throwaway group."""
    c = Consumer(consumer_config(bootstrap, f"reader-{time.monotonic_ns()}", embedded=True))
    c.subscribe([topic])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < n and time.monotonic() < deadline:
            out += [m for m in c.consume(num_messages=1000, timeout=0.25) if m.error() is None]
    finally:
        c.close()
    return out
