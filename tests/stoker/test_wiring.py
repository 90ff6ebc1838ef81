"""The composition root: what settings turn on is built once per process, in one Stack, and
every part of the process (serving client, workers, verbs) shares the Stack's clients and stores."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from caches.embedders import embed_deadline
from caches.matching.answers import DEFAULT_ANSWER_BAR, DEFAULT_CENTROID_BAR
from caches.request import CacheRequest
from stoker import registry
from stoker.settings import StokerSettings
from stoker.stack import Stack
from stoker.wiring import known_dim


def test_wiring__l1_is_off_by_default_and_built_from_settings(redis_url: str) -> None:
    with Stack(StokerSettings(redis_url=redis_url)) as off:
        assert off.exact_cache.l1 is None
    s = StokerSettings(redis_url=redis_url, l1_enabled=True, l1_max_entries=7, l1_ttl_s=30)
    with Stack(s) as stack:
        cache = stack.exact_cache
        assert cache.l1 is not None and cache.l1.tracking
        assert (cache.l1.max_entries, cache.l1.ttl_s) == (7, 30)
        req = CacheRequest("acme", "m", "v1", "t1", "wired?")
        assert cache.store(cache.lookup(req), "answer").landed
        assert cache.l1.sync()
        assert [cache.lookup(req).rule for _ in range(2)] == ["exact", "exact:l1"]
    assert not cache.l1.tracking  # the Stack's close stopped the L1's listener


def test_wiring__without_a_path_one_edge_store_serves_the_whole_process(redis_url: str) -> None:
    """The serving client and the invalidation / deploy workers of one process must read and
    delete the same vectors; each used to get a fresh temp folder of its own. The folder is the
    process's: gone once the Stack is closed."""
    with Stack(StokerSettings(redis_url=redis_url, embedder_dim=8)) as stack:
        inv: Any = registry.build_handler("invalidation", stack)
        assert inv.invalidator._semantic is stack.semantic
        folder = stack.temp_folder
        assert folder is not None and folder.is_dir()
    assert stack.semantic.closed and not folder.exists()


def test_wiring__a_closed_stack_releases_its_edge_folder_for_the_next(tmp_path: Path) -> None:
    """An Edge shard is opened once per process: a second Stack on the folder opens it only
    once the first is closed, and finds what the first wrote."""
    import time

    import numpy as np

    from caches.keys import Namespace
    from caches.semantic.base import SemanticPoint

    s = StokerSettings(qdrant_path=tmp_path / "a", embedder_dim=4)
    ns = Namespace("acme", "m", "v1", "t1")
    v = np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32)
    with Stack(s) as first:
        assert first.semantic is first.semantic
        first.semantic.upsert([SemanticPoint("k1", v, ns, "c1", "p1", time.time() + 100, "q")])
    assert first.semantic.closed
    with Stack(s) as second:
        assert second.semantic is not first.semantic
        assert second.semantic.count({"tenant": "acme"}) == 1
    assert (tmp_path / "a").is_dir()  # a configured folder stays: it is the operator's


def test_wiring__the_deploy_and_every_worker_of_all_share_one_stack_s_parts(
    redis_url: str, qdrant_path: Path, kafka_bootstrap: str, embedder: Any
) -> None:
    """Built from one Stack, `stoker worker all` holds one Redis client, one embedder and one
    semantic store: the deploy handler alone used to open three Redis clients (its cutover's,
    its pre-warm runner's and its prefix warmer's), each worker more of its own."""
    s = StokerSettings(
        redis_url=redis_url, qdrant_path=qdrant_path, kafka_bootstrap=kafka_bootstrap,
        warm_backend_url="http://gpu-0:8000/v1", gateway_upstream_url="http://gpu-0:8000/v1",
    )  # fmt: skip
    with Stack(s) as stack:
        names = [n for n in registry.available(s) if not registry.is_service(n)]
        assert {"deploy", "traffic", "invalidation", "rewarm", "monitor", "prefixes"} <= set(names)
        h: dict[str, Any] = {n: registry.build_handler(n, stack) for n in names}
        try:
            r, store, cache = stack.redis, stack.semantic, stack.cache
            cutover = h["deploy"].cutover
            pre = cutover.prewarmer  # the prefix warm, then the hot set
            reds = [
                cutover.redis, cutover.purger.redis, pre.inner.runner.cache.redis,
                pre.warmer.store.r, h["traffic"].profile.r, h["invalidation"].invalidator._r,
                h["rewarm"].runner.cache.redis, h["monitor"].cache.redis, h["prefixes"].store.r,
            ]  # fmt: skip
            assert all(x is r for x in reds)
            assert cutover.purger._semantic is store and cache.semantic is store
            assert h["invalidation"].invalidator._semantic is store
            caches = [pre.inner.runner.cache, h["rewarm"].runner.cache, h["monitor"].cache]
            assert all(c is cache for c in caches)
            assert cache.embedder is not None and cache.embedder.inner is stack.embedder
            scheduler: Any = registry.build_service("scheduler", stack)
            assert scheduler.scheduler.lock.r is r
            r.ping()  # at least one connection open in the pool
            # the open connections of its pool (closing the client disconnects every one)
            pool = r.connection_pool
            opened = [c for c in pool._get_free_connections() if c.is_connected]
            assert opened
        finally:
            for handler in h.values():
                handler.close()
        # the handlers closed none of the Stack's parts (a worker stopping first used to close
        # the Redis client the others were still draining with): its owner does
        assert all(c.is_connected for c in opened)


