"""Wiring: build the cache client and its stores from settings (production URLs or embedded)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import redis

from caches.client import CacheClient
from caches.embedders import CachedEmbedder, Embedder, OpenAIEmbedder, SentenceTransformerEmbedder
from caches.policy import CachePolicy
from caches.semantic.base import SemanticStore
from caches.semantic.edge import EdgeSemanticStore
from schemas.errors import ConfigError
from stoker.settings import StokerSettings

_EMBEDDERS: dict[tuple[str, str, str | None], Embedder] = {}
_EDGE_STORES: dict[Path, EdgeSemanticStore] = {}


def policy_from(s: StokerSettings) -> CachePolicy:
    return CachePolicy(
        exact_ttl_s=s.exact_ttl_s,
        semantic_ttl_s=s.semantic_ttl_s,
        negative_ttl_s=s.negative_ttl_s,
        embedding_ttl_s=s.embedding_ttl_s,
        max_prompt_chars=s.max_prompt_chars,
        max_response_bytes=s.max_response_bytes,
        threshold=s.semantic_threshold,
        tenant_thresholds=dict(s.tenant_thresholds),
        route_thresholds=dict(s.route_thresholds),
        conservative_routes=frozenset(s.conservative_routes),
        conservative_threshold=s.conservative_threshold,
    )


def build_redis(s: StokerSettings) -> redis.Redis:
    if not s.redis_url:
        raise ConfigError("redis_url is not set (STOKER_REDIS_URL), and no embedded stack runs")
    return redis.Redis.from_url(s.redis_url, socket_timeout=5, socket_connect_timeout=5)


def build_embedder(s: StokerSettings) -> Embedder:
    """One model per process: loading all-MiniLM-L6-v2 takes seconds and ~100 MB."""
    ident = (s.embedder, s.embedder_model, s.embedder_url)
    if ident not in _EMBEDDERS:
        if s.embedder == "openai":
            if not s.embedder_url:
                raise ConfigError("embedder=openai needs STOKER_EMBEDDER_URL")
            key = s.embedder_api_key.get_secret_value() if s.embedder_api_key else None
            _EMBEDDERS[ident] = OpenAIEmbedder(
                s.embedder_url, s.embedder_model, dim=384, api_key=key
            )
        else:
            _EMBEDDERS[ident] = SentenceTransformerEmbedder(s.embedder_model)
    return _EMBEDDERS[ident]


def build_semantic(s: StokerSettings, dim: int) -> SemanticStore:
    if s.semantic_backend == "server":
        from qdrant_client import QdrantClient

        from caches.semantic.server import ServerSemanticStore

        if not s.qdrant_url:
            raise ConfigError("semantic_backend=server needs STOKER_QDRANT_URL")
        key = s.qdrant_api_key.get_secret_value() if s.qdrant_api_key else None
        client = (
            QdrantClient(url=s.qdrant_url, api_key=key)
            if s.qdrant_url != ":memory:"
            else QdrantClient(":memory:")
        )
        return ServerSemanticStore(client, s.qdrant_collection, dim)
    from caches.semantic.edge import EdgeSemanticStore

    path = Path(s.qdrant_path or tempfile.mkdtemp(prefix="stoker-qdrant-")).resolve()
    # An Edge shard is a folder one process opens once: every part of this process (serving
    # client, invalidation and deploy workers) shares the one open store of a folder.
    store = _EDGE_STORES.get(path)
    if store is None or store.closed:
        store = _EDGE_STORES[path] = EdgeSemanticStore(path, dim)
    return store


def build_cache_client(s: StokerSettings, *, semantic: bool = True) -> CacheClient:
    r = build_redis(s)
    pol = policy_from(s)
    if not semantic:
        return CacheClient(r, policy=pol)
    emb = build_embedder(s)
    store = build_semantic(s, emb.dim)
    return CacheClient(
        r, semantic=store, embedder=CachedEmbedder(emb, r, pol.embedding_ttl_s), policy=pol
    )


def build_deploy_worker(settings: StokerSettings) -> Any:
    """Registry factory for `stoker worker deploy`: the cutover with the hot-set pre-warm."""
    from invalidators.deploy import build_deploy_handler
    from warmers.prewarm import build_prewarmer

    return build_deploy_handler(settings, build_prewarmer(settings))
