"""Fixtures for the warmers: a cache client on the real Redis (the simulated backend and the
manual clock are in tests/conftest.py)."""

from __future__ import annotations

import pytest
import redis

from caches.client import CacheClient
from caches.policy import CachePolicy


@pytest.fixture
def cache(redis_client: redis.Redis) -> CacheClient:
    """Exact-only cache client (the warmer never reads the semantic layer) on the real Redis."""
    return CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=600, negative_ttl_s=5))
