"""Which handler `stoker worker NAME` runs: name -> factory(stack) -> Handler (or Service).

The factories live here, in the shell, because they read settings and build objects; each
handler's own package takes what it needs as arguments. Every factory takes its parts from the
process's one Stack (stoker/stack.py), so the workers of a process share one Redis client, one
embedder and one semantic store, and a handler closes none of them (the Stack's owner does,
once every worker has stopped). The traffic worker never loads the embedder or the warmer.
To add a worker: a factory and a line in _BUILTIN (or register() from a plugin).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from schemas.errors import StokerError
from stoker import wiring as W
from stoker.settings import StokerSettings
from stoker.stack import Stack
from streams.base import Handler

HandlerFactory = Callable[[Stack], Handler]

# Every worker the CLI knows; one without a factory yet is "not available yet", not unknown.
WORKER_NAMES: Final = (
    "traffic", "deploy", "invalidation", "rewarm", "scheduler", "monitor", "prefixes",
)  # fmt: skip
# Workers `all` runs only when the settings ask for what they serve: the monitor re-asks the
# backend (GPU time), which only the verified matcher's error budget needs. `stoker worker
# monitor` runs it whatever the matcher (its audits of static hits still go to stoker.audit).
_OPT_IN: Final[dict[str, Callable[[StokerSettings], bool]]] = {
    "monitor": lambda s: s.semantic_matcher == "verified",
}


class Service(Protocol):
    """A long-running part that is not a Kafka consumer: run() blocks until stop()."""

    name: str

    def run(self) -> None: ...

    def stop(self) -> None: ...

    def report(self) -> str: ...


ServiceFactory = Callable[[Stack], Service]


class HandlerNotAvailable(StokerError):
    """A known worker name whose handler is not built (yet) in this installation."""


# -- the factories --


def traffic_handler(stack: Stack) -> Handler:
    """The traffic profile on the stack's Redis; events outside the settings' time bounds
    around this process's clock go to the dead-letter topic (warmers/traffic/event_time.py)."""
    from warmers.hotset.calibration import Calibration
    from warmers.traffic.options import TrafficOptions
    from warmers.traffic.worker import TrafficHandler

    profile = stack.profile
    times = stack.settings.options(TrafficOptions).event_times()
    return TrafficHandler(profile, times, calibration=Calibration(profile.r), close_clients=False)


def invalidation_handler(stack: Stack) -> Handler:
    """Invalidations on the stack's Redis and semantic store (the store the serving client
    of this process reads, when the gateway runs in it too)."""
    from invalidators.handlers import InvalidationHandler
    from invalidators.invalidation import Invalidator
    from invalidators.purge import PurgeOptions

    # a template change purges the old template's entries at the deploy's pace
    inv = Invalidator(stack.redis, stack.semantic, stack.settings.options(PurgeOptions))
    return InvalidationHandler(inv, close_clients=False)


def deploy_handler(stack: Stack, prewarmer: object | None = None) -> Handler:
    """The cutover on the stack's Redis, semantic store and stoker.status, with the hot-set
    pre-warm (`prewarmer`, default: the stack's, on the same Redis)."""
    from invalidators.cutover import Cutover
    from invalidators.deploy import DeployHandler
    from invalidators.deployjob import Prewarmer
    from invalidators.purge import Purger

    r = stack.redis
    pre: Prewarmer = prewarmer if prewarmer is not None else stack.deploy_prewarmer()  # type: ignore[assignment]
    cutover = Cutover(
        r, Purger(r, stack.semantic), stack.status_sink, prewarmer=pre,
        options=W.cutover_options(stack.settings),
    )  # fmt: skip
    return DeployHandler(cutover)


def prefixes_handler(stack: Stack) -> Handler:
    """The hot prompt prefixes of the request log, per tenant and model, on the stack's
    Redis (what the prefix warmer sends after a deploy or a restart)."""
    from warmers.prefix.options import PrefixOptions
    from warmers.prefix.worker import PrefixLogHandler

    min_tokens = stack.settings.options(PrefixOptions).min_tokens
    return PrefixLogHandler(stack.hot_prefixes, min_tokens=min_tokens, close_clients=False)


def rewarm_handler(stack: Stack, *, backend_url: str | None = None) -> Handler:
    """The re-warm after a KB change that carries the document's new text: the warm runner of
    `stoker warm` (its planner, pace and backend, or `backend_url`), on the changes' topic."""
    from warmers.rewarm import RewarmHandler, RewarmOptions

    runner = stack.runner(progress=False, backend_url=backend_url)
    return RewarmHandler(runner, stack.settings.options(RewarmOptions))


