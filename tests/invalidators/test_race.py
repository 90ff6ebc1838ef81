"""The race from issue 4: 10,000 writes racing 1,000 invalidations of their docs, in threads."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from caches import keys as K
from caches.client import CacheClient
from caches.policy import CachePolicy
from caches.request import CacheRequest
from invalidators.invalidation import Invalidator
from schemas.common import DocRef
from schemas.entries import CacheEntry
from schemas.events import KnowledgeBaseChanged

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py

DOCS = [f"kb/doc-{i}" for i in range(40)]
WRITERS, WRITES_EACH = 4, 2_500
INVALIDATORS, CHANGES_EACH = 2, 500


def test_race__no_entry_built_on_an_invalidated_doc_survives(redis_client: redis.Redis):
    cache = CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=600))
    inv = Invalidator(redis_client)
    published = dict.fromkeys(DOCS, 1)  # the knowledge base's current version of each doc
    lock = threading.Lock()
    landed, refused, deleted = [0] * WRITERS, [0] * WRITERS, [0] * INVALIDATORS

    def write(w: int) -> None:
        rng = random.Random(w)
        for i in range(WRITES_EACH):
            # The retriever read the KB a moment ago: the version may already be outdated.
            docs = tuple(DocRef(doc_id=d, version=published[d]) for d in rng.sample(DOCS, 2))
            req = CacheRequest("acme", "llama", "v1", "t1", f"q{rng.randrange(500)}", docs=docs)
            res = cache.lookup(req, use_semantic=False)
            if res.outcome != "miss":
                continue
            if cache.store(res, f"answer {w}-{i}").landed:
                landed[w] += 1
            else:
                refused[w] += 1

    def change(n: int) -> None:
        rng = random.Random(1_000 + n)
        for _ in range(CHANGES_EACH):
            doc = rng.choice(DOCS)
            with lock:
                published[doc] += 1
                version = published[doc]
            ev = KnowledgeBaseChanged(
                tenant="acme", doc_id=doc, doc_version=version, change="updated"
            )
            deleted[n] += inv.kb_changed(ev).deleted

    with ThreadPoolExecutor(WRITERS + INVALIDATORS) as pool:
        futures = [pool.submit(write, w) for w in range(WRITERS)]
        futures += [pool.submit(change, n) for n in range(INVALIDATORS)]
        for f in futures:
            f.result(timeout=240)

    floors = {d: int(redis_client.get(K.doc_floor_key("acme", d)) or 0) for d in DOCS}
    assert floors == published  # every change raised its floor, none lowered one
    survivors = stale = 0
    for key in redis_client.scan_iter(match=K.entries_pattern("llama", "v1"), count=1_000):
        entry = CacheEntry.from_bytes(redis_client.get(key))
        survivors += 1
        stale += any(v < floors[d] for d, v in entry.docs)
    assert stale == 0
    # The race was real: writes landed, stale ones were refused, and invalidations deleted some.
    assert sum(landed) > 0 and sum(refused) > 0 and sum(deleted) > 0 and survivors > 0
