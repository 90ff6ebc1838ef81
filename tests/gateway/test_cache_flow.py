"""The gateway through the OpenAI SDK: hits and misses, identity, HTTP cache semantics, the
live version, herd protection and failing open, against redis-server and real upstreams."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest
import redis

from caches.live import LiveVersions
from simulation.backend.http import SimulatorThread
from stoker.wiring import GATEWAY_CLIENT_NAME
from tests.gateway.conftest import GatewayFactory, client
from tests.gateway.upstreams import Script, Served
from tests.waiting import wait_for

MSG = [{"role": "user", "content": "How do I reset my password?"}]


def ask(c: openai.OpenAI, messages: list[dict[str, Any]] = MSG, **kw: Any) -> Any:
    kw.setdefault("temperature", 0)
    return c.chat.completions.with_raw_response.create(model="sim-model", messages=messages, **kw)


def outcome(raw: Any) -> str:
    return str(raw.headers["x-stoker-cache"])


@pytest.mark.topologies  # the asyncio cluster client too: see tests/conftest.py
def test_gateway__miss_then_exact_hit_with_the_same_answer_and_headers(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    gw = make_gateway(sim.url)
    c = client(gw)
    first, second = ask(c), ask(c)
    assert (outcome(first), outcome(second)) == ("miss", "exact")
    a, b = first.parse(), second.parse()
    assert a.choices[0].message.content == b.choices[0].message.content
    assert b.choices[0].finish_reason == "stop" and b.usage.completion_tokens > 0
    assert (
        second.headers["x-stoker-rule"] == "exact" and float(second.headers["x-stoker-score"]) == 1
    )
    assert second.headers["x-stoker-key"] == first.headers["x-stoker-key"]
    assert second.headers["x-stoker-source"] == "live" and "x-stoker-source" not in first.headers
    assert int(second.headers["age"]) >= 0
    assert sim.stats().served == 1


def test_gateway__completions_route_keys_apart_from_chat(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    gw = make_gateway(sim.url)
    c = client(gw)
    q = "How do I reset my password?"
    chat = ask(c, [{"role": "user", "content": q}])
    comp = c.completions.with_raw_response.create(model="sim-model", prompt=q, temperature=0)
    again = c.completions.with_raw_response.create(model="sim-model", prompt=q, temperature=0)
    assert (outcome(chat), outcome(comp), outcome(again)) == ("miss", "miss", "exact")
    assert again.parse().choices[0].text == comp.parse().choices[0].text


@pytest.mark.topologies  # the asyncio cluster client too: see tests/conftest.py
def test_gateway__tenants_never_share_an_entry(make_gateway: GatewayFactory, sim: SimulatorThread):
    gw = make_gateway(sim.url)
    assert outcome(ask(client(gw, "acme"))) == "miss"
    assert outcome(ask(client(gw, "globex"))) == "miss"
    assert outcome(ask(client(gw, "globex"))) == "exact"


def test_gateway__sampling_is_never_cached_and_no_temperature_means_the_default(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    gw = make_gateway(sim.url, gateway_default_temperature=1.0)
    c = client(gw)
    hot = [ask(c, temperature=0.7) for _ in range(2)]
    assert [outcome(r) for r in hot] == ["bypass", "bypass"]
    assert "temperature>0" in hot[0].headers["x-stoker-reason"]
    none_given = c.chat.completions.with_raw_response.create(model="sim-model", messages=MSG)
    assert outcome(none_given) == "bypass"
    assert redis_client.keys("stk:{t:acme}:e:*") == []
    assert outcome(ask(c)) == "miss"  # temperature 0: cached


def test_gateway__multi_turn_history_keys_the_answer(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    gw = make_gateway(sim.url)
    c = client(gw)
    q = {"role": "user", "content": "and in French?"}
    about_cats = [
        {"role": "user", "content": "say cat"},
        {"role": "assistant", "content": "cat"},
        q,
    ]
    about_dogs = [
        {"role": "user", "content": "say dog"},
        {"role": "assistant", "content": "dog"},
        q,
    ]
    assert outcome(ask(c, about_cats)) == "miss"
    assert outcome(ask(c, about_dogs)) == "miss"  # same question, another conversation
    assert outcome(ask(c, about_dogs)) == "exact"
    assert outcome(ask(c, [q])) == "miss"  # the question alone is yet another


def test_gateway__template_version_header_or_the_system_prompt_digest(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    gw = make_gateway(sim.url)
    sys_a = [{"role": "system", "content": "You are terse."}, *MSG]
    sys_b = [{"role": "system", "content": "You are verbose."}, *MSG]
    c = client(gw)
    assert [outcome(ask(c, m)) for m in (sys_a, sys_b, sys_a)] == ["miss", "miss", "exact"]
    pinned = client(gw, **{"X-Stoker-Template-Version": "t7"})
    # One template version named by the client: the system prompt's wording no longer keys.
    assert [outcome(ask(pinned, m)) for m in (sys_a, sys_b)] == ["miss", "exact"]


def test_gateway__stoker_extension_scopes_the_entry_and_never_goes_upstream(
    make_gateway: GatewayFactory, scripted: Served, script: Script
) -> None:
    gw = make_gateway(scripted.url)
    c = client(gw)
    ext = {"stoker": {"docs": [{"doc_id": "kb/reset"}], "route": "support"}}
    assert outcome(ask(c, extra_body=ext)) == "miss"
    assert outcome(ask(c, extra_body=ext)) == "exact"
    assert outcome(ask(c)) == "miss"  # no docs: another context
    assert all("stoker" not in body for body in script.seen)
    assert all(not any(k.startswith("x-stoker") for k in h) for h in script.headers)


def test_gateway__cache_control_no_cache_refreshes_and_no_store_writes_nothing(
    make_gateway: GatewayFactory, scripted: Served, script: Script
) -> None:
    gw = make_gateway(scripted.url)
    c = client(gw)
    assert outcome(ask(c)) == "miss"
    script.text = "a newer answer"
    fresh = ask(c, extra_headers={"Cache-Control": "no-cache"})
    assert outcome(fresh) == "miss" and fresh.parse().choices[0].message.content == "a newer answer"
    wait_for(
        lambda: ask(c).parse().choices[0].message.content == "a newer answer",
        5, "the refreshed entry to replace the old one",
    )  # fmt: skip
    other = [{"role": "user", "content": "not to be kept"}]
    assert outcome(ask(c, other, extra_headers={"Cache-Control": "no-store"})) == "miss"
    assert outcome(ask(c, other)) == "miss"


def _gateway_connections(r: Any) -> int:
    """The gateway's open connections, on every node of a cluster or on the one server."""
    nodes = [n.redis_connection for n in r.get_primaries()] if hasattr(r, "get_primaries") else [r]
    return sum(c.get("name") == GATEWAY_CLIENT_NAME for n in nodes for c in n.client_list())


