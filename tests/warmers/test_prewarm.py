"""Deploy pre-warm: the old version's hot set lands in the new version's namespace only, sized
to a projected hit-rate bar for the first hours, and READY only when the bar is reached."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis

from backends.base import Backend
from backends.client import OpenAIBackend, RetryPolicy
from caches.client import CacheClient
from caches.policy import CachePolicy
from schemas.errors import BackendUnreachable, ConfigError
from schemas.prewarm import PrewarmRequest
from simulation.backend.http import SimulatorThread
from stoker.embedded import free_port
from tests.gateway.upstreams import Served
from tests.warmers.hotset_helpers import WordsEmbedder, fill
from tests.warmers.refusing import refusing_proxy
from tests.warmers.test_hotset import MONDAY, _flat, _week
from warmers.hotset.options import HotSetConfig
from warmers.hotset.select import HotSetSelector
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.prewarm import HotSetPrewarm, HotSetPrewarmer
from warmers.runner import WarmRunner
from warmers.shadow import WarmConfig
from warmers.traffic.profile import TrafficProfile


def test_prewarm__warms_the_new_version_with_the_old_versions_hot_set(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    profile = TrafficProfile(redis_client)
    fill(profile, _week("acme", {"what is my balance": 20, "reset my pin": 12}, {}))
    fill(profile, _week("globex", {"where is my parcel": 15}, {}))
    cache = CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=600))
    # entries live 600 s here: a 60 s bar keeps them fresh for the second run
    selector = HotSetSelector(
        profile,
        WordsEmbedder(),
        config=HotSetConfig(min_ttl_left_s=60, matcher="static", value_model="hits"),
    )

    def backend() -> Backend:
        return OpenAIBackend(sim.url, retry=RetryPolicy(attempts=1))

    runner = WarmRunner(
        selector, cache, backend, WarmConfig(target_qps=200, capacity_qps=1000, ramp_s=0, min_ttl_left_s=60),
        progress=False,
    )  # fmt: skip
    start = MONDAY + timedelta(days=7, hours=10)
    pw = HotSetPrewarmer(  # the cutover's Prewarmer (mypy checks it where demo/ wires it)
        runner, Budget(requests=2), window=lambda: Window(start, start + timedelta(hours=1)),
        hit_bar=0.5,  # the balance alone serves about 40% of the hour: both are needed
    )  # fmt: skip
    res = pw.prewarm(PrewarmRequest("m", "v2", "v1", ("acme",)))
    assert (res.planned, res.sent, res.cached, res.failed) == (2, 2, 2, 0) and res.ok
    assert res.reached == res.projected >= 0.5
    assert len(redis_client.keys("stk:{t:acme}:e:m@v2:*")) == 2
    assert redis_client.keys("stk:{t:acme}:e:m@v1:*") == []  # the old namespace is untouched
    assert redis_client.keys("stk:{t:globex}:e:*") == []  # only the tenants asked for
    again = pw.prewarm(PrewarmRequest("m", "v2", "v1", ("acme",)))
    assert again.sent == 0 and again.ok  # already warm: nothing to send
    assert pw.prewarm(PrewarmRequest("other-model", "v9", "v8", ())).planned == 0


# Weekdays at 10:00, beside 4 one-off fillers an hour that no pre-warm can serve: 88 requests
# expected in 10:00-13:00, the balance about 43% of them, the five together about 81%.
HOT = {"what is my balance": 40, "reset my pin": 12, "open an account": 10, "close my card": 8,
       "change my address": 6}  # fmt: skip
START = MONDAY + timedelta(days=7, hours=10)


def bar_prewarmer(
    redis_client: redis.Redis, url: str, bar: float, budget: int = 5
) -> HotSetPrewarmer:
    """The real pre-warm on the HOT profile (model m, tenant acme), the 3 hours from START."""
    profile = TrafficProfile(redis_client)
    if "acme" not in profile.tenants():
        fill(profile, _week("acme", HOT, {}))
    cache = CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=600))
    selector = HotSetSelector(
        profile,
        WordsEmbedder(),
        config=HotSetConfig(min_ttl_left_s=60, matcher="static", value_model="hits"),
    )
    runner = WarmRunner(
        selector, cache, lambda: OpenAIBackend(url, retry=RetryPolicy(attempts=1)),
        WarmConfig(target_qps=200, capacity_qps=1000, ramp_s=0, min_ttl_left_s=60), progress=False,
    )  # fmt: skip
    return HotSetPrewarmer(
        runner, Budget(requests=budget), window=lambda: Window(START, START + timedelta(hours=3)),
        hit_bar=bar,
    )  # fmt: skip


def _landed(r: redis.Redis, version: str) -> int:
    return len(r.keys(f"stk:{{t:acme}}:e:m@{version}:*"))


def test_prewarm__sizing_stops_at_the_bar_with_fewer_sends_than_the_budget(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    low = bar_prewarmer(redis_client, sim.url, 0.3).prewarm(
        PrewarmRequest("m", "v2", "v1", ("acme",))
    )
    high = bar_prewarmer(redis_client, sim.url, 0.5).prewarm(
        PrewarmRequest("m", "v3", "v1", ("acme",))
    )
    assert low.in_budget == high.in_budget == 5  # the budget held all five
    assert (low.planned, low.sent, _landed(redis_client, "v2")) == (1, 1, 1)
    assert (high.planned, high.sent, _landed(redis_client, "v3")) == (2, 2, 2)
    # each stopped at the first item that reached its bar: one fewer would not have
    assert low.projected < 0.5 <= high.projected and low.projected >= 0.3
    assert high.reachable > 0.75 and high.expected_requests == pytest.approx(88)
    for res in (low, high):
        assert res.ok and res.reached == res.projected
        assert f"hit rate projected {res.projected:.1%}, reached {res.reached:.1%}" in res.detail
    assert "(bar 50.0%)" in high.detail and "planned 2 of 5 in budget" in high.detail


def test_prewarm__each_tenant_is_sized_to_its_own_bar_so_the_biggest_cannot_take_it_all(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    # acme's balance alone is 30% of both tenants' traffic: a cut on the total would stop there
    fill(TrafficProfile(redis_client), _week("globex", {"where is my parcel": 15}, {}))
    res = bar_prewarmer(redis_client, sim.url, 0.3).prewarm(PrewarmRequest("m", "v2", "v1", ()))
    assert res.ok and res.tenants == () and res.expected_requests > 88
    assert (res.planned, _landed(redis_client, "v2")) == (2, 1)
    assert len(redis_client.keys("stk:{t:globex}:e:m@v2:*")) == 1
    assert res.projected > 0.35  # each tenant to 30% of its own: more than 30% in all


def test_prewarm__an_unreachable_bar_warms_the_whole_plan_and_says_so(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    res = bar_prewarmer(redis_client, sim.url, 0.95).prewarm(
        PrewarmRequest("m", "v2", "v1", ("acme",))
    )
    assert (res.planned, res.sent, res.cached) == (5, 5, 5)
    assert res.ok and not res.bar_reachable and res.projected == res.reachable == res.reached
    assert 0.75 < res.reachable < 0.95  # the fillers are a tail no pre-warm serves
    assert f"bar 95.0% unreachable: the whole plan projects {res.reachable:.1%}" in res.detail


def most_refused(backend_url: str) -> Served:
    """The backend behind a proxy that refuses every send but the balance's (3 of the 4 the
    0.65 bar needs)."""
    return Served(refusing_proxy(backend_url, lambda body: b"balance" in body))


def test_prewarm__a_backend_that_refuses_most_sends_leaves_the_bar_unmet_then_a_retry_tops_up(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    with most_refused(sim.url) as broken:
        first = bar_prewarmer(redis_client, broken.url, 0.65).prewarm(
            PrewarmRequest("m", "v2", "v1", ("acme",))
        )
    assert (first.planned, first.sent, first.cached, first.failed) == (4, 4, 1, 3)
    assert first.projected >= 0.65 and first.reached < 0.5 and not first.ok
    assert first.detail.startswith("pre-warm of v2 below its bar")
    assert f"projected {first.projected:.1%}, reached {first.reached:.1%}" in first.detail
    # The retry (the cutover's, after back-off) finds the balance in place and sends the rest.
    retry = bar_prewarmer(redis_client, sim.url, 0.65)
    again: HotSetPrewarm = retry.prewarm(PrewarmRequest("m", "v2", "v1", ("acme",)))
    assert (again.planned, again.sent, again.cached) == (3, 3, 3)
    assert again.ok and again.reached == again.projected == first.projected
    assert _landed(redis_client, "v2") == 4


def test_prewarm__nothing_learned_is_ready_and_bad_settings_fail_at_once(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    res = bar_prewarmer(redis_client, sim.url, 0.3).prewarm(
        PrewarmRequest("other-model", "v9", "v8", ())
    )
    assert res.ok and res.planned == 0 and "no traffic expected" in res.detail
    runner = bar_prewarmer(redis_client, sim.url, 0.3).runner
    for kw in ({"hit_bar": 0.0}, {"hit_bar": 1.5}, {"hours": 0}, {"hours": 25}):
        with pytest.raises(ConfigError):
            HotSetPrewarmer(runner, Budget(requests=1), **kw)  # type: ignore[arg-type]


def test_prewarm__plans_by_hits_whatever_value_model_the_selector_has(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    # A flat load: valued by the miss it prevents, no warm pays (tests/warmers/test_hotset.py),
    # so `stoker warm` plans nothing. The bar counts hits: the pre-warm keeps its hot set.
    profile = TrafficProfile(redis_client)
    fill(profile, _flat("acme", {"flat hot question": 4, "flat warm question": 1}))
    cfg = HotSetConfig(min_ttl_left_s=60, value_model="prevented", matcher="static")
    runner = WarmRunner(
        HotSetSelector(profile, WordsEmbedder(), config=cfg),
        CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=600)),
        lambda: OpenAIBackend(sim.url, retry=RetryPolicy(attempts=1)),
        WarmConfig(target_qps=200, capacity_qps=1000, ramp_s=0, min_ttl_left_s=60), progress=False,
    )  # fmt: skip
    window = Window(START, START + timedelta(hours=1))
    assert runner.plan(window, Budget(requests=2)).items == []
    pw = HotSetPrewarmer(runner, Budget(requests=2), window=lambda: window, hit_bar=0.7)
    res = pw.prewarm(PrewarmRequest("m", "v2", "v1", ("acme",)))
    assert res.ok and (res.planned, res.sent, res.cached) == (1, 1, 1)  # the hot one: 80%
    assert res.reached == res.projected == pytest.approx(0.8, abs=0.05)


def test_prewarm__a_backend_that_refuses_connections_fails_it_at_once_naming_the_url(
    redis_client: redis.Redis,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(BackendUnreachable) as e:
        bar_prewarmer(redis_client, url, 0.95).prewarm(PrewarmRequest("m", "v2", "v1", ("acme",)))
    assert str(e.value).startswith(f"pre-warm of v2: cannot connect to {url}: ConnectError")
    assert _landed(redis_client, "v2") == 0
