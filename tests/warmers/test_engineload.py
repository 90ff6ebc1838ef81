"""The engine's own load gauges (vLLM's names) as the shadow warmer prices a send by them."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import httpx
import pytest

from caches.client import CacheClient
from tests.waiting import wait_for
from tests.warmers.test_shadow import FAST, _item, _warm, _worth
from warmers.backends.simhttp import SimulatorThread
from warmers.backends.simulator import SimConfig
from warmers.engineload import EngineLoad, engine_load
from warmers.throttle import AimdConfig

V1 = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %s
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.37
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.52
"""


def test_engineload__reads_vllms_gauges() -> None:
    assert engine_load(V1 % "0.0") == pytest.approx(0.52)  # the fuller of two engines
    assert engine_load(V1 % "3.0") == 1.0  # requests queue: full, whatever the KV use
    v0 = "vllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.25\n"
    assert engine_load(v0) == pytest.approx(0.25)
    assert engine_load("vllm:kv_cache_usage_perc 1.7\n") == 1.0
    # nothing said: no gauges, waiting alone (not full, but how full?), NaN, other metrics
    assert engine_load("") is None
    assert engine_load("vllm:num_requests_waiting 0\n") is None
    assert engine_load("vllm:kv_cache_usage_perc NaN\n") is None
    assert engine_load("process_cpu_seconds_total 12\n") is None


def test_engineload__a_backend_without_metrics_says_nothing(sim: SimulatorThread) -> None:
    async def go(url: str) -> float | None:
        e = EngineLoad(url)
        try:
            return await e.read()
        finally:
            await e.aclose()

    assert asyncio.run(go(sim.url + "/no-such-path")) is None
    assert asyncio.run(go("http://127.0.0.1:9/metrics")) is None  # nothing listens
    assert asyncio.run(go(sim.url + "/metrics")) == 0.0  # the simulator, idle


def test_engineload__a_send_that_no_longer_pays_at_a_queueing_engine_is_left_out(
    cache: CacheClient,
) -> None:
    """No answer yet shows the load (no latency baseline, no 429): the engine's gauges do."""
    cheap = [_worth(_item(200 + i), 80.0) for i in range(4)]  # pays at idle (0.2), not at 1.0
    cfg = dataclasses.replace(FAST, concurrency=1, idle_price=0.2,
                              aimd=AimdConfig(baseline_samples=2))  # fmt: skip
    slow = SimConfig(slots=1, queue=8, decode_ms_per_token=20.0, min_answer_tokens=60)
    with SimulatorThread(slow) as s:
        metered = dataclasses.replace(cfg, metrics_url=s.url + "/metrics")
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "a long one"}]}
        hogs = [threading.Thread(target=httpx.post, args=(s.url + "/v1/chat/completions",),
                                 kwargs={"json": body, "timeout": 60}) for _ in range(2)]  # fmt: skip
        for t in hogs:
            t.start()
        wait_for(lambda: s.stats().queued == 1, 10, "one request to wait for the busy slot")
        busy = _warm(s.url, cache, cheap, config=metered)
        blind = _warm(s.url, cache, cheap[:1], config=cfg)  # the answers alone: no load known
        for t in hogs:
            t.join(60)
    with SimulatorThread(SimConfig()) as s:  # an idle engine: its gauges say 0
        idle = _warm(s.url, cache, cheap[1:], config=dataclasses.replace(
            cfg, metrics_url=s.url + "/metrics"))  # fmt: skip
    assert (busy.sent, busy.skipped_priced) == (0, 4)
    assert (blind.sent, blind.skipped_priced) == (1, 0)
    assert (idle.sent, idle.skipped_priced) == (3, 0)
