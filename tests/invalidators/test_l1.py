"""The in-process L1 drops what the invalidators delete, through Redis tracking, on redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from caches.client import CacheClient, CacheRequest
from caches.l1 import L1Cache
from caches.policy import CachePolicy
from invalidators.invalidation import Invalidator
from invalidators.purge import Purger, PurgeSpec
from schemas.common import DocRef
from schemas.events import KnowledgeBaseChanged
from tests.waiting import wait_for

# Far above the bounded waits below, so only an invalidation message can drop an entry.
LONG_TTL_S = 600.0


@pytest.fixture
def l1(redis_client: redis.Redis) -> Iterator[L1Cache]:
    with L1Cache(redis_client, ttl_s=LONG_TTL_S, max_entries=100) as cache:
        assert cache.tracking
        yield cache


@pytest.fixture
def serving(redis_client: redis.Redis, l1: L1Cache) -> CacheClient:
    """The serving side's client (with the L1); the writer and invalidators use other clients."""
    return CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=600), l1=l1)


@pytest.fixture
def writer(redis_url: str) -> Iterator[CacheClient]:
    r = redis.Redis.from_url(redis_url)
    yield CacheClient(r, policy=CachePolicy(exact_ttl_s=600))
    r.close()


def cached(serving: CacheClient, writer: CacheClient, req: CacheRequest) -> str:
    """Land an answer through the writer and read it twice through the serving client."""
    assert writer.store(writer.lookup(req, use_semantic=False), "answer").landed
    assert serving.lookup(req).rule == "exact"  # from Redis, now in the L1
    assert serving.lookup(req).rule == "exact:l1"
    return req.key().exact()


def test_l1__kb_change_drops_the_entry_in_another_client(serving, writer, l1):
    req = CacheRequest(
        "acme", "llama", "v1", "t1", "refunds?", docs=(DocRef(doc_id="kb/r", version=1),)
    )
    key = cached(serving, writer, req)
    inv = Invalidator(writer.redis)
    kb = KnowledgeBaseChanged(tenant="acme", doc_id="kb/r", doc_version=2, change="updated")
    assert inv.kb_changed(kb).deleted == 1
    wait_for(lambda: key not in l1, 5, "the L1 to drop the KB-invalidated entry")
    assert serving.lookup(req).outcome == "miss"


def test_l1__context_bump_and_purge_drop_entries(serving, writer, l1):
    a = CacheRequest("acme", "llama", "v1", "t1", "a?", docs=(DocRef(doc_id="kb/a", version=1),))
    b = CacheRequest("globex", "llama", "v1", "t1", "b?")
    key_a, key_b = cached(serving, writer, a), cached(serving, writer, b)
    Invalidator(writer.redis).context("acme", a.key().context_hash)
    wait_for(lambda: key_a not in l1, 5, "the L1 to drop the context-invalidated entry")
    assert key_b in l1
    assert Purger(writer.redis).run(PurgeSpec("llama", "v1")).state == "done"
    wait_for(lambda: key_b not in l1, 5, "the L1 to drop the purged entry")
    assert l1.invalidations == 2


def test_l1__a_change_between_read_and_fill_is_not_cached(writer, l1, redis_client):
    req = CacheRequest("acme", "llama", "v1", "t1", "race?")
    key = req.key().exact()
    token = l1.reserve(key)  # the serving lookup reserved, then read the old value...
    assert writer.store(writer.lookup(req, use_semantic=False), "new").landed  # ...it changed
    entry = CacheClient(redis_client).lookup(req).entry
    assert entry is not None
    wait_for(lambda: key not in l1._pending, 5, "the change's message")
    assert not l1.fill(key, token, entry)
    assert key not in l1


def test_l1__lost_tracking_connection_empties_and_disables_then_recovers(serving, writer, l1):
    key = cached(serving, writer, CacheRequest("acme", "llama", "v1", "t1", "x?"))
    admin = writer.redis
    tracking_ids = [c["id"] for c in admin.client_list() if "t" in c["flags"]]
    assert tracking_ids
    for cid in tracking_ids:
        admin.client_kill_filter(_id=cid)
    wait_for(lambda: len(l1) == 0, 5, "the L1 to empty on a lost connection")
    assert key not in l1
    wait_for(lambda: l1.tracking, 5, "tracking to come back")
    req = CacheRequest("acme", "llama", "v1", "t1", "x?")
    assert serving.lookup(req).rule == "exact" and serving.lookup(req).rule == "exact:l1"
