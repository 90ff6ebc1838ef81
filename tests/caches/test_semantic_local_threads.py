"""qdrant-client's local mode (":memory:", what a single-process set-up and the tests run) is
not safe across threads; the store the wiring builds for it serialises its calls, so a gateway
thread upserting while a worker thread reads never sees half a point."""

from __future__ import annotations

import threading
import time

import numpy as np
from qdrant_client import QdrantClient

from caches.keys import namespace
from caches.semantic.base import SemanticPoint
from caches.semantic.server import ServerSemanticStore
from schemas.errors import CacheUnavailable

NS = namespace("acme", "m", "v1", "t1")


def _point(i: int) -> SemanticPoint:
    v = np.random.default_rng(i).normal(size=8).astype(np.float32)
    return SemanticPoint(
        entry_key=f"k{i}", vector=v / np.linalg.norm(v), ns=NS, context_hash="c",
        params_hash="p", expires_at=time.time() + 60, prompt=f"q{i}", answer_vector=v,
    )  # fmt: skip


def test_server_store__a_serialised_local_store_reads_safely_while_another_thread_writes() -> None:
    store = ServerSemanticStore(QdrantClient(":memory:"), "threads", dim=8, serialize=True)
    errors: list[Exception] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for i in range(300):  # bounded in count; each upsert a new point with two vectors
                store.upsert([_point(i)])
        finally:
            done.set()

    t = threading.Thread(target=writer)
    t.start()
    reads = 0
    deadline = time.monotonic() + 60
    while not done.is_set() and time.monotonic() < deadline:
        try:
            store.count({"tenant": "acme"})
        except CacheUnavailable as e:  # the unserialised store's IndexError, translated
            errors.append(e)
        reads += 1
    t.join(10)
    assert reads > 0 and errors == []
    assert store.count({"tenant": "acme"}) == 300
