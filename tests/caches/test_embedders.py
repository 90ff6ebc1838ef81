"""Embedders: the shipped model offline, the OpenAI-compatible client, and the Redis cache."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from caches import keys as K
from caches.embedders import Embedder, OpenAIEmbedder, SentenceTransformerEmbedder
from caches.embedding_cache import CachedEmbedder
from schemas.errors import BackendUnavailable, ConfigError
from tests.waiting import wait_for


def test_sentence_transformer__loads_offline_and_ranks_paraphrases(
    embedder: SentenceTransformerEmbedder,
):
    v = embedder.embed(
        ["convert celsius to fahrenheit", "celsius into fahrenheit?", "book a flight"]
    )
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def _openai_server(dim: int, seen: list[dict]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(
            {"path": request.url.path, "auth": request.headers.get("authorization"), **body}
        )
        data = [
            {"index": i, "embedding": [float(len(t))] + [1.0] * (dim - 1)}
            for i, t in enumerate(body["input"])
        ]
        return httpx.Response(200, json={"data": list(reversed(data)), "model": body["model"]})

    return httpx.MockTransport(handle)


def test_openai_embedder__posts_batch_and_returns_unit_vectors_in_order():
    seen: list[dict] = []
    e = OpenAIEmbedder(
        "http://tei:8080/", "bge-small", dim=4, api_key="sk-1", transport=_openai_server(4, seen)
    )
    v = e.embed(["a", "abcd"])
    assert seen[0]["input"] == ["dimension probe"]  # asked once, at start
    assert seen[1:] == [
        {
            "path": "/v1/embeddings",
            "auth": "Bearer sk-1",
            "model": "bge-small",
            "input": ["a", "abcd"],
        }
    ]
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0)
    assert v[1][0] > v[0][0]  # order follows "index", not the server's list order
    assert e.id == "openai:bge-small"


@pytest.mark.parametrize(
    ("written", "path"),
    [
        ("http://tei:8080", "/v1/embeddings"),
        ("http://tei:8080/v1", "/v1/embeddings"),
        ("http://tei:8080/v1/", "/v1/embeddings"),
        ("http://gw/embed/v1", "/embed/v1/embeddings"),
    ],
)
def test_openai_embedder__every_form_of_base_url_posts_where_the_openai_sdk_would(
    written: str, path: str
):
    seen: list[dict] = []
    OpenAIEmbedder(written, "m", transport=_openai_server(4, seen)).embed(["a"])
    assert [s["path"] for s in seen] == [path, path]


def test_openai_embedder__server_errors_become_backend_unavailable():
    e = OpenAIEmbedder(
        "http://tei", "m", dim=4, transport=httpx.MockTransport(lambda r: httpx.Response(503))
    )
    with pytest.raises(BackendUnavailable, match="HTTP 503"):
        e.embed(["x"])


def test_openai_embedder__dimension_is_asked_of_the_server_at_start():
    e = OpenAIEmbedder("http://tei", "m", transport=_openai_server(768, []))
    assert e.dim == 768
    assert e.embed(["x"]).shape == (1, 768)


def test_openai_embedder__a_dimension_the_server_contradicts_fails_at_start():
    with pytest.raises(ConfigError, match=r"returns 4-dimensional vectors.*says 8"):
        OpenAIEmbedder("http://tei", "m", dim=8, transport=_openai_server(4, []))


def test_openai_embedder__server_down_at_start_without_a_dimension_is_a_config_error():
    down = httpx.MockTransport(lambda r: httpx.Response(503))
    with pytest.raises(ConfigError, match="STOKER_EMBEDDER_DIM"):
        OpenAIEmbedder("http://tei", "m", transport=down)


def test_openai_embedder__answers_of_another_dimension_later_are_a_config_error():
    dims = iter([4, 8])

    def handle(request: httpx.Request) -> httpx.Response:
        n, body = next(dims), json.loads(request.content)
        data = [{"index": i, "embedding": [1.0] * n} for i, _ in enumerate(body["input"])]
        return httpx.Response(200, json={"data": data})

    e = OpenAIEmbedder("http://tei", "m", transport=httpx.MockTransport(handle))
    with pytest.raises(ConfigError, match="shape"):
        e.embed(["x"])


class CountingEmbedder(Embedder):
    """A deterministic stand-in model that counts what it was asked to embed."""

    id = "counting"
    dim = 4

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.asarray([[len(t), 1, 0, 0] for t in texts], dtype=np.float32)


def test_cached_embedder__computes_each_text_once_per_tenant(redis_client: redis.Redis):
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, redis_client, ttl_s=60)
    first = cached.embed("acme", ["a", "bb"])
    again = cached.embed("acme", ["bb", "a", "ccc"])
    assert inner.calls == [["a", "bb"], ["ccc"]]
    assert np.array_equal(first[0], again[1]) and np.array_equal(first[1], again[0])
    cached.embed("globex", ["a"])  # another tenant has its own embedding keys
    assert inner.calls[-1] == ["a"]
    assert 0 < redis_client.ttl(K.embedding_key("acme", "counting", "a")) <= 60


def test_cached_embedder__read_only_reads_the_cache_and_writes_nothing(redis_client: redis.Redis):
    inner = CountingEmbedder()
    CachedEmbedder(inner, redis_client, ttl_s=60).embed("acme", ["a"])  # the gateway's write
    before = sorted(redis_client.keys("*"))
    ro = CachedEmbedder(inner, redis_client, ttl_s=60, read_only=True)
    got = ro.embed("acme", ["a", "bb", "ccc"])
    assert inner.calls[-1] == ["bb", "ccc"]  # "a" came from the cache
    assert got.tolist() == [[1, 1, 0, 0], [2, 1, 0, 0], [3, 1, 0, 0]]
    assert sorted(redis_client.keys("*")) == before
    ro.embed("acme", ["bb"])
    assert inner.calls[-1] == ["bb"]  # still not cached: computed again


def test_batching_embedder__concurrent_callers_share_model_calls_and_get_their_rows():
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from caches.embedders import BatchingEmbedder

    inner = CountingEmbedder()
    gate = threading.Event()
    slow = inner.embed

    def held(texts: Sequence[str]) -> np.ndarray:
        gate.wait(5)  # the first call holds the model while the others queue up
        return slow(texts)

    inner.embed = held  # type: ignore[method-assign]
    batching = BatchingEmbedder(inner)
    texts = [f"text {'x' * i}" for i in range(20)]
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(batching.embed, [t]) for t in texts]
        gate.set()
        rows = [f.result(10) for f in futures]
    for t, row in zip(texts, rows, strict=True):
        assert row.shape == (1, 4) and row[0][0] == len(t)
    assert batching.batches < len(texts)  # later callers rode on shared calls
    assert sum(len(c) for c in inner.calls) == len(texts)
    batching.close()


def test_batching_embedder__a_model_error_reaches_every_waiting_caller():
    from caches.embedders import BatchingEmbedder

    class Broken(CountingEmbedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            raise ConfigError("model gone")

    b = BatchingEmbedder(Broken())
    with pytest.raises(ConfigError, match="model gone"):
        b.embed(["a"])
    b.close()


def test_batching_embedder__a_lookup_goes_before_waiting_background_and_a_late_one_is_dropped():
    # a model that runs one pass at a time (torch): the lookup thread and the background
    # thread take turns, lookups first
    from caches.embedders import BatchingEmbedder, EmbedDeadlinePassed

    inner = CountingEmbedder()
    go = threading.Event()
    entered = _held_until(inner, "hold", go)
    b = BatchingEmbedder(inner)
    with ThreadPoolExecutor(4) as pool:
        held = pool.submit(b.embed, ["hold"])
        assert entered.wait(5)  # the model busy with a background pass
        background = pool.submit(b.embed, ["background"])
        late = pool.submit(_lookup, b, "late", 0.05)
        with pytest.raises(EmbedDeadlinePassed):
            late.result(5)  # gave up at its deadline, the model still held
        urgent = pool.submit(_lookup, b, "urgent")
        wait_for(lambda: b.queued() == 2)  # "background" and "urgent" wait
        go.set()
        for f in (held, background, urgent):
            f.result(5)
    # the urgent lookup's pass before the background one; the late one never computed
    assert inner.calls == [["hold"], ["urgent"], ["background"]]
    assert b.dropped == 1
    b.close()


def test_batching_embedder__a_model_that_runs_passes_side_by_side_never_holds_a_lookup():
    from caches.embedders import BatchingEmbedder

    inner = CountingEmbedder()
    inner.concurrent = True  # as ONNX Runtime's sessions are
    go = threading.Event()
    entered = _held_until(inner, "hold", go)
    b = BatchingEmbedder(inner)
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(b.embed, ["hold", "more"])
        assert entered.wait(5)
        row = _lookup(b, "urgent", 5.0)  # served while the background pass still runs
        assert not held.done() and row[0][0] == len("urgent")
        go.set()
        held.result(5)
    b.close()


def _held_until(inner: CountingEmbedder, text: str, go: threading.Event) -> threading.Event:
    """Make `inner` block on `text` until `go` is set; the event returned is set once it does."""
    entered = threading.Event()
    plain = inner.embed

    def embed(texts: Sequence[str]) -> np.ndarray:
        if text in texts:
            entered.set()
            go.wait(5)
        return plain(texts)

    inner.embed = embed  # type: ignore[method-assign]
    return entered


def _lookup(b: Any, text: str, within_s: float = 5.0) -> np.ndarray:
    from caches.embedders import embed_deadline

    with embed_deadline(time.monotonic() + within_s):
        out: np.ndarray = b.embed([text])
        return out


def test_batching_embedder__serving_lookups_a_long_background_call_yields_between_passes():
    from caches.embedders import BatchingEmbedder

    inner = CountingEmbedder()
    go = threading.Event()
    entered = _held_until(inner, "b1", go)
    b = BatchingEmbedder(inner, background_pass_s=0.0)  # one background text a pass
    _lookup(b, "first")  # the process serves lookups
    texts = ["b0", "b1", "b2", "b3"]
    with ThreadPoolExecutor(2) as pool:
        background = pool.submit(b.embed, texts)
        assert entered.wait(5)  # the model holds b1
        lookup = pool.submit(_lookup, b, "urgent")
        wait_for(lambda: b._lookups_waiting == 1)  # its turn asked for
        go.set()
        rows = background.result(5)
        lookup.result(5)
    # the lookup waited for one background text, not four
    assert inner.calls == [["first"], ["b0"], ["b1"], ["urgent"], ["b2"], ["b3"]]
    assert rows[:, 0].tolist() == [2.0] * 4 and rows.shape == (4, 4)
    b.close()


def test_batching_embedder__with_no_lookups_background_calls_batch_whole():
    from caches.embedders import BatchingEmbedder

    inner = CountingEmbedder()
    b = BatchingEmbedder(inner, background_pass_s=0.0)
    texts = [f"t{'x' * i}" for i in range(10)]
    rows = b.embed(texts)
    assert inner.calls == [texts]  # a worker: nobody waits behind it
    assert rows[:, 0].tolist() == [len(t) for t in texts]
    b.close()


def test_batching_embedder__a_lookup_pass_holds_what_fits_before_the_oldest_deadline():
    from caches.embedders import BatchingEmbedder

    inner = CountingEmbedder()
    go = threading.Event()
    entered = _held_until(inner, "hold", go)
    b = BatchingEmbedder(inner)
    b._cost["lookup"].add(1, 1.9)  # as if a lookup text had cost 1.9 s a pass
    with ThreadPoolExecutor(8) as pool:
        held = pool.submit(_lookup, b, "hold")
        assert entered.wait(5)
        queued = [pool.submit(_lookup, b, f"q{i}") for i in range(6)]
        wait_for(lambda: b.queued() == 6)
        go.set()
        held.result(10)
        for f in queued:
            f.result(10)
    # under 5 s left at the oldest deadline, a one-text pass at 1.5-2 s, half of it fixed
    # (a pass of n: (1 + n) / 2 of those): 4 or 5 a pass, not all six
    assert 4 <= len(inner.calls[1]) <= 5
    assert sorted(t for c in inner.calls[1:] for t in c) == [f"q{i}" for i in range(6)]
    b.close()


def test_pass_cost__a_fixed_share_lets_more_texts_fit_in_the_same_time() -> None:
    from caches.passes import PassCost

    linear, affine = PassCost(), PassCost(fixed=0.5)
    for cost in (linear, affine):
        assert cost.texts_within(1.0, 64, 7) == 7  # no pass seen yet
        cost.add(1, 0.010)  # one text: 10 ms
    assert linear.texts_within(0.030, 64, 1) == 3
    # 30 ms holds (1 + n) / 2 one-text passes: n = 5
    assert affine.texts_within(0.030, 64, 1) == 5
    affine.add(4, 0.025)  # four texts cost 2.5 one-text passes: 10 ms each, as before
    assert affine.per_text == pytest.approx(0.010)
    assert affine.texts_within(0.001, 64, 1) == 1 and affine.texts_within(10.0, 64, 1) == 64
