"""The gateway's Prometheus series: what it served, what it bypassed and why, and its log.

Labels are bounded: outcome (5 values), bypass reason (a fixed set: deadline, cache_down,
rejected, temperature>0, temperature_unset, no-cache, n>1, logprobs, non-text content, several
prompts, empty prompt, over_limit (a prompt over the cache's max_prompt_chars); and
semantic_deadline / semantic_down, where only the semantic layer was skipped and the miss was
still stored), route (the 4 API paths), HTTP status class, upstream (the gateway's one base
URL). No tenant, no prompt.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SERVED = Counter(
    "stoker_gateway_served",
    "Requests the gateway answered, by cache outcome and API",
    ["outcome", "api"],
)
BYPASS = Counter(
    "stoker_gateway_bypass",
    "Requests that went upstream without the cache, by reason (deadline / cache_down = failed open)",
    ["reason"],
)
HTTP = Counter(
    "stoker_gateway_http_responses", "HTTP responses by route and status class", ["route", "status"]
)
COALESCED = Counter(
    "stoker_gateway_coalesced",
    "Misses answered by another request's upstream call (herd protection)",
)
STORES = Counter("stoker_gateway_stores", "Answers offered to the cache, by result", ["result"])
LOG_EVENTS = Counter(
    "stoker_gateway_log_events",
    "Request-log events: published, dropped (buffer full or broker refused), unpublished (no Kafka)",
    ["result"],
)
UPSTREAM_SECONDS = Histogram(
    "stoker_gateway_upstream_seconds",
    "Upstream call time (to the end of the answer)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LOOKUP_SECONDS = Histogram(
    "stoker_gateway_lookup_seconds",
    "Cache lookup time, as the request waited for it",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
)
IN_FLIGHT = Gauge("stoker_gateway_in_flight", "Requests being answered now")
UPSTREAM_UP = Gauge(
    "stoker_upstream_up",
    "Whether the upstream answered the gateway's last GET <base>/models (1) or not (0)",
    ["upstream"],
)

# The bypass reasons that are the gateway failing open, not a request's own choice.
FAILED_OPEN = frozenset({"deadline", "cache_down"})


def bypass(reason: str) -> None:
    BYPASS.labels(reason=reason.split(":")[0]).inc()


def served(outcome: str, api: str) -> None:
    SERVED.labels(outcome=outcome, api=api).inc()


def stored(result: str) -> None:
    STORES.labels(result=result).inc()


def logged(result: str, n: int = 1) -> None:
    LOG_EVENTS.labels(result=result).inc(n)
