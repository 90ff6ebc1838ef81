"""The wrong-hit monitor worker on the embedded broker: served semantic hits from the request log
re-asked of a simulated backend that answers like a model, judged by meaning, one HitAudited
each on stoker.audit, verdicts counted once in the shared budget, poison dead-lettered."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import REGISTRY

from audits.judge import Auditor
from audits.monitor import MonitorHandler, MonitorOptions, sampled
from backends.client import OpenAIBackend
from caches.client import CacheClient
from caches.embedding_cache import CachedEmbedder
from caches.matching.answers import AnswerJudge
from caches.matching.bounds import Strata
from caches.matching.counts import RedisCounts
from caches.matching.error_budget import ErrorBudget
from caches.matching.verified import LADDER
from caches.policy import CachePolicy
from caches.request import CacheRequest
from caches.semantic.base import SemanticQuery
from caches.semantic.edge import EdgeSemanticStore
from schemas.codec import decode_event
from schemas.events import HitAudited
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig
from stoker.settings import StokerSettings
from stoker.wiring import build_publisher, worker_config
from streams.topics import ensure_topics, topic_name
from streams.worker import Worker
from tests.events import UNUSED_BACKEND, encode, request
from tests.streams.conftest import produce, read_topic

TIMEOUT_S = 60
FAST = SimConfig(slots=16, queue=256, prefill_ms_per_token=0.01, decode_ms_per_token=0.2)
# What the backend understands: the two password phrasings are one question; the balance
# question is another, served (wrongly) the weather answer below.
MEANINGS = {
    "how do i reset my password": "password",
    "how can i reset my password?": "password",
    "how do i reset my password please": "password",
    "what is the weather today": "weather",
    "what is my bank balance": "balance",
    "what is the refund policy": "refund-v1",
}
RULE = "verified:L0:cos>=0.62,agree>=1,margin>=0.10:s5"


@pytest.fixture
def model_sim() -> Iterator[SimulatorThread]:
    with SimulatorThread(dataclasses.replace(FAST, meanings=MEANINGS, vary_wording=True)) as s:
        yield s


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique: str) -> StokerSettings:
    return StokerSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, kafka_broker="tansu",
        topic_prefix=f"m{unique}.", worker_batch_size=100, worker_backoff_base_s=0.01,
        worker_backoff_max_s=0.05, gateway_upstream_url=UNUSED_BACKEND,
    )  # fmt: skip


@pytest.fixture
def cache(redis_client: redis.Redis, embedder: Any, tmp_path: Path) -> Iterator[CacheClient]:
    store = EdgeSemanticStore(tmp_path / "edge", dim=embedder.dim)
    yield CacheClient(
        redis_client, semantic=store, embedder=CachedEmbedder(embedder, redis_client, 600),
        policy=CachePolicy(exact_ttl_s=600, semantic_ttl_s=600),
    )  # fmt: skip
    store.close()


def sim_answer(sim: SimulatorThread, prompt: str) -> str:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": prompt}]}
    reply = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=10).json()
    return str(reply["choices"][0]["message"]["content"])


def req(prompt: str) -> CacheRequest:
    return CacheRequest("acme", "sim-model", "v1", "t1", prompt)


def cached(cache: CacheClient, prompt: str, answer: str) -> str:
    """Store `answer` under `prompt`; the entry key's digest, as the request log names it."""
    miss = cache.lookup(req(prompt))
    assert cache.store(miss, answer).landed
    return miss.key.rsplit(":", 1)[-1]


def served(i: int, query: str, digest: str, **kw: Any) -> dict[str, Any]:
    """A v2 RequestLogged of a semantic hit, as the gateway publishes it."""
    body = {"model": "sim-model", "messages": [{"role": "user", "content": query}],
            "temperature": 0}  # fmt: skip
    fields = {
        "schema_version": 2, "model_id": "sim-model", "model_version": "v1",
        "template_version": "t1", "prompt": query, "context_docs": [], "route": "support",
        "cache_outcome": "semantic", "gpu_ms": 0.0, "tokens_out": 0,
        "request": {"api": "chat", "body": body}, "cache_key": digest, "cache_rule": RULE,
        "cache_score": 0.81, "answer": {"digest": "d" * 64, "vector_id": digest},
    }  # fmt: skip
    return request(i, **(fields | kw))


