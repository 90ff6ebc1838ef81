"""The shadow warmer against the real simulator over loopback and the real redis-server."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from backends.base import GenerationRequest
from backends.client import OpenAIBackend, RetryPolicy
from backends.pacing import AimdConfig, ManualClock
from caches.client import CacheClient
from caches.request import CacheRequest
from schemas.common import DocRef, RequestParams
from schemas.entries import CacheEntry as Entry
from schemas.errors import CacheUnavailable, ConfigError
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig
from stoker.embedded import free_port
from tests.waiting import wait_for_async
from warmers.hotset.plan import WarmItem
from warmers.hotset.value import Worth
from warmers.shadow import ShadowWarmer, WarmConfig, WarmSummary

FAST = WarmConfig(target_qps=200, capacity_qps=1000, ramp_s=0, jitter_frac=0.1, seed=1)


def _item(i: int, tenant: str = "acme", **params: object) -> WarmItem:
    return WarmItem.of(
        GenerationRequest(
            tenant,
            "sim-model",
            "v1",
            "t1",
            f"hot question number {i}",
            RequestParams(**params),
            (DocRef(doc_id=f"d{i % 3}", version=1),),
        )
    )


def _warm(url: str, cache: CacheClient, items: list[WarmItem], **kw: object) -> WarmSummary:
    cfg = kw.pop("config", FAST)

    async def go() -> WarmSummary:
        async with OpenAIBackend(url, retry=RetryPolicy(attempts=1)) as b:
            w = ShadowWarmer(b, cache, cfg, progress=False, **kw)  # type: ignore[arg-type]
            return await w.run(items)

    return asyncio.run(go())


def _entry(cache: CacheClient, item: WarmItem) -> Entry | None:
    res = cache.lookup(item.identity, use_semantic=False)
    return res.entry


def test_shadow__an_answer_cut_by_max_tokens_is_not_stored_and_is_not_a_failure(
    sim: SimulatorThread, cache: CacheClient
) -> None:
    """The backend answered; the cache keeps no truncated answer. Counted as failed, a warm of
    a model that rambles past max_tokens read "all sends failed" and exited 1."""
    cut, whole = _item(0, max_tokens=1), _item(1)
    s = _warm(sim.url, cache, [cut, whole])
    assert (s.sent, s.cached, s.failed, s.not_stored) == (2, 1, 0, 1)
    assert "length" in s.not_stored_reason
    assert _entry(cache, cut) is None and _entry(cache, whole) is not None


def test_shadow__warm_entries_land_with_warm_provenance(
    sim: SimulatorThread, cache: CacheClient
) -> None:
    items = [_item(i) for i in range(12)]
    s = _warm(sim.url, cache, items)
    assert (s.sent, s.cached, s.failed, s.refused_stale) == (12, 12, 0, 0)
    assert s.gpu_seconds > 0
    for it in items:
        e = _entry(cache, it)
        assert e is not None
        assert e.provenance.source == "warm"
        assert e.provenance.model_version == "v1"
        assert e.tokens_out > 0 and e.gpu_ms > 0
    assert sim.stats().served == 12


def test_shadow__skips_what_is_cached_with_ttl_left_rewarms_what_expires(
    sim: SimulatorThread, cache: CacheClient, redis_client: redis.Redis
) -> None:
    items = [_item(i) for i in range(6)]
    _warm(sim.url, cache, items)
    redis_client.pexpire(items[0].identity.key().exact(), 30_000)  # 30 s left: under the bar
    cfg = WarmConfig(target_qps=200, capacity_qps=1000, ramp_s=0, min_ttl_left_s=60, jitter_frac=0)
    s = _warm(sim.url, cache, items, config=cfg)
    assert (s.sent, s.cached, s.skipped_cached) == (1, 1, 5)
    assert redis_client.pttl(items[0].identity.key().exact()) > 60_000
    # the re-warm reports the key it landed (the demo matches it to the hits it served)
    assert s.sent_keys == s.landed_keys == [items[0].identity.key().exact()]
    assert sim.stats().served == 7


def test_shadow__never_sends_what_must_not_be_cached(
    sim: SimulatorThread, cache: CacheClient
) -> None:
    items = [_item(1, temperature=0.7), _item(2, no_cache=True), _item(3)]
    s = _warm(sim.url, cache, items)
    assert (s.skipped_uncacheable, s.sent, s.cached) == (2, 1, 1)
    assert sim.stats().served == 1


def test_shadow__paraphrase_identity_keys_the_rendered_request(
    sim: SimulatorThread, cache: CacheClient
) -> None:
    rendered = GenerationRequest("acme", "sim-model", "v1", "t1", "SYSTEM: be brief\nUSER: hi")
    identity = CacheRequest("acme", "sim-model", "v1", "t1", "hi")
    s = _warm(sim.url, cache, [WarmItem(rendered, identity)])
    assert s.cached == 1
    assert cache.lookup(identity, use_semantic=False).outcome == "exact"
    other_tenant = CacheRequest("globex", "sim-model", "v1", "t1", "hi")
    assert cache.lookup(other_tenant, use_semantic=False).outcome == "miss"
    with pytest.raises(ConfigError):
        WarmItem(rendered, CacheRequest("globex", "sim-model", "v1", "t1", "hi"))


def test_shadow__a_retire_during_the_run_keeps_its_writes_out(cache: CacheClient) -> None:
    items = [_item(i) for i in range(4)]

    async def scenario(s: SimulatorThread) -> WarmSummary:
        async with OpenAIBackend(s.url, retry=RetryPolicy(attempts=1)) as b:
            w = ShadowWarmer(b, cache, FAST, progress=False)
            run = asyncio.create_task(w.run(items))
            await wait_for_async(
                lambda: s.stats().queued == 4
            )  # lookups done, GPU not yet computing
            cache.generations.retire_model_version("sim-model", "v1")
            s.set_slots(4)
            return await asyncio.wait_for(run, 10)

    with SimulatorThread(SimConfig(slots=0, queue=16, decode_ms_per_token=0.1)) as s:
        summary = asyncio.run(scenario(s))
    assert (summary.sent, summary.refused_stale, summary.cached) == (4, 4, 0)
    assert summary.gpu_seconds > 0  # the GPU time was spent; the answers did not land
    assert all(_entry(cache, it) is None for it in items)


def test_shadow__an_invalidation_during_the_run_keeps_that_context_out(
    cache: CacheClient,
) -> None:
    items = [_item(i) for i in range(6)]  # docs d0, d1, d2 twice each

    async def scenario(s: SimulatorThread) -> WarmSummary:
        async with OpenAIBackend(s.url, retry=RetryPolicy(attempts=1)) as b:
            run = asyncio.create_task(ShadowWarmer(b, cache, FAST, progress=False).run(items))
            await wait_for_async(lambda: s.stats().queued == 6)
            cache.generations.raise_doc_floor("acme", "d0", 2)  # d0 v1 is stale now
            s.set_slots(4)
            return await asyncio.wait_for(run, 10)

    with SimulatorThread(SimConfig(slots=0, queue=16, decode_ms_per_token=0.1)) as s:
        summary = asyncio.run(scenario(s))
    assert (summary.refused_stale, summary.cached) == (2, 4)
    assert [_entry(cache, it) is None for it in items] == [i % 3 == 0 for i in range(6)]


def test_shadow__backs_off_on_429_and_counts_them(cache: CacheClient) -> None:
    # One slot, no queue, answers of >= 40 ms, sends every 10 ms: most of them get a 429.
    cfg = WarmConfig(
        target_qps=100,
        capacity_qps=500,
        ramp_s=0,
        concurrency=8,
        jitter_frac=0,
        aimd=AimdConfig(cooldown_s=0.2),
    )
    sim_cfg = SimConfig(slots=1, queue=0, decode_ms_per_token=5.0, min_answer_tokens=8)
    with SimulatorThread(sim_cfg) as s:
        summary = _warm(s.url, cache, [_item(i) for i in range(30)], config=cfg)
        rejected = s.stats().rejected
    assert summary.overloaded == rejected > 0
    assert summary.backoffs >= 1
    assert {b.reason for b in summary.backoff_events} >= {"429"}
    assert summary.final_rate_qps < 100
    assert summary.cached + summary.failed == summary.sent == 30


def _worth(item: WarmItem, saved_ms: float) -> WarmItem:
    return dataclasses.replace(item, worth=Worth(saved_ms, warm_cost_ms=100.0))


def test_shadow__prices_each_send_at_the_backends_load_and_leaves_out_what_no_longer_pays(
    cache: CacheClient,
) -> None:
    # Worth 80 ms for a 100 ms send: it pays at an idle price (0.2), not at a full one (1.0).
    # Worth 10 s: it pays at any load. One send at a time, so each sees the last one's answer.
    cheap = [_worth(_item(i), 80.0) for i in range(6)]
    dear = [_worth(_item(100 + i), 10_000.0) for i in range(2)]
    cfg = FAST.model_copy(
        update=dict(concurrency=1, idle_price=0.2, aimd=AimdConfig(baseline_samples=2))
    )
    with SimulatorThread(SimConfig(slots=0, queue=0)) as s:  # every request gets a 429
        busy = _warm(s.url, cache, [dear[0], *cheap[:3], dear[1], *cheap[3:]], config=cfg)
    assert busy.sent == busy.overloaded == 2  # the first 429 prices the cheap ones out
    assert busy.skipped_priced == 6 and busy.skipped == 6
    with SimulatorThread(SimConfig()) as s:  # an idle backend: latency at its baseline
        idle = _warm(s.url, cache, cheap, config=cfg)
    assert idle.skipped_priced == 0 and idle.sent == idle.cached == 6
    # without prices (idle_price None) the plan's choice stands at any load
    unpriced = cfg.model_copy(update=dict(idle_price=None))
    with SimulatorThread(SimConfig(slots=0, queue=0)) as s:
        blind = _warm(s.url, cache, [*dear, *cheap[:2]], config=unpriced)
    assert blind.sent == 4 and blind.skipped_priced == 0


def test_shadow__paces_at_the_target_in_clock_time(
    sim: SimulatorThread, cache: CacheClient, fake_clock: ManualClock
) -> None:
    # No jitter: on a manual clock every task's sleep moves time for all, which is not pacing.
    cfg = WarmConfig(target_qps=10, capacity_qps=50, ramp_s=0, jitter_frac=0)
    s = _warm(sim.url, cache, [_item(i) for i in range(40)], config=cfg, clock=fake_clock)
    assert s.sent == 40
    assert s.achieved_qps == pytest.approx(10, rel=0.05)


def test_shadow__ramp_starts_at_5_percent_of_capacity(
    sim: SimulatorThread, cache: CacheClient, fake_clock: ManualClock
) -> None:
    cfg = WarmConfig(target_qps=100, capacity_qps=100, ramp_s=60, jitter_frac=0)
    s = _warm(sim.url, cache, [_item(i) for i in range(11)], config=cfg, clock=fake_clock)
    # 5 QPS at the start, rising 0.25 QPS per second: ten intervals take just under 2 s.
    gaps = [b - a for a, b in itertools.pairwise(s.send_times)]
    assert gaps[0] == pytest.approx(1 / 5, rel=0.05)
    assert all(g2 <= g1 + 1e-9 for g1, g2 in itertools.pairwise(gaps))


def test_shadow__no_task_outlives_a_cancelled_run(cache: CacheClient) -> None:
    async def scenario(s: SimulatorThread) -> set[asyncio.Task[object]]:
        async with OpenAIBackend(s.url, retry=RetryPolicy(attempts=1)) as b:
            run = asyncio.create_task(
                ShadowWarmer(b, cache, FAST, progress=False).run([_item(i) for i in range(5)])
            )
            await wait_for_async(lambda: s.stats().queued == 5)  # five sends in flight, stuck
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    with SimulatorThread(SimConfig(slots=0, queue=16)) as s:
        assert asyncio.run(scenario(s)) == set()


def test_shadow__a_cache_outage_stops_the_run_and_leaves_no_task(sim: SimulatorThread) -> None:
    no_retry = Retry(NoBackoff(), 0)
    dead = CacheClient(redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=no_retry))

    async def scenario() -> set[asyncio.Task[object]]:
        async with OpenAIBackend(sim.url) as b:
            with pytest.raises(CacheUnavailable, match="redis"):
                await ShadowWarmer(b, dead, FAST, progress=False).run([_item(0)])
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    assert asyncio.run(scenario()) == set()
    assert sim.stats().served == 0


def test_shadow__a_backend_that_refuses_connections_ends_the_run_at_its_third_refusal(
    cache: CacheClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The repro: 62 items against a URL nothing listens on were each sent and retried (174
    failed sends logged). Now the client's circuit opens at the third refusal in a row, and
    the run sends nothing more: one log line, naming the URL."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    items = [_item(i) for i in range(62)]
    one_at_a_time = FAST.model_copy(update=dict(concurrency=1))
    with caplog.at_level("INFO", logger="warmers.shadow"):
        s = _warm(url, cache, items, config=one_at_a_time)
    assert (s.sent, s.failed, s.cached) == (3, 3, 0)  # RetryPolicy(attempts=1): one each
    assert s.unreachable.startswith(f"cannot connect to {url}: ConnectError")
    stopped = [r.getMessage() for r in caplog.records if "warm run stopped" in r.getMessage()]
    assert stopped == [f"warm run stopped: {s.unreachable}"]
