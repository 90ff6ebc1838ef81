"""The worker contract: a Handler applies one decoded batch idempotently; the Worker does the rest.

A handler sees each batch once per delivery, and a batch may be delivered again (a crash after
apply and before the offset commit, a rebalance, a retry after an outage), so `apply` must be
idempotent. It raises schemas.errors.RetriableError (CacheUnavailable, ...) when a dependency
is down: the worker then commits nothing, backs off and re-reads the same offsets.

Two levels, pick one:
- `apply(events)`: the common case. The worker decodes with schemas.codec.decode_many, sends
  poison to the dead-letter topic and hands over the good events in offset order.
- `decode_batch(messages)` + `apply_decoded(decoded)`: for handlers that need offsets
  (exactly-once accounting against a watermark) or a faster decoder than pydantic (traffic).
  Messages are confluent_kafka.Message objects (tests build them with its constructor).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from schemas.codec import decode_many
from schemas.errors import EventDecodeError
from schemas.events import Event


@dataclass(frozen=True, slots=True)
class Poison:
    """A message that is not a valid event, and why (for the dead-letter headers)."""

    message: Message
    error: EventDecodeError


@dataclass(slots=True)
class Decoded:
    """A decoded batch: good items in offset order, each with its message, and the poison."""

    items: list[Any] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    poison: list[Poison] = field(default_factory=list)
    # Handler-defined counts for metrics (the traffic worker: cache outcome -> requests).
    tally: dict[str, int] = field(default_factory=dict)
    # Good events, when items hold a per-batch aggregate instead of one item per event (the
    # traffic worker counts while it decodes); None: one item per event.
    aggregated: int | None = None

    @property
    def good(self) -> int:
        """Good events in the batch: what the worker applies and counts."""
        return len(self.items) if self.aggregated is None else self.aggregated


def message_value(msg: Message) -> bytes:
    # A tombstone (None) is not an event; b"" makes decode_event name it bad_json.
    value = msg.value()
    return value if isinstance(value, bytes) else b""


class Handler(ABC):
    """Applies batches of one or more logical topics (names from streams.topics.TOPICS)."""

    name: str
    topics: list[str]
    # True: the worker applies batch N in a background thread while it decodes batch N+1
    # (decode_batch and apply_decoded must then not share unsynchronised state).
    pipelined: bool = False
    # Messages per batch unless StokerSettings.worker_batch_size says otherwise.
    batch_size: int = 20_000

    def apply(self, events: list[Event]) -> None:
        """Apply good events in offset order, idempotently; RetriableError if a dependency is down.

        Override this, or apply_decoded for handlers that decode batches themselves."""
        raise NotImplementedError(f"the {self.name} handler applies decoded batches only")

    def decode_batch(self, messages: Sequence[Message]) -> Decoded:
        """Split a batch into events and poison; override for a faster decoder."""
        out = Decoded()
        results = decode_many([message_value(m) for m in messages])
        for msg, result in zip(messages, results, strict=True):
            if isinstance(result, EventDecodeError):
                out.poison.append(Poison(msg, result))
            else:
                out.items.append(result)
                out.messages.append(msg)
        return out

    def apply_decoded(self, decoded: Decoded) -> None:
        """Apply what decode_batch returned; the default hands the events to `apply`."""
        self.apply(decoded.items)

    def settled(self, decoded: Decoded) -> None:
        """Called once the batch's offsets are committed (metrics); must not raise."""
        return None

    def close(self) -> None:
        """Release clients; called once when the worker stops."""
        return None
