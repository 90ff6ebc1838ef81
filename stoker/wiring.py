"""Wiring: every object stoker runs, built from settings. The one place that reads StokerSettings.

The packages below the shell take their dependencies and plain option objects as arguments and
never import this module (import-linter holds the layers); the worker registry (registry.py)
builds its handlers and services from what is built here.

The functions here build one part each and take the parts they need as arguments; nothing is
cached here. The one object that caches them is the Stack (stoker/stack.py): one per process, so
the process shares one of each expensive part: one Redis client, the embedding model (seconds to
load, ~100 MB), the open Qdrant Edge store (an Edge shard is opened once per process).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, TypedDict, Unpack

import redis
from rich.console import Console

from caches.client import CacheClient
from caches.embedders import (
    BatchingEmbedder,
    Embedder,
    EmbedderOptions,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
)
from caches.embedding_cache import CachedEmbedder
from caches.l1 import L1Cache, L1Options
from caches.matching.answers import DEFAULT_ANSWER_BAR, DEFAULT_CENTROID_BAR, AnswerJudge
from caches.matching.base import Matcher, StaticThreshold
from caches.matching.bounds import Shares
from caches.matching.calibration import AnswerChecks
from caches.matching.cold import DEFAULT_COLD
from caches.matching.counts import RedisCounts
from caches.matching.error_budget import ErrorBudget, ServingLevels
from caches.matching.fallback import DEFAULT_FALLBACK
from caches.matching.options import MatchingOptions
from caches.matching.verified import LADDER, VerifiedMatcher
from caches.metrics import BUDGET_GAUGES
from caches.policy import CachePolicy
from caches.semantic.base import SemanticStore
from caches.semantic.edge import EdgeSemanticStore
from gateway.app import GatewayParts
from gateway.options import GatewayOptions
from gateway.requestlog import KafkaLog, NullLog, RequestLog
from invalidators.deployjob import CutoverOptions, Prewarmer
from invalidators.purge import PurgeOptions
from schemas.errors import BrokerUnavailable, ConfigError
from stoker.modelserver import cache_root
from stoker.redisconn import connect, connect_async
from stoker.settings import StokerSettings
from streams.base import Handler
from streams.jobs import JobRecords, KafkaStatusSink
from streams.publisher import EventPublisher
from streams.worker import WorkerConfig, default_group_id
from warmers.headroom import ProfileHeadroom, SharedRatio
from warmers.hotset.options import HotSetConfig
from warmers.hotset.warm_budget import Budget, BudgetOptions
from warmers.prefix.hot import HotPrefixes
from warmers.prefix.options import PrefixOptions
from warmers.prefix.warm import PrefixWarmer, PrefixWarmingPrewarmer, PrefixWarmOptions
from warmers.prewarm import HotSetPrewarmer, PrewarmOptions
from warmers.runner import WarmRunner
from warmers.shadow import WarmConfig

if TYPE_CHECKING:
    from datetime import datetime

    from backends.base import Backend
    from warmers.hotset.freshness import Freshness
    from warmers.hotset.plan import Plan
    from warmers.shadow import WarmSummary
    from warmers.traffic.profile import TrafficProfile

log = logging.getLogger(__name__)

# Dimensions of the embedding models stoker knows without loading them, so the invalidation
# and deploy workers can open the semantic store without the model (seconds and ~100 MB).
_KNOWN_DIMS: Final = MappingProxyType({("sentence-transformers", "all-MiniLM-L6-v2"): 384})


# -- stores and clients --


# Without Redis: what to set, or how to get the embedded stack a verb would use.
NO_REDIS = (
    "no Redis: set STOKER_REDIS_URL or --redis-url, or run this beside `stoker worker all` or "
    "`stoker gateway`, which start an embedded stack when nothing is configured"
)


def build_redis(s: StokerSettings) -> redis.Redis:
    """One server, or a Redis Cluster for a redis+cluster:// URL (see redisconn.py)."""
    if not s.redis_url:
        raise ConfigError(NO_REDIS)
    return connect(s.redis_url, socket_timeout=5, socket_connect_timeout=5)


