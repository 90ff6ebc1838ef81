"""The request log v2: what the gateway publishes to Tansu decodes as RequestLogged v2, carries
the replayable request and the answer, and the traffic worker learns from it; without a broker
the gateway still serves and counts what it did not publish."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
import redis
from confluent_kafka import Producer

from gateway.requestlog import KafkaLog
from schemas.codec import decode_event
from schemas.events import RequestLogged
from stoker.wiring import worker_config
from streams.topics import ensure_topics, topic_name
from streams.worker import Worker
from tests.gateway.conftest import GatewayFactory, client
from tests.gateway.upstreams import Script, Served
from tests.streams.conftest import read_topic
from tests.waiting import wait_for
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile
from warmers.traffic.worker import TrafficHandler

RAG = [
    {"role": "system", "content": "Answer from the context.\n[kb/reset] Press 'Forgot password'."},
    {"role": "user", "content": "How do I reset my password?"},
]
EXT = {"stoker": {"docs": [{"doc_id": "kb/reset"}], "route": "support"}}


def test_request_log__v2_events_carry_the_request_and_the_answer_and_are_learned_from(
    make_gateway: GatewayFactory,
    scripted: Served,
    script: Script,
    kafka_bootstrap: str,
    unique: str,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    prefix = f"log{unique}."
    gw = make_gateway(scripted.url, kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu",
                      topic_prefix=prefix)  # fmt: skip
    c = client(gw, **{"X-Stoker-Template-Version": "support-v3"})
    miss = c.chat.completions.with_raw_response.create(
        model="m", messages=RAG, temperature=0, max_tokens=64, extra_body=EXT
    )
    wait_for(lambda: redis_client.keys("stk:{t:acme}:e:*"), 5, "the answer to land")
    hit = c.chat.completions.with_raw_response.create(
        model="m", messages=RAG, temperature=0, max_tokens=64, extra_body=EXT, stream=True
    )
    assert hit.headers["x-stoker-cache"] == "exact"
    list(hit.parse())
    topic = topic_name("inference.requests", prefix)
    events = [decode_event(m.value()) for m in read_topic(kafka_bootstrap, topic, 2)]
    assert all(isinstance(e, RequestLogged) and e.schema_version == 2 for e in events)
    first, second = sorted(events, key=lambda e: e.cache_outcome != "miss")  # type: ignore[union-attr]
    assert isinstance(first, RequestLogged) and isinstance(second, RequestLogged)
    assert (first.cache_outcome, second.cache_outcome) == ("miss", "exact")
    assert first.request is not None and first.request.api == "chat"
    assert first.request.body == {"model": "m", "messages": RAG, "temperature": 0, "max_tokens": 64}
    assert second.request is not None and second.request.body == first.request.body  # no stream
    assert first.prompt == "How do I reset my password?" and first.template_version == "support-v3"
    assert [(d.doc_id, d.version) for d in first.context_docs] == [("kb/reset", None)]
    assert first.doc_generations == {"kb/reset": 0}  # seen at lookup: a warm checks it
    assert first.route == "support" and first.params.api == "chat"
    assert first.answer is not None and first.answer.text == script.text
    assert second.answer is not None and second.answer.text is None  # a hit: digest only
    assert second.answer.digest == first.answer.digest and second.answer.vector_id
    assert first.cache_key == miss.headers["x-stoker-key"] == second.cache_key
    assert second.cache_rule == "exact" and first.gpu_ms > 0 and second.gpu_ms == 0
    assert (first.cache_source, second.cache_source) == (None, "live")  # a live miss's entry

    handler = TrafficHandler(TrafficProfile(redis.Redis.from_url(redis_url)))
    from stoker.settings import StokerSettings

    s = StokerSettings(kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu", topic_prefix=prefix,
                       redis_url=redis_url)  # fmt: skip
    worker = Worker(handler, worker_config(s, handler, f"g{unique}"))
    assert worker.run_until(lambda st: st.events >= 2, 30)
    assert worker.stats.dlq == 0
    profile = TrafficProfile(redis_client)
    (top,) = profile.top_queries("acme", "m", "support-v3", range(HOURS_PER_WEEK), 10)
    assert top.count == 2
    reps = profile.representatives("acme", "m", "support-v3", [top.qkey])
    assert reps[top.qkey]["request"]["body"]["messages"] == RAG  # what a warm replays


def test_request_log__without_a_broker_the_gateway_serves_and_counts(
    make_gateway: GatewayFactory, scripted: Served
) -> None:
    gw = make_gateway(scripted.url)
    before = _metric(gw.url, 'stoker_gateway_log_events_total{result="unpublished"}')
    for _ in range(3):
        client(gw).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}], temperature=0
        )
    assert _metric(gw.url, 'stoker_gateway_log_events_total{result="unpublished"}') == before + 3


def test_request_log__a_broker_that_is_down_never_slows_a_response(
    make_gateway: GatewayFactory, scripted: Served
) -> None:
    gw = make_gateway(scripted.url, kafka_bootstrap="127.0.0.1:1", worker_create_topics=False)
    c = client(gw)
    t0 = time.perf_counter()
    for i in range(20):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}],
                                  temperature=0)  # fmt: skip
    assert time.perf_counter() - t0 < 10  # no response waited for the log


def test_request_log__a_full_buffer_drops_and_counts(kafka_bootstrap: str, unique: str) -> None:
    topic = f"drops{unique}"
    ensure_topics(kafka_bootstrap, {topic: 1})
    # A real producer whose queue holds one message, behind a buffer of one event.
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 1})
    log = KafkaLog(producer, topic, capacity=1)
    offered = [log.offer({"tenant": "acme", "n": i}) for i in range(200)]
    wait_for(lambda: log.dropped >= 150, 5, "the drops to be counted")
    assert offered.count(True) >= 1 and log.published == 0
    log.close(timeout_s=0.5)
    assert log.dropped + log.published == 200


def _metric(url: str, series: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_request_log__decodes_as_the_model_says(tmp_path: Path) -> None:
    """The gateway builds events as dicts (no pydantic on the hot path): the model must agree."""
    from caches.request import LookupResult
    from gateway.cachegate import Answer, Decision
    from gateway.completions import Served as S
    from gateway.completions import log_event
    from gateway.identity import resolve
    from gateway.options import GatewayOptions

    opts = GatewayOptions(upstream_url="http://x", default_tenant="acme", default_temperature=0)
    body = {"model": "m", "messages": RAG, "stoker": EXT["stoker"], "tools": [{"type": "function"}]}
    r = resolve("chat", body, {}, "/v1/chat/completions", opts)
    d = Decision(LookupResult("miss", key="stk:{t:acme}:e:m@v:t:abc"), None, "v", time.time())
    ev = log_event(r, d, S("miss", Answer("text", "stop", 3, 4, 12.5)), opts, "v")
    parsed = decode_event(orjson.dumps(ev))
    assert isinstance(parsed, RequestLogged) and parsed.params.model_extra == {
        "tools": [{"type": "function"}]
    }
    assert parsed.request is not None and "stoker" not in parsed.request.body
