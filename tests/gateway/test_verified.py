"""STOKER_SEMANTIC_MATCHER=verified through the real gateway: it refuses a look-alike static
serves when no answer vouches for it, serves one static refuses once the shared error budget
holds evidence, and says which rule and level served in the response headers."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from caches.matching.counts import RedisCounts
from caches.matching.error_budget import min_evidence
from caches.matching.verified import LADDER
from simulation.backend.http import SimulatorThread
from tests.gateway.conftest import FAST_SIM, GatewayFactory, client, stack_of
from tests.waiting import wait_for

STORED = [
    "how do i reset my password",
    "i forgot my password, how do i reset it",
    "how can i change my password",
    "what are the steps to reset my password",
]
# cosine 0.81 to the nearest stored phrasing (all-MiniLM-L6-v2): under static 0.92, and over
# every ladder level up to cos>=0.80 with three neighbours agreeing
FAR_PARAPHRASE = "help me recover my password please"
# 0.86 to the far paraphrase, 0.82 to the next: served from level 5 (cos>=0.80, 3 agree) down
NEAR = "i lost my password"
# a backend that understands them all as one question, wording each answer anew
MEANINGS = {p: "password" for p in [*STORED, FAR_PARAPHRASE, NEAR, "How can I reset my password?"]}


@pytest.fixture
def model_sim() -> Iterator[SimulatorThread]:
    with SimulatorThread(dataclasses.replace(FAST_SIM, meanings=MEANINGS, vary_wording=True)) as s:
        yield s


def ask(gw: Any, prompt: str, route: str = "support", tenant: str = "acme") -> Any:
    c = client(gw, tenant)
    return c.chat.completions.with_raw_response.create(
        model="sim-model",
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        extra_body={"stoker": {"route": route}},
    )


def landed(gw: Any) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith('stoker_gateway_stores_total{result="landed"}'):
            return float(line.split()[-1])
    return 0.0


def verified(make_gateway: GatewayFactory, url: str, **kw: Any) -> Any:
    # refresh 0: every lookup reads the shared counts, so a test sees new evidence at once;
    # shadow checks off: no verdict but the test's own moves the budget; a budget no embedding
    # on a loaded machine runs out of; the ladder alone (test_reasons has the cold start and
    # the answer checks' prompt-only fallback)
    kw.setdefault("semantic_cold_start", False)
    kw.setdefault("semantic_answer_checks", False)
    return make_gateway(
        url, semantic_matcher="verified", budget_refresh_s=0, budget_shadow_share=0.0,
        gateway_lookup_budget_ms=5000, **kw,
    )  # fmt: skip


def store_all(gw: Any, prompts: list[str], tenant: str = "acme") -> None:
    for i, p in enumerate(prompts, 1):
        assert ask(gw, p, tenant=tenant).headers["x-stoker-cache"] == "miss", p
        wait_for(lambda i=i: landed(gw) >= i, 20, f"answer {i} to be stored and indexed")


def test_verified__refuses_the_look_alike_static_serves_when_no_answer_vouches(
    make_gateway: GatewayFactory, model_sim: SimulatorThread
) -> None:
    static = make_gateway(
        model_sim.url, semantic_matcher="static", semantic_threshold=0.92,
        gateway_lookup_budget_ms=5000,
    )  # fmt: skip
    store_all(static, STORED[:1])
    hit = ask(static, "How can I reset my password?")  # cosine 0.99
    assert hit.headers["x-stoker-cache"] == "semantic"
    assert hit.headers["x-stoker-rule"] == "cosine>=0.920"

    # another tenant (none of static's entries), and the ladder alone: no cold start
    gw = verified(make_gateway, model_sim.url, semantic_cold_start=False)
    store_all(gw, STORED[:1], tenant="globex")
    # one cached answer and no neighbour answered alike: nothing vouches, so it goes upstream
    miss = ask(gw, "How can I reset my password?", tenant="globex")
    assert miss.headers["x-stoker-cache"] == "miss"


def test_verified__serves_what_static_misses_once_the_shared_budget_allows(
    make_gateway: GatewayFactory, model_sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    gw = verified(make_gateway, model_sim.url)
    store_all(gw, STORED)  # at the strictest level (no evidence) none of them vouch enough
    # No evidence: the strictest level (cos>=0.88): the far paraphrase is not served.
    assert ask(gw, FAR_PARAPHRASE).headers["x-stoker-cache"] == "miss"
    wait_for(lambda: landed(gw) >= len(STORED) + 1, 20, "the far paraphrase's answer to land")
    # The monitor (any replica) found enough strong hits right: every level is shown within 1%.
    counts = RedisCounts(redis_client)
    for _ in range(min_evidence(0.01)):
        counts.add("acme", "support", len(LADDER) - 1, wrong=False)
    hit = ask(gw, NEAR)
    assert hit.headers["x-stoker-cache"] == "semantic", hit.headers
    rule, score = hit.headers["x-stoker-rule"], float(hit.headers["x-stoker-score"])
    assert rule == f"verified:L0:{LADDER[0]}:s5"  # it would pass L5 (cos>=0.70), not L6 (0.88)
    assert LADDER[0].score <= score < 0.92  # static 0.92 would not have served it
    # the budget is per route: another route has no evidence and stays strict
    assert ask(gw, NEAR, route="chat").headers["x-stoker-cache"] == "miss"
    # the gauges the alert reads, for the pair with evidence
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'stoker_served_wrong_budget{route="support",tenant="acme"} 0.01' in metrics
    assert 'stoker_served_wrong_ratio{route="support",tenant="acme"} 0.0' in metrics
    assert 'stoker_served_wrong_ratio_bound{route="support",tenant="acme"}' in metrics


def test_verified__a_bad_budget_fails_at_start_with_the_setting_named() -> None:
    from schemas.errors import UsageError
    from stoker.settings import StokerSettings

    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(UsageError, match=r"STOKER_MAX_WRONG_HIT_RATE=.*greater|less"):
            StokerSettings(max_wrong_hit_rate=bad)
    with pytest.raises(UsageError, match="STOKER_SEMANTIC_MATCHER='learned'"):
        StokerSettings(semantic_matcher="learned")


def test_verified__the_gateway_s_log_feeds_the_monitor_which_audits_the_served_hit(
    make_gateway: GatewayFactory,
    model_sim: SimulatorThread,
    redis_client: redis.Redis,
    redis_url: str,
    kafka_bootstrap: str,
    unique: str,
    qdrant_path: Path,
) -> None:
    from schemas.codec import decode_event
    from schemas.events import HitAudited
    from stoker.registry import monitor_handler
    from stoker.wiring import worker_config
    from streams.worker import Worker
    from tests.streams.conftest import read_topic

    prefix = f"mon{unique}."
    kafka = {"kafka_bootstrap": kafka_bootstrap, "kafka_broker": "tansu", "topic_prefix": prefix}
    # the monitor's settings too: it runs in the gateway's process, on its Stack
    monitor = {"monitor_share": 1.0, "monitor_qps": 100.0, "monitor_backend_url": model_sim.url}
    gw = verified(make_gateway, model_sim.url, **kafka, **monitor)
    store_all(gw, STORED)
    counts = RedisCounts(redis_client)
    for _ in range(min_evidence(0.01)):
        counts.add("acme", "support", len(LADDER) - 1, wrong=False)
    assert ask(gw, NEAR).headers["x-stoker-cache"] == "semantic"
    # The monitor, as `stoker worker monitor` builds it, on the gateway's own request log.
    stack = stack_of(gw)
    h = monitor_handler(stack)
    worker = Worker(h, worker_config(stack.settings, h))
    n = len(STORED) + 1  # the misses' events and the hit's
    assert worker.run_until(lambda st: st.events >= n, 60)
    got = read_topic(kafka_bootstrap, prefix + "stoker.audit", 1)
    [audit] = [decode_event(m.value()) for m in got]
    assert isinstance(audit, HitAudited)
    assert (audit.query, audit.route, audit.verdict, audit.counted) == (
        NEAR,
        "support",
        "same",
        True,
    )
    assert audit.rule == f"verified:L0:{LADDER[0]}:s5" and audit.strength == 5
    assert audit.served_prompt in STORED
    # its verdict joined the shared counts at the hit's strength
    assert counts.read("acme", "support", len(LADDER))[5] == (1, 0)
