"""The embedding cache's write-behind: a lookup does not wait for its vectors' write-back."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from caches import keys as K
from caches.embedders import Embedder, embed_deadline
from caches.embedding_cache import CachedEmbedder
from caches.writebehind import WriteBehind


class Ones(Embedder):
    id = "ones"
    dim = 4

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.ones((len(texts), self.dim), dtype=np.float32)


class HeldWrites:
    """A real Redis client whose pipelines' writes wait for `go` (reads pass at once)."""

    def __init__(self, r: redis.Redis) -> None:
        self._r = r
        self.go = threading.Event()
        self.waiting = threading.Event()

    def mget(self, keys: Sequence[str]) -> Any:
        return self._r.mget(keys)

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self._r.pipeline(transaction=transaction)
        execute = pipe.execute

        def held(raise_on_error: bool = True) -> Any:
            self.waiting.set()
            assert self.go.wait(10)
            return execute(raise_on_error)

        pipe.execute = held  # type: ignore[method-assign]
        return pipe


def test_cached_embedder__a_lookup_returns_before_its_write_back_lands(
    redis_client: redis.Redis,
) -> None:
    held = HeldWrites(redis_client)
    cached = CachedEmbedder(Ones(), held, ttl_s=60)  # type: ignore[arg-type]
    key = K.embedding_key("acme", "ones", "what is my balance")
    with embed_deadline(time.monotonic() + 10):
        got = cached.embed("acme", ["what is my balance"])  # Redis holds the write: no wait
    assert got.tolist() == [[1, 1, 1, 1]]
    assert held.waiting.wait(5)  # the write is on its way, on another thread
    assert redis_client.get(key) is None
    held.go.set()
    assert cached._behind.flush()
    assert 0 < redis_client.ttl(key) <= 60  # landed, with its TTL


def test_cached_embedder__without_a_deadline_the_write_lands_before_it_returns(
    redis_client: redis.Redis,
) -> None:
    cached = CachedEmbedder(Ones(), redis_client, ttl_s=60)
    cached.embed("acme", ["index me"])  # indexing, a warm run: the caller can wait
    assert redis_client.exists(K.embedding_key("acme", "ones", "index me"))


def test_write_behind__a_full_queue_drops_and_a_dead_redis_is_counted_not_raised(
    redis_client: redis.Redis,
) -> None:
    held = HeldWrites(redis_client)
    wb = WriteBehind(held, ttl_s=60, max_pending=2)  # type: ignore[arg-type]
    wb.put([("wb:0", b"x")])
    assert held.waiting.wait(5)  # the thread holds the first write; two more fit the queue
    for i in range(1, 4):
        wb.put([(f"wb:{i}", b"x")])
    assert wb.dropped == 1
    held.go.set()
    assert wb.flush()
    assert redis_client.exists("wb:0", "wb:1", "wb:2") == 3 and not redis_client.exists("wb:3")
    # no retries: redis-py's default backs off for seconds between its 10, past flush's 5 s
    gone = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    dead = WriteBehind(gone, ttl_s=60)
    dead.put([("wb:x", b"x")])
    assert dead.flush()
    assert dead.failed == 1


def test_write_behind__close_lands_what_was_queued_then_ends_its_thread(
    redis_client: redis.Redis,
) -> None:
    """A closing cache client stops its writer: one thread was left per client (per test
    gateway) and ran for the life of the process."""
    wb = WriteBehind(redis_client, ttl_s=60)
    wb.put([("wb:a", b"1")])
    wb.put([("wb:b", b"2")])
    thread = wb._thread
    assert thread is not None and thread.is_alive()
    wb.close()
    assert redis_client.mget(["wb:a", "wb:b"]) == [b"1", b"2"]
    assert not thread.is_alive()
    wb.put([("wb:c", b"3")])  # after close: no new thread, nothing written
    assert wb._thread is thread and redis_client.get("wb:c") is None
