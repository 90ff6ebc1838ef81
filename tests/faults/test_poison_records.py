"""Poison records of every size up to 10 MB: dead-lettered (truncated when too big to copy
whole), their offsets committed, the records behind them applied; never a dead worker."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import redis
from confluent_kafka import Message, Producer

from schemas.errors import ConfigError, EventDecodeError
from schemas.events import Event, RequestLogged
from streams.base import Handler, Poison
from streams.deadletter import TRUNCATED_VALUE_BYTES, DeadLetters
from streams.topics import ensure_topics, producer_config
from streams.worker import WorkerConfig
from tests.cli import running_stoker, stop
from tests.events import encode, request
from tests.faults.faults_helpers import (
    committed,
    dead_letters,
    done_after,
    headers,
    produce_raw,
    run_worker,
)
from tests.waiting import wait_for
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile
from warmers.traffic.worker import TrafficHandler

ROOT = Path(__file__).resolve().parents[2]
# Around every limit on the way: librdkafka's message.max.bytes (1,000,000), Kafka's default
# max.message.bytes (1,048,588) and decode_event's 1 MiB, then far past them.
SIZES = (900_000, 1_010_000, 1_048_589, 1_200_000, 5_000_000, 10 * 1024 * 1024)


class Recorder(Handler):
    """A handler on the worker's default decode path (decode_many), recording what it applies."""

    name = "recorder"
    topics = ["inference.requests"]  # noqa: RUF012

    def __init__(self) -> None:
        self.applied: list[str] = []

    def apply(self, events: list[Event]) -> None:
        self.applied += [e.request_id for e in events if isinstance(e, RequestLogged)]


def _garbage(size: int) -> bytes:
    return os.urandom(size)


@pytest.mark.parametrize("kind", ["traffic", "plain"])
def test_worker__poison_of_every_size_up_to_10mb_is_dead_lettered_and_committed(
    kind: str, kafka_bootstrap: str, redis_client: redis.Redis, unique: str
) -> None:
    prefix = f"p{unique}."
    topic, dlq = f"{prefix}inference.requests", f"{prefix}stoker.dlq"
    ensure_topics(kafka_bootstrap, {topic: 1})
    poison = [_garbage(n) for n in SIZES]
    records = [(encode(request(0)), None), *((v, None) for v in poison), (encode(request(1)), None)]
    produce_raw(kafka_bootstrap, topic, records)
    handler: Handler = (
        TrafficHandler(TrafficProfile(redis_client)) if kind == "traffic" else Recorder()
    )
    cfg = WorkerConfig(
        bootstrap=kafka_bootstrap,
        group_id=f"g{unique}",
        embedded=True,
        topic_prefix=prefix,
        batch_size=3,
    )  # fmt: skip  (several batches: poison in each)
    worker = run_worker(handler, cfg, done_after(events=2, dlq=len(SIZES)))

    assert worker.stats.retries == 0  # nothing to retry: no record blocks the partition
    assert committed(kafka_bootstrap, cfg.group_id, topic) == len(records)
    by_offset = {
        int(headers(m)["dlq.offset"]): m for m in dead_letters(kafka_bootstrap, dlq, len(SIZES))
    }
    assert sorted(by_offset) == list(range(1, len(SIZES) + 1))
    for offset, original in enumerate(poison, start=1):
        msg, h = by_offset[offset], headers(by_offset[offset])
        assert h["dlq.topic"] == topic.encode() and h["dlq.partition"] == b"0"
        assert h["dlq.size"] == str(len(original)).encode()
        assert h["dlq.sha256"] == hashlib.sha256(original).hexdigest().encode()
        assert h["dlq.reason"] in (b"too_large", b"bad_json")
        if len(original) <= 900_000:  # fits a default broker whole
            assert h["dlq.copy"] == b"whole" and msg.value() == original
        else:
            assert h["dlq.copy"] == b"truncated"
            assert msg.value() == original[:TRUNCATED_VALUE_BYTES]
    if isinstance(handler, Recorder):
        assert handler.applied == ["r0", "r1"]
    else:
        p = TrafficProfile(redis_client)
        assert (
            sum(s.count for s in p.top_queries("acme", "llama", "t1", range(HOURS_PER_WEEK), 10))
            == 2
        )


def test_worker__oversized_headers_are_left_out_of_the_dead_letter(
    kafka_bootstrap: str, unique: str
) -> None:
    """Headers count toward a record's size: 1.5 MB of them must not make the copy fatal."""
    prefix = f"h{unique}."
    topic, dlq = f"{prefix}inference.requests", f"{prefix}stoker.dlq"
    ensure_topics(kafka_bootstrap, {topic: 1})
    fat = [("trace", os.urandom(750_000)), ("baggage", os.urandom(750_000))]
    produce_raw(kafka_bootstrap, topic, [(b"{nope", fat), (encode(request(7)), [("ok", b"1")])])
    recorder = Recorder()
    cfg = WorkerConfig(
        bootstrap=kafka_bootstrap, group_id=f"g{unique}", embedded=True, topic_prefix=prefix
    )
    run_worker(recorder, cfg, done_after(events=1, dlq=1))
    [letter] = dead_letters(kafka_bootstrap, dlq, 1)
    h = headers(letter)
    assert h["dlq.copy"] == b"truncated" and h["dlq.reason"] == b"bad_json"
    assert "trace" not in h and "baggage" not in h and letter.value() == b"{nope"
    assert recorder.applied == ["r7"]


