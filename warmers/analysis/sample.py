"""What `analyze` embeds when a log has more distinct prompts than its budget, and the estimates.

Embedding is >95% of the cost (~60-150 prompts/s on 2 cores), so the budget counts distinct
normalised prompts. Under it, every request is analysed. Over it:
1. the most asked prompts, `head_share` of the budget, are taken whole (they carry most of the
   requests and every repeat of theirs is a hit or a miss the cache decides);
2. each other prompt is taken with probability `rate` (the rest of the budget over their number,
   drawn with a fixed seed), all of its requests or none: a prompt's exact hits depend only on
   its own requests, so whole prompts keep the TTL cache's behaviour per key;
3. requests that bypass the cache (temperature > 0, no-cache) need no embedding: all are kept.
A total is estimated as the sum over kept requests of weight x value, the weight being 1 or
1/rate (Horvitz-Thompson); rates divide by the whole log's request count, which is known. Its
variance comes from the sampled prompts alone, (1 - rate) / rate^2 x (the prompt's sum)^2
summed over them, and the interval is +-1.96 sigma (95%, normal approximation).
Bias the interval does not cover: a semantic hit served by a neighbour that was not sampled is
missed, so semantic hit rates lean low by about the share of hits whose only earlier neighbour
is a tail prompt (bench_analyze_1m.py measures the total against the full computation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from warmers.analysis.keyed_log import UNCACHEABLE, KeyedLog

Z_95 = 1.96


@dataclass(frozen=True)
class Sample:
    """The requests analysed and how each counts. Invariant: when rate == 1 every weight is 1
    and log is the whole keyed log."""

    log: KeyedLog  # the requests analysed, time-sorted, keys renumbered
    weight: npt.NDArray[np.float64]  # per analysed request
    cluster: npt.NDArray[np.int64]  # per request: its sampled prompt, -1 = taken for certain
    rate: float  # the inclusion probability of a tail prompt (1.0: nothing sampled)
    requests: dict[int | None, int]  # the whole log's requests, overall (None) and per tenant
    gpu_ms: dict[int | None, float]  # ... and their GPU time
    facts: dict[str, Any]

    def rows(self, tenant: int | None) -> npt.NDArray[np.bool_]:
        if tenant is None:
            return np.ones(self.log.requests, dtype=np.bool_)
        out: npt.NDArray[np.bool_] = self.log.tenant == tenant
        return out

    def total(self, y: npt.NDArray[Any], tenant: int | None) -> float:
        """Estimated sum of y over the whole log's requests (of one tenant, or all)."""
        rows = self.rows(tenant)
        return float((self.weight[rows] * y[rows]).sum())

    def rate_of(self, part: npt.NDArray[np.bool_], tenant: int | None) -> float:
        n = self.requests[tenant]
        return round(self.total(part, tenant) / n, 6) if n else 0.0

    def interval(self, y: npt.NDArray[Any], tenant: int | None, per: float) -> tuple[float, float]:
        """95% interval of total(y) / per."""
        est = self.total(y, tenant) / per if per else 0.0
        if self.rate >= 1.0 or not per:
            return round(est, 6), round(est, 6)
        rows = self.rows(tenant) & (self.cluster >= 0)
        sums = np.bincount(self.cluster[rows], weights=y[rows].astype(np.float64))
        var = (1.0 - self.rate) / self.rate**2 * float((sums**2).sum())
        half = Z_95 * var**0.5 / per
        return round(max(0.0, est - half), 6), round(est + half, 6)


def draw(log: KeyedLog, budget: int | None, head_share: float = 0.5, seed: int = 16) -> Sample:
    """The whole log when its distinct prompts fit the budget (None: no budget), else a sample."""
    codes, uniques = pd.factorize(np.asarray(log.key_prompt, dtype=object))
    prompt_of_key = codes.astype(np.int64)
    cacheable = log.key >= 0
    prompt = np.where(cacheable, prompt_of_key[np.where(cacheable, log.key, 0)], -1)
    distinct = len(uniques)
    requests: dict[int | None, int] = {None: log.requests}
    gpu: dict[int | None, float] = {None: float(log.gpu_ms.sum())}
    for i in range(len(log.tenants)):
        requests[i] = int((log.tenant == i).sum())
        gpu[i] = float(log.gpu_ms[log.tenant == i].sum())
    facts: dict[str, Any] = {"sampled": False, "distinct_prompts": distinct, "budget": budget}
    if budget is None or distinct <= budget:
        facts |= {"embedded_prompts": distinct, "head_prompts": distinct, "tail_rate": 1.0}
        ones = np.ones(log.requests)
        return Sample(log, ones, np.full(log.requests, -1), 1.0, requests, gpu, facts)
    asked = np.bincount(prompt[cacheable], minlength=distinct)
    head_n = int(budget * head_share)
    rng = np.random.default_rng(seed)
    # most asked first; ties in a random order, so no prompt wins by where it sits in the log
    order = np.lexsort((rng.random(distinct), -asked))
    head = np.zeros(distinct, dtype=np.bool_)
    head[order[:head_n]] = True
    rate = (budget - head_n) / (distinct - head_n)
    taken = head | (rng.random(distinct) < rate)
    keep = ~cacheable | taken[np.maximum(prompt, 0)]
    tail_row = cacheable & ~head[np.maximum(prompt, 0)]
    weight = np.where(tail_row, 1.0 / rate, 1.0)[keep]
    cluster = np.where(tail_row, prompt, -1)[keep]
    facts |= {
        "sampled": True,
        "embedded_prompts": int(taken.sum()),
        "head_prompts": head_n,
        "tail_rate": round(rate, 6),
        "analysed_requests": int(keep.sum()),
    }
    return Sample(_subset(log, keep), weight, cluster, rate, requests, gpu, facts)


def _subset(log: KeyedLog, keep: npt.NDArray[np.bool_]) -> KeyedLog:
    """The kept requests, with the keys they use renumbered 0..n-1 (in first-id order)."""
    key = log.key[keep]
    used = np.unique(key[key >= 0])
    renumber = np.full(len(log.key_prompt), UNCACHEABLE, dtype=np.int64)
    renumber[used] = np.arange(len(used))
    return replace(
        log,
        ts=log.ts[keep],
        tenant=log.tenant[keep],
        key=np.where(key >= 0, renumber[np.maximum(key, 0)], UNCACHEABLE),
        gpu_ms=log.gpu_ms[keep],
        label=None if log.label is None else log.label[keep],
        key_group=log.key_group[used],
        key_prompt=[log.key_prompt[i] for i in used.tolist()],
    )
