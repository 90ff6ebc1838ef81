"""Warmer metrics: warm sends, errors, skips and stores, pacing rate, GPU-seconds, backend latency.

No tenant or model labels: a warm run spans every tenant of a namespace, and its figures per
tenant live in the run's job record (`stoker status`). Labels are fixed lists: error kind (3),
skip reason (3), store result (3).

The scheduler leader gauge is 1 in the one process that holds the scheduler's lease and 0 in
the others; the alert "scheduler leader missing" fires when no process reports 1.
"""

from __future__ import annotations

from typing import Final, Literal

from prometheus_client import Counter, Gauge, Histogram

# Seconds. A generation is prefill + decode: ~50 ms for a short answer, seconds for a long one.
BACKEND_BUCKETS: Final = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

ErrorKind = Literal["overloaded", "unavailable", "rejected", "yielded"]
StoreResult = Literal["landed", "stale", "refused"]

SENT = Counter("stoker_warm_requests_sent", "Warm requests sent to the backend")
ERRORS = Counter(
    "stoker_warm_errors",
    "Warm requests that failed: overloaded (429), unavailable (5xx, timeouts), rejected (4xx), "
    "yielded (cancelled in flight to make way for live traffic on the engine)",
    ["kind"],
)
SKIPPED = Counter(
    "stoker_warm_skipped",
    "Warm items not sent: cached (fresh entry), uncacheable, negative (failed recently), "
    "priced (worth less than its send at the backend's load then), busy (no room on the "
    "engine: live traffic held its slots)",
    ["reason"],
)
STORED = Counter(
    "stoker_warm_stored",
    "Warm answers by store result: landed, stale (generation moved meanwhile), refused",
    ["result"],
)
QPS = Gauge("stoker_warm_qps", "The warmer's current paced rate (token bucket), requests/s")
GPU_SECONDS = Counter("stoker_warm_gpu_seconds", "GPU-seconds the backend spent on warm requests")
BACKEND_LATENCY = Histogram(
    "stoker_backend_latency_seconds",
    "Backend generation latency seen by the warmer (successful calls)",
    buckets=BACKEND_BUCKETS,
)
SCHEDULER_LEADER = Gauge(
    "stoker_scheduler_leader", "1 if this process is the scheduler's leader, else 0"
)


def generated(latency_ms: float, gpu_ms: float) -> None:
    """One successful generation of a warm request."""
    BACKEND_LATENCY.observe(latency_ms / 1000.0)
    GPU_SECONDS.inc(gpu_ms / 1000.0)


def failed(kind: ErrorKind) -> None:
    ERRORS.labels(kind).inc()


def set_leader(leader: bool) -> None:
    """The scheduler calls this when it takes or loses the lease (and with False at start)."""
    SCHEDULER_LEADER.set(1 if leader else 0)
