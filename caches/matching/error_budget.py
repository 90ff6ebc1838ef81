"""An error budget per tenant and route: serve at the loosest level whose wrong-hit rate is
shown, by the monitor's verdicts, to be at or under the operator's maximum (delta).

Evidence is a verdict per checked pair: (strength, wrong), in one of two strata by how the
pair was sampled:
- audited: the monitor's audit of a served hit (re-asked, the fresh answer judged against the
  served one), with the hit's strength; a share of served hits (`Shares.audited`, 0.2);
- shadow: a shadow check of a miss: a candidate existed but fell short of the serving level,
  the backend then answered the query, and that live answer is judged against the
  candidate's (no re-ask: the gateway had to ask anyway); a share of near misses
  (`Shares.shadow`, 1.0).
Levels are nested (verified.py), so a pair of strength s is evidence for every level <= s.
For each level, the one-sided 95% Clopper-Pearson upper bound of its wrong rate is computed
from the pairs that level would have served, each weighed by the inverse of its sampling
share (bounds.py: a looser level's marginal pairs are all near misses, checked 5x as often as
the served pairs beside them; counted alike they stood for 5x the traffic they are, and the
bound held only while they were the worse pairs); the serving level is the loosest whose
bound is at or under delta, and the strictest level when none is (too little evidence is not
evidence of safety). Loosening needs evidence; tightening follows as soon as verdicts go
wrong.

ServingLevels is what a lookup asks: the level per (tenant, route), read from the counts at
most every `refresh_s` (the counts live in Redis, shared by replicas: counts.py), and kept when
Redis cannot say (the last level read, else the strictest).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from caches.matching.base import Query
from caches.matching.bounds import CONFIDENCE, Shares, Strata
from caches.matching.bounds import shown_within as shown_within  # re-exported: callers' home
from caches.matching.bounds import upper_bound as upper_bound
from schemas.errors import CacheUnavailable

# How often a process re-reads the shared counts: a loosening or tightening reaches every
# replica within this.
DEFAULT_REFRESH_S = 5.0

log = logging.getLogger(__name__)

ALIKE = Shares()  # every verdict sampled in full: all weigh alike


class VerdictCounts(Protocol):
    """Where verdicts accumulate: per (tenant, route), per strength, per stratum (Strata: shadow
    checks, audits). `add` counts a shadow check unless `audited`; `add_once` an audit."""

    def add(
        self, tenant: str, route: str, strength: int, wrong: bool, *, audited: bool = False
    ) -> None: ...

    def add_once(self, tenant: str, route: str, strength: int, wrong: bool, once: str) -> bool: ...

    def read_strata(self, tenant: str, route: str, levels: int) -> list[Strata]: ...

    def read(self, tenant: str, route: str, levels: int) -> list[tuple[int, int]]: ...


class MemoryCounts:
    """One process's counts (evaluation, tests). Production keeps them in Redis (RedisCounts),
    shared by every gateway replica and the monitor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (tenant, route) -> strength -> [shadow, shadow wrong, audited, audited wrong]
        self._c: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(dict)
        self._once: set[tuple[str, str]] = set()

    def add(
        self, tenant: str, route: str, strength: int, wrong: bool, *, audited: bool = False
    ) -> None:
        at = 2 if audited else 0
        with self._lock:
            cell = self._c[(tenant, route)].setdefault(strength, [0, 0, 0, 0])
            cell[at] += 1
            cell[at + 1] += int(wrong)

    def add_once(self, tenant: str, route: str, strength: int, wrong: bool, once: str) -> bool:
        """add an audit, once per `once` (the audited request's event id); True: counted."""
        with self._lock:
            if (tenant, once) in self._once:
                return False
            self._once.add((tenant, once))
        self.add(tenant, route, strength, wrong, audited=True)
        return True

    def read_strata(self, tenant: str, route: str, levels: int) -> list[Strata]:
        with self._lock:
            got = self._c.get((tenant, route), {})
            return [Strata(*got.get(s, (0, 0, 0, 0))) for s in range(levels)]

    def read(self, tenant: str, route: str, levels: int) -> list[tuple[int, int]]:
        """(checked, wrong) per strength, both strata together."""
        return [(c.checked, c.wrong) for c in self.read_strata(tenant, route, levels)]

    def copy(self) -> MemoryCounts:
        """The same verdicts, counted on from here without touching these (one evaluation's
        earlier traffic, carried into several runs)."""
        out = MemoryCounts()
        with self._lock:
            for pair, cells in self._c.items():
                out._c[pair] = {s: list(c) for s, c in cells.items()}
            out._once = set(self._once)
        return out


