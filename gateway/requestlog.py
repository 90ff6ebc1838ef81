"""The request log: every answered request to inference.requests as RequestLogged v2, never
blocking a response.

`offer` appends the event (a plain dict, already in the v2 shape) to a bounded buffer and
returns; a background thread encodes and produces them. A full buffer, or a producer queue
that refuses one, drops the event and counts it (stoker_gateway_log_events{result="dropped"}):
the log is for learning, and no answer waits for it. Without a broker (STOKER_KAFKA_BOOTSTRAP
unset) NullLog says so once and counts what it did not publish.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Protocol

import orjson
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from gateway import metrics as M

log = logging.getLogger(__name__)

# How long the drain thread waits for events before it polls the producer's callbacks.
_WAIT_S = 0.05


class RequestLog(Protocol):
    def offer(self, event: dict[str, Any]) -> bool: ...

    def close(self, timeout_s: float = 10.0) -> None: ...


class NullLog:
    """Publishes nowhere: a gateway without Kafka still serves."""

    def __init__(self) -> None:
        self.unpublished = 0
        self._said = False

    def offer(self, event: dict[str, Any]) -> bool:
        if not self._said:
            self._said = True
            log.warning(
                "no STOKER_KAFKA_BOOTSTRAP: the request log is published nowhere, so no worker "
                "learns from this gateway (counted in stoker_gateway_log_events)"
            )
        self.unpublished += 1
        M.logged("unpublished")
        return False

    def close(self, timeout_s: float = 10.0) -> None:
        return None


class KafkaLog:
    """offer() from the event loop; encode + produce on one thread; close() flushes."""

    def __init__(self, producer: Producer, topic: str, capacity: int = 10_000) -> None:
        self._producer: Producer | None = producer
        self._topic = topic
        self._capacity = capacity
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.published = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._drain, name="gateway-log", daemon=True)
        self._thread.start()

    def offer(self, event: dict[str, Any]) -> bool:
        if len(self._queue) >= self._capacity:
            self.dropped += 1
            M.logged("dropped")
            return False
        self._queue.append(event)
        self._ready.set()
        return True

    def _drain(self) -> None:
        while not (self._stop.is_set() and not self._queue):
            self._ready.wait(_WAIT_S)
            self._ready.clear()
            while self._queue:
                self._produce(self._queue.popleft())
            if self._producer is not None:
                self._producer.poll(0)

    def _produce(self, event: dict[str, Any]) -> None:
        assert self._producer is not None  # the drain thread ends before close() drops it
        try:
            self._producer.produce(
                self._topic,
                orjson.dumps(event),
                key=str(event["tenant"]).encode(),
                on_delivery=self._delivered,
            )
        except (BufferError, KafkaException) as e:  # the producer's queue is full, or refused
            self.dropped += 1
            M.logged("dropped")
            log.debug("request log event dropped: %s", e)

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.published += 1
            M.logged("published")
        else:
            self.dropped += 1
            M.logged("dropped")

    def close(self, timeout_s: float = 10.0) -> None:
        """Drain the buffer and flush the producer (bounded); what is left counts as dropped."""
        self._stop.set()
        self._ready.set()
        self._thread.join(timeout_s)
        producer, self._producer = self._producer, None
        if producer is None:
            return
        left = producer.flush(timeout_s)
        if left:
            self.dropped += left
            M.logged("dropped", left)
        del producer  # its broker threads end with it, not at interpreter exit