def test_dead_letters__a_copy_the_client_refuses_goes_as_a_stub(
    kafka_bootstrap: str, unique: str
) -> None:
    """A copy refused as a record (here by librdkafka's size check, as a broker with a lower
    max.message.bytes refuses it) is sent again without its value: the offset can move on."""
    topic = f"s{unique}.stoker.dlq"
    ensure_topics(kafka_bootstrap, {topic: 1})
    small = Producer(
        producer_config(kafka_bootstrap, embedded=True, **{"message.max.bytes": 200_000})
    )
    letters = DeadLetters(small, topic, "test", max_record_bytes=1_000_000)
    value = os.urandom(500_000)  # fits the whole-copy bound, not this producer
    msg = Message(topic="inference.requests", partition=2, offset=41, value=value, key=b"k")
    letters.write([Poison(msg, EventDecodeError("bad_json", "garbage"))])
    assert letters.copies == {"whole": 0, "truncated": 0, "stub": 1}
    [stub] = dead_letters(kafka_bootstrap, topic, 1)
    h = headers(stub)
    assert not stub.value() and h["dlq.copy"] == b"stub" and h["dlq.offset"] == b"41"
    assert h["dlq.sha256"] == hashlib.sha256(value).hexdigest().encode()


def test_dead_letters__a_topic_that_takes_not_even_a_stub_is_a_config_error(
    kafka_bootstrap: str, unique: str
) -> None:
    """A dead-letter topic that refuses every copy (its limit under the dlq.* headers, or
    ACLs) cannot be retried past: one clear ConfigError naming the topic, not a retry loop
    and not an untranslated KafkaException."""
    topic = f"n{unique}.stoker.dlq"
    ensure_topics(kafka_bootstrap, {topic: 1})
    tiny = Producer(producer_config(kafka_bootstrap, embedded=True, **{"message.max.bytes": 1000}))
    letters = DeadLetters(tiny, topic, "test")
    msg = Message(topic="inference.requests", partition=0, offset=7, value=b"{nope", key=b"k")
    with pytest.raises(ConfigError, match=f"the dead-letter topic {topic} refuses even a stub"):
        letters.write([Poison(msg, EventDecodeError("bad_json", "x" * 4096))])
    assert letters.copies == {"whole": 0, "truncated": 0, "stub": 0}


def test_worker_cli__a_1mb_garbage_record_is_dead_lettered_not_fatal(
    kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, unique: str
) -> None:
    """The issue's reproduction: 1,010,000 bytes of garbage, then `stoker worker traffic`.
    It died with MSG_SIZE_TOO_LARGE on every restart; now it moves on and exits 0 on SIGTERM."""
    prefix = f"c{unique}."
    topic = f"{prefix}inference.requests"
    ensure_topics(kafka_bootstrap, {topic: 1})
    produce_raw(kafka_bootstrap, topic, [(_garbage(1_010_000), None), (encode(request(3)), None)])
    env = {"STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap, "STOKER_REDIS_URL": redis_url,
           "STOKER_KAFKA_BROKER": "tansu", "STOKER_TOPIC_PREFIX": prefix,
           # the event is dated 2025-03-03: past the default one-year horizon
           "STOKER_TRAFFIC_MAX_EVENT_AGE_S": str(20 * 365 * 86_400)}  # fmt: skip
    with running_stoker("worker", "traffic", env=env) as (proc, lines):
        profile = TrafficProfile(redis_client)

        def counted() -> bool:
            assert proc.poll() is None, "".join(lines)
            return bool(profile.top_queries("acme", "llama", "t1", range(HOURS_PER_WEEK), 1))

        wait_for(counted, 90, "the event behind the poison to be counted")
        code = stop(proc, 30)
    text = "".join(lines)
    assert code == 0, text
    assert "MSG_SIZE_TOO_LARGE" not in text
    # why, and which record: in the log when it happened, and in the shutdown report
    flat = " ".join(text.split())
    said = f"the last: {topic}[0]@0: bad_json: str is not valid UTF-8"
    assert f"worker traffic: 1 record(s) to {prefix}stoker.dlq; {said}" in flat, text
    assert f"worker traffic: 1 events, 1 dead-lettered (1 bad_json; {said}" in flat, text
    assert committed(kafka_bootstrap, f"{prefix}stoker.traffic", topic) == 2
