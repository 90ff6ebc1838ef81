"""Backend protection: does shadow warming hurt live traffic, and does it yield when the GPU shrinks?

1. warm_live_p99: live traffic (open-loop Poisson at 40% of the simulator's capacity) runs in
   alternating segments without and with the warmer (ramping 5% -> 20% of capacity); ratio =
   live p99 while warming / live p99 without (goal <= 1.10). Segments alternate so machine
   noise hits both alike; the simulator drains between segments.
2. warm_backoff_on_halving: live at 40% plus the warmer at 20% of capacity, then the
   simulator's slots halve mid-run; figure = seconds until the warmer's first back-off after
   the halving (goal <= 5 s), with its rate before and after.
3. backend_protection_real, the twin of 1 on a real model server: llama-server serving
   SmolLM2-135M-Instruct as stoker runs it (`stoker model serve`: one thread, 2 slots). One
   answer (cut at `--real-max-tokens`) is timed alone first, and the live load is open-loop
   Poisson at `--real-live-load` of one slot's time (0.3: a modest load, whatever the
   machine's speed today); it runs in rounds of two segments, without and with the shadow
   warmer as shipped (streamed sends, engine_url set: it holds while live traffic holds a slot
   and makes way when a request is deferred, warmers/engineguard.py; the warm's ramp ends at
   20% of the 2 slots' capacity); the first segment of each round alternates. Both segments
   of a round send the same live prompts at the same arrival times (seeded by the round; the
   warm items from a seed of their own), `--real-requests` an arm per run (104), over
   `--real-runs` runs (3). Reports p50, p95 and p99 of each arm pooled over the runs, their
   ratios (warming / without; `p99_ratio`, goal <= 1.10) with a 95% bootstrap interval
   (each arm resampled), `requests_per_arm`, and the p99 ratio of each run. A ratio below 1
   is what was measured, no proof that warming speeds live requests (`below_one`). A slow
   row: ~25 min on this 2-core machine, so `make bench` runs it only with BENCH_SLOW=1.
The simulator runs in-process (its own thread and loop), talking over loopback HTTP;
llama-server is its own process (`make setup` builds it).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import emit, pct

from backends.base import GenerationRequest
from backends.client import OpenAIBackend, RetryPolicy, Timeouts
from backends.engine import EngineReader
from caches.client import CacheClient
from schemas.common import RequestParams
from schemas.errors import BackendUnavailable
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig
from stoker import modelserver
from stoker.embedded import EmbeddedStack, LlamaServer, serve_options
from stoker.settings import StokerSettings
from stoker.wiring import build_redis
from warmers.hotset.plan import WarmItem
from warmers.shadow import ShadowWarmer, WarmConfig

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
# A live answer on a loaded core can take tens of seconds when it waits behind others.
REAL_TIMEOUTS = Timeouts(read_s=300.0)


def capacity_qps(cfg: SimConfig) -> float:
    mean_tokens = (cfg.min_answer_tokens + cfg.default_max_tokens) / 2
    mean_s = (cfg.prefill_ms_per_token * 4 + cfg.decode_ms_per_token * mean_tokens) / 1000
    return cfg.slots / mean_s


def _req(prompt: str) -> GenerationRequest:
    return GenerationRequest("bench", "sim-model", "v1", "t1", prompt, RequestParams())


async def live_traffic(
    backend: OpenAIBackend,
    rate: float,
    seconds: float,
    rng: random.Random,
    tag: str,
    make: Callable[[str], GenerationRequest] = _req,
) -> tuple[list[float], int]:
    """Open loop: arrivals do not wait for answers, as users do not. Returns latencies, errors.
    The arrival times are drawn first, so the same rng state gives the same schedule."""
    at: list[float] = []
    while (t_next := (at[-1] if at else 0.0) + rng.expovariate(rate)) < seconds:
        at.append(t_next)
    salt = rng.random()
    return await live_arrivals(backend, at, lambda i: make(f"live {tag} {i} {salt}"))


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


# -- the twin on a real model server --

# Questions SmolLM2 answers at length (measured here: each runs to any max_tokens under ~80), so
# every answer, live or warm, costs its prefill and max_tokens decode steps.
REAL_ASKS = (
    "Tell me a long story about {}.",
    "Describe {} in as much detail as you can.",
    "Write a long poem about {}.",
    "Explain everything you know about {}.",
)
REAL_TOPICS = ("a dragon", "the sea", "a lighthouse", "winter", "a robot", "the moon", "trains",
               "a library", "bees", "volcanoes", "a city at night", "coffee")  # fmt: skip


def _real_maker(max_tokens: int, rng: random.Random) -> Callable[[str], GenerationRequest]:
    def make(tag: str) -> GenerationRequest:
        ask = rng.choice(REAL_ASKS).format(rng.choice(REAL_TOPICS))
        return GenerationRequest(
            "bench", modelserver.MODEL_ALIAS, "v1", "t1", f"{ask} ({tag})",
            RequestParams(max_tokens=max_tokens),
        )  # fmt: skip

    return make


async def real_drain(reader: EngineReader, timeout_s: float = 180.0) -> None:
    """Until the engine runs and defers nothing (the last segment's answers are done)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = await reader.read()
        if st is not None and not st.running and not st.waiting:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("llama-server did not drain")
        await asyncio.sleep(0.2)


async def alone_s(backend: OpenAIBackend, make: Callable[[str], GenerationRequest]) -> float:
    """The median of 3 answers timed one at a time (after one to load the model's pages)."""
    times = []
    for i in range(4):
        t0 = time.perf_counter()
        await backend.generate(make(f"alone {i}"))
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[1]


async def live_arrivals(
    backend: OpenAIBackend, at: list[float], make: Callable[[int], GenerationRequest]
) -> tuple[list[float], int]:
    """Open loop over given arrival times (seconds from now): request i is make(i)."""
    latencies: list[float] = []
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            await backend.generate(make(i))
        except BackendUnavailable:
            errors += 1
            return
        latencies.append(time.perf_counter() - t0)

    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    for i, t in enumerate(at):
        await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return latencies, errors


def _real_live(max_tokens: int, seed: int) -> Callable[[int], GenerationRequest]:
    """The i-th live prompt of a segment seeded `seed`: the same in both arms of a round."""
    picks = random.Random(seed)
    asks = [
        (picks.choice(REAL_ASKS).format(picks.choice(REAL_TOPICS)), picks.random())
        for _ in range(1000)
    ]

    def make(i: int) -> GenerationRequest:
        ask, salt = asks[i % len(asks)]
        return GenerationRequest(
            "bench", modelserver.MODEL_ALIAS, "v1", "t1", f"{ask} (live {seed} {i} {salt:.6f})",
            RequestParams(max_tokens=max_tokens),
        )  # fmt: skip

    return make


BOOTSTRAP = 2000


def bootstrap(off: list[float], on: list[float], q: float, seed: int) -> list[float]:
    """The 95% interval of on's q-th percentile over off's, each arm resampled alone."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(off), np.asarray(on)
    ratios = [
        np.percentile(rng.choice(b, b.size), q) / np.percentile(rng.choice(a, a.size), q)
        for _ in range(BOOTSTRAP)
    ]
    return [
        round(float(np.percentile(ratios, 2.5)), 3),
        round(float(np.percentile(ratios, 97.5)), 3),
    ]


async def real_run(
    url: str, cache: CacheClient, args: argparse.Namespace, run: int
) -> dict[str, Any]:
    """One run: `--real-rounds` rounds of two segments, off and on (the order alternates by
    round), each with the same `--real-requests` / rounds arrival times and prompts."""
    lat: dict[str, list[float]] = {"off": [], "on": []}
    errors = {"off": 0, "on": 0}
    warm = {"sent": 0.0, "yielded": 0.0, "skipped_busy": 0.0, "held_s": 0.0, "backoffs": 0.0}
    per_segment = -(-args.real_requests // args.real_rounds)
    reader = EngineReader(url, timeout_s=5.0)
    warm_make = _real_maker(args.real_max_tokens, random.Random(9000 + run))  # apart from live
    async with (
        OpenAIBackend(url, retry=NO_RETRY, timeouts=REAL_TIMEOUTS) as live,
        OpenAIBackend(url, retry=NO_RETRY, timeouts=REAL_TIMEOUTS, stream=True) as wb,
    ):
        alone = await alone_s(live, warm_make)
        rate = args.real_live_load / alone
        cap = 2 / alone  # two slots, each an answer per `alone` seconds
        cfg = WarmConfig(
            target_qps=cap, capacity_qps=cap, ramp_s=5.0, concurrency=1, seed=7,
            engine_url=None if args.real_unguarded else url,
        )  # fmt: skip
        await real_drain(reader)
        for r in range(args.real_rounds):
            seed = 1000 * (run + 1) + r
            gaps = random.Random(seed)
            at = list(itertools.accumulate(gaps.expovariate(rate) for _ in range(per_segment)))
            for arm in ("off", "on") if (r + run) % 2 == 0 else ("on", "off"):
                seg = live_arrivals(live, at, _real_live(args.real_max_tokens, seed))
                if arm == "off":
                    got, err = await seg
                else:
                    warmer = ShadowWarmer(wb, cache, cfg, progress=False)
                    items = [WarmItem.of(warm_make(f"warm {run} r{r} {i}")) for i in range(400)]
                    task = asyncio.create_task(warmer.run(items))
                    try:
                        got, err = await seg
                    finally:
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)
                    for k, v in warmer_summary(warmer).items():
                        warm[k] += v
                lat[arm] += got
                errors[arm] += err
                await real_drain(reader)
    await reader.aclose()
    return {"lat": lat, "errors": errors, "warm": warm, "alone": alone, "rate": rate}


async def real_ratio(url: str, cache: CacheClient, args: argparse.Namespace) -> None:
    load_before = os.getloadavg()[0]  # other work on the 2 cores moves every latency here
    t_start = time.monotonic()
    runs = []
    for run in range(args.real_runs):
        runs.append(await real_run(url, cache, args, run))
        print(f"backend_protection_real: run {run + 1}/{args.real_runs} done", file=sys.stderr)
    off = [x for r in runs for x in r["lat"]["off"]]
    on = [x for r in runs for x in r["lat"]["on"]]
    warm = {k: sum(r["warm"][k] for r in runs) for k in runs[0]["warm"]}
    figures: dict[str, Any] = {}
    for q in (50, 95, 99):
        figures[f"live_p{q}_ms_no_warm"] = round(pct(off, q), 1)
        figures[f"live_p{q}_ms_warm"] = round(pct(on, q), 1)
        figures[f"p{q}_ratio"] = round(pct(on, q) / pct(off, q), 3)
        figures[f"p{q}_ratio_ci95"] = bootstrap(off, on, q, seed=q)
    emit(
        "backend_protection_real",
        twin="warm_live_p99",
        server=f"llama-server {modelserver.LLAMA_CPP.version}, {modelserver.MODEL_ALIAS}, "
        "-t 1 -np 2 (slots and context as stoker serves it)",
        guarded=not args.real_unguarded,
        runs=args.real_runs,
        rounds=args.real_rounds,
        requests_per_arm=min(len(off), len(on)),
        answer_alone_ms=[round(r["alone"] * 1000, 1) for r in runs],
        live_qps=[round(r["rate"], 3) for r in runs],
        live_load=args.real_live_load,
        max_tokens=args.real_max_tokens,
        **figures,
        p99_ratio_per_run=[
            round(pct(r["lat"]["on"], 99) / pct(r["lat"]["off"], 99), 3) for r in runs
        ],
        live_errors={a: sum(r["errors"][a] for r in runs) for a in ("off", "on")},
        load_avg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        warm_sent=int(warm["sent"]),
        warm_yielded=int(warm["yielded"]),
        warm_held_s=round(warm["held_s"], 1),
        warm_skipped_busy=int(warm["skipped_busy"]),
        warm_backoffs=int(warm["backoffs"]),
        seconds=round(time.monotonic() - t_start, 1),
        goal_p99_ratio_max=1.10,
        # below 1 is what was measured, no proof: warming cannot make live requests faster
        below_one=figures["p99_ratio"] < 1.0,
    )


def warmer_summary(w: ShadowWarmer) -> dict[str, float]:
    """What a cancelled run did (its summary as it stood)."""
    sm, aimd = w.summary, w.aimd
    assert sm is not None and aimd is not None
    return {"sent": sm.sent, "yielded": sm.yielded, "skipped_busy": sm.skipped_busy,
            "held_s": sm.held_s, "backoffs": len(aimd.backoffs)}  # fmt: skip


def run_real(cache: CacheClient, args: argparse.Namespace) -> None:
    s = StokerSettings()
    got = modelserver.installed(
        modelserver.cache_root(s.model_cache_dir), server=s.llama_server_bin,
        model=s.llama_model_path,
    )  # fmt: skip
    server = LlamaServer(got.server, got.model, serve_options(s))
    server.start()
    try:
        asyncio.run(real_ratio(server.base_url, cache, args))
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--segment-s", type=float, default=10.0)
    ap.add_argument("--ramp-s", type=float, default=3.0)
    ap.add_argument("--halve-after-s", type=float, default=8.0)
    ap.add_argument("--after-s", type=float, default=6.0)
    ap.add_argument("--no-sim", action="store_true", help="only the real model server's row")
    ap.add_argument("--no-real", action="store_true", help="only the simulator's rows")
    ap.add_argument("--real-runs", type=int, default=3)
    ap.add_argument("--real-rounds", type=int, default=8, help="off/on segment pairs per run")
    ap.add_argument("--real-requests", type=int, default=104,
                    help="live requests an arm in each run (split over the rounds)")  # fmt: skip
    ap.add_argument("--real-live-load", type=float, default=0.3,
                    help="live arrivals x an answer's time alone (of one slot's time)")  # fmt: skip
    ap.add_argument("--real-max-tokens", type=int, default=12)
    ap.add_argument("--real-unguarded", action="store_true",
                    help="the warmer without the engine's gauges (its answers alone pace it)")  # fmt: skip
    args = ap.parse_args()
    with EmbeddedStack(kafka=False) as stack:
        cache = CacheClient(build_redis(stack.settings()))
        if not args.no_sim:
            with SimulatorThread(SIM) as sim:
                asyncio.run(p99_ratio(sim, cache, args))
                asyncio.run(halving(sim, cache, args))
        if not args.no_real:
            run_real(cache, args)


if __name__ == "__main__":
    main()
