"""The live demo's request log: week 1 written into it as the gateway would have, without
answers, and the gateway's own events of the day read back for their gpu_ms."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from caches.request import LookupResult
from demo.live.client import TEMPLATE, request_of
from demo.live.scenario import OLD_VERSION, LiveScenario
from gateway.cachegate import Decision
from gateway.completions import Served as GatewayServed
from gateway.completions import log_event
from gateway.identity import resolve
from stoker.settings import StokerSettings
from stoker.wiring import gateway_options
from streams.topics import TOPICS, consumer_config, producer_config, topic_name


def publish_week1(settings: StokerSettings, rows: list[dict[str, Any]], sc: LiveScenario) -> None:
    """Each row into inference.requests as the event of a miss (logged_without_answer)."""
    topic = topic_name("inference.requests", settings.topic_prefix)
    opts = gateway_options(settings, upstream_url=settings.gateway_upstream_url)
    producer = Producer(
        producer_config(settings.kafka_bootstrap or "", embedded=True, **{"linger.ms": 5})
    )
    for row in rows:
        ev = logged_without_answer(row, sc, opts)
        producer.produce(topic, orjson.dumps(ev), key=row["tenant"].encode())
        producer.poll(0)
    producer.flush(30)


def logged_without_answer(row: dict[str, Any], sc: LiveScenario, opts: Any) -> dict[str, Any]:
    """The v2 event the gateway publishes for a row it answered by a miss, without the answer:
    the request as it went upstream, the log's own time, cost and tokens."""
    body, headers = request_of(row, sc, {})
    r = resolve("chat", body, headers, "/v1/chat/completions", opts)
    d = Decision(LookupResult("miss"), None, OLD_VERSION, row["ts"].timestamp())
    ev = log_event(r, d, GatewayServed("miss", None, row["latency_ms"]), opts, OLD_VERSION)
    return ev | {
        "ts": row["ts"].isoformat(), "request_id": row["request_id"], "gpu_ms": row["gpu_ms"],
        "tokens_in": row["tokens_in"], "tokens_out": row["tokens_out"],
        "template_version": TEMPLATE,
    }  # fmt: skip


def read_request_log(
    settings: StokerSettings, want: int, idle_s: float = 3.0, timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    """The gateway's own events of inference.requests (not week 1's replay): outcome, tenant,
    gpu_ms. Read until `want` are in, or nothing came for idle_s (Tansu's high watermark is
    wrong, so the end of a partition is not known: DESIGN.md)."""
    bootstrap = settings.kafka_bootstrap or ""
    topic = topic_name("inference.requests", settings.topic_prefix)
    c = Consumer(consumer_config(bootstrap, f"live-log-{uuid.uuid4().hex[:6]}", embedded=True))
    c.assign(
        [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(TOPICS["inference.requests"])]
    )
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    try:
        while len(out) < want and time.monotonic() < deadline and time.monotonic() - last < idle_s:
            for m in c.consume(500, timeout=0.2):
                if m.error() is not None:
                    continue
                last = time.monotonic()
                ev = orjson.loads(m.value() or b"{}")
                if not str(ev.get("request_id", "")).startswith("req-"):  # week 1's log ids
                    out.append(
                        {
                            k: ev.get(k)
                            for k in (
                                "tenant",
                                "cache_outcome",
                                "gpu_ms",
                                "latency_ms",
                                "model_version",
                            )
                        }
                    )
    finally:
        c.close()
    return out
