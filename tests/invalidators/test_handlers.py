"""The invalidation handler inside the real worker loop, on Tansu, redis-server and Qdrant Edge."""

from __future__ import annotations

from confluent_kafka import Producer

from caches.client import CacheClient
from caches.request import CacheRequest
from invalidators.handlers import InvalidationHandler
from invalidators.invalidation import Invalidator
from schemas.codec import encode_event
from schemas.common import DocRef
from schemas.events import Invalidate, KnowledgeBaseChanged, RequestLogged
from streams.topics import producer_config, topic_name
from streams.worker import Worker, WorkerConfig


def test_invalidation_handler__applies_events_and_dead_letters_what_it_cannot(
    client: CacheClient, kafka_bootstrap: str, unique: str
):
    prefix = f"t{unique}."
    req = CacheRequest(
        "acme", "llama", "v1", "t1", "refunds?", docs=(DocRef(doc_id="kb/r", version=1),)
    )
    res = client.lookup(req)
    assert client.store(res, "30 days").landed
    key = req.key().exact()

    kb = KnowledgeBaseChanged(tenant="acme", doc_id="kb/r", doc_version=2, change="updated")
    entity = Invalidate(tenant="acme", by="entity", value="customer:42")
    stray = RequestLogged(
        request_id="r1",
        tenant="acme",
        model_id="llama",
        model_version="v1",
        template_version="t1",
        prompt="hi",
        cache_outcome="miss",
        latency_ms=1,
        gpu_ms=1,
        tokens_in=1,
        tokens_out=1,
    )
    producer = Producer(producer_config(kafka_bootstrap, embedded=True))
    producer.produce(topic_name("inference.kb-changes", prefix), encode_event(kb), key=b"kb/r")
    producer.produce(topic_name("inference.kb-changes", prefix), encode_event(kb), key=b"kb/r")
    for ev in (entity, stray):
        producer.produce(topic_name("inference.invalidations", prefix), encode_event(ev))
    producer.produce(topic_name("inference.invalidations", prefix), b"not json")
    assert producer.flush(10) == 0

    inv = Invalidator(client.redis, client.semantic)
    handler = InvalidationHandler(inv, close_clients=False)
    cfg = WorkerConfig(
        bootstrap=kafka_bootstrap, group_id=f"g{unique}", embedded=True, topic_prefix=prefix
    )
    worker = Worker(handler, cfg)
    done = worker.run_until(lambda s: s.events + s.dlq >= 5, timeout_s=60)

    assert done, worker.stats
    assert (worker.stats.events, worker.stats.dlq) == (2, 3)
    assert not client.redis.exists(key)