def test_wiring__the_default_model_s_dimension_is_known_without_loading_it() -> None:
    assert known_dim(StokerSettings()) == 384
    assert known_dim(StokerSettings(embedder_model="custom", embedder_dim=768)) == 768
    assert known_dim(StokerSettings(embedder_model="custom")) is None


def test_wiring__a_dimension_the_model_contradicts_fails_at_start(embedder) -> None:
    from schemas.errors import ConfigError

    with pytest.raises(ConfigError, match="384 dimensions"):
        _ = Stack(StokerSettings(embedder_dim=512)).embedder


def test_wiring__verified_by_default_with_its_shared_budget_static_when_set(redis_url: str) -> None:
    import redis as redis_lib

    from caches.matching.base import StaticThreshold
    from caches.matching.counts import RedisCounts
    from caches.matching.error_budget import ServingLevels
    from caches.matching.verified import LADDER, VerifiedMatcher
    from stoker.wiring import build_judge, build_matcher

    r = redis_lib.Redis.from_url(redis_url)
    static = StokerSettings(redis_url=redis_url, semantic_matcher="static")
    matcher, budget = build_matcher(static, r)
    assert isinstance(matcher, StaticThreshold) and budget is None
    s = StokerSettings(
        redis_url=redis_url, max_wrong_hit_rate=0.002,
        answer_bar=0.6, budget_window_s=3600, budget_refresh_s=2,
    )  # fmt: skip
    matcher, budget = build_matcher(s, r)
    assert isinstance(matcher, VerifiedMatcher) and budget is not None
    assert isinstance(matcher.level_of, ServingLevels) and matcher.level_of.refresh_s == 2
    assert (budget.delta, budget.levels, matcher.bar) == (0.002, len(LADDER), 0.6)
    assert isinstance(budget.counts, RedisCounts) and budget.counts.window_s == 3600
    judge = build_judge(s)
    # the centroid bar keeps its calibrated distance above the pair bar
    lift = DEFAULT_CENTROID_BAR - DEFAULT_ANSWER_BAR
    assert judge.bar == 0.6 and judge.centroid_bar == pytest.approx(0.6 + lift)
    assert judge.centroid_bar > judge.bar
    r.close()


