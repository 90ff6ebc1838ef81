"""An error budget per tenant and route: serve at the loosest level whose wrong-hit rate is
shown, by the monitor's verdicts, to be at or under the operator's maximum (delta).

Evidence is a verdict per checked pair: (strength, wrong). A verdict comes from
- the monitor's audit of a served hit (re-asked, the fresh answer judged against the served
  one), with the hit's strength;
- a shadow check of a miss: a candidate existed but fell short of the serving level, the
  backend then answered the query, and that live answer is judged against the candidate's
  (no re-ask: the gateway had to ask anyway).
Levels are nested (verified.py), so a pair of strength s is evidence for every level <= s.
For each level, the one-sided 95% Clopper-Pearson upper bound of its wrong rate is computed
from the pairs that level would have served; the serving level is the loosest whose bound is
at or under delta, and the strictest level when none is (too little evidence is not evidence
of safety). Loosening needs evidence; tightening follows as soon as verdicts go wrong.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

CONFIDENCE = 0.95


def upper_bound(wrong: int, checked: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper bound of a binomial rate (1.0 for no evidence)."""
    if checked <= 0:
        return 1.0
    if wrong >= checked:
        return 1.0
    alpha = 1.0 - confidence
    lo, hi = wrong / checked, 1.0
    for _ in range(60):  # bisection: P(X <= wrong | checked, p) falls as p grows
        mid = (lo + hi) / 2
        if _binom_cdf(wrong, checked, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def _binom_cdf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0 if k < n else 1.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    return sum(
        math.exp(base - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        for i in range(k + 1)
    )


class VerdictCounts(Protocol):
    """Where verdicts accumulate: per (tenant, route), per strength, (checked, wrong)."""

    def add(self, tenant: str, route: str, strength: int, wrong: bool) -> None: ...

    def read(self, tenant: str, route: str, levels: int) -> list[tuple[int, int]]: ...


class MemoryCounts:
    """One process's counts (evaluation, tests). Production keeps them in Redis (RedisCounts),
    shared by every gateway replica and the monitor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(dict)

    def add(self, tenant: str, route: str, strength: int, wrong: bool) -> None:
        with self._lock:
            cell = self._c[(tenant, route)].setdefault(strength, [0, 0])
            cell[0] += 1
            cell[1] += int(wrong)

    def read(self, tenant: str, route: str, levels: int) -> list[tuple[int, int]]:
        with self._lock:
            got = self._c.get((tenant, route), {})
            return [tuple(got.get(s, (0, 0))) for s in range(levels)]  # type: ignore[misc]


@dataclass(frozen=True)
class LevelBound:
    level: int
    checked: int
    wrong: int
    bound: float


class ErrorBudget:
    def __init__(self, counts: VerdictCounts, levels: int, max_wrong_rate: float) -> None:
        if not 0.0 < max_wrong_rate < 1.0:
            raise ValueError(f"max wrong-hit rate {max_wrong_rate} must lie in (0, 1)")
        if levels < 1:
            raise ValueError("need at least one level")
        self.counts = counts
        self.levels = levels
        self.delta = max_wrong_rate

    def record(self, tenant: str, route: str, strength: int, wrong: bool) -> None:
        if 0 <= strength < self.levels:
            self.counts.add(tenant, route, strength, wrong)

    def bounds(self, tenant: str, route: str) -> list[LevelBound]:
        """Per level: the pairs it would have served and the bound of its wrong rate."""
        per = self.counts.read(tenant, route, self.levels)
        out, checked, wrong = [], 0, 0
        for level in reversed(range(self.levels)):  # strongest pairs count for every level
            checked += per[level][0]
            wrong += per[level][1]
            out.append(LevelBound(level, checked, wrong, upper_bound(wrong, checked)))
        return out[::-1]

    def level(self, tenant: str, route: str) -> int:
        return choose_level(self.bounds(tenant, route), self.delta)


def choose_level(bounds: Sequence[LevelBound], delta: float) -> int:
    for b in bounds:  # loosest first
        if b.bound <= delta:
            return b.level
    return len(bounds) - 1
