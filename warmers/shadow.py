"""The shadow warmer: replays hot requests against the backend at a controlled, polite rate.

For each item, in the order given (the hot set's ranking):
1. check the exact cache (no semantic: a paraphrase's hit must not stop its representative):
   skip what is cached with more than `min_ttl_left_s` to live, never send what must not be
   cached (temperature > 0, no-cache) or what recently failed (negative entry); a miss hands
   back a WriteTicket, taken before the GPU computes;
2. wait for a concurrency slot, then a token from the bucket, whose rate is
   min(target, ramp ceiling, AIMD rate); jitter the send inside one interval;
   an item that carries its worth (valued by the miss it prevents) is priced again at the load
   the backend shows now, and left out when its warm would cost more than it saves at that
   load (`skipped_priced`). The load is the higher of what its answers show (Aimd.load:
   latency per token over baseline, 429s) and what its engine reports on /metrics
   (backends/engine.py: requests queued, KV cache or slots in use), when `engine_url` is set;
   with it, the send also waits for room the live traffic leaves, and the sends in flight make
   way when a request waits for a slot (engineguard.py: llama.cpp's busy and deferred slots);
3. generate; congestion (429, 5xx, timeouts, a retried call, latency over 1.5x baseline)
   halves the AIMD rate, success grows it back additively; a backend whose connections are
   refused (the client's circuit opens: BackendUnreachable) ends the run: nothing more is sent,
   and the summary says why (`unreachable`);
4. store through CacheClient with source="warm": the ticket's generation check refuses a write
   whose namespace was retired or whose context was invalidated while it computed.
No task outlives `run`: on any exit, normal or not, in-flight sends are awaited or cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.progress import Progress

from backends.base import Backend, Generation, GenerationRequest
from backends.engine import EngineReader
from backends.pacing import Aimd, AimdConfig, Backoff, Clock, MonotonicClock, Ramp, TokenBucket
from caches.boundary import redis_boundary
from caches.client import CacheClient
from caches.policy import request_bypass_reason
from caches.request import LookupResult
from schemas.errors import (
    BackendOverloaded,
    BackendRejected,
    BackendUnavailable,
    BackendUnreachable,
    ConfigError,
    RequestRejected,
)
from warmers import metrics as M
from warmers.engineguard import EngineGuard, GuardConfig
from warmers.hotset.options import DEFAULT_IDLE_PRICE, DEFAULT_MIN_TTL_LEFT_S
from warmers.hotset.plan import WarmItem
from warmers.hotset.value import price_at

log = logging.getLogger(__name__)

Skip = Literal["cached", "uncacheable", "negative", "priced", "busy"]


class WarmConfig(BaseModel):
    """The owner of warm_qps's and warm_load_from_metrics's defaults and bounds
    (stoker/options.py); its TTL bar and idle price default to the planner's (HotSetConfig's).

    capacity_qps: what the backend serves at most; unknown (None) means the target is
    taken as the ramp's end (target = 20% of capacity), so the run starts at target/4."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_qps: float = Field(default=5.0, gt=0)
    capacity_qps: float | None = None
    ramp_start_frac: float = 0.05
    ramp_end_frac: float = 0.20
    ramp_s: float = 30.0
    concurrency: int = 16
    jitter_frac: float = 0.2  # each send lands uniformly within the first 20% of its interval
    min_ttl_left_s: float = DEFAULT_MIN_TTL_LEFT_S  # under it, an entry is warmed again
    aimd: AimdConfig = Field(default_factory=AimdConfig)
    seed: int | None = None
    # A GPU-ms at idle, as a share of one at full load: what an item's worth is priced at when
    # it is sent (value.price_at). None: the plan's price stands, whatever the backend shows.
    idle_price: float | None = DEFAULT_IDLE_PRICE
    # The backend's base URL, whose engine's gauges on /metrics add to the load a send is priced
    # at (backends/engine.py); None: only the answers' latency and 429s show the load.
    engine_url: str | None = None
    # Off: engine_url is not read, and the answers' latency and 429s alone pace and price.
    load_from_metrics: bool = True
    # With engine_url: wait for room the live traffic leaves, and make way when a request waits
    # for a slot (engineguard.py); None: the engine's gauges only price sends.
    engine_guard: GuardConfig | None = Field(default_factory=GuardConfig)

    @model_validator(mode="after")
    def _check(self) -> WarmConfig:
        if self.concurrency < 1:
            raise ConfigError("concurrency must be >= 1")
        if not 0 < self.ramp_start_frac <= self.ramp_end_frac:
            raise ConfigError("need 0 < ramp_start_frac <= ramp_end_frac")
        if not 0 <= self.jitter_frac < 1:
            raise ConfigError("jitter_frac must lie in [0, 1)")
        if self.idle_price is not None and not 0.0 <= self.idle_price <= 1.0:
            raise ConfigError(f"idle price must lie in [0, 1], got {self.idle_price}")
        return self

    @property
    def metrics_url(self) -> str | None:
        """Where the engine's gauges are read: engine_url, unless load_from_metrics is off."""
        return self.engine_url if self.load_from_metrics else None

    def ramp(self) -> Ramp:
        cap = self.capacity_qps or self.target_qps / self.ramp_end_frac
        return Ramp(self.target_qps, cap, self.ramp_start_frac, self.ramp_end_frac, self.ramp_s)


