"""`Guarded`: any matcher with the lexical guards (caches/matching/lexical.py) in front of it."""

from __future__ import annotations

from collections.abc import Sequence

from caches.matching.base import Accepted, Candidate, Matcher, Query
from caches.matching.lexical import GUARDS, Guard, first_violation

__all__ = ["GUARDS", "Guard", "Guarded", "first_violation"]


class Guarded(Matcher):
    """Any matcher with the lexical guards in front: vetoed candidates never reach it."""

    def __init__(self, inner: Matcher, guards: dict[str, Guard] | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.guards = guards or GUARDS
        self.name = f"{inner.name}+guards"
        self.limit = inner.limit
        self.needs_vectors = inner.needs_vectors
        self.stats = inner.stats  # one set of counters for the pair

    def floor_for(self, q: Query) -> float:
        return self.inner.floor_for(q)

    def choose(self, q: Query, cands: Sequence[Candidate]) -> Accepted | None:
        keep: list[int] = []
        for i, c in enumerate(cands):
            hit = first_violation(q.prompt, c.prompt, self.guards)
            if hit is None:
                keep.append(i)
            else:
                self.stats.rejected(hit)
        got = self.inner.choose(q, [cands[i] for i in keep])
        return None if got is None else Accepted(keep[got.index], f"{got.rule}+guards")
