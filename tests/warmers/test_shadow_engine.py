"""The shadow warmer and the engine's own gauges (backends/engine.py): a send priced at the load
the engine reports."""

from __future__ import annotations

import dataclasses
import threading

import httpx

from caches.client import CacheClient
from tests.waiting import wait_for
from tests.warmers.test_shadow import FAST, _item, _warm, _worth
from warmers.backends.simhttp import SimulatorThread
from warmers.backends.simulator import SimConfig
from warmers.throttle import AimdConfig


def test_shadow_engine__a_send_that_no_longer_pays_at_a_queueing_engine_is_left_out(
    cache: CacheClient,
) -> None:
    """No answer yet shows the load (no latency baseline, no 429): the engine's gauges do."""
    cheap = [_worth(_item(200 + i), 80.0) for i in range(4)]  # pays at idle (0.2), not at 1.0
    cfg = dataclasses.replace(FAST, concurrency=1, idle_price=0.2,
                              aimd=AimdConfig(baseline_samples=2))  # fmt: skip
    slow = SimConfig(slots=1, queue=8, decode_ms_per_token=20.0, min_answer_tokens=60)
    with SimulatorThread(slow) as s:
        metered = dataclasses.replace(cfg, engine_url=s.url)
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
            cfg, engine_url=s.url))  # fmt: skip
    assert (busy.sent, busy.skipped_priced) == (0, 4)
    assert (blind.sent, blind.skipped_priced) == (1, 0)
    assert (idle.sent, idle.skipped_priced) == (3, 0)
