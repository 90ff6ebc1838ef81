"""Faults: Redis restarting under a worker, a worker SIGKILLed mid-stream, SIGTERM, `worker all`."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stoker.embedded import LOOPBACK, find_redis_server, free_port
from stoker.settings import StokerSettings
from stoker.wiring import worker_config
from streams.topics import ensure_topics
from streams.worker import Worker
from tests.cli import STOKER, clean_env
from tests.streams.conftest import encode, produce, request, wait_for
from warmers.traffic.decode import query_key
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile
from warmers.traffic.worker import TrafficHandler

TIMEOUT_S = 60
ROOT = Path(__file__).resolve().parents[2]


class DurableRedis:
    """A redis-server on a fixed port with an fsync-always AOF: it can stop and come back whole."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self) -> None:
        argv = [find_redis_server(), "--port", str(self.port), "--bind", LOOPBACK]
        argv += ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        argv += ["--dir", str(self.workdir)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_for(answers, 10, "redis-server to answer")
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()  # SIGTERM: redis fsyncs the AOF and exits
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[DurableRedis]:
    server = DurableRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def _total(url: str, tenants: list[str]) -> int:
    r = redis.Redis.from_url(url)
    try:
        p = TrafficProfile(r)
        return sum(
            s.count
            for t in tenants
            for s in p.top_queries(t, "llama", "t1", range(HOURS_PER_WEEK), 100_000)
        )
    finally:
        r.close()


def _settings(kafka_bootstrap: str, redis_url: str, unique: str) -> StokerSettings:
    return StokerSettings(
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        kafka_broker="tansu",
        topic_prefix=f"f{unique}.",
        worker_batch_size=300,
        worker_backoff_base_s=0.05,
        worker_backoff_max_s=0.5,
    )


def test_worker__redis_restart_stops_commits_then_resumes_exactly(
    kafka_bootstrap: str, durable_redis: DurableRedis, unique: str
) -> None:
    s = _settings(kafka_bootstrap, durable_redis.url, unique)
    topic = f"{s.topic_prefix}inference.requests"
    ensure_topics(kafka_bootstrap, {topic: 3})
    produce(kafka_bootstrap, topic, [encode(request(i)) for i in range(1500)])
    r = redis.Redis.from_url(durable_redis.url, socket_timeout=2, socket_connect_timeout=1)
    handler = TrafficHandler(TrafficProfile(r))
    worker = Worker(handler, worker_config(s, handler))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: _total(durable_redis.url, ["acme"]) >= 1500, TIMEOUT_S, "first 1500")
        durable_redis.stop()
        produce(kafka_bootstrap, topic, [encode(request(i)) for i in range(1500, 3000)])
        wait_for(lambda: worker.stats.retries >= 2, TIMEOUT_S, "the worker to retry")
        events_during_outage = worker.stats.events
        durable_redis.start()  # same port, data back from the AOF, script cache empty
        wait_for(lambda: _total(durable_redis.url, ["acme"]) >= 3000, TIMEOUT_S, "all 3000")
    finally:
        worker.stop()
        thread.join(TIMEOUT_S)
    assert not thread.is_alive()
    assert events_during_outage == 1500  # nothing was counted as done while Redis was down
    assert _total(durable_redis.url, ["acme"]) == 3000


def _spawn_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*STOKER, "worker", "traffic"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_worker__sigkill_mid_stream_then_restart_counts_exactly(
    kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, unique: str
) -> None:
    s = _settings(kafka_bootstrap, redis_url, unique)
    topic = f"{s.topic_prefix}inference.requests"
    ensure_topics(kafka_bootstrap, {topic: 6})
    tenants = ["a", "b", "c"]
    payloads = [request(i, tenant=tenants[i % 3], prompt=f"q{i % 50}") for i in range(12_000)]
    per_partition = [payloads[p::6] for p in range(6)]
    env = {**os.environ, "STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap, "STOKER_REDIS_URL": redis_url}
    env |= {"STOKER_KAFKA_BROKER": "tansu", "STOKER_TOPIC_PREFIX": s.topic_prefix}
    env |= {"STOKER_WORKER_BATCH_SIZE": "200"}
    # the payloads are dated 2025-03-03: past the default one-year horizon of event times
    env |= {"STOKER_TRAFFIC_MAX_EVENT_AGE_S": str(20 * 365 * 86_400)}
    for p, chunk in enumerate(per_partition):  # the first half
        produce(kafka_bootstrap, topic, [encode(x) for x in chunk[:1000]], partition=p)

    first = _spawn_worker(env)
    try:
        wait_for(lambda: _total(redis_url, tenants) > 0, TIMEOUT_S, "the first worker to count")
        first.kill()  # SIGKILL: no commit, no leave; its session must time out
        first.wait(10)
    finally:
        _reap(first)
    counted_at_kill = _total(redis_url, tenants)
    for p, chunk in enumerate(per_partition):  # the second half
        produce(kafka_bootstrap, topic, [encode(x) for x in chunk[1000:]], partition=p)

    second = _spawn_worker(env)
    try:
        wait_for(lambda: _total(redis_url, tenants) >= 12_000, TIMEOUT_S, "all 12000 counted")
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 0, err.decode()[-2000:]
    finally:
        _reap(second)
    assert 0 < counted_at_kill <= 6_000  # killed after counting began, before the second half
    assert _total(redis_url, tenants) == 12_000
    # Per query, not just in total: no event counted twice and another lost.
    profile = TrafficProfile(redis_client)
    expected = Counter(
        (x["tenant"], query_key(x["prompt"], x["params"], ["kb-1"])) for x in payloads
    )
    got = Counter(
        {
            (t, q.qkey): q.count
            for t in tenants
            for q in profile.top_queries(t, "llama", "t1", range(HOURS_PER_WEEK), 1000)
        }
    )
    assert got == expected
    # SIGTERM committed everything: a new member of the group would start at the end.
    from confluent_kafka import Consumer, TopicPartition

    from streams.topics import consumer_config

    c = Consumer(consumer_config(kafka_bootstrap, f"{s.topic_prefix}stoker.traffic", embedded=True))
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(6)], timeout=10)
    finally:
        c.close()
    assert [tp.offset for tp in committed] == [len(chunk) for chunk in per_partition]


def test_worker_cli__all_on_embedded_stack_says_so_and_sigterm_exits_0(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*STOKER, "worker", "all"],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []

        def read() -> None:
            assert proc.stderr is not None
            for raw in proc.stderr:
                lines.append(raw.decode())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: any("worker traffic: group" in x for x in lines), TIMEOUT_S, "start")
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        reader.join(10)
    finally:
        _reap(proc)
    text = "".join(lines)
    assert proc.returncode == 0, text
    assert "embedded stack" in text
    assert "SIGTERM" in text
