"""Which handler `stoker worker NAME` runs: name -> factory(settings) -> Handler.

Built-in handlers are listed as "module:function" paths, imported only when asked for, so the
traffic worker never loads the embedder or the warmer and a missing handler is a clear error,
not an ImportError at start. To add one: a line in _BUILTIN (or register() from a plugin).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Final, Protocol

from schemas.errors import StokerError
from stoker.settings import StokerSettings
from streams.base import Handler

HandlerFactory = Callable[[StokerSettings], Handler]

# Every worker the CLI knows; one without a factory yet is "not available yet", not unknown.
WORKER_NAMES: Final = ("traffic", "deploy", "invalidation", "scheduler")

_BUILTIN: dict[str, str] = {
    "traffic": "streams.traffic:build_traffic_handler",
    "deploy": "stoker.wiring:build_deploy_worker",  # the cutover with the hot-set pre-warm
    "invalidation": "invalidators.handlers:build_invalidation_handler",
}
_REGISTERED: dict[str, HandlerFactory] = {}
# Workers that consume no topic, so are not Handlers: factory(settings) -> Service.
_SERVICES: dict[str, str] = {"scheduler": "warmers.scheduler:build_scheduler_service"}


class Service(Protocol):
    """A long-running part that is not a Kafka consumer: run() blocks until stop()."""

    name: str

    def run(self) -> None: ...

    def stop(self) -> None: ...

    def report(self) -> str: ...


class HandlerNotAvailable(StokerError):
    """A known worker name whose handler is not built (yet) in this installation."""


def register(name: str, factory: HandlerFactory) -> None:
    _REGISTERED[name] = factory


def unregister(name: str) -> None:
    _REGISTERED.pop(name, None)


def available() -> list[str]:
    """Names with a factory, in WORKER_NAMES order, then any extra registered ones."""
    have = set(_BUILTIN) | set(_REGISTERED) | set(_SERVICES)
    return [n for n in WORKER_NAMES if n in have] + sorted(have - set(WORKER_NAMES))


def factory_for(name: str) -> HandlerFactory:
    if name in _REGISTERED:
        return _REGISTERED[name]
    path = _BUILTIN.get(name)
    if path is None:
        raise HandlerNotAvailable(
            f"the {name!r} worker is not available yet; available: {', '.join(available())}"
        )
    module, _, attr = path.partition(":")
    factory: HandlerFactory = getattr(importlib.import_module(module), attr)
    return factory


def build_handler(name: str, settings: StokerSettings) -> Handler:
    return factory_for(name)(settings)


def is_service(name: str) -> bool:
    return name in _SERVICES and name not in _REGISTERED


def build_service(name: str, settings: StokerSettings) -> Service:
    module, _, attr = _SERVICES[name].partition(":")
    service: Service = getattr(importlib.import_module(module), attr)(settings)
    return service
