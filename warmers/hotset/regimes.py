"""Day regimes: complete days clustered by their 24-hour traffic vectors (weekday, weekend, holiday).

Features are each day's hourly counts divided by the median day's total, so both the shape and
the volume count: on the sample log weekday and weekend share the diurnal curve and differ only
in volume (x0.55), which a shape-only (sum-to-one) vector would not see. KMeans runs for
k = 2..max_k and the k with the best silhouette wins; under `min_silhouette` (or with fewer than
4 days) every day is one regime. A future day's regime is the majority regime of past days of
the same weekday: a holiday is recognised after the fact, not predicted (no calendar here).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date

import numpy as np
from threadpoolctl import threadpool_limits

# Fewer days cannot show two regimes with a silhouette worth trusting (k=2 needs >= 2 per side).
_MIN_DAYS = 4
# 0.25: the conventional floor under which silhouette says "no substantial structure"; the
# sample log's weekday/weekend split scores ~0.7, a week of one regime with Poisson noise ~0.15.
DEFAULT_MIN_SILHOUETTE = 0.25


@dataclass(frozen=True)
class DayRegimes:
    """labels: regime per complete day; silhouette: of the chosen k (0.0 when k == 1)."""

    labels: dict[date, int]
    k: int
    silhouette: float

    def regime_of(self, day: date) -> int | None:
        """The day's own regime if seen, else the majority regime of its weekday, else None."""
        if day in self.labels:
            return self.labels[day]
        votes = Counter(r for d, r in self.labels.items() if d.weekday() == day.weekday())
        if not votes:
            return None
        return min(votes, key=lambda r: (-votes[r], r))  # ties: the lower label, stably

    def matching_days(self, day: date) -> list[date]:
        """Past days that behave like `day`: its regime's days, or every day if unknown."""
        regime = self.regime_of(day)
        if regime is None:
            return sorted(self.labels)
        return sorted(d for d, r in self.labels.items() if r == regime)

    def describe(self, regime: int) -> str:
        """A human name from the weekdays a regime holds: "weekday", "weekend" or "mixed"."""
        days = [d for d, r in self.labels.items() if r == regime]
        if self.k == 1:
            return "all days"
        if all(d.weekday() >= 5 for d in days):
            return "weekend"
        if all(d.weekday() < 5 for d in days):
            return "weekday"
        return f"regime {regime}"


def features(daily: Mapping[date, Sequence[int]]) -> tuple[list[date], np.ndarray]:
    days = sorted(daily)
    x = np.asarray([daily[d] for d in days], dtype=float).reshape(len(days), 24)
    totals = x.sum(axis=1)
    scale = float(np.median(totals)) if len(days) else 1.0
    return days, x / (scale if scale > 0 else 1.0)


def cluster_days(
    daily: Mapping[date, Sequence[int]],
    *,
    max_k: int = 6,
    min_silhouette: float = DEFAULT_MIN_SILHOUETTE,
    seed: int = 0,
) -> DayRegimes:
    """Cluster complete days (the caller drops today and days with no traffic)."""
    days, x = features({d: v for d, v in daily.items() if sum(v) > 0})
    if len(days) < _MIN_DAYS:
        return DayRegimes(dict.fromkeys(days, 0), 1, 0.0)
    # scikit-learn here, not at the top: importing it costs ~2 s, which every `stoker` command
    # paid at start-up (through stoker.wiring), even `--help` and bad arguments
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    best: tuple[float, int, np.ndarray] | None = None
    # One thread: a few dozen days fit in microseconds, and OpenMP's thread start-up on a busy
    # 2-core box cost ~20 ms per KMeans init (bench_hot_set; docs/benchmarks.md, "The hot set").
    with threadpool_limits(limits=1):
        distinct = len(np.unique(x.round(9), axis=0))  # KMeans cannot find more than these
        for k in range(2, min(max_k, len(days) - 1, distinct) + 1):
            labels = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(x)
            if len(set(labels.tolist())) < 2:
                continue
            score = float(silhouette_score(x, labels))
            if best is None or score > best[0] + 1e-9:
                best = (score, k, labels)
    if best is None or best[0] < min_silhouette:
        return DayRegimes(dict.fromkeys(days, 0), 1, 0.0 if best is None else best[0])
    score, k, labels = best
    return DayRegimes({d: int(r) for d, r in zip(days, labels, strict=True)}, k, score)
