"""Invalidation latency, event produced -> every affected entry gone, on the embedded stack.

KnowledgeBaseChanged events are produced at a steady 100 and 1,000 events/s into Tansu; the
invalidation handler runs in the real worker loop (streams/worker.py) on redis-server and
Qdrant Edge. Each event makes ENTRIES_PER_DOC entries (Redis + vector) stale. An event's
latency ends when the handler's apply() returns for its batch: by then its entries are gone
from Redis and Qdrant (checked for every event afterwards). Goal: p99 < 250 ms.
ratio = p99 / 250 ms (goal <= 1). Vectors come from a hash embedder (no model to load):
deletion cost does not depend on what the vectors mean.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import emit, pct
from confluent_kafka import Producer

from caches.client import CacheClient
from caches.embedders import Embedder, Vectors
from caches.embedding_cache import CachedEmbedder
from caches.request import CacheRequest
from caches.semantic.edge import EdgeSemanticStore
from invalidators.handlers import InvalidationHandler
from invalidators.invalidation import Invalidator
from schemas.codec import encode_event
from schemas.common import DocRef
from schemas.events import Event, KnowledgeBaseChanged
from stoker.embedded import EmbeddedStack
from stoker.wiring import build_redis
from streams.topics import producer_config, topic_name
from streams.worker import Worker, WorkerConfig

ENTRIES_PER_DOC = 2
GOAL_P99_MS = 250.0


class HashEmbedder(Embedder):
    id = "bench:hash"
    dim = 384

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, hashlib.sha256(t.encode()).digest()[0] % self.dim] = 1.0
        return out


class TimedHandler(InvalidationHandler):
    """Records when each event's batch was applied (its entries deleted)."""

    def __init__(self, inv: Invalidator) -> None:
        super().__init__(inv, close_clients=False)
        self.done_at: dict[str, float] = {}

    def apply(self, events: list[Event]) -> None:
        super().apply(events)
        now = time.perf_counter()
        for ev in events:
            self.done_at[ev.event_id] = now


def seed(cache: CacheClient, docs: list[str]) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for d in docs:
        for j in range(ENTRIES_PER_DOC):
            req = CacheRequest(
                "acme", "llama", "v1", "t1", f"q{j} {d}", docs=(DocRef(doc_id=d, version=1),)
            )
            res = cache.lookup(req, use_semantic=False)
            assert cache.store(res, "an answer").landed
            keys.setdefault(d, []).append(req.key().exact())
    return keys


def run_rate(
    stack: EmbeddedStack, cache: CacheClient, rate: int, seconds: float, poll_s: float
) -> None:
    n = int(rate * seconds)
    docs = [f"kb/r{rate}-d{i}" for i in range(n)]
    keys = seed(cache, docs)
    prefix = f"bench{rate}-{time.time_ns()}."
    inv = Invalidator(cache.redis, cache.semantic)
    handler = TimedHandler(inv)
    boot = stack.kafka_bootstrap
    cfg = WorkerConfig(
        bootstrap=boot, group_id=f"g{prefix}", embedded=True, topic_prefix=prefix, poll_s=poll_s
    )
    worker = Worker(handler, cfg)
    thread = threading.Thread(target=worker.run_until, args=(lambda s: s.events >= n + 1, 120))
    producer = Producer(producer_config(boot, embedded=True, **{"linger.ms": 0}))
    topic = topic_name("inference.kb-changes", prefix)

    def event(doc: str) -> KnowledgeBaseChanged:
        return KnowledgeBaseChanged(tenant="acme", doc_id=doc, doc_version=2, change="updated")

    thread.start()
    try:
        warm = event("kb/warm-up")  # wait until the worker has joined and applied one event
        producer.produce(topic, encode_event(warm))
        producer.flush(10)
        deadline = time.monotonic() + 30
        while warm.event_id not in handler.done_at and time.monotonic() < deadline:
            time.sleep(0.01)
        assert warm.event_id in handler.done_at, "worker did not start within 30 s"
        sent: dict[str, float] = {}
        t0 = time.perf_counter()
        for i, d in enumerate(docs):
            due = t0 + i / rate
            while (now := time.perf_counter()) < due:
                time.sleep(min(due - now, 0.001))
            ev = event(d)
            blob = encode_event(ev)
            sent[ev.event_id] = time.perf_counter()
            producer.produce(topic, blob, key=d.encode())
            producer.poll(0)
        producer.flush(10)
    finally:
        thread.join(timeout=150)
    assert not thread.is_alive()
    lat = [handler.done_at[e] - t for e, t in sent.items()]
    assert len(lat) == n, f"{len(lat)} of {n} events applied"
    left = sum(cache.redis.exists(k) for ks in keys.values() for k in ks)
    assert left == 0, f"{left} stale entries survived"
    assert (
        cache.semantic is not None
        and cache.semantic.count({"model_version": "v1", "tenant": "acme"}) == 0
    )
    emit(
        f"invalidation_latency_{rate}",
        events=n,
        events_per_s=rate,
        entries_per_event=ENTRIES_PER_DOC,
        p50_ms=round(pct(lat, 50), 1),
        p99_ms=round(pct(lat, 99), 1),
        max_ms=round(pct(lat, 100), 1),
        ratio=round(pct(lat, 99) / GOAL_P99_MS, 3),
        goal_p99_ms_max=GOAL_P99_MS,
        worker_poll_s=poll_s,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rates", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--poll-s", type=float, default=0.02, help="worker consume timeout")
    args = ap.parse_args()
    with EmbeddedStack() as stack, tempfile.TemporaryDirectory() as tmp:
        r = build_redis(stack.settings())
        store = EdgeSemanticStore(Path(tmp) / "edge", dim=HashEmbedder.dim)
        cache = CacheClient(r, semantic=store, embedder=CachedEmbedder(HashEmbedder(), r, 600))
        try:
            for rate in args.rates:
                run_rate(stack, cache, rate, args.seconds, args.poll_s)
        finally:
            store.close()


if __name__ == "__main__":
    main()
