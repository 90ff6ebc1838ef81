"""Metrics end to end: the traffic worker on Tansu and redis-server, scraped over HTTP."""

from __future__ import annotations

import threading
import time

import httpx
import redis
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from stoker.embedded import free_port
from stoker.metrics import serve_metrics
from streams.topics import ensure_topics, topic_name
from streams.worker import Worker, WorkerConfig, WorkerStats
from tests.streams.conftest import encode, produce, request
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def lag_seen(topic: str) -> bool:
    """The lag gauge has a series for a partition of topic (set the step after a commit)."""
    return any(
        REGISTRY.get_sample_value(
            "stoker_consumer_lag", {"worker": "traffic", "topic": topic, "partition": str(p)}
        )
        is not None
        for p in (0, 1)
    )


def test_metrics__traffic_worker_counters_move_on_the_scraped_endpoint(
    kafka_bootstrap: str, redis_client: redis.Redis, unique: str
):
    prefix = f"t{unique}."
    topic = topic_name("inference.requests", prefix)
    ensure_topics(kafka_bootstrap, {topic: 2})
    outcomes = ["exact"] * 3 + ["semantic"] * 2 + ["miss"] * 4 + ["bypass"]
    values = [encode(request(i, cache_outcome=o)) for i, o in enumerate(outcomes)]
    # one the fast path refuses but pydantic accepts ("5" for 5): counted on the slow path
    values.append(encode(request(99, cache_outcome="exact", tokens_in="5")))
    values.append(b"{not json")  # poison: dead-lettered, not counted as an outcome
    produce(kafka_bootstrap, topic, values)

    cfg = WorkerConfig(
        bootstrap=kafka_bootstrap, group_id=f"g{unique}", embedded=True, topic_prefix=prefix
    )
    worker = Worker(TrafficHandler(TrafficProfile(redis_client)), cfg)
    worker.metrics.lag_every_s = 0.0  # refresh lag on every step, not every 5 s
    with serve_metrics(free_port(), "127.0.0.1") as port:
        assert port is not None
        before = scrape(port)
        t0 = time.time()
        scraped: list[Samples] = []

        def done(stats: WorkerStats) -> bool:
            # Scraped from inside the run: lag series go when the worker leaves the group.
            if stats.events + stats.dlq < len(values) or not lag_seen(topic):
                return False
            scraped.append(scrape(port))
            return True

        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(worker.run_until(done, 60)))
        thread.start()
        thread.join(90)
        assert not thread.is_alive() and result == [True], worker.stats
        after = scraped[0]
    assert not lag_seen(topic)  # partitions released on stop: their lag series went with them

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("stoker_worker_events_total", worker="traffic") == 11
    assert moved("stoker_worker_dead_letters_total", worker="traffic", reason="bad_json") == 1
    assert moved("stoker_worker_batches_total", worker="traffic") >= 1
    assert value(after, "stoker_worker_last_batch_timestamp_seconds", worker="traffic") >= t0
    got = {o: moved("stoker_gateway_requests_total", outcome=o) for o in ("exact", "semantic")}
    assert got == {"exact": 4, "semantic": 2}
    assert moved("stoker_gateway_requests_total", outcome="miss") == 4
    assert moved("stoker_gateway_requests_total", outcome="bypass") == 1
    lags = {
        dict(labels)["partition"]: v
        for (name, labels), v in after.items()
        if name == "stoker_consumer_lag" and dict(labels).get("topic") == topic
    }
    assert set(lags) <= {"0", "1"} and lags and all(v >= 0 for v in lags.values())