GATEWAY_CLIENT_NAME = "stoker-gateway"  # in CLIENT LIST, so operators see whose connections


def build_async_redis(s: StokerSettings) -> Any:
    """redis.asyncio on the settings' Redis (the gateway's event loop; its own connections)."""
    if not s.redis_url:
        raise ConfigError(NO_REDIS)
    return connect_async(
        s.redis_url, socket_timeout=5, socket_connect_timeout=5, client_name=GATEWAY_CLIENT_NAME
    )


def build_embedder(s: StokerSettings, model: Embedder | None = None) -> Embedder:
    """The settings' model, loaded now (all-MiniLM-L6-v2: seconds and ~100 MB), or `model`
    already loaded, behind the batcher: build it once per process, as the Stack does."""
    model = model if model is not None else load_model(s)
    emb = BatchingEmbedder(  # concurrent callers share forward passes
        model, s.embedder_batch_max_texts, max_wait_s=s.embedder_batch_wait_ms / 1000
    )
    if s.embedder_dim is not None and s.embedder_dim != emb.dim:
        raise ConfigError(
            f"{s.embedder_model} embeds in {emb.dim} dimensions, but "
            f"STOKER_EMBEDDER_DIM says {s.embedder_dim}"
        )
    return emb


def load_model(s: StokerSettings) -> Embedder:
    """The settings' embedding model itself (no batcher)."""
    if s.embedder == "openai":
        if not s.embedder_url:
            raise ConfigError("embedder=openai needs STOKER_EMBEDDER_URL")
        key = s.embedder_api_key.get_secret_value() if s.embedder_api_key else None
        return OpenAIEmbedder(s.embedder_url, s.embedder_model, dim=s.embedder_dim, api_key=key)
    opts = s.options(EmbedderOptions)
    return SentenceTransformerEmbedder.from_options(opts, cache_root(s.model_cache_dir))


def known_dim(s: StokerSettings) -> int | None:
    """The vector size of the configured embedder when it is known without loading the model
    (the invalidation and deploy workers open the semantic store without it), else None."""
    if s.embedder_dim is not None:
        return s.embedder_dim
    return _KNOWN_DIMS.get((s.embedder, s.embedder_model))


def build_semantic(s: StokerSettings, dim: int, edge_path: Path | None = None) -> SemanticStore:
    """The settings' semantic store. Edge: the shard in `edge_path` (STOKER_QDRANT_PATH, or the
    process's temp folder the Stack made), which a process opens once."""
    if s.semantic_backend == "server":
        from qdrant_client import QdrantClient

        from caches.semantic.server import ServerSemanticStore

        if not s.qdrant_url:
            raise ConfigError("semantic_backend=server needs STOKER_QDRANT_URL")
        if s.qdrant_url != ":memory:":
            key = s.qdrant_api_key.get_secret_value() if s.qdrant_api_key else None
            return ServerSemanticStore(
                QdrantClient(url=s.qdrant_url, api_key=key), s.qdrant_collection, dim
            )
        # qdrant-client's local mode lives in this process (small tests and single-process
        # setups only: it is brute force); the Stack shares it between its parts.
        return ServerSemanticStore(
            QdrantClient(":memory:"), s.qdrant_collection, dim, serialize=True
        )
    path = edge_path or (Path(s.qdrant_path).resolve() if s.qdrant_path else None)
    if path is None:
        raise ConfigError("the Qdrant Edge store needs a folder (STOKER_QDRANT_PATH)")
    return EdgeSemanticStore(path, dim)


def build_l1(s: StokerSettings, r: redis.Redis) -> L1Cache | None:
    """The in-process L1 for exact hits, started (tracking on), or None when it is off."""
    o = s.options(L1Options)
    return L1Cache(r, max_entries=o.max_entries, ttl_s=o.ttl_s).start() if o.enabled else None


