"""Fixtures for the warmers: the simulated backend on loopback, a cache client, a manual clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from caches.client import CacheClient
from caches.policy import CachePolicy
from warmers.backends.simhttp import SimulatorThread
from warmers.backends.simulator import SimConfig
from warmers.throttle import ManualClock

# Fast enough for tests, slow enough that slots and queues matter: 8..16 tokens at 1 ms each.
FAST_SIM = SimConfig(
    slots=4,
    queue=64,
    prefill_ms_per_token=0.05,
    decode_ms_per_token=1.0,
    min_answer_tokens=8,
    default_max_tokens=16,
)


@pytest.fixture
def fake_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sim() -> Iterator[SimulatorThread]:
    with SimulatorThread(FAST_SIM) as s:
        yield s


@pytest.fixture
def cache(redis_client: redis.Redis) -> CacheClient:
    """Exact-only cache client (the warmer never reads the semantic layer) on the real Redis."""
    return CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=600, negative_ttl_s=5))
