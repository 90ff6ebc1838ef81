"""Staggered purge on the real redis-server and Qdrant Edge."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis

from caches import keys as K
from caches.semantic.base import SemanticPoint
from invalidators.checkpoint import checkpoint_key
from invalidators.purge import PurgeOptions, PurgeProgress, Purger, PurgeSpec

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py


def put(
    r: redis.Redis, tenant: str, model: str, version: str, template: str = "t1", n: int = 5
) -> list[bytes]:
    ns = K.Namespace(tenant, model, version, template)
    pipe = r.pipeline(transaction=False)
    made = []
    for i in range(n):
        key = K.CacheKey(ns, f"prompt {i}", "{}", "ctx")
        for k in (key.exact(), key.negative()):
            pipe.set(k, b"x", ex=600)
            made.append(k.encode())
    pipe.execute()
    return made


def remaining(r: redis.Redis, keys: list[bytes]) -> int:
    return sum(r.exists(k) for k in keys)


def test_purge__removes_the_version_in_every_tenant_and_nothing_else(redis_client):
    r = redis_client
    doomed = [k for t in ("acme", "globex", "t*1 [x]:y") for k in put(r, t, "llama", "v1")]
    kept = [
        *put(r, "acme", "llama", "v10"),  # a version with the same prefix
        *put(r, "acme", "llama", "v*"),  # a version that is a glob
        *put(r, "acme", "llama2", "v1"),  # another model, same version string
        *put(r, "acme", "llama", "v2", template="v1"),  # the version string as a template
        *put(r, "v1", "llama", "v2"),  # the version string as a tenant
    ]
    others = [K.embedding_key("acme", "e", "x").encode(), K.doc_index_key("acme", "d").encode()]
    for k in others:
        r.set(k, b"1")
    prog = Purger(r).run(PurgeSpec("llama", "v1"), PurgeOptions(batch=7))
    assert prog.state == "done"
    assert remaining(r, doomed) == 0
    assert remaining(r, kept) == len(kept) and remaining(r, others) == len(others)
    assert prog.deleted == len(doomed)
    assert not r.exists(checkpoint_key(PurgeSpec("llama", "v1").job_id))


def test_purge__tenant_and_template_narrow_it(redis_client):
    r = redis_client
    acme_t1 = put(r, "acme", "llama", "v1", "t1")
    acme_t2 = put(r, "acme", "llama", "v1", "t2")
    globex = put(r, "globex", "llama", "v1", "t1")
    Purger(r).run(PurgeSpec("llama", "v1", tenant="acme", template_version="t1"))
    assert remaining(r, acme_t1) == 0
    assert remaining(r, acme_t2) == len(acme_t2) and remaining(r, globex) == len(globex)


def test_purge__dry_run_counts_and_deletes_nothing(redis_client):
    r = redis_client
    doomed = put(r, "acme", "llama", "v1", n=40) + put(r, "globex", "llama", "v1", n=10)
    put(r, "acme", "llama", "v2", n=10)
    prog = Purger(r).run(PurgeSpec("llama", "v1"), PurgeOptions(batch=16, dry_run=True))
    assert prog.state == "dry-run"
    assert prog.matched == len(doomed) and prog.deleted == 0
    assert remaining(r, doomed) == len(doomed)
    assert not r.keys("stk:job:*")


class Crash(Exception):
    pass


def test_purge__resumes_from_its_checkpoint_after_a_crash(redis_client):
    r = redis_client
    doomed = put(r, "acme", "llama", "v1", n=3000)
    kept = put(r, "acme", "llama", "v2", n=3000)
    spec, opts = PurgeSpec("llama", "v1"), PurgeOptions(batch=100)
    full_calls = Purger(r).run(spec, PurgeOptions(batch=100, dry_run=True)).scan_calls

    def crash_halfway(p: PurgeProgress) -> None:
        if p.scan_calls >= full_calls // 2:
            raise Crash  # the process dies after a batch was deleted and checkpointed

    with pytest.raises(Crash):
        Purger(r).run(spec, opts, on_progress=crash_halfway)
    first_calls = full_calls // 2
    saved = Purger(r).checkpoints.load(spec.job_id)
    assert saved is not None
    # One tenant lives on one primary: a cluster's other primaries are done or not begun.
    (node,) = [n for n in saved["nodes"].values() if n["cursor"] != 0]
    assert 0 < saved["deleted"] < len(doomed)
    assert remaining(r, doomed) == len(doomed) - saved["deleted"]

    resumed = Purger(r).run(spec, opts)
    assert resumed.state == "done"
    assert list(resumed.resumed_from.values()) == [node["cursor"]]
    # Starting over would cost about full_calls more SCANs; resuming costs the other half.
    assert first_calls + resumed.scan_calls <= full_calls * 1.15
    assert remaining(r, doomed) == 0 and remaining(r, kept) == len(kept)
    assert resumed.deleted >= len(doomed)  # counts carried over from the first run


def test_purge__stop_interrupts_a_throttled_run_and_keeps_the_checkpoint(redis_client):
    r = redis_client
    put(r, "acme", "llama", "v1", n=500)
    stop = threading.Event()

    def stop_after_two(p: PurgeProgress) -> None:
        if p.batches == 2:
            stop.set()

    spec = PurgeSpec("llama", "v1")
    prog = Purger(r).run(
        spec, PurgeOptions(rate=2000, batch=50), on_progress=stop_after_two, stop=stop
    )
    assert prog.state == "interrupted" and prog.batches == 2
    assert r.exists(checkpoint_key(spec.job_id))


def test_purge__deletes_the_versions_semantic_points_only(redis_client, edge_store):
    def point(tenant: str, version: str, i: int) -> SemanticPoint:
        ns = K.Namespace(tenant, "llama", version, "t1")
        key = K.CacheKey(ns, f"p{i}", "{}", "ctx").exact()
        vec = np.ones(16, dtype=np.float32) / 4.0
        return SemanticPoint(key, vec, ns, "ctx", "ph", 2e9, f"p{i}")

    edge_store.upsert(
        [point(t, v, i) for t in ("acme", "globex") for v in ("v1", "v2") for i in range(5)]
    )
    spec = PurgeSpec("llama", "v1")
    purger = Purger(redis_client, edge_store)
    assert purger.semantic_count(spec) == 10
    assert purger.run(spec).semantic_deleted
    assert edge_store.count({"model_version": "v1"}) == 0
    assert edge_store.count({"model_version": "v2"}) == 10


def test_purge_spec__refuses_a_whole_model_across_tenants():
    with pytest.raises(ValueError, match="needs a version"):
        PurgeSpec("llama", None)