@dataclass(frozen=True)
class LevelBound:
    """The pairs a level would have served: (checked, wrong) as weighted counts (bounds.py:
    whole numbers where every stratum weighs alike); `bound` is computed when first read (a
    gauge reads the serving level's only; choosing the level needs `within`)."""

    level: int
    checked: float
    wrong: float

    @functools.cached_property
    def bound(self) -> float:
        return upper_bound(self.wrong, self.checked)

    def within(self, delta: float) -> bool:
        return shown_within(self.wrong, self.checked, delta)


@dataclass(frozen=True)
class Evidence:
    """One route's verdicts: per ladder level (loosest first), the cold rule's own, and the
    answer checks' (calibration.py: near pairs (checked, disagreed), unrelated pairs
    (checked, agreed))."""

    ladder: list[LevelBound]
    cold: LevelBound
    near: LevelBound = LevelBound(-1, 0, 0)
    unrelated: LevelBound = LevelBound(-1, 0, 0)


class ErrorBudget:
    """Verdicts per strength 0..levels-1 (the ladder's, nested), and one more slot, `cold`
    (= levels), for the cold rule (cold.py), which is no ladder level: its verdicts are its own
    and count for no level. Two slots past it hold the answer checks (calibration.py), in the
    same counts: `near` (a pair disagreeing counts as wrong) and `unrelated` (agreeing does).

    `shares`: how the ladder's verdicts were sampled, to weigh them (bounds.py); the default
    weighs every verdict alike. The slots past the ladder are read unweighted: each holds one
    rule's (or one check's) pairs, whose sampling does not tilt them toward any strength."""

    def __init__(
        self,
        counts: VerdictCounts,
        levels: int,
        max_wrong_rate: float,
        *,
        shares: Shares = ALIKE,
    ) -> None:
        if not 0.0 < max_wrong_rate < 1.0:
            raise ValueError(f"max wrong-hit rate {max_wrong_rate} must lie in (0, 1)")
        if levels < 1:
            raise ValueError("need at least one level")
        self.counts = counts
        self.levels = levels
        self.cold = levels
        self.near = levels + 1
        self.unrelated = levels + 2
        self.delta = max_wrong_rate
        self.shares = shares

    def record(
        self, tenant: str, route: str, strength: int, wrong: bool, *, audited: bool = False
    ) -> None:
        """One verdict: a shadow check of a near miss, or (`audited`) the monitor's audit of a
        served hit."""
        if 0 <= strength <= self.cold:
            self.counts.add(tenant, route, strength, wrong, audited=audited)

    def record_once(self, tenant: str, route: str, strength: int, wrong: bool, once: str) -> bool:
        """An audit, once per `once` (the audited request's event id); True when it counted."""
        if not 0 <= strength <= self.cold:
            return False
        return self.counts.add_once(tenant, route, strength, wrong, once)

    def record_check(self, tenant: str, route: str, near: bool, counted: bool) -> None:
        """One answer check (calibration.py): a near pair (`counted`: its answers disagreed)
        or an unrelated pair (`counted`: its answers agreed)."""
        self.counts.add(tenant, route, self.near if near else self.unrelated, counted)

    def evidence(self, tenant: str, route: str) -> Evidence:
        """Per level: the pairs it would have served, weighed (and the bound of their wrong
        rate); the cold rule's verdicts; the answer checks. One read."""
        per = self.counts.read_strata(tenant, route, self.levels + 3)
        out, acc = [], Strata()
        for level in reversed(range(self.levels)):  # strongest pairs count for every level
            acc = acc.plus(per[level])
            out.append(LevelBound(level, *self.shares.weigh(acc)))

        def whole(slot: int) -> LevelBound:
            return LevelBound(slot, per[slot].checked, per[slot].wrong)

        return Evidence(out[::-1], whole(self.cold), whole(self.near), whole(self.unrelated))

    def bounds(self, tenant: str, route: str) -> list[LevelBound]:
        return self.evidence(tenant, route).ladder

    def level(self, tenant: str, route: str) -> int:
        return choose_level(self.bounds(tenant, route), self.delta)


def choose_level(bounds: Sequence[LevelBound], delta: float) -> int:
    for b in bounds:  # loosest first
        if b.within(delta):
            return b.level
    return len(bounds) - 1