def build_judge(s: StokerSettings) -> AnswerJudge:
    """When two answers mean the same. The centroid bar keeps its calibrated distance above the
    pair bar (answers.py), so STOKER_ANSWER_BAR moves both."""
    lift, bar = DEFAULT_CENTROID_BAR - DEFAULT_ANSWER_BAR, s.options(MatchingOptions).answer_bar
    return AnswerJudge(bar=bar, centroid_bar=min(1.0, bar + lift))


def build_budget(s: StokerSettings, r: redis.Redis) -> ErrorBudget:
    """The error budget over the verdict counts in Redis, shared by every replica; its verdicts
    weighed by the shares they are sampled at (caches/matching/bounds.py)."""
    o = s.options(MatchingOptions)
    shares = Shares(audited=s.monitor_share, shadow=o.budget_shadow_share)
    counts = RedisCounts(r, o.budget_window_s)
    return ErrorBudget(counts, len(LADDER), o.max_wrong_hit_rate, shares=shares)


def build_matcher(s: StokerSettings, r: redis.Redis) -> tuple[Matcher, ErrorBudget | None]:
    """STOKER_SEMANTIC_MATCHER: the static threshold, or the verified matcher serving at the
    level its error budget allows (the budget is None for static)."""
    if s.semantic_matcher == "static":
        return StaticThreshold(), None
    o = s.options(MatchingOptions)
    budget = build_budget(s, r)
    levels = ServingLevels(budget, o.budget_refresh_s)
    BUDGET_GAUGES.watch(levels)
    cold = DEFAULT_COLD if o.cold_start else None
    if not o.answer_checks:
        matcher = VerifiedMatcher(levels, bar=o.answer_bar, cold=cold, cold_open=levels.cold_open)
        return matcher, budget
    checks = AnswerChecks(budget, build_judge(s).agree)
    matcher = VerifiedMatcher(
        levels, bar=o.answer_bar, cold=cold, cold_open=levels.cold_open,
        fallback=DEFAULT_FALLBACK, signal_of=lambda q: checks.signal(levels, q), checks=checks,
    )  # fmt: skip
    return matcher, budget


def build_cache_client(
    s: StokerSettings,
    r: redis.Redis,
    emb: Embedder | None = None,
    store: SemanticStore | None = None,
) -> CacheClient:
    """The serving side's cache client on `r`: exact only without an embedder and a store (or
    with the semantic layer off). Close it (CacheClient.close) to stop its L1 listener."""
    pol = s.options(CachePolicy)
    l1 = build_l1(s, r)
    if emb is None or store is None or not s.semantic_enabled:
        return CacheClient(r, policy=pol, l1=l1)
    matcher, budget = build_matcher(s, r)
    return CacheClient(
        r,
        semantic=store,
        embedder=CachedEmbedder(emb, r, pol.embedding_ttl_s),
        policy=pol,
        l1=l1,
        matcher=matcher,
        budget=budget,
        judge=build_judge(s),
        shadow_share=s.options(MatchingOptions).budget_shadow_share,
    )


# -- streams --


def worker_config(s: StokerSettings, handler: Handler, group: str | None = None) -> WorkerConfig:
    """How `handler` consumes: the settings' broker, its group (default <prefix>stoker.<name>)
    and its batch size (the setting, else the handler's own default)."""
    if not s.kafka_bootstrap:
        raise ConfigError("kafka_bootstrap is not set (STOKER_KAFKA_BOOTSTRAP)")
    return s.options(
        WorkerConfig,
        bootstrap=s.kafka_bootstrap,
        group_id=group or default_group_id(handler.name, s.topic_prefix),
        embedded=s.kafka_broker == "tansu",
        topic_prefix=s.topic_prefix,
        batch_size=s.worker_batch_size or handler.batch_size,
    )


def build_publisher(s: StokerSettings) -> EventPublisher:
    return EventPublisher(
        s.kafka_bootstrap, topic_prefix=s.topic_prefix, embedded=s.kafka_broker == "tansu"
    )


def build_status_sink(publisher: EventPublisher) -> KafkaStatusSink:
    return KafkaStatusSink(publisher)


