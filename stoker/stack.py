"""The composition root: one Stack per process, built from one StokerSettings.

Each part is built the first time something asks for it (functools.cached_property, calling
the build functions of wiring.py with the parts they need) and then shared: every worker
handler, service and verb of the process gets its parts from the one Stack, so a process holds
one Redis client, one embedding model and one open Qdrant Edge store (an Edge shard can be
opened once per process). close() releases what was opened, and only that.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from collections.abc import Callable
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from stoker import wiring as W
from stoker.settings import StokerSettings

if TYPE_CHECKING:
    import redis

    from backends.base import Backend
    from caches.client import CacheClient
    from caches.embedders import Embedder
    from caches.semantic.base import SemanticStore
    from gateway.app import GatewayParts
    from invalidators.deployjob import Prewarmer
    from streams.jobs import KafkaStatusSink
    from streams.publisher import EventPublisher
    from warmers.prefix.hot import HotPrefixes
    from warmers.prefix.warm import PrefixWarmer
    from warmers.runner import WarmRunner
    from warmers.traffic.profile import TrafficProfile

log = logging.getLogger(__name__)


class Stack:
    """The parts one process runs with, each built once from `settings`. Use it as a context
    manager, or call close() when the last user of its parts has stopped."""

    def __init__(
        self,
        settings: StokerSettings,
        *,
        model: Embedder | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """model: an embedding model already loaded, shared by several Stacks in one process
        (the tests' gateways, the demo's passes); None loads the settings' model on first use.
        Each Stack batches on it with threads of its own and stops them at close().
        clock: the planner's now (the traffic profile's clock), a replay's virtual one; None:
        the wall clock."""
        self.settings = settings
        self._model = model
        self.clock = clock
        self.closed = False
        self.temp_folder: Path | None = None  # the Edge folder made for this process, if any

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- clients and stores --

    @cached_property
    def redis(self) -> redis.Redis:
        return W.build_redis(self.settings)

    @cached_property
    def async_redis(self) -> Any:
        """The gateway's redis.asyncio client (its event loop's; the gateway closes it)."""
        return W.build_async_redis(self.settings)

    @cached_property
    def embedder(self) -> Embedder:
        """The embedding model, loaded on first use (seconds and ~100 MB)."""
        return W.build_embedder(self.settings, self._model)

    @cached_property
    def semantic_dim(self) -> int:
        """The store's vector size: known from the settings when it can be, so the workers that
        only delete vectors open the store without loading the model."""
        known = W.known_dim(self.settings)
        return known if known is not None else self.embedder.dim

    @cached_property
    def semantic(self) -> SemanticStore:
        """The semantic store. Edge: the STOKER_QDRANT_PATH folder, or one temp folder for the
        process (so the serving client and the workers share their vectors), removed at close()
        or, failing that, once the store is gone."""
        s = self.settings
        if s.semantic_backend != "edge" or s.qdrant_path:
            return W.build_semantic(s, self.semantic_dim)
        dim = self.semantic_dim  # before the folder: loading a model may fail
        path = Path(tempfile.mkdtemp(prefix="stoker-qdrant-")).resolve()
        try:
            store = W.build_semantic(s, dim, path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        self.temp_folder = path
        self._remove_temp = weakref.finalize(store, shutil.rmtree, path, ignore_errors=True)
        return store

    @cached_property
    def cache(self) -> CacheClient:
        """The serving side's cache client: with the semantic layer when it is on."""
        if not self.settings.semantic_enabled:
            return self.exact_cache
        return W.build_cache_client(self.settings, self.redis, self.embedder, self.semantic)

    @cached_property
    def exact_cache(self) -> CacheClient:
        """A cache client without the semantic layer (a dry run opens no semantic store)."""
        if "cache" in self.__dict__ and self.cache.semantic is None:
            return self.cache
        return W.build_cache_client(self.settings, self.redis)

    @cached_property
    def profile(self) -> TrafficProfile:
        return W.build_profile(self.settings, self.redis, self.clock)

    @cached_property
    def hot_prefixes(self) -> HotPrefixes:
        return W.build_hot_prefixes(self.settings, self.redis)

    @cached_property
    def publisher(self) -> EventPublisher:
        return W.build_publisher(self.settings)

    @cached_property
    def status_sink(self) -> KafkaStatusSink:
        return W.build_status_sink(self.publisher)

    @cached_property
    def backend(self) -> Callable[[], Backend]:
        """The warm backend client factory (a fresh client per run) of the settings."""
        return W.warm_backend(self.settings)

    # -- what is built of the parts (a new one per call: each has state of its own) --

    def runner(self, **choices: Unpack[W.RunnerChoices]) -> WarmRunner:
        """A warm runner on the shared cache, embedder and profile (dry_run: on the exact cache,
        writing nothing); each worker that warms gets its own, as each runs its own plans."""
        cache = self.exact_cache if choices.get("dry_run") else self.cache
        return W.build_runner(self.settings, cache, self.embedder, self.profile, **choices)

    def prefix_warmer(self, **overrides: Any) -> PrefixWarmer:
        """The prefix warmer of the shared hot prefixes (overrides: wiring.prefix_warm_options)."""
        return W.build_prefix_warmer(self.settings, self.hot_prefixes, **overrides)

    def deploy_prewarmer(self) -> Prewarmer:
        return W.build_deploy_prewarmer(
            self.settings, self.runner(progress=False), self.hot_prefixes
        )

    def gateway(self, *, upstream_url: str | None = None) -> GatewayParts:
        return W.build_gateway(
            self.settings, self.cache, self.async_redis, upstream_url=upstream_url
        )

    # -- the end --

    def close(self) -> None:
        """Close what was opened, users first: the cache clients (their L1 listeners and
        embedding write-behind), the semantic store (so the folder can be opened again), the
        embedder's threads, the publisher's queue, Redis, and
        the process's temp Edge folder. A second close does nothing."""
        if self.closed:
            return
        self.closed = True
        built = self.__dict__
        caches = {id(built[n]): built[n] for n in ("cache", "exact_cache") if n in built}
        for cache in caches.values():  # one object when the semantic layer is off
            _quietly("cache client close", cache.close)
        if "semantic" in built:
            _quietly("semantic store close", built["semantic"].close)
        if "embedder" in built:  # its batching threads (a shared model stays loaded)
            _quietly("embedder close", built["embedder"].close)
        if "publisher" in built:
            _quietly("publisher flush", built["publisher"].flush)
        if "redis" in built:
            _quietly("redis close", built["redis"].close)
        remove = built.get("_remove_temp")
        if remove is not None:
            remove()


def _quietly(what: str, close: Callable[[], object]) -> None:
    """One part failing to close (a broker gone first) must not keep the rest open."""
    try:
        close()
    except Exception as e:  # logged: the process is stopping and has nothing better to do
        log.warning("stack: %s failed: %s", what, e)
