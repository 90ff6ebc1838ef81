"""Why a response did not hit, in X-Stoker-Reason, through the real gateway with the openai SDK:
a semantic lookup over its budget (semantic_deadline), a look-alike the matcher would not serve
(semantic_unsure, with the best candidate's score), nothing near (semantic_none), a look-alike
with no answer evidence yet (no_evidence_yet), an answer cut at max_tokens (not_stored, on its
repeat and its paraphrases), a prompt over the cache's limit (forwarded, bypass), and a request
that sent no temperature (temperature_unset, with what to set) apart from one that sent > 0.
And the cold start: a young cache serves the user's four paraphrases of a cached question."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from caches.embedders import BatchingEmbedder, embed_deadline
from caches.matching.cold import DEFAULT_COLD
from caches.matching.fallback import DEFAULT_FALLBACK
from simulation.backend.http import SimulatorThread
from tests.gateway.conftest import FAST_SIM, GatewayFactory, client
from tests.gateway.upstreams import Script, Served
from tests.waiting import wait_for

CACHED = "how do i reset my password"
# The user's four paraphrases: cosine 0.96-0.99 to CACHED (all-MiniLM-L6-v2), no guard fires.
PARAPHRASES = [
    "How can I reset my password?",
    "how to reset my password",
    "What do I do to reset my password?",
    "I need to reset my password, how?",
]
MEANINGS = {p: "password" for p in [CACHED, *PARAPHRASES]}


@pytest.fixture
def model_sim() -> Iterator[SimulatorThread]:
    with SimulatorThread(dataclasses.replace(FAST_SIM, meanings=MEANINGS, vary_wording=True)) as s:
        yield s


def ask(gw: Any, prompt: str, tenant: str = "acme", **params: Any) -> Any:
    return client(gw, tenant).chat.completions.with_raw_response.create(
        model="sim-model", messages=[{"role": "user", "content": prompt}], **params
    )


def metric(gw: Any, series: str) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def store(gw: Any, prompt: str, tenant: str = "acme") -> None:
    before = metric(gw, 'stoker_gateway_stores_total{result="landed"}')
    assert ask(gw, prompt, tenant, temperature=0).headers["x-stoker-cache"] == "miss"
    wait_for(
        lambda: metric(gw, 'stoker_gateway_stores_total{result="landed"}') > before,
        20, "the answer to be stored and indexed",
    )  # fmt: skip


def test_reasons__no_temperature_is_temperature_unset_and_says_what_to_send(
    make_gateway: GatewayFactory, model_sim: SimulatorThread
) -> None:
    gw = make_gateway(model_sim.url, gateway_default_temperature=1.0)
    series = 'stoker_gateway_bypass_total{reason="temperature_unset"}'
    before = metric(gw, series)
    unset = ask(gw, CACHED)  # the SDK sends no temperature
    assert unset.headers["x-stoker-cache"] == "bypass"
    reason = unset.headers["x-stoker-reason"]
    assert reason.startswith("temperature_unset: ")
    assert "temperature=0" in reason and "STOKER_GATEWAY_DEFAULT_TEMPERATURE=0" in reason
    sampled = ask(gw, CACHED, temperature=0.7)  # chosen: not the same thing
    assert sampled.headers["x-stoker-reason"] == "temperature>0"
    assert metric(gw, series) == before + 1
    assert ask(gw, CACHED, temperature=0).headers["x-stoker-cache"] == "miss"


def test_reasons__a_declined_look_alike_is_semantic_unsure_with_its_score(
    make_gateway: GatewayFactory, model_sim: SimulatorThread
) -> None:
    # no cold start and no answer checks: the ladder alone, whose strictest level wants three
    # agreeing neighbours
    gw = make_gateway(
        model_sim.url, semantic_matcher="verified", semantic_cold_start=False,
        semantic_answer_checks=False,
    )  # fmt: skip
    landed = 'stoker_gateway_stores_total{result="landed"}'
    before = metric(gw, landed)  # the process's counter: earlier tests' stores count too
    first = ask(gw, CACHED, temperature=0)
    assert first.headers["x-stoker-cache"] == "miss"
    assert first.headers["x-stoker-reason"].startswith("semantic_none: ")
    wait_for(lambda: metric(gw, landed) > before, 20, "the answer to be stored and indexed")
    miss = ask(gw, PARAPHRASES[0], temperature=0)
    assert miss.headers["x-stoker-cache"] == "miss"
    reason = miss.headers["x-stoker-reason"]
    assert reason.startswith("semantic_unsure: score=0.9"), reason
    score = float(reason.split("score=")[1].split(";")[0])
    assert float(miss.headers["x-stoker-score"]) == score and 0.95 < score < 1.0
    assert "verified serves L7" in reason and "cold rule" not in reason


def test_reasons__a_young_cache_serves_the_four_paraphrases_by_the_cold_rule(
    make_gateway: GatewayFactory, model_sim: SimulatorThread
) -> None:
    # the cold start, without the answer checks (as shipped, they put a young cache on the
    # prompt-only fallback first: the next test)
    gw = make_gateway(model_sim.url, semantic_answer_checks=False)
    store(gw, CACHED)
    for p in PARAPHRASES:
        hit = ask(gw, p, temperature=0)
        assert hit.headers["x-stoker-cache"] == "semantic", (p, hit.headers)
        assert hit.headers["x-stoker-rule"].startswith(f"verified:cold:{DEFAULT_COLD}")
        assert "x-stoker-reason" not in hit.headers
    # another amount is no look-alike, however near: the number guard holds on the cold rule
    store(gw, "how do i reset my password in 2 steps", tenant="globex")
    other = ask(gw, "how do i reset my password in 3 steps", tenant="globex", temperature=0)
    assert other.headers["x-stoker-cache"] == "miss"
    assert other.headers["x-stoker-reason"].startswith("semantic_unsure: score=")


def test_reasons__answers_not_shown_to_separate_put_it_on_the_prompt_only_fallback(
    make_gateway: GatewayFactory, model_sim: SimulatorThread
) -> None:
    # As shipped: until the backend's own traffic shows its answers tell meanings apart, the
    # verified matcher serves the prompt-only rule and says so in the rule, the reason of a
    # miss and a gauge.
    gw = make_gateway(model_sim.url, budget_refresh_s=0)
    store(gw, CACHED, tenant="initech")
    hit = ask(gw, PARAPHRASES[0], tenant="initech", temperature=0)
    assert hit.headers["x-stoker-cache"] == "semantic", hit.headers
    assert hit.headers["x-stoker-rule"] == f"verified:fallback:unknown:{DEFAULT_FALLBACK}"
    gauge = 'stoker_semantic_prompt_fallback{tenant="initech"}'
    assert metric(gw, gauge) == 1.0
    # (a tenant of their own: at the fallback's cosine, "... in 2 steps" is a look-alike of
    # CACHED, which names no number for the guard to compare)
    store(gw, "how do i reset my password in 2 steps", tenant="hooli")
    other = ask(gw, "how do i reset my password in 3 steps", tenant="hooli", temperature=0)
    assert other.headers["x-stoker-cache"] == "miss"
    reason = other.headers["x-stoker-reason"]
    assert reason.startswith("semantic_unsure: score=0.9"), reason
    assert f"prompt-only fallback ({DEFAULT_FALLBACK}) found none: the prompts differ (number)" in (
        reason
    )


def test_reasons__a_look_alike_with_no_answer_evidence_yet_is_no_evidence_yet(
    make_gateway: GatewayFactory, model_sim: SimulatorThread
) -> None:
    # As shipped, on a young cache: "how do i recover my account" is a look-alike of CACHED
    # (cosine 0.68) that only evidence of the backend's answers could vouch for, and none is in.
    gw = make_gateway(model_sim.url, budget_refresh_s=0)
    store(gw, CACHED, tenant="umbrella")
    miss = ask(gw, "how do i recover my account", tenant="umbrella", temperature=0)
    assert miss.headers["x-stoker-cache"] == "miss"
    reason = miss.headers["x-stoker-reason"]
    assert reason.startswith(
        "no_evidence_yet: the cache has not yet seen enough answers to tell whether look-alikes "
        "mean the same; "
    ), reason
    assert "near pairs" not in reason and "score=0.6" in reason


def test_reasons__a_semantic_lookup_past_its_budget_is_semantic_deadline(
    make_gateway: GatewayFactory, model_sim: SimulatorThread
) -> None:
    gw = make_gateway(model_sim.url, gateway_lookup_budget_ms=300)
    emb = gw.parts.gate.cache.embedder.inner
    assert isinstance(emb, BatchingEmbedder)

    # The embedder's lookup thread busy with a long pass (64 texts of ~250 tokens: seconds on
    # one thread): a lookup's embed cannot finish within 300 ms, and is dropped, not computed
    # late. (A background pass would not do: lookups have a thread of their own.)
    def hog_lookups() -> None:
        with embed_deadline(time.monotonic() + 60):
            emb.embed([("word " * 250 + str(i)) for i in range(64)])

    hog = threading.Thread(target=hog_lookups)
    hog.start()
    wait_for(lambda: emb.queued() == 0, 10, "the long pass to start")
    dropped = emb.dropped
    late = ask(gw, "a question nobody asked before", temperature=0)
    assert late.headers["x-stoker-cache"] == "miss"
    assert late.headers["x-stoker-reason"] == (
        "semantic_deadline: the semantic lookup took over the 300 ms lookup budget"
    )
    assert metric(gw, 'stoker_gateway_bypass_total{reason="semantic_deadline"}') >= 1
    hog.join(60)
    wait_for(lambda: emb.dropped > dropped, 10, "the late embed to be dropped unrun")
    # the embedder free again: the next lookup fits its budget and says what it found
    again = ask(gw, "which river runs through the old town", temperature=0)
    assert again.headers["x-stoker-reason"].startswith(("semantic_none", "semantic_unsure"))


def test_reasons__an_answer_cut_at_max_tokens_makes_its_repeat_and_paraphrases_say_not_stored(
    make_gateway: GatewayFactory, model_sim: SimulatorThread
) -> None:
    # No wait between the requests: the not-stored mark is searchable when the response ends.
    gw = make_gateway(model_sim.url)
    cut = ask(gw, CACHED, tenant="wonka", temperature=0, max_tokens=2)
    assert cut.parse().choices[0].finish_reason == "length"
    assert cut.headers["x-stoker-reason"].startswith("semantic_none: ")
    again = ask(gw, CACHED, tenant="wonka", temperature=0, max_tokens=2)
    assert again.headers["x-stoker-cache"] == "miss"
    assert again.headers["x-stoker-reason"] == (
        "not_stored: finish_reason=length: the last answer to this request was not cached"
    )
    for p in PARAPHRASES:
        miss = ask(gw, p, tenant="wonka", temperature=0, max_tokens=2)
        assert miss.headers["x-stoker-cache"] == "miss"
        reason = miss.headers["x-stoker-reason"]
        assert reason.startswith("not_stored: finish_reason=length: the last answer to a "), p
    # streamed, the same
    streamed = client(gw, "wonka").chat.completions.with_raw_response.create(
        model="sim-model", messages=[{"role": "user", "content": CACHED}], temperature=0,
        max_tokens=2, stream=True,
    )  # fmt: skip
    assert streamed.headers["x-stoker-reason"].startswith("not_stored: finish_reason=length")
    assert [c.choices[0].finish_reason for c in streamed.parse() if c.choices][-1] == "length"
    # never across tenants
    other = ask(gw, PARAPHRASES[0], tenant="slate", temperature=0, max_tokens=2)
    assert other.headers["x-stoker-reason"].startswith("semantic_none: ")


def test_reasons__a_prompt_over_the_cache_limit_is_forwarded_and_says_so(
    make_gateway: GatewayFactory, scripted: Served, script: Script
) -> None:
    gw = make_gateway(scripted.url)
    series = 'stoker_gateway_bypass_total{reason="over_limit"}'
    before = metric(gw, series)
    long = "tell me about this log: " + "x" * 40_000
    got = ask(gw, long, temperature=0)
    assert got.headers["x-stoker-cache"] == "bypass"
    reason = got.headers["x-stoker-reason"]
    assert reason.startswith("bypass: prompt over the cache's limit (40024 chars; "), reason
    assert script.seen[-1]["messages"][-1]["content"] == long  # forwarded whole
    assert got.parse().choices[0].message.content == script.text
    assert metric(gw, series) == before + 1
    # the model's own limit is the upstream's to state: its error passes through unchanged
    script.status = 400
    with pytest.raises(openai.BadRequestError) as e:
        ask(gw, long, temperature=0)
    assert e.value.body == {"message": "scripted failure", "type": "server_error"}
    assert e.value.response.headers["x-stoker-reason"].startswith("bypass: prompt over the ")
