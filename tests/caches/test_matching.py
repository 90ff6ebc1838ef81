"""Matchers: guards, verification by the backend's answers, policy thresholds, and the client plug-in."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from caches.client import CacheClient
from caches.embedders import SentenceTransformerEmbedder
from caches.matching import (
    Candidate,
    Guarded,
    Query,
    StaticThreshold,
    first_violation,
)
from caches.matching.error_budget import ErrorBudget, MemoryCounts
from caches.matching.verified import Level, VerifiedMatcher
from caches.policy import CachePolicy
from caches.request import CacheRequest

C2F = "how do i convert celsius to fahrenheit"
F2C = "how do i convert fahrenheit to celsius"

# What the warmer saw: three questions, a few phrasings each, with the backend's answers.
BANK = {
    "multiply by 9/5 and add 32": [
        "how do i convert celsius to fahrenheit",
        "how can i convert celsius into fahrenheit",
        "formula to turn celsius into fahrenheit",
        "change a temperature from celsius to fahrenheit",
    ],
    "your balance is 120 dollars": [
        "what is my account balance",
        "what's the balance of my account",
        "tell me my bank balance",
        "how much money is in my account",
    ],
    "sunny, 21 degrees": [
        "what is the weather like today",
        "how is the weather today",
        "what's the weather today",
        "tell me today's weather",
    ],
}


def _cands(embedder: SentenceTransformerEmbedder, query: str, cached: list[str]):
    vecs = embedder.embed([query, *cached])
    scores = vecs[1:] @ vecs[0]
    cands = [
        Candidate(f"k{i}", p, float(s), vecs[i + 1])
        for i, (p, s) in enumerate(zip(cached, scores, strict=True))
    ]
    return vecs[0], sorted(cands, key=lambda c: -c.score)


@pytest.mark.parametrize(
    ("query", "cached", "guard"),
    [
        (F2C, C2F, "order"),
        ("transfer $50 to savings", "transfer $500 to savings", "number"),
        ("can i pay my bill online", "can't i pay my bill online", "negation"),
        ("what is my account balance", "what's the balance of my account", None),
        ("convert celsius to fahrenheit", "how do i convert celsius into fahrenheit", None),
    ],
)
def test_guards__name_the_difference_a_cosine_misses(query, cached, guard):
    assert first_violation(query, cached) == guard


def test_static__keeps_the_rule_string_of_the_threshold(embedder):
    vec, cands = _cands(embedder, "what's the weather today", ["what is the weather like today"])
    m = StaticThreshold()
    got = m.decide(Query("what's the weather today", vec, 0.5), cands)
    assert got is not None and got.rule == "cosine>=0.500"
    assert m.decide(Query("what's the weather today", vec, 0.999), cands) is None
    assert m.stats.lookups == 2 and m.stats.hits == {"cosine>=0.500": 1}


def test_guarded__vetoes_a_flip_static_serves_and_counts_it(embedder):
    vec, cands = _cands(embedder, F2C, [C2F])
    assert cands[0].score > 0.95  # the cosine alone would serve it at any usual threshold
    assert StaticThreshold().decide(Query(F2C, vec, 0.92), cands) is not None
    m = Guarded(StaticThreshold())
    assert m.decide(Query(F2C, vec, 0.92), cands) is None
    assert m.stats.rejected_by_guard == {"order": 1}


def test_match_stats__reach_prometheus_summed_over_matchers(embedder):
    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    vec, cands = _cands(embedder, F2C, [C2F])
    before = (
        sample("stoker_semantic_match_decisions_total"),
        sample("stoker_semantic_match_hits_total", {"rule": "cosine>=0.900"}),
        sample("stoker_semantic_guard_rejections_total", {"guard": "order"}),
    )
    for _ in range(2):  # two matchers, one process-wide sum
        StaticThreshold().decide(Query(F2C, vec, 0.9), cands)
        Guarded(StaticThreshold()).decide(Query(F2C, vec, 0.9), cands)
    after = (
        sample("stoker_semantic_match_decisions_total"),
        sample("stoker_semantic_match_hits_total", {"rule": "cosine>=0.900"}),
        sample("stoker_semantic_guard_rejections_total", {"guard": "order"}),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [4, 2, 2]


def _bank_cands(embedder: SentenceTransformerEmbedder, query: str, answers: dict[str, str]):
    """What one search with answers returns: each banked prompt as an entry with its answer
    vector, best score first (`answers` overrides what the backend said to some prompts)."""
    prompts = [p for ps in BANK.values() for p in ps]
    said = {p: a for a, ps in BANK.items() for p in ps} | answers
    pv = embedder.embed([query, *prompts])
    av = embedder.embed([f"The answer: {said[p]}." for p in prompts])
    scores = pv[1:] @ pv[0]
    cands = [
        Candidate(f"k{i}", p, float(s), answer=av[i])
        for i, (p, s) in enumerate(zip(prompts, scores, strict=True))
    ]
    return pv[0], sorted(cands, key=lambda c: -c.score)


def _verified(level: int = 0, **kw) -> VerifiedMatcher:
    ladder = (Level(0.5, 1), Level(0.5, 2), Level(0.995, 3))
    return VerifiedMatcher(lambda q: level, ladder=ladder, **kw)


def test_verified__serves_where_the_neighbours_answers_agree(embedder):
    vec, cands = _bank_cands(embedder, "tell me today's weather please", {})
    m = _verified()
    got = m.decide(Query("tell me today's weather please", vec, 0.92), cands)
    assert got is not None and "weather" in cands[got.index].prompt
    assert got.rule.startswith("verified:L0:cos>=0.50,agree>=1,margin>=0.00:s")
    assert m.stats.hits[got.rule] == 1


def test_verified__a_neighbour_answered_otherwise_blocks_what_is_not_clearly_nearer(embedder):
    q = "tell me today's weather please"
    vec, cands = _bank_cands(embedder, q, {})
    near = [c for c in cands if "weather" in c.prompt]
    # The backend answered one weather phrasing with something else entirely: the query may be
    # that something else, unless the candidate is clearly nearer than it.
    other = near[-1].prompt
    vec, cands = _bank_cands(
        embedder, q, {other: "your parcel left the depot and arrives on monday"}
    )
    a = _verified().assess(Query(q, vec, 0.92), cands)
    served, odd = cands[a.index], next(c for c in cands if c.prompt == other)
    assert "weather" in served.prompt and served.prompt != other
    assert a.margin == pytest.approx(served.score - odd.score)
    for margin, serves in ((a.margin - 0.01, True), (a.margin + 0.01, False)):
        m = VerifiedMatcher(lambda q: 0, ladder=(Level(0.5, 1, margin),))
        assert (m.decide(Query(q, vec, 0.92), cands) is not None) is serves
    # Answered alike, the same phrasing is no objection at any margin short of the score.
    vec, cands = _bank_cands(embedder, q, {})
    m = VerifiedMatcher(lambda q: 0, ladder=(Level(0.5, 1, a.margin + 0.01),))
    assert m.decide(Query(q, vec, 0.92), cands) is not None


def test_verified__the_level_gates_and_strength_says_which_levels_would_serve(embedder):
    q = "tell me today's weather please"
    vec, cands = _bank_cands(embedder, q, {})
    a = _verified().assess(Query(q, vec, 0.92), cands)
    assert a.index >= 0 and a.strength == 1  # 3 agreeing neighbours, but the score is < 0.995
    assert _verified(level=1).decide(Query(q, vec, 0.92), cands) is not None
    strict = _verified(level=2)
    assert strict.decide(Query(q, vec, 0.92), cands) is None
    assert strict.stats.verification == {"below_level": 1}


def test_verified__probes_are_evidence_never_served(embedder):
    q = "tell me today's weather please"
    vec, cands = _bank_cands(embedder, q, {})
    probes = [replace(c, kind="probe") for c in cands]
    assert _verified().decide(Query(q, vec, 0.92), probes) is None


def test_verified__ladders_only_tighten():
    with pytest.raises(ValueError, match="loosen"):
        VerifiedMatcher(lambda q: 0, ladder=(Level(0.8, 2), Level(0.7, 3)))
    with pytest.raises(ValueError, match="loosen"):
        VerifiedMatcher(lambda q: 0, ladder=(Level(0.6, 2, 0.2), Level(0.7, 3, 0.1)))


def test_conservative__static_threshold_and_guards_bind_any_matcher(embedder):
    vec, cands = _cands(embedder, F2C, [C2F])
    cands = [replace(c, answer=c.vector) for c in cands]
    m = VerifiedMatcher(lambda q: 0, ladder=(Level(0.5, 0),))
    assert m.decide(Query(F2C, vec, 0.92), cands) is not None  # no neighbour objects: served
    assert m.decide(Query(F2C, vec, 0.92, conservative=True), cands) is None
    assert m.stats.rejected_by_guard == {"order": 1}


def test_policy__route_overrides_tenant_and_conservative_raises_the_floor():
    p = CachePolicy(
        threshold=0.92,
        tenant_thresholds={"acme": 0.9},
        route_thresholds={"acme/faq": 0.85, "*/chat": 0.88},
        conservative_routes=frozenset({"*/medical"}),
        conservative_threshold=0.96,
    )
    assert p.threshold_for("acme") == 0.9
    assert p.threshold_for("acme", "faq") == 0.85
    assert p.threshold_for("globex", "faq") == 0.92
    assert p.threshold_for("globex", "chat") == 0.88
    assert p.threshold_for("acme", "medical") == 0.96
    assert p.conservative_for("acme", "medical") and not p.conservative_for("acme", "faq")
    assert not p.conservative_for("acme")


def _client(base: CacheClient, matcher) -> CacheClient:
    return CacheClient(
        base.redis, semantic=base.semantic, embedder=base.embedder, policy=base.policy,
        matcher=matcher,
    )  # fmt: skip


def _req(prompt: str) -> CacheRequest:
    return CacheRequest("acme", "llama-3-8b", "v1", "t1", prompt)


def test_client__guarded_matcher_refuses_the_flip_the_default_serves(cache_client):
    res = cache_client.lookup(_req(C2F))
    assert cache_client.store(res, "multiply by 9/5 and add 32").landed
    served = cache_client.lookup(_req(F2C))
    assert served.outcome == "semantic" and served.rule == "cosine>=0.920"
    guarded = _client(cache_client, Guarded(StaticThreshold()))
    res = guarded.lookup(_req(F2C))
    assert res.outcome == "miss" and res.ticket is not None
    assert guarded.matcher.stats.rejected_by_guard == {"order": 1}


def test_client__verified_matcher_indexes_answers_serves_and_shadow_checks(cache_client):
    budget = ErrorBudget(MemoryCounts(), levels=2, max_wrong_rate=0.01)
    ladder = (Level(0.6, 1), Level(0.99, 1))
    level = {"now": 0}
    client = CacheClient(
        cache_client.redis, semantic=cache_client.semantic, embedder=cache_client.embedder,
        policy=cache_client.policy, budget=budget, shadow_share=1.0,
        matcher=VerifiedMatcher(lambda q: level["now"], ladder=ladder),
    )  # fmt: skip
    for prompt in ("what is the weather like today", "how is the weather today"):
        res = client.lookup(_req(prompt))
        assert res.outcome == "miss"
        assert client.store(res, "Sunny and 21 degrees all afternoon.").semantic_indexed
    hit = client.lookup(_req("tell me today's weather please"))
    assert hit.outcome == "semantic" and hit.entry is not None
    assert "weather" in hit.entry.prompt
    assert hit.rule.startswith("verified:L0:cos>=0.60,agree>=1,margin>=0.00:s0")
    assert 0.6 <= (hit.score or 0) < 0.99
    # At the strict level the same query misses, but the miss carries its best candidate, and
    # the live answer it then gets is judged against that candidate's: evidence for level 0.
    level["now"] = 1
    miss = client.lookup(_req("what's the weather today"))
    assert miss.outcome == "miss" and miss.shadow is not None and miss.shadow.strength == 0
    assert client.store(miss, "Sunny, 21 degrees this afternoon.").landed
    assert budget.bounds("acme", "")[0].checked == 1
    assert budget.bounds("acme", "")[0].wrong == 0
    assert client.lookup(_req("tell me my bank balance")).outcome == "miss"
