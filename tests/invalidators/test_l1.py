"""The in-process L1 drops what the invalidators delete, through Redis tracking, on redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from caches import slots
from caches.client import CacheClient
from caches.l1 import L1Cache
from caches.policy import CachePolicy
from caches.request import CacheRequest
from invalidators.invalidation import Invalidator
from invalidators.purge import Purger, PurgeSpec
from schemas.common import DocRef
from schemas.events import KnowledgeBaseChanged
from stoker.redisconn import connect
from tests.waiting import wait_for

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py

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
    r = connect(redis_url)
    yield CacheClient(r, policy=CachePolicy(exact_ttl_s=600))
    r.close()


def cached(serving: CacheClient, writer: CacheClient, req: CacheRequest) -> str:
    """Land an answer through the writer and read it twice through the serving client.

    The write's own invalidation message may reach the L1 after the first read reserved the
    key, and would then (rightly) refuse that fill; sync() waits until it has arrived."""
    assert writer.store(writer.lookup(req, use_semantic=False), "answer").landed
    assert serving.l1 is not None and serving.l1.sync()
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
    killed = 0
    for _, node in slots.primaries(writer.redis):  # one tracking connection per primary
        for cid in [c["id"] for c in node.client_list() if "t" in c["flags"]]:
            killed += node.client_kill_filter(_id=cid)
    assert killed == len(slots.primaries(writer.redis))
    wait_for(lambda: len(l1) == 0, 5, "the L1 to empty on a lost connection")
    assert not l1.sync(0.5) or l1.tracking  # a round trip needs a tracking connection
    assert key not in l1
    wait_for(lambda: l1.tracking, 5, "tracking to come back")
    req = CacheRequest("acme", "llama", "v1", "t1", "x?")
    assert serving.lookup(req).rule == "exact" and serving.lookup(req).rule == "exact:l1"


def test_l1__a_late_message_refuses_one_fill_and_the_next_lookup_fills(serving, writer, l1):
    """A message for a change made before the read, arriving after the reserve, costs one
    Redis read: the next lookup reserves afresh and fills."""
    req = CacheRequest("acme", "llama", "v1", "t1", "late?")
    key = req.key().exact()
    token = l1.reserve(key)  # a lookup reserved ...
    assert writer.store(writer.lookup(req, use_semantic=False), "answer").landed  # ... a write
    assert l1.sync()  # ... whose message arrives before the fill
    entry = CacheClient(writer.redis).lookup(req).entry
    assert entry is not None
    assert not l1.fill(key, token, entry)
    assert serving.lookup(req).rule == "exact"
    assert serving.lookup(req).rule == "exact:l1"


def test_l1__overlapping_readers_of_a_key_share_a_reservation(writer, l1):
    """Each reader used to get its own token, so a new reader voided the previous one's fill:
    under steady concurrency on a hot key no fill ever landed."""
    req = CacheRequest("acme", "llama", "v1", "t1", "hot?")
    key = req.key().exact()
    assert writer.store(writer.lookup(req, use_semantic=False), "answer").landed
    assert l1.sync()
    entry = CacheClient(writer.redis).lookup(req).entry
    assert entry is not None
    first, second = l1.reserve(key), l1.reserve(key)
    assert first is not None and first == second
    assert l1.fill(key, first, entry)
    assert key in l1 and l1.pending == 0


def test_l1__steady_writes_of_other_keys_never_stop_fills(serving, writer, l1):
    """Under a write mix (other keys landing all the time, each a message), reads of a key
    that does not change keep filling: messages cancel only their own key."""
    reqs = [CacheRequest("acme", "llama", "v1", "t1", f"other {i}?") for i in range(200)]
    hot = CacheRequest("acme", "llama", "v1", "t1", "steady?")
    assert writer.store(writer.lookup(hot, use_semantic=False), "answer").landed
    assert l1.sync()
    served = []
    for i, other in enumerate(reqs):
        assert writer.store(writer.lookup(other, use_semantic=False), "x").landed
        served.append(serving.lookup(hot).rule)
        if i % 20 == 0:  # the TTL-less way to force a refill: drop the entry locally
            l1._entries.pop(hot.key().exact(), None)
    assert served.count("exact:l1") >= len(served) - 2 * (len(served) // 20 + 1)
    assert l1.refused_fills == 0


def test_l1__a_miss_leaves_no_reservation_behind(serving, l1):
    for i in range(50):
        assert serving.lookup(
            CacheRequest("acme", "llama", "v1", "t1", f"nothing {i}?")
        ).outcome == ("miss")
    assert l1.pending == 0