def handler(cache: CacheClient, s: StokerSettings, sim: SimulatorThread, **opts: Any):
    budget = ErrorBudget(RedisCounts(cache.redis), len(LADDER), 0.01)
    return MonitorHandler(
        cache, lambda: OpenAIBackend(sim.url), build_publisher(s), Auditor(AnswerJudge()),
        budget, options=MonitorOptions(**({"share": 1.0, "qps": 1000.0} | opts)),
    )  # fmt: skip


def audits(s: StokerSettings, n: int) -> list[HitAudited]:
    got = read_topic(s.kafka_bootstrap or "", topic_name("stoker.audit", s.topic_prefix), n)
    out = [decode_event(m.value()) for m in got]
    assert all(isinstance(a, HitAudited) for a in out)
    return out  # type: ignore[return-value]


def test_monitor__judges_served_hits_by_meaning_counts_once_and_dead_letters_poison(
    cache: CacheClient, settings: StokerSettings, model_sim: SimulatorThread
) -> None:
    right = cached(
        cache, "how do i reset my password", sim_answer(model_sim, "how do i reset my password")
    )
    wrong = cached(
        cache, "what is the weather today", sim_answer(model_sim, "what is the weather today")
    )
    topic = topic_name("inference.requests", settings.topic_prefix)
    ensure_topics(settings.kafka_bootstrap or "", {topic: 1})
    values = [
        encode(served(0, "How can I reset my password?", right)),
        b"not json",
        encode(served(1, "what is my bank balance", wrong)),
        encode(request(2)),  # a v1 miss: nothing to audit
        encode(served(3, "what is my bank balance", "0" * 32)),  # its entry is gone
    ]
    produce(settings.kafka_bootstrap or "", topic, values)
    h = handler(cache, settings, model_sim)
    assert Worker(h, worker_config(settings, h)).run_until(
        lambda st: st.events + st.dlq >= len(values), TIMEOUT_S
    )
    first = {a.query: a for a in audits(settings, 2)}
    ok, bad = first["How can I reset my password?"], first["what is my bank balance"]
    assert (ok.verdict, bad.verdict) == ("same", "different"), (ok, bad)
    assert ok.counted and bad.counted and ok.strength == 5 and ok.rule == RULE
    assert (ok.tenant, ok.route, ok.served_prompt) == (
        "acme",
        "support",
        "how do i reset my password",
    )
    counts = RedisCounts(cache.redis)
    assert counts.read("acme", "support", len(LADDER))[5] == (2, 1)
    assert counts.read_strata("acme", "support", len(LADDER))[5] == Strata(0, 0, 2, 1)  # audits
    dlq = read_topic(
        settings.kafka_bootstrap or "", topic_name("stoker.dlq", settings.topic_prefix), 1
    )
    assert [m.value() for m in dlq] == [b"not json"]
    # The same records delivered again (another group: a rewind, a rebalance): re-asked and
    # published again, but the budget counts each request once.
    h2 = handler(cache, settings, model_sim)
    again = Worker(h2, worker_config(settings, h2, group=f"again-{settings.topic_prefix}"))
    assert again.run_until(lambda st: st.events + st.dlq >= len(values), TIMEOUT_S)
    repeat = audits(settings, 4)[2:]
    assert sorted(a.event_id for a in repeat) == ["e0", "e1"] and not any(a.counted for a in repeat)
    assert counts.read("acme", "support", len(LADDER))[5] == (2, 1)
    # the probes: what the backend said to each query now lies beside it in the store, as
    # evidence for the verified matcher's next lookups there
    key = req("How can I reset my password?").key()
    assert cache.embedder is not None and cache.semantic is not None
    vec = cache.embedder.embed_one("acme", key.prompt_norm)
    q = SemanticQuery(vec, key.ns, key.context_hash, key.params_hash, 0.99, time.time(), 5, True)
    probes = [m for m in cache.semantic.search(q) if m.kind == "probe"]
    assert probes and probes[0].answer_vector is not None


def test_monitor__the_qps_cap_drops_what_it_cannot_carry_and_sampling_is_stable(
    cache: CacheClient, settings: StokerSettings, model_sim: SimulatorThread
) -> None:
    from schemas.events import RequestLogged

    right = cached(cache, "how do i reset my password", "Open settings and choose reset.")
    events = [
        RequestLogged.model_validate(served(i, "How can I reset my password?", right))
        for i in range(5)
    ]
    before = audited("over_rate")
    h = handler(cache, settings, model_sim, qps=1 / 3600)  # one token, then one an hour
    h.apply(events)  # type: ignore[arg-type]
    assert audited("over_rate") - before == 4
    assert len(audits(settings, 1)) == 1
    # sampling is by event id: the same ids on every delivery, about the share overall
    ids = [f"ev{i}" for i in range(2000)]
    picked = [sampled(i, 0.2) for i in ids]
    assert picked == [sampled(i, 0.2) for i in ids] and 0.16 < sum(picked) / 2000 < 0.24
    assert not any(sampled(i, 0.0) for i in ids) and all(sampled(i, 1.0) for i in ids)
    with pytest.raises(ValueError, match="share"):
        MonitorOptions(share=1.5)


