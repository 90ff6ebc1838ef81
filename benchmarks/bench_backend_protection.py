"""Backend protection: does shadow warming hurt live traffic, and does it yield when the GPU shrinks?

1. warm_live_p99: live traffic (open-loop Poisson at 40% of the simulator's capacity) runs in
   alternating segments without and with the warmer (ramping 5% -> 20% of capacity); ratio =
   live p99 while warming / live p99 without (goal <= 1.10). Segments alternate so machine
   noise hits both alike; the simulator drains between segments.
2. warm_backoff_on_halving: live at 40% plus the warmer at 20% of capacity, then the
   simulator's slots halve mid-run; figure = seconds until the warmer's first back-off after
   the halving (goal <= 5 s), with its rate before and after.
The simulator runs in-process (its own thread and loop), talking over loopback HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable

from _common import emit, pct

from backends.base import GenerationRequest
from backends.client import OpenAIBackend, RetryPolicy
from caches.client import CacheClient
from schemas.common import RequestParams
from schemas.errors import BackendUnavailable
from stoker.embedded import EmbeddedStack
from stoker.wiring import build_redis
from warmers.backends.simhttp import SimulatorThread
from warmers.backends.simulator import SimConfig
from warmers.shadow import ShadowWarmer, WarmConfig, WarmItem

# 8 slots, answers of 8..64 tokens at 4 ms each (~0.15 s mean): ~55 QPS of capacity.
SIM = SimConfig(
    slots=8,
    queue=64,
    prefill_ms_per_token=0.2,
    decode_ms_per_token=4.0,
    min_answer_tokens=8,
    default_max_tokens=64,
)
LIVE_FRAC = 0.4
NO_RETRY = RetryPolicy(attempts=1)


def capacity_qps(cfg: SimConfig) -> float:
    mean_tokens = (cfg.min_answer_tokens + cfg.default_max_tokens) / 2
    mean_s = (cfg.prefill_ms_per_token * 4 + cfg.decode_ms_per_token * mean_tokens) / 1000
    return cfg.slots / mean_s


def _req(prompt: str) -> GenerationRequest:
    return GenerationRequest("bench", "sim-model", "v1", "t1", prompt, RequestParams())


async def live_traffic(
    backend: OpenAIBackend, rate: float, seconds: float, rng: random.Random, tag: str
) -> tuple[list[float], int]:
    """Open loop: arrivals do not wait for answers, as users do not. Returns latencies, errors."""
    latencies: list[float] = []
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            await backend.generate(_req(f"live {tag} {i} {rng.random()}"))
        except BackendUnavailable:
            errors += 1
            return
        latencies.append(time.perf_counter() - t0)

    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    t_next = 0.0
    while True:
        t_next += rng.expovariate(rate)
        if t_next >= seconds:
            break
        await asyncio.sleep(max(0.0, start + t_next - time.perf_counter()))
        tasks.append(asyncio.create_task(one(len(tasks))))
    await asyncio.gather(*tasks)
    return latencies, errors


def warm_items(tag: str, n: int) -> list[WarmItem]:
    return [WarmItem.of(_req(f"warm {tag} question {i}")) for i in range(n)]


async def drain(sim: SimulatorThread, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (st := sim.stats()).busy or st.queued:
        if time.monotonic() > deadline:
            raise TimeoutError("simulator did not drain")
        await asyncio.sleep(0.05)


async def with_warmer(
    warmer: ShadowWarmer, items: list[WarmItem], body: Callable[[], object]
) -> object:
    """Run body() while the warmer runs; then stop the warmer (cancel: nothing lingers)."""
    run = asyncio.create_task(warmer.run(items))
    try:
        return await body()  # type: ignore[misc]
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def p99_ratio(sim: SimulatorThread, cache: CacheClient, args: argparse.Namespace) -> None:
    cap = capacity_qps(SIM)
    cfg = WarmConfig(target_qps=cap, capacity_qps=cap, ramp_s=args.ramp_s, seed=5)
    rng = random.Random(42)
    off: list[float] = []
    on: list[float] = []
    errors = {"off": 0, "on": 0}
    warm_rates: list[float] = []
    warm_backoffs: list[str] = []
    async with (
        OpenAIBackend(sim.url, retry=NO_RETRY) as live,
        OpenAIBackend(sim.url, retry=NO_RETRY) as wb,
    ):
        for r in range(args.rounds):
            lat, err = await live_traffic(live, LIVE_FRAC * cap, args.segment_s, rng, f"off{r}")
            off += lat
            errors["off"] += err
            await drain(sim)
            warmer = ShadowWarmer(wb, cache, cfg, progress=False)
            served0 = sim.stats().served
            t0 = time.perf_counter()
            lat, err = await with_warmer(  # type: ignore[misc]
                warmer,
                warm_items(f"r{r}", int(cap * args.segment_s)),
                lambda r=r: live_traffic(live, LIVE_FRAC * cap, args.segment_s, rng, f"on{r}"),
            )
            span = time.perf_counter() - t0
            warm_rates.append((sim.stats().served - served0 - len(lat)) / span)
            assert warmer.aimd is not None
            warm_backoffs += [b.reason for b in warmer.aimd.backoffs]
            on += lat
            errors["on"] += err
            await drain(sim)
    emit(
        "warm_live_p99",
        capacity_qps=round(cap, 1),
        live_qps=round(LIVE_FRAC * cap, 1),
        warm_qps_mean=round(sum(warm_rates) / len(warm_rates), 2),
        warm_ceiling_qps=round(0.2 * cap, 1),
        warm_backoffs=warm_backoffs,
        live_p99_ms_no_warm=round(pct(off, 99), 1),
        live_p99_ms_warm=round(pct(on, 99), 1),
        live_p50_ms_no_warm=round(pct(off, 50), 1),
        live_p50_ms_warm=round(pct(on, 50), 1),
        samples=[len(off), len(on)],
        live_errors=errors,
        ratio=round(pct(on, 99) / pct(off, 99), 3),
        goal_ratio_max=1.10,
    )


async def halving(sim: SimulatorThread, cache: CacheClient, args: argparse.Namespace) -> None:
    cap = capacity_qps(SIM)
    cfg = WarmConfig(target_qps=cap, capacity_qps=cap, ramp_s=2.0, seed=6)
    rng = random.Random(43)
    sim.set_slots(SIM.slots)
    async with (
        OpenAIBackend(sim.url, retry=NO_RETRY) as live,
        OpenAIBackend(sim.url, retry=NO_RETRY) as wb,
    ):
        warmer = ShadowWarmer(wb, cache, cfg, progress=False)
        t_half: list[float] = []

        async def scenario() -> object:
            async def halve() -> None:
                await asyncio.sleep(args.halve_after_s)
                sim.set_slots(SIM.slots // 2)
                t_half.append(warmer.clock.now())

            h = asyncio.create_task(halve())
            seconds = args.halve_after_s + args.after_s
            res = await live_traffic(live, LIVE_FRAC * cap, seconds, rng, "halving")
            await h
            return res

        await with_warmer(warmer, warm_items("halving", int(cap * 60)), scenario)
    assert warmer.aimd is not None
    after = [b for b in warmer.aimd.backoffs if b.at >= t_half[0]]
    before = [b for b in warmer.aimd.backoffs if b.at < t_half[0]]
    first = after[0] if after else None
    seconds = (first.at - t_half[0]) if first else float("inf")
    emit(
        "warm_backoff_on_halving",
        seconds=round(seconds, 3),
        reason=first.reason if first else None,
        rate_before=round(first.rate_before, 2) if first else None,
        rate_after=round(first.rate_after, 2) if first else None,
        final_rate=round(warmer.aimd.rate, 2),
        backoffs_before_halving=len(before),
        backoffs_after_halving=len(after),
        ratio=round(seconds / 5.0, 3),
        goal_seconds_max=5.0,
    )
    await drain(sim)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--segment-s", type=float, default=10.0)
    ap.add_argument("--ramp-s", type=float, default=3.0)
    ap.add_argument("--halve-after-s", type=float, default=8.0)
    ap.add_argument("--after-s", type=float, default=6.0)
    args = ap.parse_args()
    with EmbeddedStack(kafka=False) as stack, SimulatorThread(SIM) as sim:
        cache = CacheClient(build_redis(stack.settings()))
        asyncio.run(p99_ratio(sim, cache, args))
        asyncio.run(halving(sim, cache, args))


if __name__ == "__main__":
    main()