def test_wiring__the_deploy_prewarm_takes_its_hours_bar_guard_and_budget_from_settings() -> None:
    from types import SimpleNamespace
    from typing import cast

    from stoker.wiring import build_prewarmer
    from warmers.headroom import ProfileHeadroom
    from warmers.runner import WarmRunner

    s = StokerSettings(
        deploy_prewarm_hours=5, deploy_prewarm_hit_bar=0.4, deploy_prewarm_min_share=0.8,
        warm_budget_requests=7,
    )  # fmt: skip
    from schemas.common import utcnow

    profile = SimpleNamespace(clock=utcnow)
    # only handed through: no embedder to load
    runner = cast(WarmRunner, SimpleNamespace(selector=SimpleNamespace(profile=profile),
                                              cache=SimpleNamespace(redis=None)))  # fmt: skip
    pw = build_prewarmer(s, runner)
    assert (pw.hit_bar, pw.min_share, pw.budget.requests) == (0.4, 0.8, 7)
    assert pw.window().hours() == 5 and pw.runner is runner
    # held to the headroom under the profile's forecast peak, at the scheduler's share
    assert isinstance(pw.room, ProfileHeadroom) and pw.room.profile is profile
    assert pw.room.share == 1.0
    assert pw.room.busy is None  # no model server configured: the forecast as it is
    served = s.model_copy(update={"warm_backend_url": "http://127.0.0.1:9/v1"})
    room = build_prewarmer(served, runner).room
    assert room is not None and room.busy is not None  # read against what the server reports
    assert room.busy() is None  # nothing listens there: it says nothing
    half = build_prewarmer(s.model_copy(update={"warm_headroom_share": 0.5}), runner)
    assert isinstance(half.room, ProfileHeadroom) and half.room.share == 0.5
    assert build_prewarmer(s.model_copy(update={"warm_headroom_share": 0.0}), runner).room is None


def test_wiring__the_planner_takes_its_value_model_and_prices_from_settings() -> None:
    from stoker.wiring import hot_set_config

    # the settings' model (the owner's default is the same, "prevented")
    assert hot_set_config(StokerSettings(warm_value_model="prevented")).value_model == "prevented"
    s = StokerSettings(
        warm_value_model="hits", warm_idle_price=0.5, warm_latency_weight=3.0,
        warm_min_ttl_left_s=60, warm_cluster_threshold=0.9,
    )  # fmt: skip
    cfg = hot_set_config(s)
    assert (cfg.value_model, cfg.idle_price, cfg.latency_weight) == ("hits", 0.5, 3.0)
    assert (cfg.min_ttl_left_s, cfg.cluster_threshold) == (60, 0.9)
    # it clusters paraphrases for the matcher the gateways serve with (verified by default)
    assert hot_set_config(StokerSettings()).matcher == "verified"
    assert hot_set_config(StokerSettings(semantic_matcher="static")).matcher == "static"


def test_wiring__the_warmer_reads_the_engines_load_from_the_backends_metrics() -> None:
    from stoker.wiring import warm_config

    s = StokerSettings(warm_qps=3.0, warm_idle_price=0.4)
    cfg = warm_config(s, "http://gpu-0:8000/")
    assert (cfg.metrics_url, cfg.target_qps, cfg.idle_price) == (
        "http://gpu-0:8000/", 3.0, 0.4)  # fmt: skip
    assert cfg.engine_guard is not None  # it waits for room the live traffic leaves
    assert warm_config(s, "http://gpu-0:8000", qps=9.0).target_qps == 9.0
    off = StokerSettings(warm_load_from_metrics=False)
    assert warm_config(off, "http://gpu-0:8000").metrics_url is None


@pytest.mark.parametrize(
    "written", ["http://gpu:8000", "http://gpu:8000/v1", "http://gpu:8000/v1/"]
)
def test_wiring__the_engines_metrics_are_read_at_the_servers_root_whatever_the_url_form(
    written: str,
) -> None:
    from backends.engine import EngineReader
    from stoker.wiring import warm_config

    url = warm_config(StokerSettings(), written).engine_url
    assert url is not None
    assert EngineReader(url).metrics_url == "http://gpu:8000/metrics"


def test_wiring__a_closed_stack_stops_the_threads_its_embedder_and_cache_started(
    redis_url: str, qdrant_path: Path, embedder: Any
) -> None:
    """Stacks sharing one loaded model each batch on it with threads of their own; close()
    ends them (they outlived every Stack, one set per test gateway, until the process ended)."""
    before = set(threading.enumerate())
    stack = Stack(StokerSettings(redis_url=redis_url, qdrant_path=qdrant_path), model=embedder)
    cache = stack.cache
    assert cache.embedder is not None and cache.embedder.inner is stack.embedder
    assert stack.embedder.inner is embedder  # the shared model, not a second load
    with embed_deadline(time.monotonic() + 30):  # a lookup's embedding: its write-back goes behind
        cache.embedder.embed("acme", ["how do I reset my password?"])
    started = [t for t in threading.enumerate() if t not in before]
    names = {t.name for t in started}
    assert {"embedder-lookups", "embedding-write-behind"} <= names
    stack.close()
    assert [t.name for t in started if t.is_alive()] == []