@pytest.mark.topologies  # the asyncio cluster client too: see tests/conftest.py
def test_gateway__connects_before_its_first_request_so_that_one_pays_no_handshake(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    make_gateway(sim.url)
    # A cluster client's first command also fetches the slot map: on a busy machine that took
    # longer than the 50 ms lookup budget, and the first request went upstream uncached.
    assert _gateway_connections(redis_client) >= 1


@pytest.mark.topologies  # the asyncio cluster client too: see tests/conftest.py
def test_gateway__moves_to_the_live_version_without_a_restart(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    gw = make_gateway(sim.url)
    c = client(gw)
    assert ask(c).headers["x-stoker-model-version"] == "default"
    LiveVersions(redis_client).set("sim-model", "v2", deploy_id="d1", accepted_at=time.time())
    wait_for(lambda: ask(c).headers["x-stoker-model-version"] == "v2", 5, "the gateway to move")
    assert outcome(ask(c)) == "exact"  # v2's own entry now
    pinned = ask(c, extra_headers={"X-Stoker-Model-Version": "canary"})
    assert pinned.headers["x-stoker-model-version"] == "canary" and outcome(pinned) == "miss"


def test_gateway__an_api_key_map_names_the_tenant_and_ignores_the_header(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    gw = make_gateway(sim.url, gateway_api_keys={"sk-acme": "acme", "sk-globex": "globex"})
    acme = openai.OpenAI(
        base_url=gw.url + "/v1", api_key="sk-acme", max_retries=0,
        default_headers={"X-Stoker-Tenant": "globex"},  # forged: ignored
    )  # fmt: skip
    assert outcome(ask(acme)) == "miss"
    assert redis_client.keys("stk:{t:globex}:e:*") == [] and redis_client.keys("stk:{t:acme}:e:*")
    stranger = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-nobody", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        ask(stranger)
    assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"


def test_gateway__100_concurrent_identical_misses_make_one_upstream_call(
    make_gateway: GatewayFactory, scripted: Served, script: Script
) -> None:
    script.delay_s = 0.3  # long enough that all 100 arrive while the first is upstream
    gw = make_gateway(scripted.url)
    body = {"model": "m", "messages": MSG, "temperature": 0}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=gw.url, headers={"X-Stoker-Tenant": "acme"}, timeout=30,
            limits=httpx.Limits(max_connections=100),
        ) as h:  # fmt: skip
            return await asyncio.gather(
                *(h.post("/v1/chat/completions", json=body) for _ in range(100))
            )

    replies = asyncio.run(burst())
    assert [r.status_code for r in replies] == [200] * 100
    assert script.calls() == 1
    texts = {r.json()["choices"][0]["message"]["content"] for r in replies}
    assert texts == {script.text}
    assert sum(r.headers.get("x-stoker-coalesced") == "true" for r in replies) >= 90


def test_gateway__redis_down_fails_open_and_is_counted(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_url: str
) -> None:
    """The cache being down never becomes a 5xx: every request goes upstream."""
    gw = make_gateway(sim.url)
    gw_down = make_gateway(sim.url, redis_url="redis://127.0.0.1:1/0")
    for g in (gw, gw_down):
        replies = [ask(client(g)) for _ in range(2)]
        assert all(r.http_response.status_code == 200 for r in replies)
    assert outcome(ask(client(gw_down))) == "bypass"
    metrics = httpx.get(gw_down.url + "/metrics").text
    assert 'stoker_gateway_bypass_total{reason="cache_down"}' in metrics


def test_gateway__a_lookup_over_its_budget_goes_upstream(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    # 300 ms: room for a normal lookup on a loaded machine, far under the pause below
    gw = make_gateway(sim.url, gateway_lookup_budget_ms=300)
    c = client(gw)
    assert outcome(ask(c)) == "miss" and outcome(ask(c)) == "exact"
    redis_client.execute_command("CLIENT", "PAUSE", "3000", "ALL")  # every Redis call now waits
    t0 = time.perf_counter()
    slow = ask(c)
    took = time.perf_counter() - t0
    assert outcome(slow) == "bypass" and "deadline" in slow.headers["x-stoker-reason"]
    assert took < 2.5  # it did not wait for Redis
    redis_client.execute_command("CLIENT", "UNPAUSE")


@pytest.mark.topologies  # the asyncio cluster client too: see tests/conftest.py
def test_gateway__an_upstream_failure_pauses_retries_of_that_request(
    make_gateway: GatewayFactory, scripted: Served, script: Script
) -> None:
    gw = make_gateway(scripted.url, negative_ttl_s=30)
    c = client(gw)
    script.status = 500
    with pytest.raises(openai.InternalServerError):
        ask(c)
    wait_for(lambda: _negative(c), 5, "the negative entry to land")
    assert script.calls() == 1


def _negative(c: openai.OpenAI) -> bool:
    try:
        ask(c)
    except openai.APIStatusError as e:
        return e.status_code == 503 and e.body["code"] == "negative_cache"
    return False


@pytest.mark.topologies  # the asyncio cluster client too: see tests/conftest.py
def test_gateway__semantic_hit_serves_a_paraphrase_with_its_score(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    # A budget no embedding on a loaded machine runs out of: this test is about the paraphrase
    # (the deadline has tests of its own).
    gw = make_gateway(
        sim.url, semantic_matcher="static", semantic_threshold=0.9, gateway_lookup_budget_ms=5000
    )
    c = client(gw)
    assert outcome(ask(c, [{"role": "user", "content": "how do i reset my password"}])) == "miss"
    # The answer is indexed for semantic search after the response went out: wait for it.
    wait_for(lambda: _landed(gw.url) >= 1, 10, "the answer to be stored and indexed")
    para = [{"role": "user", "content": "How can I reset my password?"}]
    hit = ask(c, para)
    assert outcome(hit) == "semantic"
    assert 0.9 <= float(hit.headers["x-stoker-score"]) < 1
    assert hit.headers["x-stoker-rule"].startswith("cosine>=")


def _landed(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith('stoker_gateway_stores_total{result="landed"}'):
            return float(line.split()[-1])
    return 0.0


def test_gateway__key_header_names_the_entry_in_redis(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    gw = make_gateway(sim.url)
    c = client(gw)
    digest = ask(c).headers["x-stoker-key"]
    wait_for(lambda: redis_client.keys(f"stk:{{t:acme}}:e:*:{digest}"), 5, "the entry to land")