def test_monitor__adds_no_load_to_a_backend_that_shows_it_is_full(
    cache: CacheClient, settings: StokerSettings
) -> None:
    """Off-peak by the backend's own signals: after a 429 the monitor drops its samples (counted
    "busy") instead of re-asking; an idle backend gets every re-ask; with busy_load None, the
    cap alone paces it."""
    from schemas.events import RequestLogged

    right = cached(cache, "how do i reset my password", "Open settings and choose reset.")
    events = [
        RequestLogged.model_validate(served(i, "How can I reset my password?", right))
        for i in range(5)
    ]
    results = ("busy", "backend_error", "same", "different")
    with SimulatorThread(SimConfig(slots=0, queue=0)) as full:  # every request gets a 429
        before = [audited(r) for r in results]
        handler(cache, settings, full).apply(events)  # type: ignore[arg-type]
        got = [audited(r) - b for r, b in zip(results, before, strict=True)]
        assert got == [4, 1, 0, 0]  # one re-ask found it full; the other four never went
        before = [audited(r) for r in results]
        # a cap no 5 re-asks can reach: 429s come back in well under the 1 ms a token takes at 1000/s
        handler(cache, settings, full, busy_load=None, qps=1e6).apply(events)  # type: ignore[arg-type]
        assert [audited(r) - b for r, b in zip(results, before, strict=True)][:2] == [0, 5]
    with SimulatorThread(FAST) as idle:
        before = [audited(r) for r in results]
        handler(cache, settings, idle).apply(events)  # type: ignore[arg-type]
        got = [audited(r) - b for r, b in zip(results, before, strict=True)]
        assert got[:2] == [0, 0] and got[2] + got[3] == 5
    with pytest.raises(ValueError, match="busy_load"):
        MonitorOptions(busy_load=0.0)


def audited(result: str) -> float:
    return REGISTRY.get_sample_value("stoker_monitor_audits_total", {"result": result}) or 0.0


def test_monitor__built_from_settings_with_the_serving_budget(
    settings: StokerSettings, qdrant_path: Path
) -> None:
    from caches.matching.error_budget import ServingLevels
    from stoker.registry import monitor_handler
    from stoker.stack import Stack

    s = settings.model_copy(
        update={"semantic_matcher": "verified", "qdrant_path": qdrant_path, "monitor_qps": 3.0,
                "monitor_share": 0.5, "max_wrong_hit_rate": 0.02, "monitor_stale_share": 0.3,
                "monitor_stale_window_s": 600.0}
    )  # fmt: skip
    stack = Stack(s)
    h = monitor_handler(stack)
    try:
        assert isinstance(h, MonitorHandler)
        assert (h.options.share, h.options.qps) == (0.5, 3.0)
        assert (h.options.stale_share, h.options.stale_window_s) == (0.3, 600.0)
        assert h.options.busy_load == 0.5
        assert h.budget is not None and isinstance(h.budget.counts, RedisCounts)
        assert h.budget.delta == 0.02 and isinstance(h.levels, ServingLevels)
        assert h.auditor.budget is None  # the handler counts each verdict once itself
        assert h.cache is stack.cache and h.sink is stack.publisher  # the process's own
    finally:
        h.close()
        stack.close()


