"""Publishing events to Kafka for the CLI verbs and for job status (stoker.status)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from schemas.codec import encode_event
from schemas.errors import BrokerUnavailable, ConfigError
from schemas.events import BaseEvent
from streams.topics import TOPICS, ensure_topics, producer_config, topic_name

# A publish is done when the broker acknowledged it; 10 s bounds a CLI call against a broker
# that is down (a healthy flush takes ~2 ms on the embedded broker).
FLUSH_TIMEOUT_S = 10.0


class EventPublisher:
    """Produces events to logical topics and waits for the acknowledgements on flush()."""

    def __init__(
        self,
        bootstrap: str | None,
        *,
        topic_prefix: str = "",
        embedded: bool = False,
        create_topics: bool = True,
    ) -> None:
        if not bootstrap:
            raise ConfigError(
                "no Kafka: set STOKER_KAFKA_BOOTSTRAP=host:port or --kafka-bootstrap (the broker "
                "the stoker workers read), or run this beside `stoker worker all` or `stoker "
                "gateway`, which start an embedded stack when nothing is configured"
            )
        self._bootstrap = bootstrap
        self._prefix = topic_prefix
        self._create = create_topics
        self._created: set[str] = set()
        self._producer = Producer(producer_config(self._bootstrap, embedded=embedded))
        self._errors: list[str] = []

    def publish(self, logical: str, event: BaseEvent, key: str | None = None) -> None:
        name = topic_name(logical, self._prefix)
        if self._create and name not in self._created:
            # Explicit creation: Tansu would auto-create it with the wrong partition count.
            ensure_topics(self._bootstrap, {name: TOPICS[logical]})
            self._created.add(name)
        self._producer.produce(
            name,
            encode_event(event),
            key=key.encode() if key is not None else None,
            on_delivery=self._on_delivery,
        )
        self._producer.poll(0)

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._errors.append(err.str())

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        left = self._producer.flush(timeout_s)
        if left:
            raise BrokerUnavailable(
                f"{left} event(s) not acknowledged by Kafka at {self._bootstrap} in {timeout_s} s"
            )
        if self._errors:
            errors, self._errors = self._errors, []
            raise BrokerUnavailable(f"Kafka refused event(s): {'; '.join(errors)}")

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._producer.flush(FLUSH_TIMEOUT_S)