@dataclass
class WarmSummary:
    sent: int = 0
    cached: int = 0  # answers that landed
    skipped_cached: int = 0
    skipped_uncacheable: int = 0
    skipped_negative: int = 0
    skipped_priced: int = 0  # worth less than its send at the load the backend showed then
    skipped_busy: int = 0  # found no room on the engine within its hold (engineguard.py)
    yielded: int = 0  # sends cancelled in flight to make way for live traffic (engineguard.py)
    held_s: float = 0.0  # time sends waited for room on the engine
    failed: int = 0
    overloaded: int = 0  # of the failed, how many were 429s
    refused_stale: int = 0  # generation moved or namespace retired while computing
    # answered, but not an answer the cache keeps (cut by max_tokens: finish_reason=length),
    # and the first such reason: the backend did not fail, the answer was not cacheable
    not_stored: int = 0
    not_stored_reason: str = ""
    unreachable: str = ""  # why the run stopped sending: the backend refuses connections
    gpu_seconds: float = 0.0
    achieved_qps: float = 0.0
    elapsed_s: float = 0.0
    final_rate_qps: float = 0.0
    backoff_events: list[Backoff] = field(default_factory=list)
    send_times: list[float] = field(default_factory=list, repr=False)
    sent_keys: list[str] = field(default_factory=list, repr=False)  # exact keys, as sent
    landed_keys: list[str] = field(default_factory=list, repr=False)  # exact keys, as landed

    @property
    def skipped(self) -> int:
        """Items not sent: cached, uncacheable, recently failed, priced out or held out."""
        s = self
        return (
            s.skipped_cached + s.skipped_uncacheable + s.skipped_negative + s.skipped_priced
            + s.skipped_busy
        )  # fmt: skip

    @property
    def backoffs(self) -> int:
        return len(self.backoff_events)