def test_monitor__re_asks_exact_hits_served_soon_after_an_invalidation_and_flags_stale_ones(
    cache: CacheClient, settings: StokerSettings, model_sim: SimulatorThread
) -> None:
    """The backend's knowledge changed (a new refund policy) but an entry built on the old one
    survived: an exact hit of it served after the change is re-asked, judged different, and
    counted stale. Exact hits of a tenant with no change, or served before it, are not asked."""
    from datetime import datetime, timedelta

    from invalidators.handlers import InvalidationHandler
    from invalidators.invalidation import Invalidator
    from schemas.events import KnowledgeBaseChanged, RequestLogged

    policy = "what is the refund policy"
    # (asked in the other order than the re-asks below: the simulator's wording is seeded by
    # its call count, and no two answers compared here should share their boilerplate)
    kept = cached(
        cache, "how do i reset my password", sim_answer(model_sim, "how do i reset my password")
    )
    old = cached(cache, policy, sim_answer(model_sim, policy))
    at = datetime(2025, 3, 3, 10, 0, tzinfo=UTC)
    # The invalidation worker applies a change of another doc of acme's: it notes the time.
    inv = InvalidationHandler(Invalidator(cache.redis), close_clients=False)
    inv.apply(
        [KnowledgeBaseChanged(tenant="acme", doc_id="faq", doc_version=2, change="updated", ts=at)]
    )  # type: ignore[list-item]

    def exact(i: int, query: str, digest: str, tenant: str = "acme", after_s: float = 60.0):
        ts = (at + timedelta(seconds=after_s)).isoformat()
        fields = served(i, query, digest, cache_outcome="exact", cache_rule=None,
                        cache_score=None, tenant=tenant, ts=ts)  # fmt: skip
        return RequestLogged.model_validate(fields)

    events = [
        exact(0, policy, old),  # stale: the backend now answers the new policy
        exact(1, "how do i reset my password", kept),  # still what the backend says
        exact(2, policy, old, tenant="globex"),  # no change in globex
        exact(3, policy, old, after_s=-60.0),  # served before the change
        exact(4, policy, old, after_s=7200.0),  # long after: outside the window
    ]
    changed = dataclasses.replace(
        FAST, meanings=MEANINGS | {policy: "refund-v2"}, vary_wording=True
    )
    before = stale("different"), stale("same")
    with SimulatorThread(changed) as now:
        h = handler(cache, settings, now, stale_share=1.0, stale_window_s=3600.0)
        h.apply(events)  # type: ignore[arg-type]
    got = {a.event_id: a for a in audits(settings, 2)}
    assert sorted(got) == ["e0", "e1"]
    assert (got["e0"].verdict, got["e1"].verdict) == ("different", "same"), got
    assert all(
        a.cache_outcome == "exact" and a.strength is None and not a.counted for a in got.values()
    )
    assert got["e0"].served_prompt == policy
    assert (stale("different") - before[0], stale("same") - before[1]) == (1, 1)
    # stale checks say nothing of the matcher: the semantic budget is untouched
    assert RedisCounts(cache.redis).read("acme", "support", len(LADDER)) == [(0, 0)] * len(LADDER)


def stale(result: str) -> float:
    labels = {"tenant": "acme", "result": result}
    return REGISTRY.get_sample_value("stoker_monitor_stale_checks_total", labels) or 0.0


def test_monitor__judges_a_verified_hit_against_the_answers_that_vouched_for_it(
    cache: CacheClient, settings: StokerSettings, model_sim: SimulatorThread
) -> None:
    """With the verified matcher, the fresh answer is judged against the centroid of the served
    answer and its agreeing neighbours' (the centroid bar, 0.58), as the shadow check judges a
    near miss; with a matcher that weighs no answers, against the served answer (the pair
    bar, DEFAULT_ANSWER_BAR)."""
    from caches.matching.verified import VerifiedMatcher
    from schemas.events import RequestLogged

    verified = CacheClient(
        cache.redis, semantic=cache.semantic, embedder=cache.embedder, policy=cache.policy,
        matcher=VerifiedMatcher(lambda q: 0),
    )  # fmt: skip
    for prompt in ("how do i reset my password", "how can i reset my password?"):
        assert verified.store(verified.lookup(req(prompt)), sim_answer(model_sim, prompt)).landed
    query = "how do i reset my password please"
    hit = verified.lookup(req(query))
    assert hit.outcome == "semantic" and hit.key is not None, hit
    event = RequestLogged.model_validate(served(0, query, hit.key.rsplit(":", 1)[-1]))
    h = handler(verified, settings, model_sim)
    h.apply([event])
    plain = handler(cache, settings, model_sim)  # the static matcher's client: no centroid
    plain.apply([RequestLogged.model_validate(served(1, query, hit.key.rsplit(":", 1)[-1]))])
    got = {a.event_id: a for a in audits(settings, 2)}
    assert got["e0"].verdict == got["e1"].verdict == "same"
    from caches.matching.answers import DEFAULT_ANSWER_BAR, DEFAULT_CENTROID_BAR

    assert got["e0"].reason == f"cosine>={DEFAULT_CENTROID_BAR:.2f}"
    assert got["e1"].reason == f"cosine>={DEFAULT_ANSWER_BAR:.2f}"
