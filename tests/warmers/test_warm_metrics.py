"""Warmer metrics against the real simulator: sends, GPU-seconds, backend latency, skips, rate."""

from __future__ import annotations

import asyncio

import pytest
import redis
from prometheus_client import REGISTRY

from backends.base import GenerationRequest
from backends.client import OpenAIBackend, RetryPolicy
from caches.client import CacheClient
from schemas.common import DocRef
from simulation.backend.http import SimulatorThread
from warmers.hotset.plan import WarmItem
from warmers.scheduler import LeaderLock, WarmScheduler
from warmers.shadow import ShadowWarmer, WarmConfig, WarmSummary

# min_ttl_left_s=0: the test cache keeps entries for minutes, and a cached one must count as fresh
FAST = WarmConfig(
    target_qps=200, capacity_qps=1000, ramp_s=0, jitter_frac=0.1, seed=1, min_ttl_left_s=0
)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _items(n: int) -> list[WarmItem]:
    return [
        WarmItem.of(
            GenerationRequest(
                "acme",
                "sim-model",
                "v1",
                "t1",
                f"metric question {i}",
                docs=(DocRef(doc_id="d", version=1),),
            )
        )
        for i in range(n)
    ]


def _warm(url: str, cache: CacheClient, items: list[WarmItem]) -> WarmSummary:
    async def go() -> WarmSummary:
        async with OpenAIBackend(url, retry=RetryPolicy(attempts=1)) as b:
            return await ShadowWarmer(b, cache, FAST, progress=False).run(items)

    return asyncio.run(go())


def test_warm_metrics__move_with_the_run(sim: SimulatorThread, cache: CacheClient):
    names = (
        "stoker_warm_requests_sent_total",
        "stoker_warm_gpu_seconds_total",
        "stoker_backend_latency_seconds_count",
    )
    before = {n: sample(n) for n in names}
    landed0 = sample("stoker_warm_stored_total", result="landed")
    cached0 = sample("stoker_warm_skipped_total", reason="cached")
    items = _items(6)

    first = _warm(sim.url, cache, items)
    second = _warm(sim.url, cache, items)  # everything is cached now: all skipped

    assert first.sent == 6 and second.skipped_cached == 6
    assert sample(names[0]) - before[names[0]] == 6
    assert sample(names[1]) - before[names[1]] == pytest.approx(first.gpu_seconds)
    assert sample(names[2]) - before[names[2]] == 6
    assert sample("stoker_warm_stored_total", result="landed") - landed0 == 6
    assert sample("stoker_warm_skipped_total", reason="cached") - cached0 == 6
    assert sample("stoker_warm_qps") == 0  # no run in progress


def test_scheduler_leader_gauge__follows_the_lease(redis_client: redis.Redis):
    leader = WarmScheduler(LeaderLock(redis_client, 30.0, key="stk:test-leader"), lambda: None)
    follower = WarmScheduler(LeaderLock(redis_client, 30.0, key="stk:test-leader"), lambda: None)
    leader._lead()
    assert leader.is_leader and sample("stoker_scheduler_leader") == 1
    follower._lead()  # the same process seeing a follower: the gauge says what this one is
    assert not follower.is_leader and sample("stoker_scheduler_leader") == 0
    leader.stop()
    assert sample("stoker_scheduler_leader") == 0
    follower._lead()  # the lease was released: the follower takes it
    assert sample("stoker_scheduler_leader") == 1
    follower.stop()
