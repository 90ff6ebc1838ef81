"""Fixtures for invalidators: a cache client on the real Redis and a Qdrant Edge shard."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import redis

from caches.client import CacheClient
from caches.embedders import Embedder, Vectors
from caches.embedding_cache import CachedEmbedder
from caches.policy import CachePolicy
from caches.semantic.edge import EdgeSemanticStore


class HashEmbedder(Embedder):
    """A deterministic stand-in for the embedding model (these tests need no semantics):
    each word lands in one of `dim` buckets, so equal texts get equal unit vectors."""

    id = "test:hash"

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.split() or [""]:
                out[i, hashlib.sha256(word.encode()).digest()[0] % self.dim] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def edge_store(tmp_path: Path) -> Iterator[EdgeSemanticStore]:
    store = EdgeSemanticStore(tmp_path / "edge", dim=16)
    yield store
    store.close()


@pytest.fixture
def client(redis_client: redis.Redis, edge_store: EdgeSemanticStore) -> CacheClient:
    pol = CachePolicy(exact_ttl_s=600, semantic_ttl_s=600, negative_ttl_s=30)
    emb = CachedEmbedder(HashEmbedder(), redis_client, 600)
    return CacheClient(redis_client, semantic=edge_store, embedder=emb, policy=pol)
