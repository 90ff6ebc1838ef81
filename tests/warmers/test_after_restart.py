"""The prefix warm of a replica that restarted or is new, found by reading each replica's
/metrics: simulated replicas over HTTP and a real llama-server restarted, the prefix store on
the real redis-server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.engine import read_engine
from schemas.errors import UsageError
from simulation.backend.http import SimulatorThread
from stoker.embedded import LlamaServer, free_port
from stoker.modelserver import MODEL_ALIAS as MODEL
from stoker.settings import StokerSettings
from tests.gateway.upstreams import Served
from tests.warmers.test_prefix_warm import SIM, _live_gpu_ms, _store
from warmers.prefix.after_restart import CAME_BACK, ReplicaWatch
from warmers.prefix.hot import HotPrefixes, Prefix
from warmers.prefix.warm import PrefixWarmer, PrefixWarmOptions


def test_replicas__a_restarted_and_a_new_replica_are_warmed_a_busy_one_is_not(
    redis_client: redis.Redis,
) -> None:
    store = _store(redis_client, 1)
    sent: list[tuple[str, str]] = []

    def warm(model: str, url: str) -> object:
        sent.append((model, url))
        return PrefixWarmer(store, PrefixWarmOptions(backend_url=url, qps=50)).warm(model)

    with SimulatorThread(SIM) as old, SimulatorThread(SIM) as new:
        _live_gpu_ms(old, 7)  # old has served traffic; new has prefilled nothing
        watch = ReplicaWatch({"llama": [old.url, new.url, "http://127.0.0.1:9"]}, warm)
        assert watch() == [("llama", new.url, "a new replica: it has prefilled nothing yet")]
        # the warm landed on the new replica: a request with the hot prefix skips its prefill
        assert _live_gpu_ms(new, 1) == pytest.approx(2.0 * 14 + 1.0)
        assert watch() == []  # nothing changed: nothing sent
        old.restart()
        assert watch() == [("llama", old.url, "restarted: its process start time moved")]
        assert _live_gpu_ms(old, 1) == pytest.approx(2.0 * 14 + 1.0)
        assert watch() == []
        # the replica that never answered is remembered as nothing, and warmed nothing
        assert "http://127.0.0.1:9" not in watch.seen
    assert sent == [("llama", new.url), ("llama", old.url)]


def test_replicas__the_simulator_exports_its_start_and_moves_it_on_restart() -> None:
    with SimulatorThread(SIM) as s:
        before = read_engine(s.url)
        s.restart()
        after = read_engine(s.url)
    assert before is not None and after is not None
    assert before.started is not None and after.started is not None
    assert after.started > before.started and before.prompt_tokens == 0


def test_replicas__a_replica_that_stopped_answering_and_answers_again_is_warmed() -> None:
    """llama.cpp exports no start time, and traffic after a restart can carry its counters past
    where they were by the next check: a replica seen, then silent, then answering again is
    warmed whatever its counters say."""
    text = ["llamacpp:prompt_tokens_total 500\nllamacpp:requests_processing 0\n"]

    async def metrics(_: Request) -> Response:
        return Response(text[0], media_type="text/plain")

    app = Starlette(routes=[Route("/metrics", metrics), Route("/props", metrics)])
    sent: list[tuple[str, str]] = []
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    watch = ReplicaWatch({"llama": [url]}, lambda m, u: sent.append((m, u)), timeout_s=2.0)
    with Served(app, port=port):
        assert watch() == []  # seen with traffic behind it: left alone
    assert watch() == [] and watch.silent == {url}  # down: remembered, nothing sent
    text[0] = text[0].replace("500", "900")  # back, and busier than before by the next check
    with Served(app, port=port):
        assert watch() == [("llama", url, CAME_BACK)]
        assert watch() == [] and watch.silent == set()
    assert sent == [("llama", url)]


@pytest.mark.parametrize(
    "value",
    ['{"llama": ["ftp://x"]}', '{"": ["http://x:8000"]}', '["http://x:8000"]'],
)
def test_replicas__bad_replica_settings_fail_naming_them(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOKER_PREFIX_WARM_REPLICAS", value)
    with pytest.raises(UsageError, match="bad setting STOKER_PREFIX_WARM_REPLICAS="):
        StokerSettings()


SYSTEM = "You answer questions about our invoices and refunds. " * 30  # ~300 tokens


def test_replicas__a_restarted_llama_server_is_found_and_its_hot_prompts_held_again(
    redis_client: redis.Redis, restartable_llama: tuple[Callable[[], LlamaServer], int]
) -> None:
    """llama-server exports no process start time: the watch finds its restart by its counters
    gone back, and warms its hot system prompt, which the next live request then finds in the
    server's prompt cache (its prefill starts after the system prompt)."""
    start, port = restartable_llama
    url = f"http://127.0.0.1:{port}/v1"
    sent: list[str] = []
    watch = ReplicaWatch({MODEL: [url]}, _warmer(redis_client, sent), timeout_s=5.0)
    first = start()
    _chat(url, SYSTEM, "What is a refund?")  # traffic: counters above zero
    assert watch() == []  # seen with traffic behind it
    first.stop()
    start()
    assert watch() == [
        (MODEL, url, "restarted: its llamacpp:prompt_tokens_total counter went back")
    ]
    assert sent == [url]
    # the warm reached the new process: its own counters show the system prompt prefilled
    warmed = read_engine(url)
    assert warmed is not None and warmed.prompt_tokens is not None
    assert warmed.prompt_tokens >= 300, warmed
    answer = _chat(url, SYSTEM, "How long does a refund take?")
    held = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert held >= 0.9 * (answer["usage"]["prompt_tokens"] - 20), answer["usage"]


def test_replicas__a_llama_server_busier_than_before_when_checked_again_is_warmed_as_come_back(
    redis_client: redis.Redis, restartable_llama: tuple[Callable[[], LlamaServer], int]
) -> None:
    """Traffic in the seconds after a restart can carry llama-server's counters past where
    they were by the next check: the watch saw it silent in between, and warms it."""
    start, port = restartable_llama
    url = f"http://127.0.0.1:{port}/v1"
    sent: list[str] = []
    watch = ReplicaWatch({MODEL: [url]}, _warmer(redis_client, sent), timeout_s=2.0)
    first = start()
    _chat(url, "Be brief.", "Name one fruit.")
    assert watch() == []
    first.stop()
    assert watch() == [] and watch.silent == {url}  # down: nothing to warm yet
    start()
    # the same request (temperature 0: the same counters) and a longer one: every counter
    # is at or past where it was, so only the silence says the process is new
    _chat(url, "Be brief.", "Name one fruit.")
    _chat(url, SYSTEM, "What is a refund?")
    assert watch() == [(MODEL, url, CAME_BACK)]
    assert sent == [url] and watch.silent == set()


def _warmer(r: redis.Redis, sent: list[str]) -> Callable[[str, str], object]:
    """The scheduler's warm of one replica (stoker/registry.py), SYSTEM hot in the store."""
    store = HotPrefixes(r)
    store.add("acme", MODEL, [(Prefix(MODEL, (("system", SYSTEM),), 270), 10)], now=time.time())

    def warm(model: str, replica: str) -> object:
        sent.append(replica)
        return PrefixWarmer(store, PrefixWarmOptions(backend_url=replica, timeout_s=120)).warm(
            model
        )

    return warm


def _chat(url: str, system: str, question: str) -> dict[str, Any]:
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"model": MODEL, "messages": msgs, "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{url}/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    return dict(r.json())
