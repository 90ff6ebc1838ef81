"""Event-based invalidation on the real redis-server and Qdrant Edge."""

from __future__ import annotations

import pytest

from caches import keys as K
from caches.client import CacheClient
from caches.request import CacheRequest
from caches.semantic.edge import EdgeSemanticStore
from invalidators.invalidation import InvalidationUnsupported, Invalidator
from schemas.common import DocRef
from schemas.events import Invalidate, KnowledgeBaseChanged, PromptTemplateChanged

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py


def req(prompt: str, *docs: tuple[str, int], tenant: str = "acme", **kw: str) -> CacheRequest:
    fields = {"model_id": "llama", "model_version": "v1", "template_version": "t1"} | kw
    refs = tuple(DocRef(doc_id=d, version=v) for d, v in docs)
    return CacheRequest(tenant=tenant, prompt=prompt, docs=refs, **fields)


def warm(c: CacheClient, r: CacheRequest) -> str:
    res = c.lookup(r)
    assert res.outcome == "miss"
    assert c.store(res, f"answer to {r.prompt}").landed
    return r.key().exact()


def _has_point(store: EdgeSemanticStore, key: str) -> bool:
    return store.count({"entry_key": key}) == 1


def kb(
    doc: str, version: int, change: str = "updated", tenant: str = "acme"
) -> KnowledgeBaseChanged:
    return KnowledgeBaseChanged(tenant=tenant, doc_id=doc, doc_version=version, change=change)


@pytest.fixture
def inv(client: CacheClient, edge_store: EdgeSemanticStore) -> Invalidator:
    return Invalidator(client.redis, edge_store)


def test_kb_changed__deletes_exactly_the_older_doc_versions_in_redis_and_qdrant(
    client, inv, edge_store
):
    old = [
        warm(client, req("what is the refund window", ("kb/refunds", 1))),
        warm(client, req("refunds for shoes", ("kb/refunds", 1), ("kb/shoes", 4))),
    ]
    new = warm(client, req("refund policy now", ("kb/refunds", 2)))
    other_doc = warm(client, req("shoe sizes", ("kb/shoes", 4)))
    other_tenant = warm(
        client, req("what is the refund window", ("kb/refunds", 1), tenant="globex")
    )

    res = inv.kb_changed(kb("kb/refunds", 2))

    assert (res.deleted, res.kept, res.floor) == (2, 1, 2)
    for key in old:
        assert not client.redis.exists(key) and not _has_point(edge_store, key)
    for key in (new, other_doc, other_tenant):
        assert client.redis.exists(key) and _has_point(edge_store, key)
    members = client.redis.smembers(K.doc_index_key("acme", "kb/refunds"))
    assert members == {new.encode()}


def test_kb_changed__a_write_begun_before_the_change_does_not_land(client, inv):
    pending = client.lookup(req("what is the refund window", ("kb/refunds", 1)))
    inv.kb_changed(kb("kb/refunds", 2))
    assert not client.store(pending, "the old answer").landed
    assert client.lookup(req("what is the refund window", ("kb/refunds", 1))).outcome == "miss"


def test_kb_changed__retraction_removes_the_named_version_too(client, inv):
    v2 = warm(client, req("refund policy now", ("kb/refunds", 2)))
    v3 = warm(client, req("refund policy next", ("kb/refunds", 3)))
    res = inv.kb_changed(kb("kb/refunds", 2, "retracted"))
    assert res.floor == 3
    assert not client.redis.exists(v2) and client.redis.exists(v3)


def test_kb_changed__duplicated_and_out_of_order_events_do_no_harm(client, inv):
    keys = {v: warm(client, req(f"refunds {v}", ("kb/refunds", v))) for v in (1, 2, 3)}
    inv.kb_changed(kb("kb/refunds", 3))
    inv.kb_changed(kb("kb/refunds", 2))  # older, arrives late
    res = inv.kb_changed(kb("kb/refunds", 3))  # redelivered
    assert res.floor == 3 and res.deleted == 0
    assert [bool(client.redis.exists(keys[v])) for v in (1, 2, 3)] == [False, False, True]
    # The late v2 event did not lower the floor: a v2 write is still refused.
    pending = client.lookup(req("refunds late", ("kb/refunds", 2)))
    assert not client.store(pending, "stale").landed


def test_invalidate_context__bumps_then_deletes_every_entry_of_the_context(client, inv, edge_store):
    r1 = req("refund window", ("kb/refunds", 1))
    k1 = warm(client, r1)
    same_ctx = warm(client, req("refunds, how long", ("kb/refunds", 1)))
    other = warm(client, req("shoe sizes", ("kb/shoes", 1)))
    pending = client.lookup(req("refund for boots", ("kb/refunds", 1)))
    ev = Invalidate(tenant="acme", by="context_hash", value=r1.key().context_hash)
    assert inv.invalidate(ev).deleted == 2
    assert not client.redis.exists(k1) and not client.redis.exists(same_ctx)
    assert not _has_point(edge_store, k1)
    assert client.redis.exists(other)
    assert not client.store(pending, "computed before the invalidation").landed
    assert inv.invalidate(ev).deleted == 0  # idempotent


