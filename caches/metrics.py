"""Cache client metrics: lookups by outcome and their latency, semantic hit scores, stores.

The lookup path is the serving hot path (an exact hit is one GET, ~100 us on loopback), and
prometheus-client's labelled Counter + Histogram cost 2-7 us per call here (each takes a lock;
measured on this loaded 2-core box). So lookups are tallied in plain lists, one slot per
(outcome, bucket), and turned into a counter and a histogram only when Prometheus scrapes:
~0.5 us per lookup. Two threads racing on one slot can lose an increment under the GIL; a
metric may undercount by that, a cache never misbehaves by it.

Labels are bounded on purpose: outcome (5 values), store result and a reason from a fixed
list. No tenant or prompt: the gateway serves any number of tenants. The one exception is the
error budget's gauges (stoker_served_wrong_*{tenant,route}): the alert on them is per tenant
and route by definition, and ServingLevels bounds the pairs it knows (1,000 by default).
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from functools import wraps
from typing import Final, ParamSpec, Protocol, TypeVar

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from caches.matching.base import MATCH_TOTALS
from caches.matching.calibration import ROUTE as CHECKS_ROUTE
from caches.matching.calibration import AnswerSignal
from caches.matching.error_budget import ServingLevels, min_evidence

OUTCOMES: Final = ("exact", "semantic", "negative", "miss", "bypass")
# Seconds. An exact hit sits near 0.1-0.5 ms, a semantic lookup (embed + search + MGET) near
# 2-20 ms, so the buckets are dense below 25 ms.
LOOKUP_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# Cosine of accepted semantic hits: where they sit above the threshold (0.92 default) tells
# whether it is too tight (mass piled at the bar) or too loose.
SCORE_BUCKETS: Final = (0.8, 0.85, 0.9, 0.92, 0.94, 0.96, 0.98, 0.99, 0.995, 1.0)
# Why a store did not land, as CacheClient.store words it (the part before ":"); any other
# text is counted as "other" so a reason carrying a number never mints a new series.
STORE_REASONS: Final = frozenset(
    {
        "landed",
        "not cacheable",
        "incomplete answer",
        "error response",
        "empty response",
        "response over",
        "retired namespace",
        "stale",
    }
)

SEMANTIC_HIT_SCORE = Histogram(
    "stoker_cache_semantic_hit_score",
    "Cosine similarity of accepted semantic hits",
    buckets=SCORE_BUCKETS,
)
STORES = Counter(
    "stoker_cache_stores",
    "Cache stores by result (landed / refused) and reason",
    ["result", "reason"],
)

# The embedding micro-batcher (caches/embedders.py), by kind: "lookup" (a request waits on it,
# within the lookup budget of 50 ms by default) or "background" (indexing answers, warm runs).
# Seconds: dense up to 100 ms, where the lookup budget sits.
EMBED_BUCKETS: Final = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
EMBED_SECONDS = Histogram(
    "stoker_embed_seconds",
    "Embedding time as a caller waited for it (queue + forward pass), by kind",
    ["kind"],
    buckets=EMBED_BUCKETS,
)
EMBED_PASS_SECONDS = Histogram(
    "stoker_embed_pass_seconds", "One forward pass of the embedder, by kind", ["kind"],
    buckets=EMBED_BUCKETS,
)  # fmt: skip
EMBED_BATCH_TEXTS = Histogram(
    "stoker_embed_batch_texts", "Texts per forward pass of the embedder, by kind", ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)  # fmt: skip


class _LookupTally(Collector):
    """Per outcome: count, latency sum and bucket counts; exported at scrape time."""

    def __init__(self) -> None:
        n = len(LOOKUP_BUCKETS) + 1  # the last slot is +Inf
        self.buckets: dict[str, list[int]] = {o: [0] * n for o in OUTCOMES}
        self.sums: dict[str, float] = dict.fromkeys(OUTCOMES, 0.0)

    def observe(self, outcome: str, seconds: float) -> None:
        row = self.buckets.get(outcome)
        if row is None:  # an outcome this module does not know: not worth a new series
            return
        row[bisect_left(LOOKUP_BUCKETS, seconds)] += 1
        self.sums[outcome] += seconds

    def collect(self) -> Iterator[Metric]:
        count = CounterMetricFamily(
            "stoker_cache_lookups", "Cache lookups by outcome", labels=["outcome"]
        )
        hist = HistogramMetricFamily(
            "stoker_cache_lookup_seconds", "Cache lookup latency by outcome", labels=["outcome"]
        )
        for o in OUTCOMES:
            row = list(self.buckets[o])  # a copy: lookups go on while we export
            cumulative, acc = [], 0
            for bound, n in zip((*LOOKUP_BUCKETS, float("inf")), row, strict=True):
                acc += n
                cumulative.append((_fmt(bound), float(acc)))
            count.add_metric([o], float(acc))
            hist.add_metric([o], cumulative, self.sums[o])
        yield count
        yield hist

    def describe(self) -> Iterator[Metric]:
        # Names only, so the registry refuses a clash at import and tests can list them.
        yield CounterMetricFamily("stoker_cache_lookups", "", labels=["outcome"])
        yield HistogramMetricFamily("stoker_cache_lookup_seconds", "", labels=["outcome"])


def _fmt(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


LOOKUPS: Final = _LookupTally()
REGISTRY.register(LOOKUPS)


class _MatchTally(Collector):
    """The semantic matchers' decisions (caches.matching.MATCH_TOTALS), read at scrape time.

    Labels stay bounded: a rule names the matcher and its configured threshold or vote count
    (one series per configured threshold, not per score), a guard is one of a fixed few."""

    # (name, help, label, the counts by label value; label None: one unlabelled count)
    FAMILIES: Final = (
        (
            "stoker_semantic_match_decisions",
            "Semantic lookups that reached the matcher",
            None,
            lambda t: {"": t.lookups},
        ),
        (
            "stoker_semantic_match_hits",
            "Semantic hits by the rule that accepted them",
            "rule",
            lambda t: t.hits,
        ),
        (
            "stoker_semantic_guard_rejections",
            "Candidates a lexical guard refused",
            "guard",
            lambda t: t.rejected_by_guard,
        ),
        (
            "stoker_semantic_match_verifications",
            "Learned matchers' checks of a candidate by outcome",
            "outcome",
            lambda t: t.verification,
        ),
    )

    def collect(self) -> Iterator[Metric]:
        for name, doc, label, counts in self.FAMILIES:
            family = CounterMetricFamily(name, doc, labels=[label] if label else None)
            for value, n in sorted(counts(MATCH_TOTALS).items()):
                family.add_metric([value] if label else [], float(n))
            yield family

    def describe(self) -> Iterator[Metric]:
        for name, _, label, _ in self.FAMILIES:
            yield CounterMetricFamily(name, "", labels=[label] if label else None)


REGISTRY.register(_MatchTally())


class _BudgetGauges(Collector):
    """The error budget of every verified matcher in the process, per tenant and route, from
    the counts each last read (no I/O at scrape time; counts.py keeps them in Redis, so every
    replica exports the same figures, and the alert takes max/min over replicas):
    - stoker_served_wrong_ratio: wrong / checked among the verdicts of the serving level (the
      pairs it would serve: monitor audits of served hits and shadow checks of near misses);
    - stoker_served_wrong_ratio_bound: their one-sided 95% Clopper-Pearson upper bound, only
      once there are enough verdicts that a bound could be within budget at all (299 for 1%;
      min_evidence): with fewer, the matcher serves at its strictest level and a bound of
      3/n says "not yet shown", not "wrong above budget", which StokerServedWrongAboveBudget
      must not page about;
    - stoker_served_wrong_budget: the operator's maximum (STOKER_MAX_WRONG_HIT_RATE);
    - stoker_semantic_prompt_fallback{tenant}: 1 while the tenant's answer checks have not shown
      that the backend's answers tell meanings apart (caches/matching/calibration.py: blind or
      unknown), so the prompt-only rule serves instead of the ladder; 0 once they have."""

    NAMES: Final = (
        ("stoker_served_wrong_ratio", "Share of budget verdicts judged wrong, serving level"),
        ("stoker_served_wrong_ratio_bound", "95% upper bound of the served wrong-hit rate"),
        ("stoker_served_wrong_budget", "Maximum wrong-hit rate served (the error budget)"),
    )
    FALLBACK: Final = (
        "stoker_semantic_prompt_fallback",
        "1 while the backend's answers are not shown to tell meanings apart (prompt-only rule)",
    )

    def __init__(self) -> None:
        self._watched: weakref.WeakSet[ServingLevels] = weakref.WeakSet()

    def watch(self, levels: ServingLevels) -> None:
        self._watched.add(levels)

    def collect(self) -> Iterator[Metric]:
        ratio, bound, budget = (
            GaugeMetricFamily(n, doc, labels=["tenant", "route"]) for n, doc in self.NAMES
        )
        fallback = GaugeMetricFamily(*self.FALLBACK, labels=["tenant"])
        seen: set[tuple[str, str]] = set()
        for levels in list(self._watched):
            for s in levels.serving():
                if (s.tenant, s.route) in seen:  # two clients of one process: the same counts
                    continue
                seen.add((s.tenant, s.route))
                if s.route == CHECKS_ROUTE:  # the answer checks are kept per tenant
                    state = AnswerSignal(s.near, s.unrelated).state
                    fallback.add_metric([s.tenant], float(state != "separates"))
                ev, labels = s.evidence, [s.tenant, s.route]
                ratio.add_metric(labels, ev.wrong / ev.checked if ev.checked else 0.0)
                if ev.checked >= min_evidence(s.delta):
                    bound.add_metric(labels, ev.bound)
                budget.add_metric(labels, s.delta)
        yield ratio
        yield bound
        yield budget
        yield fallback

    def describe(self) -> Iterator[Metric]:
        for name, _ in self.NAMES:
            yield GaugeMetricFamily(name, "", labels=["tenant", "route"])
        yield GaugeMetricFamily(self.FALLBACK[0], "", labels=["tenant"])


BUDGET_GAUGES: Final = _BudgetGauges()
REGISTRY.register(BUDGET_GAUGES)


class _Looked(Protocol):
    @property
    def outcome(self) -> str: ...

    @property
    def score(self) -> float | None: ...


class _Stored(Protocol):
    @property
    def landed(self) -> bool: ...

    @property
    def reason(self) -> str: ...


P = ParamSpec("P")
S = TypeVar("S", bound=_Stored)


def observe_lookup(res: _Looked, seconds: float) -> None:
    """Tally one lookup's outcome and latency (CacheClient.lookup calls it inline: a decorator's
    *args/**kwargs forwarding alone cost ~1 us on the hit path)."""
    LOOKUPS.observe(res.outcome, seconds)
    if res.outcome == "semantic" and res.score is not None:
        SEMANTIC_HIT_SCORE.observe(res.score)


def observed_store(fn: Callable[P, S]) -> Callable[P, S]:
    """Decorates CacheClient.store: count landed / refused by a bounded reason."""

    @wraps(fn)
    def store(*args: P.args, **kwargs: P.kwargs) -> S:
        res = fn(*args, **kwargs)
        count_store(res)
        return res

    return store


def count_store(res: _Stored) -> None:
    """Count one store's result (observed_store does it for CacheClient.store)."""
    STORES.labels("landed" if res.landed else "refused", store_reason(res.reason)).inc()


def store_reason(reason: str) -> str:
    """The bounded label for a StoreResult.reason ("stale: generation moved at c" -> "stale")."""
    head = reason.split(":", 1)[0].strip()
    if head.startswith("response over"):
        head = "response over"
    return head if head in STORE_REASONS else "other"
