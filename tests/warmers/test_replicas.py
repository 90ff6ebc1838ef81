"""The prefix warm of a replica that restarted or is new, found by reading each replica's
/metrics: two simulated replicas over HTTP, the prefix store on the real redis-server."""

from __future__ import annotations

import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.engine import read_engine
from schemas.errors import UsageError
from stoker.embedded import free_port
from stoker.settings import StokerSettings
from tests.gateway.upstreams import Served
from tests.warmers.test_prefix_warm import SIM, _live_gpu_ms, _store
from warmers.backends.simhttp import SimulatorThread
from warmers.prefixwarm import PrefixWarmer, PrefixWarmOptions
from warmers.replicas import CAME_BACK, ReplicaWatch


def test_replicas__a_restarted_and_a_new_replica_are_warmed_a_busy_one_is_not(
    redis_client: redis.Redis,
) -> None:
    store = _store(redis_client, 1)
    sent: list[tuple[str, str]] = []

    def warm(model: str, url: str) -> object:
        sent.append((model, url))
        return PrefixWarmer(store, PrefixWarmOptions(url, qps=50)).warm(model)

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
