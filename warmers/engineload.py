"""The backend's load as its own engine reports it on /metrics (vLLM's gauges), for pricing a
warm when it is sent.

The shadow warmer prices each valued send at the backend's load (value.price_at). Its answers
show that load late: latency per token rises once the batch is already full, and a 429 comes
once the queue is. An engine that exports its state says it at once:
- `vllm:num_requests_waiting` above 0: requests queue for a batch slot, the engine is full
  (load 1.0);
- else `vllm:kv_cache_usage_perc` (vLLM V1; `vllm:gpu_cache_usage_perc` in V0), the share of
  the KV cache the running requests hold, 0..1: how much room the batch has left.
A backend that exports neither (or no /metrics) gives None, and the answers' load stands alone.

`EngineLoad` reads at most every `interval_s`, in the background after its first read, so a
slow /metrics never holds a send back; its task ends with the run (`aclose`).
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from warmers.promtext import samples
from warmers.throttle import Clock, MonotonicClock

_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def engine_load(metrics: str) -> float | None:
    """0 idle .. 1 full from an engine's Prometheus text (module docstring); None when it does
    not say. Several engines (one per label set) count by the fullest."""
    got = samples(metrics, (_WAITING, *_KV_USAGE))
    if max(got.get(_WAITING, [0.0])) > 0:
        return 1.0
    usage = [v for name in _KV_USAGE for v in got.get(name, [])]
    return min(1.0, max(0.0, max(usage))) if usage else None


class EngineLoad:
    """The last load read from `url` (a /metrics endpoint), refreshed in the background."""

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        self.url, self.interval_s, self.timeout_s = url, interval_s, timeout_s
        self.clock = clock or MonotonicClock()
        self.last: float | None = None
        self._read_at: float | None = None
        self._http: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None

    async def read(self) -> float | None:
        """The load now, as last read: the first call waits for one read (at most timeout_s);
        later calls start a refresh when the last read is older than interval_s, and return
        what is known without waiting for it."""
        if self._read_at is None:
            await self._refresh()
        elif self.clock.now() - self._read_at >= self.interval_s and self._task is None:
            self._task = asyncio.create_task(self._refresh())
            self._task.add_done_callback(self._forget)
        return self.last

    def _forget(self, _t: asyncio.Task[None]) -> None:
        self._task = None

    async def _refresh(self) -> None:
        self._read_at = self.clock.now()
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout_s)
        try:
            resp = await self._http.get(self.url)
        except httpx.HTTPError:
            self.last = None
            return
        self.last = engine_load(resp.text) if resp.status_code == 200 else None

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._http is not None:
            await self._http.aclose()