class ShadowWarmer:
    """One run at a time. The cache client is sync. A lookup is cheaper on the loop than through
    asyncio.to_thread, so it runs on the loop (2% of it at 50 QPS; bench_warm_qps, see
    docs/benchmarks.md, "Warm pacing"); `store` runs in a thread because with a semantic store
    it embeds the prompt, milliseconds of CPU that would stall pacing."""

    def __init__(
        self,
        backend: Backend,
        cache: CacheClient,
        config: WarmConfig | None = None,
        *,
        clock: Clock | None = None,
        progress: bool | None = None,
        console: Console | None = None,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.cfg = config or WarmConfig()
        self.clock = clock or MonotonicClock()
        self._console = console or Console(stderr=True)
        self._progress = self._console.is_terminal if progress is None else progress
        self.aimd: Aimd | None = None  # the live controller of the current run (benchmarks read it)
        self.summary: WarmSummary | None = None  # the current run's, as it goes (the same)

    async def run(self, items: Iterable[WarmItem]) -> WarmSummary:
        todo = list(items)
        s = self.summary = WarmSummary()
        bar = Progress(console=self._console, disable=not self._progress, transient=True)
        with bar:
            task_id = bar.add_task("warming", total=len(todo))
            await _Run(self, s, lambda: bar.advance(task_id)).go(todo)
        return s

    # -- step 1: what to send --

    def check(self, item: WarmItem) -> LookupResult | Skip:
        """A miss (with its WriteTicket) to warm, or why the item is skipped."""
        req = item.identity
        if request_bypass_reason(req.params):
            return "uncacheable"
        try:
            res = self.cache.lookup(req, use_semantic=False)
        except RequestRejected:
            return "uncacheable"
        if res.outcome == "bypass":
            return "uncacheable"
        if res.outcome == "negative":
            return "negative"
        if res.outcome != "exact":
            return res
        key = req.key()
        with redis_boundary("pttl"):
            pttl = int(self.cache.redis.pttl(key.exact()))
        bar_s = self.cfg.min_ttl_left_s if item.refresh_under_s is None else item.refresh_under_s
        if pttl == -1 or pttl > bar_s * 1000:
            return "cached"
        # Expiring soon (or gone since the GET): warm again under a fresh ticket.
        ticket = self.cache.generations.snapshot(key, req.docs)
        return LookupResult("miss", ticket=ticket, key=key.exact())


class _Run:
    """The state of one run: pacing, in-flight tasks, the summary."""

    def __init__(self, w: ShadowWarmer, s: WarmSummary, tick: Callable[[], None]) -> None:
        self.w, self.s, self.tick = w, s, tick
        self.clock = w.clock
        self.ramp = w.cfg.ramp()
        self.aimd = w.aimd = Aimd(w.cfg.aimd, self.ramp.ceiling(0.0), self.clock)
        # Burst 2, not 1: a timer fires ~1 ms late on a busy loop, and with room for one token
        # only, that time is lost every interval (bench_warm_qps: warm_qps_50); a second token
        # keeps the fraction, and an idle spell still buys at most one extra send.
        self.bucket = TokenBucket(self.aimd.rate, self.clock, burst=2.0)
        self.sem = asyncio.Semaphore(w.cfg.concurrency)
        self.tasks: set[asyncio.Task[None]] = set()
        self.error: BaseException | None = None
        self.rng = random.Random(w.cfg.seed)
        self.t0 = self.clock.now()
        self.on_air: set[asyncio.Task[None]] = set()  # sends the backend is computing
        self.room = asyncio.Lock()  # one send at a time asks the guard for room
        url, guarded = w.cfg.metrics_url, w.cfg.engine_guard
        self.engine: EngineReader | None = None
        self.guard: EngineGuard | None = None
        if url and (guarded is not None or w.cfg.idle_price is not None):
            every = guarded.interval_s if guarded is not None else 1.0
            self.engine = EngineReader(url, interval_s=every, clock=self.clock.now)
        if self.engine is not None and guarded is not None:
            self.guard = EngineGuard(self.engine, guarded, self.clock, lambda: len(self.on_air))

    async def go(self, todo: list[WarmItem]) -> None:
        watch = None
        if self.guard is not None:
            watch = asyncio.create_task(self.guard.watch(self._make_way, self._deferred))
        try:
            for item in todo:
                self._raise_if_failed()
                if self.s.unreachable:
                    break
                verdict = self.w.check(item)
                if isinstance(verdict, str):
                    self._skip(verdict)
                    continue
                await self.sem.acquire()
                if self.s.unreachable:  # came in while this item waited for its slot
                    self.sem.release()
                    break
                if await self._priced_out(item):
                    self.sem.release()
                    self._skip("priced")
                    continue
                await self._pace()
                t = asyncio.create_task(self._warm_one(item, verdict))
                self.tasks.add(t)
                t.add_done_callback(self._done)
            if self.tasks:
                await asyncio.wait(set(self.tasks))
            self._raise_if_failed()
        finally:
            if watch is not None:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
            await self._cancel_all()
            self._finish()

    def _skip(self, why: Skip, *, advance: bool = True) -> None:
        M.SKIPPED.labels(why).inc()
        if why == "cached":
            self.s.skipped_cached += 1
        elif why == "uncacheable":
            self.s.skipped_uncacheable += 1
        elif why == "priced":
            self.s.skipped_priced += 1
        elif why == "busy":
            self.s.skipped_busy += 1
        else:
            self.s.skipped_negative += 1
        if advance:
            self._advance()

    async def _priced_out(self, item: WarmItem) -> bool:
        """Step 2's price check, once every earlier send has its slot (and with one slot, its
        answer): the load those answers show, or the engine reports, is the load this send
        would meet."""
        idle = self.w.cfg.idle_price
        if item.worth is None or idle is None:
            return False
        engine = await self.engine.latest() if self.engine else None
        loads = [self.aimd.load(), engine.load if engine else None]
        known = [x for x in loads if x is not None]
        if not known:  # no baseline and no engine gauges yet: the plan's forecast price stands
            return False
        return item.worth.value_at(price_at(max(known), idle)) <= 0.0

    def _advance(self) -> None:
        self.tick()

    def _make_way(self) -> int:
        """Cancel the sends the backend is computing (engineguard.py, step 2); how many."""
        on_air = list(self.on_air)
        for t in on_air:
            t.cancel()
            M.failed("yielded")
        self.s.yielded += len(on_air)
        return len(on_air)

    def _deferred(self) -> None:
        self.aimd.on_congestion("engine_deferred")

    async def _pace(self) -> None:
        elapsed = self.clock.now() - self.t0
        self.bucket.set_rate(self.aimd.set_ceiling(self.ramp.ceiling(elapsed)))
        M.QPS.set(self.bucket.rate)
        await self.bucket.acquire()

    def _done(self, t: asyncio.Task[None]) -> None:
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None and self.error is None:
            self.error = t.exception()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    async def _cancel_all(self) -> None:
        if self.engine is not None:
            await self.engine.aclose()
        pending = list(self.tasks)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def _finish(self) -> None:
        s = self.s
        s.elapsed_s = self.clock.now() - self.t0
        s.held_s = self.guard.held_s if self.guard is not None else 0.0
        s.final_rate_qps = self.aimd.rate
        M.QPS.set(0)  # the run is over: nothing is sent until the next one
        s.backoff_events = list(self.aimd.backoffs)
        if s.sent >= 2:
            times = sorted(s.send_times)
            span = times[-1] - times[0]
            s.achieved_qps = (s.sent - 1) / span if span > 0 else 0.0

    # -- steps 2-4 for one item --

    async def _warm_one(self, item: WarmItem, miss: LookupResult) -> None:
        try:
            jitter = self.w.cfg.jitter_frac
            if jitter:
                await self.clock.sleep(self.rng.uniform(0.0, jitter / self.bucket.rate))
            if not await self._on_air():
                self._skip("busy", advance=False)  # the finally below advances
                return
            self.s.sent_keys.append(miss.key)
            gen = await self._send(item.request)
            if gen is not None:
                await self._store(miss, gen)
        finally:
            self.sem.release()
            self._advance()

    async def _on_air(self) -> bool:
        """Count this task among the sends the backend computes, once the guard (if any) finds
        room for it: one task at a time, so the next one counts this one as the warm's own."""
        task = asyncio.current_task()
        assert task is not None
        if self.guard is None:
            self.on_air.add(task)
            return True
        async with self.room:
            if not await self.guard.room():
                return False
            self.on_air.add(task)
            return True

    async def _send(self, req: GenerationRequest) -> Generation | None:
        self.s.sent += 1
        M.SENT.inc()
        self.s.send_times.append(self.clock.now())
        try:
            gen = await self.w.backend.generate(req)
        except BackendOverloaded:
            self.s.failed += 1
            self.s.overloaded += 1
            M.failed("overloaded")
            self.aimd.on_congestion("429")
            return None
        except BackendUnreachable as e:
            self.s.failed += 1
            M.failed("unavailable")
            if not self.s.unreachable:  # one line for the run, not one per send in flight
                self.s.unreachable = str(e)
                log.warning("warm run stopped: %s", e)
            return None
        except BackendUnavailable as e:
            self.s.failed += 1
            self.aimd.on_congestion("unavailable")
            M.failed("unavailable")
            log.info("warm send failed: %s", e)
            return None
        except BackendRejected as e:
            self.s.failed += 1  # the request itself is bad: no congestion signal
            M.failed("rejected")
            log.warning("backend rejected a warm request: %s", e)
            return None
        finally:
            self.on_air.discard(asyncio.current_task())
        self.s.gpu_seconds += gen.gpu_ms / 1000.0
        M.generated(gen.latency_ms, gen.gpu_ms)
        if gen.retries:
            self.aimd.on_congestion("retried")
        else:
            self.aimd.on_success(gen.latency_ms, gen.tokens_out)
        return gen

    async def _store(self, miss: LookupResult, gen: Generation) -> None:
        res = await asyncio.to_thread(
            self.w.cache.store,
            miss,
            gen.text,
            source="warm",
            tokens_in=gen.tokens_in,
            tokens_out=gen.tokens_out,
            gpu_ms=gen.gpu_ms,
            finish_reason=gen.finish_reason,  # a truncated warm answer is never stored
        )
        if res.landed:
            self.s.cached += 1
            self.s.landed_keys.append(miss.key)
            M.STORED.labels("landed").inc()
        elif res.reason.startswith(("stale", "retired")):
            self.s.refused_stale += 1
            M.STORED.labels("stale").inc()
        else:
            M.STORED.labels("refused").inc()
            self.s.not_stored += 1
            self.s.not_stored_reason = self.s.not_stored_reason or res.reason
            log.info("warm answer not stored: %s", res.reason)
