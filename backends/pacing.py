"""Pacing for whatever loads a backend or Redis: one token bucket (the warmers' and the
monitor's grants, the purge's deletions), the 5%->20% ramp and an AIMD controller.

All three read time from an injected Clock, so tests drive them with a fake clock and count
grants instead of timing them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Protocol

# Float slack on "a whole token": (1 - x) / r * r + x can land a hair under 1, and a sleep of
# 1e-17 s does not move a clock that reads 1e3 s, so without it the wait would never end.
_EPS = 1e-9


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    def wait(self, seconds: float, stop: threading.Event | None) -> bool:
        """Block a thread for `seconds`; False if `stop` was set (at once or while waiting)."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def wait(self, seconds: float, stop: threading.Event | None) -> bool:
        if stop is None:
            time.sleep(seconds)  # a pacing delay, not a wait on a condition
            return True
        return not stop.wait(seconds)


class ManualClock:
    """Time moves only when someone sleeps (each sleep still yields to the event loop): tests
    and what-if runs count what happens per simulated second without waiting for it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)

    def wait(self, seconds: float, stop: threading.Event | None) -> bool:
        if stop is not None and stop.is_set():
            return False
        self.t += max(0.0, seconds)
        return True


class TokenBucket:
    """Grants at `rate` per second on average, at most `burst` at once after an idle spell.

    Two ways to take from it. Grants before the work (`acquire`, `try_acquire`: one unit each,
    for requests to a backend): it starts with one token, so the first grant comes at once and
    the rest at the rate, and a short run is not front-loaded by a full bucket. Payment after
    the work (`spend(n)`, for batches of deletions whose size is known only once done): the
    bucket may go into debt and the caller waits it off, so a run of k batches of n lasts
    exactly k * n / rate (paying before would hand the first batch out free, a run of k batches
    one batch short; tests/backends/test_pacing.py holds it). The rate may change between
    grants."""

    def __init__(
        self, rate: float, clock: Clock | None = None, burst: float = 1.0, start: float = 1.0
    ) -> None:
        if rate <= 0 or burst < 1 or not 0 <= start <= burst:
            raise ValueError("rate must be > 0, burst >= 1 and 0 <= start <= burst")
        self.rate = rate
        self.burst = burst
        self._clock = clock or MonotonicClock()
        self._tokens = start
        self._last = self._clock.now()

    def set_rate(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self._refill()
        self.rate = rate

    def _refill(self) -> None:
        now = self._clock.now()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def try_acquire(self) -> bool:
        """Take a token if one is there, never waiting: for a sampler that drops what its rate
        cannot carry (the wrong-hit monitor) instead of falling behind its input."""
        self._refill()
        if self._tokens >= 1.0 - _EPS:
            self._tokens = max(0.0, self._tokens - 1.0)
            return True
        return False

    async def acquire(self) -> None:
        """Wait for one token. Each wait is bounded by 1/rate (re-read after every sleep)."""
        while True:
            self._refill()
            if self._tokens >= 1.0 - _EPS:
                self._tokens = max(0.0, self._tokens - 1.0)
                return
            await self._clock.sleep((1.0 - self._tokens) / self.rate)

    def spend(self, n: int, stop: threading.Event | None = None) -> bool:
        """Account n units just done and block until they are paid for; False if `stop` was
        set (before or while waiting). Spending more than `burst` at once is allowed: the debt
        pushes the next call later."""
        self._refill()
        self._tokens -= max(0, n)
        if self._tokens >= 0:
            return not (stop is not None and stop.is_set())
        return self._clock.wait(-self._tokens / self.rate, stop)


@dataclass(frozen=True)
class Ramp:
    """The warm-rate ceiling: start_frac of capacity, rising linearly to end_frac over
    duration_s, never above the target. Warming starts gently (5% of what the backend can do)
    and only then claims its share (20%): a cold start never lands as a spike."""

    target_qps: float
    capacity_qps: float
    start_frac: float = 0.05
    end_frac: float = 0.20
    duration_s: float = 30.0

    def ceiling(self, elapsed_s: float) -> float:
        if self.duration_s <= 0 or elapsed_s >= self.duration_s:
            frac = self.end_frac
        else:
            frac = self.start_frac + (self.end_frac - self.start_frac) * (
                max(0.0, elapsed_s) / self.duration_s
            )
        return min(self.target_qps, frac * self.capacity_qps)


@dataclass(frozen=True)
class AimdConfig:
    """Halve on congestion (429, 5xx, timeouts, latency over 1.5x baseline), at most once per
    cooldown_s so one burst of errors counts once, as TCP cuts once per round trip; add
    increase_frac of the ceiling per second otherwise (from half to full in 5 s at 0.1)."""

    decrease_factor: float = 0.5
    increase_frac_per_s: float = 0.1
    min_qps: float = 0.2
    cooldown_s: float = 1.0
    baseline_samples: int = 20
    latency_factor: float = 1.5
    ewma_alpha: float = 0.2
    # 3 answers in a row over the bar: one late answer on a busy client (GIL, GC) is not a slow
    # backend, and an EWMA would carry one 9x outlier over the bar for 6 answers. Costs 3
    # answers of reaction, 0.6 s at 5 QPS.
    latency_patience: int = 3
    # How long a 429, 5xx, timeout or retry reads as a full backend (Aimd.load): about the
    # retry-after a server sends, and a few cooldowns.
    busy_hold_s: float = 5.0


@dataclass(frozen=True)
class Backoff:
    at: float  # clock time
    reason: str
    rate_before: float
    rate_after: float


class Aimd:
    """The allowed rate under a moving ceiling. Latency is judged per output token (what
    decode time scales with), so long and short answers share one baseline: the EWMA of the
    first `baseline_samples` successes. Congestion by latency: `latency_patience` answers in
    a row slower than baseline x latency_factor."""

    def __init__(self, cfg: AimdConfig, ceiling: float, clock: Clock) -> None:
        self.cfg = cfg
        self._clock = clock
        self._rate = ceiling
        self._ceiling = ceiling
        self._last_change = clock.now()
        self._last_cut = float("-inf")
        self._last_congestion = float("-inf")
        self._n = 0
        self._over = 0  # answers in a row with the EWMA over the bar
        self.baseline: float | None = None
        self.current: float | None = None
        self.backoffs: list[Backoff] = []

    @property
    def rate(self) -> float:
        return self._rate

    def set_ceiling(self, ceiling: float) -> float:
        """The ramp moved. A rate at the ceiling follows it (the ramp is the plan, and nothing
        went wrong yet); a rate cut below it grows back additively; a lower ceiling clips."""
        following = self._rate >= self._ceiling * (1 - 1e-9)
        self._ceiling = ceiling
        if following:
            self._rate = ceiling
            self._last_change = self._clock.now()
        else:
            self._grow()  # capped by the new ceiling
        return self._rate

    def _grow(self) -> None:
        now = self._clock.now()
        step = self.cfg.increase_frac_per_s * self._ceiling * (now - self._last_change)
        self._rate = min(self._ceiling, self._rate + step)
        self._last_change = now

    def on_success(self, latency_ms: float, tokens_out: int) -> None:
        per_token = latency_ms / max(1, tokens_out)
        a = self.cfg.ewma_alpha
        self.current = per_token if self.current is None else a * per_token + (1 - a) * self.current
        self._n += 1
        if self.baseline is None:
            if self._n >= self.cfg.baseline_samples:
                self.baseline = self.current
            self._grow()
            return
        if per_token > self.baseline * self.cfg.latency_factor:
            self._over += 1
            if self._over >= self.cfg.latency_patience:
                self.on_congestion("latency")
                return
        else:
            self._over = 0
        self._grow()

    def load(self) -> float | None:
        """The backend's load as the answers show it, 0 idle .. 1 full: full within
        `busy_hold_s` of a congestion signal (429, 5xx, timeout, retry), else the latency per
        token over the baseline (1x: 0, latency_factor x, where the rate is cut: 1). None
        before the baseline is known."""
        if self._clock.now() - self._last_congestion < self.cfg.busy_hold_s:
            return 1.0
        if self.baseline is None or self.current is None or self.baseline <= 0:
            return None
        over = self.current / self.baseline - 1.0
        return min(1.0, max(0.0, over / max(self.cfg.latency_factor - 1.0, 1e-9)))

    def on_congestion(self, reason: str) -> None:
        now = self._clock.now()
        self._last_congestion = now
        self._grow()
        if now - self._last_cut < self.cfg.cooldown_s:
            return
        before = self._rate
        self._rate = max(self.cfg.min_qps, before * self.cfg.decrease_factor)
        self._last_cut = self._last_change = now
        self.backoffs.append(Backoff(now, reason, before, self._rate))
