"""eval-semantic's tally per configuration: hits, wrong hits, out-of-scope hits, the ceiling,
scored from labels after each decision (the scorer is the only reader of labels)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FIRST = 500  # a young cache: the cold start's figures are over the stream's first queries


@dataclass
class QualityRow:
    name: str
    queries: int = 0
    hits: int = 0
    wrong: int = 0
    oos_queries: int = 0
    oos_hits: int = 0
    reachable: int = 0
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    first_hits: int = 0  # over the first FIRST queries: a young cache
    first_wrong: int = 0
    # (query, served entry) stream indices of every hit: what a monitor would check
    served: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        first = min(self.queries, FIRST)
        return {
            "name": self.name,
            "hit_rate": self.hits / max(self.queries, 1),
            "wrong_share": self.wrong / max(self.hits, 1),
            f"first{FIRST}_hit_rate": self.first_hits / max(first, 1),
            f"first{FIRST}_wrong_share": self.first_wrong / max(self.first_hits, 1),
            f"first{FIRST}_hits": self.first_hits,
            "oos_hit_rate": self.oos_hits / max(self.oos_queries, 1),
            "ceiling": self.reachable / max(self.queries, 1),
            "queries": self.queries,
            "hits": self.hits,
            "wrong_hits": self.wrong,
            "seconds": round(self.seconds, 2),
            **{k: v for k, v in self.stats.items() if k != "lookups"},
        }


class Scorer:
    """The only reader of labels, called after each decision."""

    def __init__(self, row: QualityRow, labels: Sequence[str], oos_label: str) -> None:
        self.row = row
        self.labels = labels
        self.oos = oos_label
        self.cached: set[str] = set()

    def wrong(self, i: int, hit: int) -> bool:
        """Would serving query i the answer stored for query `hit` be wrong?"""
        return self.labels[i] == self.oos or self.labels[hit] != self.labels[i]

    def record(self, i: int, hit: int | None) -> bool:
        """Tally query i's outcome; True when it was a wrong hit."""
        r, label = self.row, self.labels[i]
        r.queries += 1
        r.oos_queries += label == self.oos
        r.reachable += label != self.oos and label in self.cached
        if hit is None:
            self.cached.add(label)
            return False
        wrong = self.wrong(i, hit)
        r.served.append((i, hit))
        r.hits += 1
        r.oos_hits += label == self.oos
        r.wrong += wrong
        if r.queries <= FIRST:
            r.first_hits += 1
            r.first_wrong += wrong
        return wrong


def percentiles(prefix: str, ms: list[float]) -> dict[str, float]:
    """p50 and p99 of per-query durations in ms, each measured on its own (a percentile of
    differences, never a difference of percentiles, which can come out negative)."""
    if not ms:
        return {f"{prefix}_ms_p50": 0.0, f"{prefix}_ms_p99": 0.0}
    p50, p99 = np.percentile(ms, [50, 99])
    return {f"{prefix}_ms_p50": float(p50), f"{prefix}_ms_p99": float(p99)}
