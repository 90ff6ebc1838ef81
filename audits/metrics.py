"""The wrong-hit monitor's metrics: the served hits it sampled, by result, and the stale-serve
checks after an invalidation. Labels are fixed lists (the result) and the tenant."""

from __future__ import annotations

from typing import Literal

from prometheus_client import Counter

# The wrong-hit monitor (audits/monitor.py), per served hit it sampled: "same" /
# "different" (judged), "over_rate" (dropped: the QPS cap had no token), "busy" (dropped: the
# backend's answers showed it loaded), "entry_gone" (expired or invalidated before the re-ask),
# "backend_error", "cut" (the re-ask ended on its length).
AuditResult = Literal[
    "same", "different", "over_rate", "busy", "entry_gone", "backend_error", "cut"
]
AUDITS = Counter(
    "stoker_monitor_audits",
    "Served hits the wrong-hit monitor sampled, by result (same / different when re-asked)",
    ["result"],
)
# Of those, the exact hits served soon after an invalidation in their tenant (the stale-serve
# check), by verdict: "different" is an answer the backend no longer gives, served from cache.
STALE_CHECKS = Counter(
    "stoker_monitor_stale_checks",
    "Exact hits served soon after an invalidation, re-asked, by verdict (different: stale)",
    ["tenant", "result"],
)


def audited(result: AuditResult) -> None:
    AUDITS.labels(result).inc()


def stale_checked(tenant: str, verdict: Literal["same", "different"]) -> None:
    STALE_CHECKS.labels(tenant, verdict).inc()