# -- warming --


def build_profile(
    s: StokerSettings, r: redis.Redis, clock: Callable[[], datetime] | None = None
) -> TrafficProfile:
    """The traffic profile on `r`: what the traffic worker writes and the planner reads; its
    clock is the wall clock's, or a replay's (`stoker analyze --warming`)."""
    from warmers.traffic.options import TrafficOptions
    from warmers.traffic.profile import TrafficProfile

    o = s.options(TrafficOptions)
    return TrafficProfile(
        r, o.retention_weeks, week_capacity=o.week_capacity, hour_capacity=o.hour_capacity,
        **({} if clock is None else {"clock": clock}),
    )  # fmt: skip


def warm_backend(
    s: StokerSettings, url: str | None = None, source: str | None = "STOKER_WARM_BACKEND_URL"
) -> Callable[[], Backend]:
    """A fresh client per warm run to `url` (default: the settings' warm backend); `source`
    is the setting named when it cannot connect."""
    from backends.client import OpenAIBackend

    model = s.warm_backend_model

    def backend() -> Backend:
        # streamed: a warm cancelled mid-answer (the engine guard making way, a SIGTERM) stops
        # llama-server's work at its next token, not ~1 s later (backends/client.py)
        return OpenAIBackend(url or s.warm_url(), model=model, source=source, stream=True)

    return backend


class RunnerChoices(TypedDict, total=False):
    """What a verb or worker chooses of its warm runner (the rest is the settings')."""

    qps: float | None
    backend_url: str | None
    progress: bool | None
    console: Console | None
    dry_run: bool
    # a replay's (warmers/replay/): what the cache holds, and where the sends go, instead of
    # the cache's Redis and the shadow warmer
    freshness: Freshness | None
    send: Callable[[Plan], WarmSummary] | None


def build_runner(
    s: StokerSettings,
    cache: CacheClient,
    embedder: Embedder,
    profile: TrafficProfile,
    **choices: Unpack[RunnerChoices],
) -> WarmRunner:
    """The warm runner on `cache` (exact only for a dry run), `embedder` (the raw model) and
    the traffic `profile`, warming the settings' backend (or `backend_url`).

    dry_run: plan only, writing nothing: the embedding cache is read, not written, no
    semantic store is opened and no job record is written."""
    dry_run, backend_url = choices.get("dry_run", False), choices.get("backend_url")
    qps, progress, console = choices.get("qps"), choices.get("progress"), choices.get("console")
    from warmers.hotset.calibration import Calibration
    from warmers.hotset.select import HotSetSelector

    # a dry run reads the embedding cache (what the gateway embedded as it served) and
    # writes nothing back
    emb: Embedder | CachedEmbedder = (
        CachedEmbedder(embedder, cache.redis, s.embedding_ttl_s, read_only=True)
        if dry_run
        else cache.embedder or (CachedEmbedder(embedder, cache.redis, s.embedding_ttl_s))
    )
    # valued by the miss it prevents, a cluster a cached paraphrase already serves is checked
    # against the cache (a dry run opens no semantic store: it sees exact entries only)
    # read by every plan; written after a real run; on the profile's clock (a replay's)
    calibration = Calibration(cache.redis, clock=lambda: profile.clock().timestamp())
    selector = HotSetSelector(
        profile, emb, policy=s.options(CachePolicy), config=hot_set_config(s),
        cache=None if dry_run else cache, calibration=calibration,
        freshness=choices.get("freshness"),
    )  # fmt: skip
    # a dry run plans without a model server, and a replay sends to its own (`send`); a run
    # needs one (ConfigError names the settings)
    offline = dry_run or choices.get("send") is not None
    url = backend_url or (s.warm_backend_url or s.gateway_upstream_url if offline else s.warm_url())
    source = None if backend_url else "STOKER_WARM_BACKEND_URL"  # named when it cannot connect
    backend = warm_backend(s, url, source)
    warm_cfg = warm_config(s, url, qps)
    records = None if dry_run else JobRecords(cache.redis)
    return WarmRunner(
        selector, cache, backend, warm_cfg, progress, console, records,
        None if dry_run else calibration, choices.get("send"),
    )  # fmt: skip


