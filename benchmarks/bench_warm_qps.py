"""Shadow-warmer rate accuracy: achieved / target QPS at 5, 20 and 50 against the simulator.

Each rate runs for --seconds (distinct prompts, so nothing is skipped as cached) against an
in-process simulator with room to spare (64 slots, 40-160 ms answers: ~600 QPS), so the figure is
the pacing's own accuracy. achieved = (sends - 1) / (last send - first send); the ramp is off
(it is measured by its own test) and jitter is on. Goal: ratio within 1 +- 0.05.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import emit

from backends.base import GenerationRequest
from backends.client import OpenAIBackend, RetryPolicy
from caches.client import CacheClient
from schemas.common import RequestParams
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig
from stoker.embedded import EmbeddedStack
from stoker.wiring import build_redis
from warmers.hotset.plan import WarmItem
from warmers.shadow import ShadowWarmer, WarmConfig

SIM = SimConfig(
    slots=64,
    queue=256,
    prefill_ms_per_token=0.1,
    decode_ms_per_token=5.0,
    min_answer_tokens=8,
    default_max_tokens=32,
)


async def one_rate(url: str, cache: CacheClient, rate: float, seconds: float) -> None:
    n = int(rate * seconds) + 1
    items = [
        WarmItem.of(
            GenerationRequest(
                "bench", "sim-model", "v1", "t1", f"rate {rate} question {i}", RequestParams()
            )
        )
        for i in range(n)
    ]
    cfg = WarmConfig(target_qps=rate, capacity_qps=rate / 0.2, ramp_s=0, concurrency=32, seed=7)
    async with OpenAIBackend(url, retry=RetryPolicy(attempts=1)) as backend:
        t0 = time.perf_counter()
        s = await ShadowWarmer(backend, cache, cfg, progress=False).run(items)
        wall = time.perf_counter() - t0
    emit(
        f"warm_qps_{int(rate)}",
        target=rate,
        achieved=round(s.achieved_qps, 3),
        ratio=round(s.achieved_qps / rate, 4),
        goal_ratio_range=[0.95, 1.05],
        sent=s.sent,
        cached=s.cached,
        failed=s.failed,
        backoffs=s.backoffs,
        backoff_reasons=sorted({b.reason for b in s.backoff_events}),
        run_s=round(wall, 2),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", type=float, nargs="+", default=[5.0, 20.0, 50.0])
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    with EmbeddedStack(kafka=False) as stack, SimulatorThread(SIM) as sim:
        r = build_redis(stack.settings())
        cache = CacheClient(r)
        for rate in args.rates:
            asyncio.run(one_rate(sim.url, cache, rate, args.seconds))


if __name__ == "__main__":
    main()
