"""Helpers for the stream tests: RequestLogged payloads, producing, and reading a topic."""

from __future__ import annotations

import time
from typing import Any

import orjson
from confluent_kafka import Consumer, Message, Producer

from streams.topics import consumer_config, producer_config
from tests.waiting import wait_for  # noqa: F401  (the stream tests import it from here)


def request(i: int = 0, **fields: Any) -> dict[str, Any]:
    """A valid RequestLogged as the gateway would send it; fields override."""
    base: dict[str, Any] = {
        "type": "request_logged",
        "schema_version": 1,
        "event_id": f"e{i}",
        "ts": "2025-03-03T10:15:00Z",  # a Monday: hour of week 10
        "request_id": f"r{i}",
        "tenant": "acme",
        "model_id": "llama",
        "model_version": "v1",
        "template_version": "t1",
        "prompt": f"question {i % 7}",
        "params": {"temperature": 0.0},
        "context_docs": [{"doc_id": "kb-1", "version": 2}],
        "cache_outcome": "miss",
        "latency_ms": 120.0,
        "gpu_ms": 100.0,
        "tokens_in": 10,
        "tokens_out": 20,
    }
    base.update(fields)
    return base


def encode(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj)


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
