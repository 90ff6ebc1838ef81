"""Hot-set coverage at K=200 with the bounded profile, against the exact profile, same stream.

Week 1 of one tenant's long-tailed stream (benchmarks/_longtail_stream.py, 1M distinct queries,
60% one-offs) is written into a bounded TrafficProfile on a redis-server through the real batch
path. For each day of week 2 (same head, new one-offs), the K queries week 1 asked most in that
day's 24 hours of week are chosen twice: from the profile (TrafficProfile.top_queries, what the
hot-set selector reads first) and from week 1's exact counts, computed here in Python from the
same stream. Coverage = the share of that day's week-2 requests whose query was chosen.
ratio = bounded coverage / exact coverage (goal >= 0.99).
"""

from __future__ import annotations

import argparse

import numpy as np
import redis
from _common import emit
from _longtail_stream import MODEL, TEMPLATE, TENANT, Week, feed, week

from stoker.embedded import RedisServer
from warmers.traffic.profile import HOUR_CAPACITY, WEEK_CAPACITY, TrafficProfile

WEEK_NUMBER = 2900


def exact_top(w: Week, hours: range, k: int) -> set[str]:
    asked = w.query[(w.how >= hours.start) & (w.how < hours.stop)]
    ids, counts = np.unique(asked, return_counts=True)
    rows = sorted(zip(counts.tolist(), w.qkeys(ids), strict=True), key=lambda r: (-r[0], r[1]))
    return {q for _, q in rows[:k]}  # most asked first, ties by key (as top_queries does)


def covered(w: Week, hours: range, chosen: set[str]) -> int:
    asked = w.query[(w.how >= hours.start) & (w.how < hours.stop)]
    ids, counts = np.unique(asked, return_counts=True)
    return sum(c for q, c in zip(w.qkeys(ids), counts.tolist(), strict=True) if q in chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--distinct", type=int, default=1_000_000)
    ap.add_argument("--week-capacity", type=int, default=WEEK_CAPACITY, help="queries a week")
    ap.add_argument("--hour-capacity", type=int, default=HOUR_CAPACITY, help="... an hour")
    args = ap.parse_args()
    week1, week2 = week(args.distinct, seed=16, week_no=0), week(args.distinct, seed=17, week_no=1)
    server = RedisServer()
    server.launch()
    try:
        server.wait_ready()
        r = redis.Redis.from_url(server.url)
        profile = TrafficProfile(
            r, week_capacity=args.week_capacity, hour_capacity=args.hour_capacity
        )
        feed(profile, week1, WEEK_NUMBER)
        bounded = exact = total = 0
        for day in range(7):
            hours = range(day * 24, day * 24 + 24)
            top = profile.top_queries(TENANT, MODEL, TEMPLATE, hours, args.k)
            bounded += covered(week2, hours, {s.qkey for s in top})
            exact += covered(week2, hours, exact_top(week1, hours, args.k))
            total += int(((week2.how >= hours.start) & (week2.how < hours.stop)).sum())
        r.close()
    finally:
        server.stop()
    emit(
        "hot_set_bounded",
        ratio=round(bounded / exact, 4),
        coverage_bounded=round(bounded / total, 4),
        coverage_exact=round(exact / total, 4),
        k=args.k,
        distinct=args.distinct,
        week_capacity=args.week_capacity,
        hour_capacity=args.hour_capacity,
    )


if __name__ == "__main__":
    main()
