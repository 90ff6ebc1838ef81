"""The prefix warm of a replica that restarted or is new, found by reading each replica's
/metrics: two simulated replicas over HTTP, the prefix store on the real redis-server."""

from __future__ import annotations

import httpx
import pytest
import redis

from schemas.errors import UsageError
from stoker.settings import StokerSettings
from tests.warmers.test_prefix_warm import SIM, _live_gpu_ms, _store
from warmers.backends.simhttp import SimulatorThread
from warmers.prefixwarm import PrefixWarmer, PrefixWarmOptions
from warmers.replicas import ReplicaState, ReplicaWatch, emptied, replica_state

VLLM = """# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e+09
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 20.0
"""


def test_replicas__state_and_when_a_cache_must_be_empty() -> None:
    assert replica_state(VLLM) == ReplicaState(1.7e9, 320.0)
    assert replica_state("") == ReplicaState(None, None)
    busy, fresh = ReplicaState(1.0, 500.0), ReplicaState(1.0, 0.0)
    assert emptied(None, fresh) is not None  # first seen, nothing prefilled: new
    assert emptied(None, busy) is None  # first seen with traffic behind it: left alone
    assert emptied(None, ReplicaState(None, None)) is None
    assert emptied(busy, ReplicaState(2.0, 900.0)) == "restarted: its process start time moved"
    assert (
        emptied(busy, ReplicaState(None, 10.0)) == "restarted: its prefix-cache counter went back"
    )
    assert emptied(busy, ReplicaState(1.0, 900.0)) is None


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
        before = replica_state(httpx.get(s.url + "/metrics", timeout=10).text)
        s.restart()
        after = replica_state(httpx.get(s.url + "/metrics", timeout=10).text)
    assert before.started is not None and after.started is not None
    assert after.started > before.started and before.queries == 0


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
