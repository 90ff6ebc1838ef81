"""The worker loop on the embedded broker: dead letters, retries, stop, commits, scale-out."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from schemas.errors import CacheUnavailable
from schemas.events import Event, RequestLogged
from stoker.settings import StokerSettings
from stoker.wiring import worker_config
from streams.base import Handler
from streams.topics import consumer_config, ensure_topics
from streams.worker import Worker
from tests.streams.conftest import encode, produce, read_topic, request, wait_for
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile
from warmers.traffic.worker import TrafficHandler

TIMEOUT_S = 60


class Recorder(Handler):
    """Records what it applies; fails the first `failures` batches with CacheUnavailable."""

    name = "recorder"
    topics = ["inference.requests"]  # noqa: RUF012

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.applied: list[str] = []
        self.calls = 0

    def apply(self, events: list[Event]) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise CacheUnavailable("redis is down (test)")
        self.applied += [e.request_id for e in events if isinstance(e, RequestLogged)]


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique: str) -> StokerSettings:
    return StokerSettings(
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        kafka_broker="tansu",
        topic_prefix=f"w{unique}.",
        worker_batch_size=200,
        worker_backoff_base_s=0.01,
        worker_backoff_max_s=0.05,
    )


def _topic(s: StokerSettings) -> str:
    return f"{s.topic_prefix}inference.requests"


def _committed(s: StokerSettings, group: str, partitions: int) -> dict[int, int]:
    c = Consumer(consumer_config(s.kafka_bootstrap or "", group, embedded=True))
    try:
        tps = [TopicPartition(_topic(s), p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in c.committed(tps, timeout=10)}
    finally:
        c.close()


def test_worker__poison_goes_to_dlq_with_reason_and_worker_goes_on(
    settings: StokerSettings,
) -> None:
    ensure_topics(settings.kafka_bootstrap or "", {_topic(settings): 1})
    values = [encode(request(0)), b"not json", encode(request(1, tenant="")), encode(request(2))]
    produce(settings.kafka_bootstrap or "", _topic(settings), values, headers=[("trace", b"t-1")])
    handler = Recorder()
    worker = Worker(handler, worker_config(settings, handler))
    assert worker.run_until(lambda s: s.events + s.dlq >= 4, TIMEOUT_S)
    assert handler.applied == ["r0", "r2"]
    dead = read_topic(settings.kafka_bootstrap or "", worker.dlq_topic, 2)
    assert [m.value() for m in dead] == [values[1], values[2]]
    headers = [dict(m.headers() or []) for m in dead]
    assert [h["dlq.reason"] for h in headers] == [b"bad_json", b"invalid_fields"]
    assert [h["dlq.offset"] for h in headers] == [b"1", b"2"]
    assert all(h["trace"] == b"t-1" for h in headers)  # the original headers are kept
    assert all(h["dlq.topic"] == _topic(settings).encode() for h in headers)
    assert b"tenant" in headers[1]["dlq.detail"]
    assert _committed(settings, worker.config.group_id, 1) == {0: 4}


def test_worker__retriable_error_commits_nothing_and_retries_same_batch(
    settings: StokerSettings,
) -> None:
    ensure_topics(settings.kafka_bootstrap or "", {_topic(settings): 2})
    produce(
        settings.kafka_bootstrap or "", _topic(settings), [encode(request(i)) for i in range(500)]
    )
    handler = Recorder(failures=3)
    worker = Worker(handler, worker_config(settings, handler))
    assert worker.run_until(lambda s: len(set(handler.applied)) >= 500, TIMEOUT_S)
    assert worker.stats.retries == 3
    assert set(handler.applied) == {f"r{i}" for i in range(500)}  # nothing skipped
    assert sum(_committed(settings, worker.config.group_id, 2).values()) == 500


def test_worker__stop_from_another_thread_finishes_and_leaves(settings: StokerSettings) -> None:
    ensure_topics(settings.kafka_bootstrap or "", {_topic(settings): 1})
    produce(
        settings.kafka_bootstrap or "", _topic(settings), [encode(request(i)) for i in range(50)]
    )
    handler = Recorder()
    worker = Worker(handler, worker_config(settings, handler))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: len(handler.applied) == 50, TIMEOUT_S, "50 events applied")
    finally:
        worker.stop()
        thread.join(TIMEOUT_S)
    assert not thread.is_alive()
    assert _committed(settings, worker.config.group_id, 1) == {0: 50}


def _profile_total(r: redis.Redis, tenants: list[str]) -> int:
    p = TrafficProfile(r)
    return sum(
        s.count
        for t in tenants
        for s in p.top_queries(t, "llama", "t1", range(HOURS_PER_WEEK), 100_000)
    )


@pytest.fixture
def workers() -> Iterator[list[tuple[Worker, threading.Thread]]]:
    """Worker threads started by a test; all stopped and joined when it ends."""
    running: list[tuple[Worker, threading.Thread]] = []
    yield running
    for w, _ in running:
        w.stop()
    for _, t in running:
        t.join(TIMEOUT_S)
    assert not any(t.is_alive() for _, t in running)


def _traffic_worker(s: StokerSettings) -> Worker:
    handler = TrafficHandler(TrafficProfile(redis.Redis.from_url(s.redis_url or "")))
    return Worker(handler, worker_config(s, handler))


def _start(worker: Worker, running: list[tuple[Worker, threading.Thread]]) -> Worker:
    t = threading.Thread(target=worker.run)
    running.append((worker, t))
    t.start()
    return worker


def test_worker__two_members_split_partitions_and_totals_are_exact(
    settings: StokerSettings,
    redis_client: redis.Redis,
    workers: list[tuple[Worker, threading.Thread]],
) -> None:
    bootstrap = settings.kafka_bootstrap or ""
    ensure_topics(bootstrap, {_topic(settings): 6})
    members = [_start(_traffic_worker(settings), workers) for _ in range(2)]
    wait_for(
        lambda: (
            all(w.stats.assigned for w in members)
            and sum(len(w.stats.assigned) for w in members) == 6
        ),
        TIMEOUT_S,
        "both members to own partitions",
    )
    tenants = [f"t{i}" for i in range(4)]
    for p in range(6):
        values = [encode(request(i, tenant=tenants[i % 4])) for i in range(p * 500, p * 500 + 500)]
        produce(bootstrap, _topic(settings), values, partition=p)
    wait_for(lambda: _profile_total(redis_client, tenants) >= 3000, TIMEOUT_S, "3000 counted")
    # stats count committed batches; a pipelined batch commits a poll after its apply
    wait_for(lambda: sum(w.stats.events for w in members) >= 3000, TIMEOUT_S, "3000 committed")
    assert all(w.stats.events > 0 for w in members)
    # >=: a rebalance in between may redeliver a batch to the other member; the profile's
    # watermark still counts it once.
    assert sum(w.stats.events for w in members) >= 3000
    assert _profile_total(redis_client, tenants) == 3000


def test_worker__idle_on_the_embedded_broker_rests_and_still_applies_each_record_at_once(
    settings: StokerSettings, workers: list[tuple[Worker, threading.Thread]]
) -> None:
    """Tansu answers a fetch only after its full wait, so an idle consumer pauses its partitions
    between fetches. A record produced during a rest is read when it ends (at most 0.3 s here),
    not at librdkafka's next wake-up (up to 1 s later) and not never; a stream of records
    takes no rest at all."""
    s = settings.model_copy(update={"worker_idle_fetch_max_s": 0.3})
    bootstrap = s.kafka_bootstrap or ""
    ensure_topics(bootstrap, {_topic(s): 2})
    handler = Recorder()
    worker = _start(Worker(handler, worker_config(s, handler)), workers)
    wait_for(lambda: worker.stats.assigned and worker.stats.rests >= 3, TIMEOUT_S, "rests")
    waits = []
    for i in range(5):
        # quiet until a rest at its longest has ended since the last record
        done = worker.stats.rests
        wait_for(lambda d=done: worker.stats.rests > d and worker.stats.last_rest_s == 0.3,
                 TIMEOUT_S, "a rest at its longest")  # fmt: skip
        t0 = time.monotonic()
        produce(bootstrap, _topic(s), [encode(request(i))])
        wait_for(lambda n=i + 1: len(handler.applied) == n, TIMEOUT_S, f"record {i}")
        waits.append(time.monotonic() - t0)
    assert sorted(waits)[2] < 0.6, waits  # the median: a rest, a probe, a batch
    rests = worker.stats.rests
    for i in range(5, 45):  # each record as soon as the last is applied: never quiet for long
        produce(bootstrap, _topic(s), [encode(request(i))])
        wait_for(lambda n=i + 1: len(handler.applied) == n, TIMEOUT_S, f"record {i}")
    assert worker.stats.rests - rests <= 1, worker.stats.rests - rests
    assert sorted(handler.applied) == sorted(f"r{i}" for i in range(45))  # each once, none lost
