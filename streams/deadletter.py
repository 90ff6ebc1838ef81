"""Dead letters: every record a handler refuses reaches stoker.dlq, and none can stop a worker.

A poison record once stopped a worker for good: a 1,010,000-byte record of garbage made the
dead-letter produce fail (librdkafka's message.max.bytes is 1,000,000), the exception escaped
untranslated, and every restart died at the same offset. Now each record goes out as one of
three copies, tried in order, and its offset is committed once one landed:
1. whole: value, key and original headers as read, plus the dlq.* headers, when the copy fits
   `max_record_bytes` (default 1,000,000: what librdkafka sends by default, and under Kafka's
   default max.message.bytes of 1,048,588);
2. truncated: the first 64 KiB of the value, the key up to 4 KiB, the original headers only if
   they total 16 KiB or less; dlq.copy=truncated;
3. stub: no value, no original headers; sent when the client or the broker refuses a copy as a
   record (too large, invalid, a policy); dlq.copy=stub.
Every copy carries dlq.reason, dlq.detail, dlq.topic, dlq.partition, dlq.offset, dlq.handler,
dlq.size (the original value's bytes) and dlq.sha256 (of the whole original value), so a
truncated record can still be matched with the one it stands for.
A stub refused too, or an authorization error, is a ConfigError (the topic takes nothing, and
retrying cannot help); any other failure is a BrokerUnavailable: the worker commits nothing and
re-reads the batch.

The settings that could make one record fatal, audited (tests/faults/test_poison_records.py):
- producer message.max.bytes: raised to the largest copy plus PRODUCER_HEADROOM_BYTES, so no
  copy this module builds is refused by the client; a broker or topic with a lower limit
  refuses it as a record, and the stub goes instead;
- header size: headers count toward a record's size; a copy keeps original headers only when
  they fit (1.5 MB of them is tested), and dlq.detail is cut at 4 KiB;
- compression: the dead-letter producer sends uncompressed (librdkafka's default), so the size
  checked here is the size sent (a compressed original is decompressed by the consumer, so
  its dlq.size is the uncompressed value's);
- consumer fetch sizes: max.partition.fetch.bytes and fetch.max.bytes are soft (a first
  record larger than either is still returned, KIP-74), and receive.message.max.bytes
  (100 MB) is above any record a broker with Kafka's limits stores: a 10 MB record is read.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from schemas.errors import BrokerUnavailable, ConfigError
from streams.base import Poison

# What `max_record_bytes` defaults to; see the module docstring.
DEFAULT_MAX_RECORD_BYTES: Final = 1_000_000
# Room the producer needs above the largest record: the batch and record framing (~100 bytes)
# and the dlq.* headers (up to ~4.5 KB: the detail is cut at 4 KiB).
PRODUCER_HEADROOM_BYTES: Final = 65_536
# A truncated copy keeps enough of the value to see what the producer sent (the digest names
# the whole), a key that still says where it came from, and small original headers.
TRUNCATED_VALUE_BYTES: Final = 65_536
TRUNCATED_KEY_BYTES: Final = 4_096
TRUNCATED_HEADERS_BYTES: Final = 16_384
_DETAIL_BYTES: Final = 4_096
# Refusals of one record that another, smaller copy of it can get past.
_RECORD_ERRORS: Final = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.POLICY_VIOLATION,
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        KafkaError._BAD_MSG,
        KafkaError._INVALID_ARG,
    }
)
# Refusals of the topic itself: no copy gets through until an operator acts.
_TOPIC_ERRORS: Final = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
    }
)

Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class DeadLetter:
    """One copy of a refused record, ready to produce."""

    value: bytes | None  # None: the original was a tombstone, copied whole
    key: bytes | None
    headers: Headers
    copy: str  # "whole", "truncated" or "stub"


class DeadLetters:
    """Writes the poison of a batch to the dead-letter topic; returns once every record landed."""

    def __init__(
        self,
        producer: Producer,
        topic: str,
        handler_name: str,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        flush_s: float = 10.0,
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.handler_name = handler_name
        self.max_record_bytes = max_record_bytes
        self.flush_s = flush_s
        self.copies: dict[str, int] = {"whole": 0, "truncated": 0, "stub": 0}  # landed, by kind

    def write(self, poison: Sequence[Poison]) -> None:
        """1-3 of the module docstring; raises BrokerUnavailable (retry) or ConfigError."""
        letters = [self.letter(p) for p in poison]
        refused = self._send(letters)
        if refused:
            stubs = [self.stub(poison[i]) for i in refused]
            again = self._send(stubs)
            if again:
                raise ConfigError(
                    f"the dead-letter topic {self.topic} refuses even a stub of "
                    f"{len(again)} record(s); fix the topic (size limit, ACLs) and restart"
                )

    def letter(self, p: Poison) -> DeadLetter:
        """The whole copy if it fits, else the truncated one."""
        value, key, original = _parts(p.message)
        headers = original + self._dlq_headers(p, value, "whole")
        size = len(value) + len(key or b"") + _headers_bytes(headers)
        if size <= self.max_record_bytes:
            raw = p.message.value()
            return DeadLetter(value if raw is not None else None, key, headers, "whole")
        kept = original if _headers_bytes(original) <= TRUNCATED_HEADERS_BYTES else []
        headers = kept + self._dlq_headers(p, value, "truncated")
        short_key = None if key is None else key[:TRUNCATED_KEY_BYTES]
        return DeadLetter(value[:TRUNCATED_VALUE_BYTES], short_key, headers, "truncated")

    def stub(self, p: Poison) -> DeadLetter:
        value, key, _ = _parts(p.message)
        short_key = None if key is None else key[:TRUNCATED_KEY_BYTES]
        return DeadLetter(b"", short_key, self._dlq_headers(p, value, "stub"), "stub")

    def _dlq_headers(self, p: Poison, value: bytes, copy: str) -> Headers:
        msg = p.message
        return [
            ("dlq.reason", p.error.reason.encode()),
            ("dlq.detail", p.error.detail.encode()[:_DETAIL_BYTES]),
            ("dlq.topic", (msg.topic() or "").encode()),
            ("dlq.partition", str(msg.partition()).encode()),
            ("dlq.offset", str(msg.offset()).encode()),
            ("dlq.handler", self.handler_name.encode()),
            ("dlq.size", str(len(value)).encode()),
            ("dlq.sha256", hashlib.sha256(value).hexdigest().encode()),
            ("dlq.copy", copy.encode()),
        ]

    def _send(self, letters: Sequence[DeadLetter]) -> list[int]:
        """Produce and flush; the indexes of letters refused as records (3 of the docstring)."""
        errors: dict[int, KafkaError] = {}
        for i, d in enumerate(letters):
            try:
                self._produce(i, d, errors)
            except KafkaException as exc:  # refused before it left: librdkafka's own checks
                errors[i] = exc.args[0]
        left = self.producer.flush(self.flush_s)
        if left:
            raise BrokerUnavailable(f"dead-letter topic {self.topic}: {left} undelivered")
        topic_refusals = [e for e in errors.values() if e.code() in _TOPIC_ERRORS]
        if topic_refusals:
            raise ConfigError(f"dead-letter topic {self.topic}: {topic_refusals[0].str()}")
        others = [e.str() for e in errors.values() if e.code() not in _RECORD_ERRORS]
        if others:
            raise BrokerUnavailable(f"dead-letter topic {self.topic}: errors {others[:3]}")
        for i, d in enumerate(letters):
            if i not in errors:
                self.copies[d.copy] += 1
        return sorted(errors)

    def _produce(self, i: int, d: DeadLetter, errors: dict[int, KafkaError]) -> None:
        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors[i] = err

        deadline = time.monotonic() + self.flush_s
        while True:
            try:
                self.producer.produce(
                    self.topic, value=d.value, key=d.key, headers=d.headers, on_delivery=on_delivery
                )
                return
            except BufferError:  # the local queue is full: let it drain, within flush_s
                if time.monotonic() > deadline:
                    raise BrokerUnavailable(f"dead-letter topic {self.topic}: queue full") from None
                self.producer.poll(0.05)


def producer_limit(max_record_bytes: int) -> int:
    """The dead-letter producer's message.max.bytes: the largest copy plus its framing."""
    return max(DEFAULT_MAX_RECORD_BYTES, max_record_bytes) + PRODUCER_HEADROOM_BYTES


def _parts(msg: Message) -> tuple[bytes, bytes | None, Headers]:
    """(value, key, original headers) of a record; a tombstone's value as b"" (its digest)."""
    raw = msg.value()
    value = raw if isinstance(raw, bytes) else b"" if raw is None else str(raw).encode()
    k = msg.key()
    key = k if isinstance(k, bytes) or k is None else str(k).encode()
    given = msg.headers() or []
    return value, key, list(given.items()) if isinstance(given, dict) else list(given)


def _headers_bytes(headers: Headers) -> int:
    total = 0
    for name, v in headers:
        total += len(name.encode()) + (0 if v is None else len(v))
    return total
