"""Cache metrics: every lookup tallied by outcome with its latency, stores by bounded reason."""

from __future__ import annotations

import pytest
import redis
from prometheus_client import REGISTRY, generate_latest

from caches import metrics as M
from caches.client import CacheClient
from caches.request import CacheRequest
from schemas.common import RequestParams


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def req(prompt: str = "what is the boiling point of water", **kw) -> CacheRequest:
    fields = {"tenant": "acme", "model_id": "m", "model_version": "v1", "template_version": "t1"}
    return CacheRequest(prompt=prompt, **(fields | kw))


def test_lookup_metrics__outcomes_latency_and_store_reasons(redis_client: redis.Redis):
    c = CacheClient(redis_client)
    before = {o: sample("stoker_cache_lookups_total", outcome=o) for o in M.OUTCOMES}
    seconds_before = sample("stoker_cache_lookup_seconds_count", outcome="exact")
    landed_before = sample("stoker_cache_stores_total", result="landed", reason="landed")
    refused_before = sample("stoker_cache_stores_total", result="refused", reason="not cacheable")

    miss = c.lookup(req())
    assert c.store(miss, "100 C at sea level").landed
    for _ in range(3):
        assert c.lookup(req()).outcome == "exact"
    bypass = c.lookup(req(params=RequestParams(temperature=0.7)))
    assert not c.store(bypass, "sampled").landed

    moved = {o: sample("stoker_cache_lookups_total", outcome=o) - before[o] for o in M.OUTCOMES}
    assert moved == {"exact": 3, "semantic": 0, "negative": 0, "miss": 1, "bypass": 1}
    assert sample("stoker_cache_lookup_seconds_count", outcome="exact") - seconds_before == 3
    assert sample("stoker_cache_lookup_seconds_bucket", outcome="exact", le="+Inf") >= 3
    assert sample("stoker_cache_lookup_seconds_sum", outcome="exact") > 0
    landed = sample("stoker_cache_stores_total", result="landed", reason="landed")
    refused = sample("stoker_cache_stores_total", result="refused", reason="not cacheable")
    assert (landed - landed_before, refused - refused_before) == (1, 1)
    # the exposition Prometheus scrapes parses the collector's output
    assert b'stoker_cache_lookups_total{outcome="exact"}' in generate_latest(REGISTRY)


def test_lookup_metrics__semantic_hit_score_observed(cache_client: CacheClient):
    n0 = sample("stoker_cache_semantic_hit_score_count")
    s0 = sample("stoker_cache_semantic_hit_score_sum")
    miss = cache_client.lookup(req("How do I convert Celsius to Fahrenheit?"))
    assert cache_client.store(miss, "multiply by 9/5, add 32").landed
    hit = cache_client.lookup(req("how can I convert celsius into fahrenheit"))
    assert hit.outcome == "semantic"
    assert sample("stoker_cache_semantic_hit_score_count") - n0 == 1
    assert sample("stoker_cache_semantic_hit_score_sum") - s0 == pytest.approx(hit.score)


def test_store_reason__bounded_labels():
    assert M.store_reason("stale: generation moved at c") == "stale"
    assert M.store_reason("response over 256000 bytes") == "response over"
    assert M.store_reason("not cacheable: temperature>0") == "not cacheable"
    assert M.store_reason("something new 12345") == "other"


def test_budget_gauges__per_tenant_and_route_with_the_bound_once_it_can_be_within_budget():
    from caches.matching.error_budget import ErrorBudget, MemoryCounts, ServingLevels, min_evidence

    budget = ErrorBudget(MemoryCounts(), levels=3, max_wrong_rate=0.01)
    levels = ServingLevels(budget, refresh_s=0)
    M.BUDGET_GAUGES.watch(levels)
    labels = {"tenant": "gauge-t", "route": "faq"}
    for _ in range(50):
        budget.record("gauge-t", "faq", 2, wrong=False)
    budget.record("gauge-t", "faq", 2, wrong=True)
    assert levels.level("gauge-t", "faq") == 2  # 1 in 51: the strictest level, not shown safe
    assert sample("stoker_served_wrong_ratio", **labels) == pytest.approx(1 / 51)
    assert sample("stoker_served_wrong_budget", **labels) == 0.01
    # 51 verdicts cannot show 1%: no bound, so the alert stays quiet while a route proves itself
    assert REGISTRY.get_sample_value("stoker_served_wrong_ratio_bound", labels) is None
    for _ in range(min_evidence(0.01)):
        budget.record("gauge-t", "faq", 2, wrong=False)
    levels.level("gauge-t", "faq")  # a lookup reads the counts again
    bound = REGISTRY.get_sample_value("stoker_served_wrong_ratio_bound", labels)
    assert bound is not None and 0.01 < bound < 0.02  # 1 in 350: still over a 1% budget
    # nothing is exported for a pair no lookup asked about
    assert (
        REGISTRY.get_sample_value("stoker_served_wrong_budget", {"tenant": "x", "route": ""})
        is None
    )
