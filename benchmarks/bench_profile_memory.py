"""Traffic profile memory per tenant at 100k, 1M and 5M distinct queries a week (long tail).

One tenant's week (benchmarks/_longtail_stream.py: 60% one-offs, a Zipf head, hour-of-day
peaks) is written into a TrafficProfile on a fresh redis-server through the real batch path;
bytes = MEMORY USAGE summed over the tenant's keys. Goal: flat past the budget, i.e. once the
hours are full (week_capacity queries each), more distinct queries cost no more memory.
The unbounded profile this replaced kept every query: its bytes grew with the distinct count.
"""

from __future__ import annotations

import argparse
import time

from _common import emit
from _longtail_stream import feed, tenant_bytes, week

from stoker.embedded import RedisServer
from warmers.traffic.profile import HOUR_CAPACITY, WEEK_CAPACITY, TrafficProfile

SIZES = {"bytes_100k": 100_000, "bytes_1m": 1_000_000, "bytes_5m": 5_000_000}
WEEK_NUMBER = 2900  # any week: the profile's keys carry it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--week-capacity", type=int, default=WEEK_CAPACITY, help="queries a week")
    ap.add_argument("--hour-capacity", type=int, default=HOUR_CAPACITY, help="... an hour")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every size (a quick run)")
    ap.add_argument(
        "--sizes", default=",".join(s.removeprefix("bytes_") for s in SIZES), metavar="S,S,...",
        help="the sizes measured, of 100k, 1m, 5m (make bench's default run leaves out 5m: ~4 min)",
    )  # fmt: skip
    args = ap.parse_args()
    sizes = {f"bytes_{s.strip()}" for s in args.sizes.split(",") if s.strip()}
    if not sizes or sizes - SIZES.keys():
        ap.error(f"--sizes: some of {', '.join(s.removeprefix('bytes_') for s in SIZES)}")
    figures: dict[str, int | float] = {}
    started = time.perf_counter()
    for name, distinct in ((n, d) for n, d in SIZES.items() if n in sizes):
        server = RedisServer()
        server.launch()
        try:
            server.wait_ready()
            import redis

            r = redis.Redis.from_url(server.url)
            w = week(int(distinct * args.scale), seed=16)
            feed(
                TrafficProfile(
                    r, week_capacity=args.week_capacity, hour_capacity=args.hour_capacity
                ),
                w,
                WEEK_NUMBER,
            )
            figures[name] = tenant_bytes(r)
            figures[name.replace("bytes", "events")] = len(w.query)
            r.close()
        finally:
            server.stop()
    emit(
        "profile_memory",
        **figures,
        week_capacity=args.week_capacity,
        hour_capacity=args.hour_capacity,
        seconds=round(time.perf_counter() - started, 1),
    )


if __name__ == "__main__":
    main()