def scheduler_service(stack: Stack) -> Service:
    """The leader-elected schedule: warm the next hour, sweep expired vectors, send the hot
    prompt prefixes before each day's peak, and to the watched replicas that restarted."""
    import time

    from warmers.headroom import ScheduledWarm
    from warmers.prefix.options import PrefixOptions
    from warmers.scheduler import LeaderLock, SchedulerConfig, SchedulerService, WarmScheduler

    s = stack.settings
    runner = stack.runner(progress=False)
    lock = LeaderLock(runner.cache.redis, s.scheduler_lock_ttl_s)
    cfg, o = s.options(SchedulerConfig), s.options(PrefixOptions)
    warm = ScheduledWarm(runner, W.default_budget(s), W.build_headroom(s, runner))

    def sweep() -> None:
        if runner.cache.semantic is not None:
            runner.cache.semantic.sweep_expired(time.time())

    prefixes = None
    if o.before_peak_s > 0:
        from warmers.prefix.before_peak import PeakPrefixWarm

        prefix_warmer = stack.prefix_warmer()
        prefixes = PeakPrefixWarm(
            runner.selector.profile, prefix_warmer.warm, lead_s=o.before_peak_s
        )
    replicas = None
    if o.replicas:
        from warmers.prefix.after_restart import ReplicaWatch

        def warm_replica(model: str, url: str) -> object:
            return stack.prefix_warmer(backend_url=url).warm(model)

        replicas = ReplicaWatch(o.replicas, warm_replica)
    return SchedulerService(WarmScheduler(lock, warm, sweep, cfg, prefixes, replicas))


def monitor_handler(stack: Stack) -> Handler:
    """The wrong-hit monitor: the serving side's cache client (its embedder, semantic store for
    probes, and with the verified matcher its error budget), the backend to re-ask, and
    stoker.audit."""
    from audits.judge import Auditor
    from audits.monitor import MonitorHandler
    from audits.options import MonitorOptions
    from backends.base import Backend
    from backends.client import OpenAIBackend
    from caches.matching.error_budget import ServingLevels

    s = stack.settings
    cache = stack.cache
    url = s.monitor_backend_url or s.upstream_url()
    model = s.warm_backend_model

    def backend() -> Backend:
        return OpenAIBackend(url, model=model)

    level_of = getattr(cache.matcher, "level_of", None)
    levels = level_of if isinstance(level_of, ServingLevels) else None
    opts = s.options(MonitorOptions)
    # its verdicts reach the budget once each, by the handler; its audits of near look-alikes
    # are answer checks (caches/matching/calibration.py)
    auditor = Auditor(cache.judge, checks=getattr(cache.matcher, "checks", None))
    return MonitorHandler(
        cache, backend, stack.publisher, auditor, cache.budget, levels, opts, close_clients=False
    )


_BUILTIN: dict[str, HandlerFactory] = {
    "traffic": traffic_handler,
    "deploy": deploy_handler,
    "invalidation": invalidation_handler,
    "rewarm": rewarm_handler,
    "monitor": monitor_handler,
    "prefixes": prefixes_handler,
}
_REGISTERED: dict[str, HandlerFactory] = {}
# Workers that consume no topic, so are not Handlers.
_SERVICES: dict[str, ServiceFactory] = {"scheduler": scheduler_service}


# -- the registry --


def register(name: str, factory: HandlerFactory) -> None:
    _REGISTERED[name] = factory


def unregister(name: str) -> None:
    _REGISTERED.pop(name, None)


def available(settings: StokerSettings | None = None) -> list[str]:
    """Names with a factory, in WORKER_NAMES order, then any extra registered ones; an opt-in
    worker only when `settings` turn on what it serves (never without settings)."""
    have = set(_BUILTIN) | set(_REGISTERED) | set(_SERVICES)
    have -= {
        n for n, on in _OPT_IN.items() if n not in _REGISTERED and not (settings and on(settings))
    }
    return [n for n in WORKER_NAMES if n in have] + sorted(have - set(WORKER_NAMES))


def opted_out(settings: StokerSettings) -> list[str]:
    """Opt-in workers these settings leave out of `all`."""
    return [n for n, on in _OPT_IN.items() if not on(settings)]


def factory_for(name: str) -> HandlerFactory:
    factory = _REGISTERED.get(name) or _BUILTIN.get(name)
    if factory is None:
        raise HandlerNotAvailable(
            f"the {name!r} worker is not available yet; available: {', '.join(available())}"
        )
    return factory


def build_handler(name: str, stack: Stack) -> Handler:
    return factory_for(name)(stack)


def is_service(name: str) -> bool:
    return name in _SERVICES and name not in _REGISTERED


def build_service(name: str, stack: Stack) -> Service:
    return _SERVICES[name](stack)