def warm_config(s: StokerSettings, backend_url: str | None, qps: float | None = None) -> WarmConfig:
    """The shadow warmer's pacing and prices; the engine's load is read from the backend's
    /metrics (backends/engine.py) unless STOKER_WARM_LOAD_FROM_METRICS is off."""
    return s.options(
        WarmConfig, target_qps=qps or s.warm_qps, min_ttl_left_s=s.warm_min_ttl_left_s,
        idle_price=s.warm_idle_price, engine_url=backend_url,
    )  # fmt: skip


def hot_set_config(s: StokerSettings) -> HotSetConfig:
    """The planner's options; its value model is the settings' (the deploy pre-warm overrides
    it per plan: warmers/prewarm.py)."""
    return s.options(HotSetConfig)


def default_budget(s: StokerSettings) -> Budget:
    return s.options(BudgetOptions).budget()


def build_prewarmer(
    s: StokerSettings,
    runner: WarmRunner,
    *,
    busy: Callable[[], float | None] | None = None,
    clock: Callable[[], datetime] | None = None,
) -> HotSetPrewarmer:
    """The deploy pre-warm: the warm runner (progress off: it runs inside a worker), the
    budget, the bar READY stands for, and the headroom its sends are held to (busy, clock:
    build_headroom's)."""
    o = s.options(PrewarmOptions)
    return HotSetPrewarmer(
        runner, default_budget(s), hours=o.hours, hit_bar=o.hit_bar, min_share=o.min_share,
        room=build_headroom(s, runner, busy=busy, clock=clock),
    )  # fmt: skip


def build_headroom(
    s: StokerSettings,
    runner: WarmRunner,
    *,
    busy: Callable[[], float | None] | None = None,
    clock: Callable[[], datetime] | None = None,
) -> ProfileHeadroom | None:
    """The room under the forecast peak that the scheduler's and the deploy's warms are held
    to (None: STOKER_WARM_HEADROOM_SHARE is 0, no cap), its forecast read against the busy
    seconds the warm backend reports on /metrics (`busy`: a replay's ledger instead), on the
    wall clock (`clock`: a replay's)."""
    share = s.warm_headroom_share
    if share <= 0:
        return None
    if busy is None:
        try:
            busy = busy_seconds(s.warm_url())
        except ConfigError:  # no model server configured: the forecast as it is
            busy = None
    shared = SharedRatio(runner.cache.redis)  # the scheduler's ratio, for the deploy worker
    return ProfileHeadroom(
        runner.selector.profile, share, busy=busy, shared=shared,
        **({} if clock is None else {"clock": clock}),
    )  # fmt: skip


def busy_seconds(url: str) -> Callable[[], float | None]:
    """The model server's busy seconds so far, read from its /metrics when called (None: it
    does not answer, or does not say)."""
    from backends.engine import read_engine

    def read() -> float | None:
        state = read_engine(url, timeout_s=2.0)
        return None if state is None else state.busy_s

    return read


def build_hot_prefixes(s: StokerSettings, r: redis.Redis) -> HotPrefixes:
    return HotPrefixes(r, capacity=s.options(PrefixOptions).capacity)


def prefix_warm_options(
    s: StokerSettings,
    *,
    backend_url: str | None = None,
    qps: float | None = None,
    top_n: int | None = None,
    dry_run: bool = False,
) -> PrefixWarmOptions:
    """dry_run: a plan needs no backend; one configured still sizes the budget."""
    url = backend_url or s.prefix_warm_backend_url
    if not dry_run:
        url = url or s.warm_url()
    elif url is None:
        url = s.warm_backend_url or s.gateway_upstream_url
    return s.options(
        PrefixWarmOptions,
        backend_url=url,
        qps=qps or s.prefix_warm_qps,
        top_n=top_n or s.prefix_warm_top_n,
        model=s.warm_backend_model,
        host_cache_tokens=s.prefix_warm_host_cache_tokens,
    )


