"""The demo's TTLs on the simulated clock: a real redis-server and Qdrant Edge store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from caches.client import CacheClient
from caches.embedders import CachedEmbedder
from caches.policy import CachePolicy
from caches.request import CacheRequest
from caches.semantic.edge import EdgeSemanticStore
from demo.clock import HOUR_MS, SimTTL, stored_ttl_s
from tests.warmers.hotset_helpers import WordsEmbedder

TTL_S = 3 * 3600


def req(prompt: str) -> CacheRequest:
    return CacheRequest(
        prompt=prompt, tenant="acme", model_id="m", model_version="v1", template_version="t1"
    )


@pytest.fixture
def client(redis_client: redis.Redis, tmp_path: Path) -> Iterator[CacheClient]:
    emb = WordsEmbedder()
    store = EdgeSemanticStore(tmp_path / "edge", dim=emb.dim)
    ttl = stored_ttl_s(TTL_S)
    pol = CachePolicy(exact_ttl_s=ttl, semantic_ttl_s=ttl, negative_ttl_s=30)
    yield CacheClient(redis_client, semantic=store, embedder=CachedEmbedder(emb, redis_client, 600),
                      policy=pol)  # fmt: skip
    store.close()


def store(c: CacheClient, prompt: str) -> str:
    res = c.lookup(req(prompt))
    assert res.outcome == "miss" and res.ticket is not None
    assert c.store(res, f"answer to {prompt}", gpu_ms=100).landed
    return res.ticket.key.exact()


def test_advance__takes_an_hour_off_each_step_and_expires_entries_and_vectors(
    client: CacheClient,
):
    r = client.redis
    assert client.semantic is not None
    first = store(client, "how do i reset my router password")
    clock = SimTTL(r, client.semantic, ["m"])
    step = clock.advance(1)
    assert (step.expired, step.kept) == (0, 1)
    left = r.pttl(first)
    assert (
        stored_ttl_s(TTL_S) * 1000 - HOUR_MS - 5_000 < left <= stored_ttl_s(TTL_S) * 1000 - HOUR_MS
    )
    later = store(client, "what is the capital of france")
    clock.advance(1)
    clock.advance(1)  # the first entry has half an hour left, the later one 1.5 h
    assert (
        r.exists(first)
        and client.lookup(req("how do i reset my router password")).outcome == "exact"
    )
    assert client.lookup(req("how do i reset my router password please")).outcome == "semantic"
    step = clock.advance(1)
    assert step.expired == 1 and not r.exists(first) and r.exists(later)
    # its vector went with it: a paraphrase no longer finds it, and the store holds one point
    assert client.lookup(req("how do i reset my router password please")).outcome == "miss"
    assert client.semantic.count() == 1
    assert clock.expired_total == 1


def test_advance__deletes_short_lived_marks_and_leaves_other_keys(client: CacheClient):
    r = client.redis
    res = client.lookup(req("a failing question"))
    assert client.store_negative(res)
    r.set("unrelated:key", b"1")  # no expiry, not an entry: not the clock's business
    r.set("stk:other", b"1", ex=60)
    step = SimTTL(r, client.semantic, ["m"]).advance(1)
    assert step.expired == 1  # the negative mark's 30 s ran out within the hour
    assert r.exists("unrelated:key") and r.ttl("unrelated:key") == -1
    assert 0 < r.ttl("stk:other") <= 60
