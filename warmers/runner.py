"""One warm run, end to end: plan the hot set for a window, then warm it through the shadow warmer.

Shared by `stoker warm`, the scheduler and the deploy pre-warm, so all three choose and send
alike. Built from settings by `build_runner` (the embedder loads once per process).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rich.console import Console

from caches.client import CacheClient
from stoker.settings import StokerSettings
from warmers.backends.base import Backend
from warmers.budget import Budget
from warmers.hotset import HotSetSelector, Plan
from warmers.shadow import ShadowWarmer, WarmConfig, WarmSummary
from warmers.window import Window

BackendFactory = Callable[[], Backend]


@dataclass
class WarmRunner:
    selector: HotSetSelector
    cache: CacheClient
    backend: BackendFactory  # a fresh client per run: each run owns (and closes) its pool
    warm_config: WarmConfig
    progress: bool | None = None
    console: Console | None = None

    def plan(
        self,
        window: Window,
        budget: Budget,
        *,
        tenants: Iterable[str] | None = None,
        model_id: str | None = None,
        model_version: str | None = None,
    ) -> Plan:
        return self.selector.plan(
            window, budget, tenants=tenants, model_id=model_id, model_version=model_version
        )

    def warm(self, plan: Plan) -> WarmSummary:
        """Send the plan's items (synchronously: runs its own event loop)."""
        return asyncio.run(self._warm(plan))

    async def _warm(self, plan: Plan) -> WarmSummary:
        if not plan.items:
            return WarmSummary()
        async with self.backend() as b:
            w = ShadowWarmer(
                b, self.cache, self.warm_config, progress=self.progress, console=self.console
            )
            return await w.run(plan.warm_items())


def build_runner(
    settings: StokerSettings,
    *,
    qps: float | None = None,
    backend_url: str | None = None,
    progress: bool | None = None,
    console: Console | None = None,
    dry_run: bool = False,
) -> WarmRunner:
    """From StokerSettings: profile and cache on its Redis, its embedder, its backend.

    dry_run: plan only, writing nothing: the embedder is used bare (no embedding-cache
    writes) and no semantic store is opened."""
    from caches.embedders import CachedEmbedder, Embedder
    from stoker.wiring import build_cache_client, build_embedder, policy_from
    from warmers.backends.openai import OpenAIBackend
    from warmers.hotset import HotSetConfig
    from warmers.profile import TrafficProfile

    s = settings
    cache = build_cache_client(s, semantic=not dry_run)
    emb: Embedder | CachedEmbedder = (
        build_embedder(s)
        if dry_run
        else cache.embedder or (CachedEmbedder(build_embedder(s), cache.redis, s.embedding_ttl_s))
    )
    profile = TrafficProfile(cache.redis, s.traffic_retention_weeks)
    hot_cfg = HotSetConfig(
        min_ttl_left_s=s.warm_min_ttl_left_s, cluster_threshold=s.warm_cluster_threshold
    )
    selector = HotSetSelector(profile, emb, policy=policy_from(s), config=hot_cfg)
    url = backend_url or s.warm_backend_url
    model = s.warm_backend_model

    def backend() -> Backend:
        return OpenAIBackend(url, model=model)

    warm_cfg = WarmConfig(target_qps=qps or s.warm_qps, min_ttl_left_s=s.warm_min_ttl_left_s)
    return WarmRunner(selector, cache, backend, warm_cfg, progress, console)


def default_budget(settings: StokerSettings) -> Budget:
    if settings.warm_budget_gpu_seconds is not None:
        return Budget(gpu_seconds=settings.warm_budget_gpu_seconds)
    return Budget(requests=settings.warm_budget_requests)