def test_invalidate_doc__deletes_every_version_and_refuses_in_flight_writes(client, inv):
    keys = [warm(client, req(f"refunds {v}", ("kb/refunds", v))) for v in (1, 2)]
    other = warm(client, req("shoes", ("kb/shoes", 1)))
    pending = client.lookup(req("refunds 2, again", ("kb/refunds", 2)))
    res = inv.invalidate(Invalidate(tenant="acme", by="doc", value="kb/refunds"))
    assert res.deleted == 2
    assert not any(client.redis.exists(k) for k in keys) and client.redis.exists(other)
    assert not client.store(pending, "computed before").landed
    # Not a retirement: a fresh write of the same doc version lands again.
    assert warm(client, req("refunds 2", ("kb/refunds", 2)))


def test_invalidate_doc__scope_narrows_to_a_version(client, inv):
    v1 = warm(client, req("refunds", ("kb/refunds", 1)))
    v2 = warm(client, req("refunds", ("kb/refunds", 1), model_version="v2"))
    ev = Invalidate(
        tenant="acme", by="doc", value="kb/refunds", model_id="llama", model_version="v2"
    )
    inv.invalidate(ev)
    assert client.redis.exists(v1) and not client.redis.exists(v2)


def test_invalidate_namespace__flushes_the_tenants_version(client, inv, edge_store):
    v1 = warm(client, req("hello"))
    v2 = warm(client, req("hello", model_version="v2"))
    globex = warm(client, req("hello", tenant="globex"))
    pending = client.lookup(req("hello again"))
    ev = Invalidate(tenant="acme", by="namespace", value="", model_id="llama", model_version="v1")
    assert inv.invalidate(ev).deleted == 1
    assert not client.redis.exists(v1) and not _has_point(edge_store, v1)
    assert client.redis.exists(v2) and client.redis.exists(globex)
    assert not client.store(pending, "computed before the flush").landed
    assert warm(client, req("hello"))  # a flush, not a retirement


def test_template_changed__retires_and_purges_the_old_template(client, inv, edge_store):
    old = warm(client, req("hello", template_version="t1"))
    old_v2 = warm(client, req("hello", template_version="t1", model_version="v2"))
    new = warm(client, req("hello", template_version="t2"))
    ev = PromptTemplateChanged(
        tenant="acme", model_id="llama", old_template_version="t1", new_template_version="t2"
    )
    assert inv.template_changed(ev).deleted == 2
    assert not client.redis.exists(old) and not client.redis.exists(old_v2)
    assert not _has_point(edge_store, old) and client.redis.exists(new)
    res = client.lookup(req("hello", template_version="t1"))
    assert not client.store(res, "on a retired template").landed


def test_invalidate_entity__is_a_clear_poison_error(inv):
    ev = Invalidate(tenant="acme", by="entity", value="customer:42")
    with pytest.raises(InvalidationUnsupported, match="not supported"):
        inv.invalidate(ev)


def test_kb_changed__prunes_index_members_whose_entry_expired(client, inv):
    key = warm(client, req("refunds", ("kb/refunds", 1)))
    client.redis.delete(key)  # expired before the change arrived
    res = inv.kb_changed(kb("kb/refunds", 2))
    assert (res.deleted, res.pruned) == (0, 1)
    assert not client.redis.exists(K.doc_index_key("acme", "kb/refunds"))


def test_kb_changed_many__a_batch_with_duplicates_and_disorder_equals_one_by_one(client, inv):
    refunds = {v: warm(client, req(f"refunds {v}", ("kb/refunds", v))) for v in (1, 2, 3, 4)}
    shoes = {v: warm(client, req(f"shoes {v}", ("kb/shoes", v))) for v in (1, 2)}
    globex = warm(client, req("refunds 1", ("kb/refunds", 1), tenant="globex"))
    batch = [
        kb("kb/refunds", 3),
        kb("kb/refunds", 2),  # older, later in the batch
        kb("kb/refunds", 3),  # duplicate
        kb("kb/shoes", 1, "retracted"),
    ]
    res = inv.kb_changed_many(batch)
    assert (res.deleted, res.kept) == (3, 3)
    alive = {f"refunds {v}": bool(client.redis.exists(k)) for v, k in refunds.items()}
    alive |= {f"shoes {v}": bool(client.redis.exists(k)) for v, k in shoes.items()}
    assert alive == {
        "refunds 1": False,
        "refunds 2": False,
        "refunds 3": True,
        "refunds 4": True,
        "shoes 1": False,
        "shoes 2": True,
    }
    assert client.redis.exists(globex)
    assert inv.kb_changed_many(batch).deleted == 0  # redelivered batch
    pending = client.lookup(req("refunds late", ("kb/refunds", 2)))
    assert not client.store(pending, "stale").landed
