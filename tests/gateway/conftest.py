"""Gateway fixtures: real upstreams on loopback, and gateways built as `stoker gateway` builds
them (stoker.wiring.build_gateway) on the session's redis-server, served by uvicorn."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from caches.embedders import Embedder
from gateway.service import GatewayServer
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig
from stoker import wiring as W
from stoker.settings import StokerSettings
from stoker.stack import Stack
from tests.gateway.upstreams import Script, Served, scripted_app

# Answers in a few ms (compressed time), with real slots and SSE.
FAST_SIM = SimConfig(slots=16, queue=256, prefill_ms_per_token=0.01, decode_ms_per_token=0.2)

GatewayFactory = Callable[..., GatewayServer]


@pytest.fixture
def sim() -> Iterator[SimulatorThread]:
    with SimulatorThread(FAST_SIM) as s:
        yield s


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def scripted(script: Script) -> Iterator[Served]:
    with Served(scripted_app(script)) as s:
        yield s


def gateway_settings(redis_url: str, qdrant_path: Path, **overrides: Any) -> StokerSettings:
    fields: dict[str, Any] = {
        "redis_url": redis_url,
        "qdrant_path": qdrant_path,
        "gateway_default_temperature": 0.0,  # the tests' upstreams decode greedily
        "exact_ttl_s": 600,
        "semantic_ttl_s": 600,
        # Tests of caching, not of latency: on a loaded CI machine a lookup can pass the 50 ms
        # default, and then fails open. The deadline has its own test, with its own budget.
        "gateway_lookup_budget_ms": 1000,
    }
    return StokerSettings(**(fields | overrides))


@pytest.fixture(scope="session")
def stack_model() -> Embedder:
    """The embedding model a Stack of default settings loads (the engine too), once a run."""
    return W.load_model(StokerSettings())


@pytest.fixture
def make_gateway(
    redis_client: Any, redis_url: str, qdrant_path: Path, stack_model: Embedder
) -> Iterator[GatewayFactory]:
    """make_gateway(upstream_url, **settings) -> a running gateway on a Stack of its own, as a
    `stoker gateway` process has (a second one gets an Edge folder of its own, as a second
    process would); all stopped, then their Stacks closed, at the end. The Stacks share the
    run's loaded model (unless a test sets the embedder), each batching on it with threads of
    its own: a model loaded per gateway cost seconds and ~100 MB each."""
    running: list[GatewayServer] = []
    stacks: list[Stack] = []

    def make(upstream_url: str, **overrides: Any) -> GatewayServer:
        folder = qdrant_path.with_name(f"qdrant-gw{len(stacks)}") if stacks else qdrant_path
        s = gateway_settings(overrides.pop("redis_url", redis_url), folder, **overrides)
        shared = None if any(k.startswith("embedder") for k in overrides) else stack_model
        stacks.append(stack := Stack(s, model=shared))
        gw = GatewayServer(stack.gateway(upstream_url=upstream_url)).start()
        gw.stack = stack  # type: ignore[attr-defined]  # for stack_of
        running.append(gw)
        return gw

    yield make
    for gw in running:
        gw.stop()
    for gw in running:
        gw.join(30)
    for stack in stacks:
        stack.close()


def stack_of(gw: GatewayServer) -> Stack:
    """The Stack a gateway of make_gateway runs on: a worker a test runs beside it is a part
    of the same process, so it takes its parts (Redis, embedder, the Edge store) from it."""
    stack: Stack = gw.stack  # type: ignore[attr-defined]
    return stack


def client(gw: GatewayServer, tenant: str | None = "acme", **headers: str) -> openai.OpenAI:
    """The official SDK pointed at the gateway, as a user would."""
    h = dict(headers)
    if tenant is not None:
        h["X-Stoker-Tenant"] = tenant
    return openai.OpenAI(
        base_url=gw.url + "/v1", api_key="sk-test", default_headers=h, max_retries=0
    )
