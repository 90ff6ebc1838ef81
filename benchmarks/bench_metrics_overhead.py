"""What metrics cost on the serving hot path: an exact-hit lookup with and without the tally.

ratio = p50 with metrics / p50 without (CacheClient._lookup, what lookup times and tallies), interleaved per
lookup on one redis-server so machine noise hits both alike. Also the cost of one scrape
(generate_latest over every stoker family).
"""

from __future__ import annotations

import argparse
import time

from _common import emit, pct
from prometheus_client import REGISTRY, generate_latest

from caches.client import CacheClient
from caches.request import CacheRequest
from stoker.embedded import EmbeddedStack
from stoker.metrics import register_all
from stoker.wiring import build_redis


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    register_all()
    with EmbeddedStack(kafka=False) as stack:
        r = build_redis(stack.settings())
        cache = CacheClient(r)
        reqs = [
            CacheRequest(f"t{i % 10}", "m", "v1", "t1", f"prompt {i}") for i in range(args.entries)
        ]
        for q in reqs:
            assert cache.store(cache.lookup(q), "answer").landed
        with_m: list[float] = []
        without: list[float] = []
        for _ in range(args.rounds):
            for q in reqs:
                t0 = time.perf_counter()
                cache.lookup(q)
                with_m.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                cache._lookup(q, True, None)
                without.append(time.perf_counter() - t0)
        scrapes = []
        for _ in range(50):
            t0 = time.perf_counter()
            generate_latest(REGISTRY)
            scrapes.append(time.perf_counter() - t0)
        r.close()
    emit(
        "metrics_overhead_exact_lookup",
        lookups=len(with_m),
        p50_ms=pct(with_m, 50),
        p99_ms=pct(with_m, 99),
        bare_p50_ms=pct(without, 50),
        bare_p99_ms=pct(without, 99),
        added_p50_us=(pct(with_m, 50) - pct(without, 50)) * 1000,
        scrape_p50_ms=pct(scrapes, 50),
        ratio=pct(with_m, 50) / pct(without, 50),
    )


if __name__ == "__main__":
    main()
