"""Fixtures for the cache layer: every semantic store, and clients on the real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from qdrant_client import QdrantClient

from caches.client import CacheClient
from caches.embedders import SentenceTransformerEmbedder
from caches.embedding_cache import CachedEmbedder
from caches.policy import CachePolicy
from caches.semantic.base import SemanticStore
from caches.semantic.edge import EdgeSemanticStore
from caches.semantic.server import ServerSemanticStore


@pytest.fixture(params=["edge", "server"])
def semantic_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SemanticStore]:
    """Every semantic store implementation, for the contract suite (small dimension)."""
    store: SemanticStore
    if request.param == "edge":
        store = EdgeSemanticStore(tmp_path / "edge", dim=8)
    else:
        store = ServerSemanticStore(QdrantClient(":memory:"), "contract", dim=8)
    yield store
    store.close()


@pytest.fixture(params=["edge", "server"])
def cache_client(
    request: pytest.FixtureRequest,
    redis_client: redis.Redis,
    embedder: SentenceTransformerEmbedder,
    tmp_path: Path,
) -> Iterator[CacheClient]:
    """The full client on the real redis-server, over each semantic store."""
    store: SemanticStore
    if request.param == "edge":
        store = EdgeSemanticStore(tmp_path / "edge", dim=embedder.dim)
    else:
        store = ServerSemanticStore(QdrantClient(":memory:"), "client", dim=embedder.dim)
    pol = CachePolicy(exact_ttl_s=600, semantic_ttl_s=600, negative_ttl_s=5)
    yield CacheClient(
        redis_client,
        semantic=store,
        embedder=CachedEmbedder(embedder, redis_client, 600),
        policy=pol,
    )
    store.close()
