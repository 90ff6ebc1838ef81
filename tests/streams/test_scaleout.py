"""Traffic workers scale out in one consumer group: members join and leave while events flow,
and every event is counted exactly once (the profile's per-partition watermarks)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis
from confluent_kafka import Producer

from stoker.redisconn import connect
from stoker.settings import StokerSettings
from stoker.wiring import worker_config
from streams.topics import ensure_topics, producer_config
from streams.worker import Worker
from tests.streams.conftest import encode, request, wait_for
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile
from warmers.traffic.worker import TrafficHandler

TIMEOUT_S = 60
PARTITIONS = 6
TENANTS = [f"t{i}" for i in range(4)]
# Events are produced in rounds of 120 (20 per partition), one every ~20 ms, until the last
# membership change has settled, then one round more: every join and leave (~1-3 s each on
# the embedded broker) happens while events flow. MAX_ROUNDS bounds it if a change never does.
PER_ROUND, MAX_ROUNDS = 120, 3_000


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique: str) -> StokerSettings:
    return StokerSettings(
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        kafka_broker="tansu",
        topic_prefix=f"s{unique}.",
        worker_batch_size=200,  # many small batches: a rebalance lands between some of them
    )


@pytest.fixture
def members() -> Iterator[dict[str, tuple[Worker, threading.Thread]]]:
    """Worker threads a test starts by name; all stopped and joined when it ends."""
    running: dict[str, tuple[Worker, threading.Thread]] = {}
    yield running
    for w, _ in running.values():
        w.stop()
    for _, t in running.values():
        t.join(TIMEOUT_S)
    assert not any(t.is_alive() for _, t in running.values())


def join(s: StokerSettings, running: dict[str, tuple[Worker, threading.Thread]], name: str):
    handler = TrafficHandler(TrafficProfile(connect(s.redis_url or "")))
    worker = Worker(handler, worker_config(s, handler))
    t = threading.Thread(target=worker.run, name=f"member-{name}")
    running[name] = (worker, t)
    t.start()


def owners(running: dict[str, tuple[Worker, threading.Thread]]) -> dict[str, int]:
    return {n: len(w.stats.assigned) for n, (w, t) in running.items() if t.is_alive()}


def settled(running: dict[str, tuple[Worker, threading.Thread]], names: set[str]) -> bool:
    """Exactly these members are alive, each owns partitions, and together all of them."""
    own = owners(running)
    return set(own) == names and all(own.values()) and sum(own.values()) == PARTITIONS


def counted(r: redis.Redis) -> dict[str, list[int]]:
    """tenant -> every query's count, sorted (queries are keyed by digest)."""
    p = TrafficProfile(r)
    hours = range(HOURS_PER_WEEK)
    return {
        t: sorted(q.count for q in p.top_queries(t, "llama", "t1", hours, 100_000)) for t in TENANTS
    }


def total(r: redis.Redis) -> int:
    return sum(sum(c) for c in counted(r).values())


def test_traffic_workers__members_join_and_leave_during_ingest_and_counts_stay_exact(
    settings: StokerSettings,
    redis_client: redis.Redis,
    members: dict[str, tuple[Worker, threading.Thread]],
) -> None:
    bootstrap = settings.kafka_bootstrap or ""
    topic = f"{settings.topic_prefix}inference.requests"
    ensure_topics(bootstrap, {topic: PARTITIONS})
    events: list[dict[str, object]] = []
    changed = threading.Event()  # the last change has settled: produce one round more, stop

    def producer() -> None:
        out = Producer(producer_config(bootstrap, embedded=True, **{"linger.ms": 2}))
        for _ in range(MAX_ROUNDS):
            last = changed.is_set()
            for _ in range(PER_ROUND):
                i = len(events)
                events.append(request(i, tenant=TENANTS[i % 4]))
                out.produce(topic, encode(events[i]), key=str(i), partition=i % PARTITIONS)
            assert out.flush(30) == 0
            if last:
                return
            changed.wait(0.02)  # paces the rounds; once set, the next round is the last

    join(settings, members, "a")
    wait_for(lambda: settled(members, {"a"}), TIMEOUT_S, "member a to own every partition")
    flow = threading.Thread(target=producer)
    flow.start()
    try:
        join(settings, members, "b")  # a join while events flow
        wait_for(lambda: settled(members, {"a", "b"}), TIMEOUT_S, "a and b to share")
        join(settings, members, "c")
        wait_for(lambda: settled(members, {"a", "b", "c"}), TIMEOUT_S, "a, b, c to share")
        members["a"][0].stop()  # a leave while events flow: its partitions move
        wait_for(lambda: settled(members, {"b", "c"}), TIMEOUT_S, "b and c to take a's share")
    finally:
        changed.set()
        flow.join(TIMEOUT_S)
    assert not flow.is_alive()

    per_query: dict[tuple[str, str], int] = {}
    for e in events:
        key = (e["tenant"], e["prompt"])
        per_query[key] = per_query.get(key, 0) + 1
    want = {t: sorted(n for (u, _), n in per_query.items() if u == t) for t in TENANTS}
    wait_for(lambda: total(redis_client) >= len(events), TIMEOUT_S, "every event counted")
    assert counted(redis_client) == want  # per tenant and query: none lost, none twice
    applied = {n: w.stats.events for n, (w, _) in members.items()}
    assert all(applied.values()), applied  # every member did part of the work
