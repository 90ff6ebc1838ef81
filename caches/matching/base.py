"""The matcher contract: which of the store's top-k candidates, if any, may answer a query.

A matcher sees only what a live cache has at lookup time: the query's text and vector, the
candidates' prompts, scores and (if it asks) vectors. It never sees labels or intents.

Decision, in order (`Matcher.decide`):
1. drop candidates under the query's floor (the search already did; a guard against misuse);
2. conservative routes: drop candidates under `Query.threshold` and any that a lexical guard
   rejects, so a sensitive route never serves below its static threshold;
3. the matcher's own rule (`choose`) picks one candidate or none, and names the rule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from caches.matching.lexical import first_violation

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Candidate:
    """One search result; `vector` is filled only for matchers with `needs_vectors`, `answer`
    (what the backend answered, embedded) and probes only for matchers with `needs_answers`."""

    entry_key: str
    prompt: str
    score: float
    vector: Vector | None = None
    answer: Vector | None = None
    kind: str = "entry"  # or "probe": evidence only, never served


@dataclass(frozen=True)
class Query:
    prompt: str
    vector: Vector
    threshold: float  # the policy's static threshold for this tenant and route
    conservative: bool = False
    tenant: str = ""
    route: str = ""


@dataclass(frozen=True)
class Accepted:
    index: int  # into the candidates passed to decide()
    rule: str  # what accepted it, for the audit trail (LookupResult.rule)


@dataclass
class MatchStats:
    """Plain counters: hits per rule, guard rejections per guard, verification outcomes (agree /
    disagree / unsure) of learned matchers. Every matcher's counts also go into the process-wide
    MATCH_TOTALS, which caches.metrics exports to Prometheus at scrape time (so the lookup path
    pays a Counter increment, not a labelled prometheus-client call)."""

    hits: Counter[str] = field(default_factory=Counter)
    rejected_by_guard: Counter[str] = field(default_factory=Counter)
    verification: Counter[str] = field(default_factory=Counter)
    lookups: int = 0

    def looked(self) -> None:
        self.lookups += 1
        MATCH_TOTALS.lookups += 1

    def hit(self, rule: str) -> None:
        self.hits[rule] += 1
        MATCH_TOTALS.hits[rule] += 1

    def rejected(self, guard: str) -> None:
        self.rejected_by_guard[guard] += 1
        MATCH_TOTALS.rejected_by_guard[guard] += 1

    def verified(self, outcome: str) -> None:
        self.verification[outcome] += 1
        MATCH_TOTALS.verification[outcome] += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "lookups": self.lookups,
            "semantic_hits": sum(self.hits.values()),
            "hits_by_rule": dict(self.hits),
            "rejected_by_guard": dict(self.rejected_by_guard),
            "verification": dict(self.verification),
        }


# Every matcher of the process, summed (never reset: Prometheus counters only grow).
MATCH_TOTALS = MatchStats()


class Matcher(ABC):
    """Search with `floor_for(q)` as score threshold and `limit` as k, then call `decide`."""

    name: str = "matcher"
    limit: int = 3
    needs_vectors: bool = False
    needs_answers: bool = False

    def __init__(self) -> None:
        self.stats = MatchStats()

    def floor_for(self, q: Query) -> float:
        """Lowest cosine worth fetching for this query."""
        return q.threshold

    @abstractmethod
    def choose(self, q: Query, cands: Sequence[Candidate]) -> Accepted | None:
        """Pick one of `cands` (best score first) or none."""

    def why_not(self, q: Query, cands: Sequence[Candidate]) -> str:
        """Why none of `cands` was served, in a few words (X-Stoker-Reason carries it); it
        starts with the best entry's score, "score=0.9412"."""
        return best_score(cands)

    def miss_reason(self, q: Query, cands: Sequence[Candidate]) -> str:
        """The whole reason of a miss none of `cands` served, its code first (the part before
        the first colon, which logs and reports count by)."""
        return f"semantic_unsure: {self.why_not(q, cands)}"

    def decide(self, q: Query, cands: Sequence[Candidate]) -> Accepted | None:
        self.stats.looked()
        floor = self.floor_for(q)
        keep = [i for i, c in enumerate(cands) if c.score >= floor]
        if q.conservative:
            keep = [i for i in keep if cands[i].score >= q.threshold]
            keep = [i for i in keep if self._guard_ok(q.prompt, cands[i].prompt)]
        got = self.choose(q, [cands[i] for i in keep])
        if got is None:
            return None
        rule = f"conservative:{got.rule}" if q.conservative else got.rule
        self.stats.hit(rule)
        return Accepted(keep[got.index], rule)

    def _guard_ok(self, query: str, cached: str) -> bool:
        hit = first_violation(query, cached)
        if hit is not None:
            self.stats.rejected(hit)
        return hit is None


class StaticThreshold(Matcher):
    """What every semantic cache does today: the best candidate if its cosine clears the
    threshold. The default; its rule string is the one the client wrote before matchers."""

    name = "static"

    def __init__(self, threshold: float | None = None, limit: int = 3) -> None:
        super().__init__()
        self.threshold = threshold  # None: the policy's threshold for the tenant/route
        self.limit = limit

    def _cut(self, q: Query) -> float:
        return q.threshold if self.threshold is None else self.threshold

    def floor_for(self, q: Query) -> float:
        return self._cut(q)

    def choose(self, q: Query, cands: Sequence[Candidate]) -> Accepted | None:
        cut = self._cut(q)
        for i, c in enumerate(cands):
            if c.score >= cut:
                return Accepted(i, f"cosine>={cut:.3f}")
        return None

    def why_not(self, q: Query, cands: Sequence[Candidate]) -> str:
        return f"{best_score(cands)}; the static threshold is {self._cut(q):.2f}"


def best_score(cands: Sequence[Candidate]) -> str:
    """ "score=<the best entry's cosine>", or "score=none" when only probes were near."""
    best = max((c.score for c in cands if c.kind == "entry"), default=None)
    return "score=none" if best is None else f"score={best:.4f}"
