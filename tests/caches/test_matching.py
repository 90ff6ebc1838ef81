"""Matchers: guards, answer-agreement verification, policy thresholds, and the client plug-in."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import REGISTRY

from caches.client import CacheClient, CacheRequest
from caches.embedders import SentenceTransformerEmbedder
from caches.matching import (
    AnswerAgreement,
    AnswerBank,
    Candidate,
    Guarded,
    Query,
    StaticThreshold,
    first_violation,
)
from caches.matching.learned import answer_id
from caches.policy import CachePolicy

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


def _bank(embedder: SentenceTransformerEmbedder, k: int = 3) -> AnswerBank:
    bank = AnswerBank(embedder.dim, k=k)
    prompts = [p for ps in BANK.values() for p in ps]
    answers = [a for a, ps in BANK.items() for _ in ps]
    bank.observe(embedder.embed(prompts), answers)
    return bank


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


def test_answer_bank__votes_for_the_answer_of_the_nearest_phrasings(embedder):
    bank = _bank(embedder)
    vote = bank.votes(embedder.embed(["what's my balance right now"]))[0]
    assert vote.answer == answer_id("Your balance is 120 dollars.")  # normalised equivalence
    assert vote.count == 3 and vote.nearest > vote.other


def test_answer_bank__rejects_misshapen_observations(embedder):
    with pytest.raises(ValueError, match="vectors"):
        AnswerBank(embedder.dim).observe(np.zeros((2, 3), dtype=np.float32), ["a", "b"])


def test_answer_agreement__serves_the_agreeing_candidate_not_the_closest(embedder):
    bank = _bank(embedder)
    query = "how's the weather looking today"
    vec, cands = _cands(embedder, query, ["what is my account balance", "what's the weather today"])
    m = AnswerAgreement(bank, floor=0.0, votes=3)
    got = m.decide(Query(query, vec, 0.92), cands)
    assert got is not None and cands[got.index].prompt == "what's the weather today"
    assert got.rule.startswith("answers-agree>=3/3")
    assert m.stats.verification["agree"] == 1


def test_answer_agreement__refuses_when_answers_differ_or_votes_are_weak(embedder):
    bank = _bank(embedder)
    query = "how is the weather today"
    vec, cands = _cands(embedder, query, ["tell me my bank balance"])
    m = AnswerAgreement(bank, floor=0.0, votes=3)
    assert m.decide(Query(query, vec, 0.92), cands) is None
    assert m.stats.verification["disagree"] == 1
    with pytest.raises(ValueError, match="votes"):
        AnswerAgreement(bank, votes=4)


def test_conservative__static_threshold_and_guards_bind_any_matcher(embedder):
    bank = _bank(embedder)
    vec, cands = _cands(embedder, F2C, [C2F])
    m = AnswerAgreement(bank, floor=0.0, votes=3)
    assert m.decide(Query(F2C, vec, 0.92), cands) is not None  # same answer region: served
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


def test_client__learned_matcher_records_score_and_rule(cache_client, embedder):
    res = cache_client.lookup(_req("what is the weather like today"))
    assert cache_client.store(res, "sunny, 21 degrees").landed
    client = _client(cache_client, AnswerAgreement(_bank(embedder), floor=0.6, votes=3))
    hit = client.lookup(_req("tell me today's weather please"))
    assert hit.outcome == "semantic" and hit.entry is not None
    assert hit.entry.prompt == "what is the weather like today"
    assert hit.rule == "answers-agree>=3/3,cos>=0.60"
    assert hit.score is not None and 0.6 <= hit.score < 1.0
    assert client.matcher.stats.as_dict()["semantic_hits"] == 1
    assert client.lookup(_req("tell me my bank balance")).outcome == "miss"