def cold_open(ev: Evidence, delta: float) -> bool:
    """May the cold rule (cold.py) serve on a route with this evidence? While its own verdicts
    show it within budget; else on trial: none of its own came back wrong, and the route holds
    fewer verdicts in all than any level needs to be shown within budget (299 at 1%)."""
    if ev.cold.within(delta):
        return True
    checked = ev.cold.checked + (ev.ladder[0].checked if ev.ladder else 0)  # [0]: every pair
    return ev.cold.wrong == 0 and checked < min_evidence(delta)


@functools.lru_cache(maxsize=64)
def min_evidence(delta: float, confidence: float = CONFIDENCE) -> int:
    """The fewest verdicts whose bound can be at or under delta (all of them clean): below it
    no level can be shown within budget, whatever the verdicts say (299 for 1%)."""
    n = max(1, math.floor(-math.log(1.0 - confidence) / delta) - 2)
    while upper_bound(0, n, confidence) > delta:
        n += 1
    return n


@dataclass(frozen=True)
class Serving:
    """One (tenant, route): the level served at and its evidence (the pairs it would serve)."""

    tenant: str
    route: str
    level: int
    evidence: LevelBound
    delta: float
    near: LevelBound = LevelBound(-1, 0, 0)  # the answer checks (calibration.py)
    unrelated: LevelBound = LevelBound(-1, 0, 0)


class ServingLevels:
    """`level_of` for VerifiedMatcher: the budget's level per (tenant, route), cached.

    Thread-safe (the gateway looks up on a pool). At most `max_pairs` pairs are kept, least
    recently asked evicted: a route name comes from the client, so the set must be bounded."""

    def __init__(
        self,
        budget: ErrorBudget,
        refresh_s: float = DEFAULT_REFRESH_S,
        *,
        max_pairs: int = 1_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget
        self.refresh_s = refresh_s
        self.max_pairs = max_pairs
        self.clock = clock
        self._lock = threading.Lock()
        # (tenant, route) -> (read at, evidence or None when never read)
        self._seen: OrderedDict[tuple[str, str], tuple[float, Evidence | None]] = OrderedDict()

    def __call__(self, q: Query) -> int:
        return self.level(q.tenant, q.route)

    def level(self, tenant: str, route: str) -> int:
        ev = self._evidence(tenant, route)
        if ev is None:
            return self.budget.levels - 1
        return choose_level(ev.ladder, self.budget.delta)

    def cold_open(self, q: Query) -> bool:
        """May the cold rule serve this query's route (cold_open; not while unread)?"""
        ev = self._evidence(q.tenant, q.route)
        return ev is not None and cold_open(ev, self.budget.delta)

    def evidence_of(self, q: Query) -> Evidence | None:
        """The query's route's evidence as last read (None: never read, Redis silent)."""
        return self._evidence(q.tenant, q.route)

    def _evidence(self, tenant: str, route: str) -> Evidence | None:
        pair, now = (tenant, route), self.clock()
        with self._lock:
            at, ev = self._seen.get(pair, (-math.inf, None))
            if now - at < self.refresh_s:
                self._seen.move_to_end(pair)
                return ev
            self._seen[pair] = (now, ev)  # one reader per refresh; the rest use the last
            self._seen.move_to_end(pair)
            while len(self._seen) > self.max_pairs:
                self._seen.popitem(last=False)
        try:
            fresh = self.budget.evidence(tenant, route)
        except CacheUnavailable as e:
            log.debug("budget of %s/%s unreadable, serving at the last level: %s", *pair, e)
            return ev
        with self._lock:
            if pair in self._seen:
                self._seen[pair] = (now, fresh)
        return fresh

    def refresh(self) -> None:
        """Read every known pair again on its next lookup (a test, or new evidence to act on)."""
        with self._lock:
            for pair, (_, ev) in self._seen.items():
                self._seen[pair] = (-math.inf, ev)

    def serving(self) -> list[Serving]:
        """What each known pair serves at, from the last read (no I/O: for a scrape)."""
        with self._lock:
            items = list(self._seen.items())
        out = []
        for (tenant, route), (_, ev) in items:
            if ev is None:
                continue
            level = choose_level(ev.ladder, self.budget.delta)
            out.append(
                Serving(
                    tenant, route, level, ev.ladder[level], self.budget.delta, ev.near,
                    ev.unrelated,
                )
            )  # fmt: skip
        return out
