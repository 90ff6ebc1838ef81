"""A token bucket that paces deletions to a target rate without letting bursts pile up."""

from __future__ import annotations

import threading
import time


class TokenBucket:
    """`spend(n)` after doing n units of work waits until they are paid for at `rate` per second.

    Paying after the work (not before) makes a run of k batches last exactly k * n / rate, so
    the achieved rate is the target, not k / (k - 1) of it (+2.6% measured at 40 batches when
    paying before). Spending more than `burst` in one call is allowed and pushes the next call
    later; `burst` caps the credit saved while idle (0 = no credit: pauses are exact).
    rate None = unthrottled.
    """

    def __init__(self, rate: float | None, burst: float = 0.0) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 per second or None, got {rate}")
        self.rate = rate
        self.burst = burst
        self._due = time.monotonic()

    def spend(self, n: int, stop: threading.Event | None = None) -> bool:
        """Account n units just done and wait for them; False if `stop` was set while waiting."""
        if self.rate is None or n <= 0:
            return not (stop is not None and stop.is_set())
        now = time.monotonic()
        self._due = max(self._due, now - self.burst / self.rate) + n / self.rate
        wait = self._due - now
        if wait <= 0:
            return not (stop is not None and stop.is_set())
        if stop is None:
            time.sleep(wait)  # a pacing delay, not a wait on a condition
            return True
        return not stop.wait(wait)