def build_prefix_warmer(s: StokerSettings, hot: HotPrefixes, **overrides: Any) -> PrefixWarmer:
    """The prefix warmer of the `hot` prefixes to the settings' backend (overrides:
    backend_url, qps, top_n, dry_run, as `stoker warm-prefixes` takes them)."""
    return PrefixWarmer(hot, prefix_warm_options(s, **overrides))


def build_deploy_prewarmer(s: StokerSettings, runner: WarmRunner, hot: HotPrefixes) -> Prewarmer:
    """The deploy worker's pre-warm: the hot set, after the prefix warm when that is on."""
    hot_set = build_prewarmer(s, runner)
    if not s.prefix_warm_on_deploy:
        return hot_set
    return PrefixWarmingPrewarmer(hot_set, build_prefix_warmer(s, hot))


def cutover_options(s: StokerSettings) -> CutoverOptions:
    return s.options(CutoverOptions, purge=s.options(PurgeOptions))


# -- the gateway --


def gateway_options(s: StokerSettings, *, upstream_url: str | None = None) -> GatewayOptions:
    import hashlib

    keys = {
        hashlib.sha256(k.get_secret_value().encode()).hexdigest(): tenant
        for k, tenant in s.gateway_api_keys.items()
    }
    up_key = s.gateway_upstream_api_key
    return s.options(
        GatewayOptions,
        upstream_url=upstream_url or s.upstream_url(),
        upstream_api_key=up_key.get_secret_value() if up_key else None,
        api_key_tenants=keys,
    )


def build_request_log(s: StokerSettings, capacity: int) -> RequestLog:
    """The request log to inference.requests, or NullLog when no broker is configured."""
    if not s.kafka_bootstrap:
        return NullLog()
    from confluent_kafka import Producer

    from streams.topics import TOPICS, ensure_topics, producer_config, topic_name

    topic = topic_name("inference.requests", s.topic_prefix)
    if s.worker_create_topics:
        try:
            ensure_topics(s.kafka_bootstrap, {topic: TOPICS["inference.requests"]})
        except BrokerUnavailable as e:  # the gateway serves without its log; librdkafka retries
            log.warning("request log: %s; serving on, events wait for the broker", e)
    # linger batches the log (a few ms late is fine); the queue bound is the producer's share
    # of "never block a response": a full queue drops (counted), it never waits.
    conf = producer_config(
        s.kafka_bootstrap, embedded=s.kafka_broker == "tansu",
        **{"linger.ms": 20, "queue.buffering.max.messages": max(capacity, 1000)},
    )  # fmt: skip
    return KafkaLog(Producer(conf), topic, capacity)


def build_gateway(
    s: StokerSettings, cache: CacheClient, async_redis: Any, *, upstream_url: str | None = None
) -> GatewayParts:
    """Everything `stoker gateway` serves with: the cache (with the semantic layer and the L1
    when it is on), the upstream pool, the request log. The gateway closes `async_redis` (its
    event loop's); `cache` is its owner's to close (the Stack's, after the gateway stops)."""
    from gateway.cachegate import CacheGate
    from gateway.health import UpstreamHealth
    from gateway.upstream import Upstream

    opts = gateway_options(s, upstream_url=upstream_url)
    if cache.embedder is not None:  # load and run the model once now, not on the first lookup
        cache.embedder.inner.embed(["warm up"])
    upstream = Upstream(
        opts.upstream_url,
        api_key=opts.upstream_api_key,
        timeout_s=opts.upstream_timeout_s,
        connections=opts.upstream_connections,
        forward_auth=not opts.api_key_tenants,
    )
    health = UpstreamHealth(
        upstream, every_s=opts.upstream_check_s, strict_models=opts.strict_models
    )
    return GatewayParts(
        CacheGate(cache, async_redis, opts),
        upstream,
        health,
        build_request_log(s, opts.log_buffer),
        opts,
    )
