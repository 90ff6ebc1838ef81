"""What `analyze` embeds when a log has more distinct prompts than its budget, and the estimates.

Embedding is >95% of the cost (~60-150 prompts/s on 2 cores), so the budget counts distinct
normalised prompts. Under it, every request is analysed. Over it, the unit of the sample is a
family: prompts that are one another with a few words trimmed from either end ("hey ...",
"... please", "can you tell me ..."), found by hashing (no embedding). Near duplicates are kept or
left out together, so a sampled prompt keeps the neighbours that would have served it:
1. the most asked families, about `head_share` of the budget in prompts, are taken whole (they
   carry most of the requests);
2. each other family is taken with probability `rate` (the rest of the budget over the prompts
   left, drawn with a fixed seed), all of its prompts and requests or none;
3. requests that bypass the cache (temperature > 0, no-cache) need no embedding: all are kept.
A total is estimated as the sum over kept requests of weight x value, the weight being 1 or
1/rate (Horvitz-Thompson); rates divide by the whole log's request count, which is known. Its
variance comes from the sampled families alone, (1 - rate) / rate^2 x (the family's sum)^2
summed over them.
Bias: a semantic hit whose server is a tail prompt of another family (a paraphrase in other
words) is seen only when that family was drawn too. Each hit seen from such a server is
evidence of 1/rate - 1 more the sample missed if every such hit had one possible server
(an upper bound: most have several, and any one of them serves). So the reported rate adds half
of that bound, and its interval spans from the uncorrected figure to the fully corrected one,
widened by 1.96 sigma each side (bench_analyze_1m.py measures both against the full log).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from audits.whatif.keyed_log import UNCACHEABLE, KeyedLog

Z_95 = 1.96
# Families: words trimmed from the two ends together, at most; and prompts per family, at most
# (a chain of trims must not glue the log into one unit the sample takes or leaves whole).
FAMILY_TRIM = 4
FAMILY_CAP = 256
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


@dataclass(frozen=True)
class Sample:
    """The requests analysed and how each counts. Invariant: when rate == 1 every weight is 1
    and log is the whole keyed log."""

    log: KeyedLog  # the requests analysed, time-sorted, keys renumbered
    weight: npt.NDArray[np.float64]  # per analysed request
    cluster: npt.NDArray[np.int64]  # per request: its sampled family, -1 = taken for certain
    key_cluster: npt.NDArray[np.int64]  # per key of `log`: its sampled family, -1 = certain
    rate: float  # the inclusion probability of a tail family (1.0: nothing sampled)
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

    def rate_of(self, part: npt.NDArray[Any], tenant: int | None) -> float:
        n = self.requests[tenant]
        return round(self.total(part, tenant) / n, 6) if n else 0.0

    def unseen(self, served_by: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Per request, the upper bound on hits the sample missed for each one it saw: a hit
        served by (key id in served_by, -1 = not a semantic hit) a tail prompt of another family
        stands for 1/rate - 1 more (see the module docstring)."""
        if self.rate >= 1.0:
            return np.zeros(self.log.requests)
        has = served_by >= 0
        mine = np.where(self.log.key >= 0, self.key_cluster[np.maximum(self.log.key, 0)], -1)
        server = np.where(has, self.key_cluster[np.maximum(served_by, 0)], -1)
        other = has & (server >= 0) & (server != mine)
        return np.where(other, (1.0 - self.rate) / self.rate, 0.0)

    def interval(
        self,
        y: npt.NDArray[Any],
        tenant: int | None,
        per: float,
        unseen: npt.NDArray[np.float64] | None = None,
    ) -> tuple[float, float]:
        """95% interval of total(y + unseen / 2) / per: from total(y) to total(y + unseen), each
        end widened by the sampling error of total(y)."""
        base = self.total(y, tenant) / per if per else 0.0
        extra = self.total(unseen, tenant) / per if per and unseen is not None else 0.0
        if self.rate >= 1.0 or not per:
            return round(base, 6), round(base + extra, 6)
        rows = self.rows(tenant) & (self.cluster >= 0)
        sums = np.bincount(self.cluster[rows], weights=y[rows].astype(np.float64))
        var = (1.0 - self.rate) / self.rate**2 * float((sums**2).sum())
        half = Z_95 * var**0.5 / per
        return round(max(0.0, base - half), 6), round(min(1.0, base + extra + half), 6)


def families(prompts: list[str]) -> npt.NDArray[np.int64]:
    """Per prompt, a family id: prompts that equal one another, word for word, once at most
    FAMILY_TRIM words are trimmed from the ends of the longer share a family (union-find,
    families capped at FAMILY_CAP prompts). Punctuation and case do not count."""
    words = [tuple(_WORD.findall(p.casefold())) for p in prompts]
    first: dict[tuple[str, ...], int] = {}
    for i, w in enumerate(words):
        first.setdefault(w, i)
    parent = list(range(len(prompts)))
    size = [1] * len(prompts)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def join(a: int, b: int) -> None:
        ra, rb = root(a), root(b)
        if ra != rb and size[ra] + size[rb] <= FAMILY_CAP:
            if size[ra] < size[rb]:
                ra, rb = rb, ra
            parent[rb] = ra
            size[ra] += size[rb]

    for i, w in enumerate(words):
        join(i, first[w])
        n = len(w)
        for lead in range(FAMILY_TRIM + 1):
            for tail in range(min(FAMILY_TRIM - lead, n - lead - 1) + 1):
                if lead or tail:
                    j = first.get(w[lead : n - tail])
                    if j is not None:
                        join(i, j)
    roots = np.fromiter((root(i) for i in range(len(prompts))), dtype=np.int64, count=len(prompts))
    out: npt.NDArray[np.int64] = pd.factorize(roots)[0].astype(np.int64)
    return out


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
        ones, certain = np.ones(log.requests), np.full(log.requests, -1)
        every_key = np.full(len(log.key_prompt), -1)
        return Sample(log, ones, certain, every_key, 1.0, requests, gpu, facts)
    family = families(list(uniques))
    n_fam = int(family.max()) + 1
    members = np.bincount(family, minlength=n_fam)
    asked = np.bincount(family[prompt[cacheable]], minlength=n_fam)
    rng = np.random.default_rng(seed)
    # most asked first; ties in a random order, so no family wins by where it sits in the log
    order = np.lexsort((rng.random(n_fam), -asked))
    head_fams = int(np.searchsorted(np.cumsum(members[order]), budget * head_share, "right"))
    head = np.zeros(n_fam, dtype=np.bool_)
    head[order[:head_fams]] = True
    head_n = int(members[head].sum())
    rate = (budget - head_n) / (distinct - head_n)
    taken = (head | (rng.random(n_fam) < rate))[family]
    in_tail = ~head[family]
    safe = np.maximum(prompt, 0)
    keep = ~cacheable | taken[safe]
    tail_row = cacheable & in_tail[safe]
    weight = np.where(tail_row, 1.0 / rate, 1.0)[keep]
    cluster = np.where(tail_row, family[safe], -1)[keep]
    sub = _subset(log, keep)
    key_family = np.where(in_tail, family, -1)[prompt_of_key]
    used = np.unique(log.key[keep & cacheable])
    facts |= {
        "sampled": True,
        "embedded_prompts": int(taken.sum()),
        "head_prompts": head_n,
        "families": n_fam,
        "tail_rate": round(rate, 6),
        "analysed_requests": int(keep.sum()),
    }
    return Sample(sub, weight, cluster, key_family[used], rate, requests, gpu, facts)


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
