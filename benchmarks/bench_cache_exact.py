"""Exact lookup through the cache client against a raw redis-py GET of the same bytes, same run.

ratio = stoker p50 / raw p50 (goal <= 1.3). Both run interleaved in rounds on one redis-server,
so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import time

from _common import emit, pct

from caches.client import CacheClient
from caches.request import CacheRequest
from schemas.common import DocRef
from stoker.embedded import EmbeddedStack
from stoker.wiring import build_redis


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with EmbeddedStack(kafka=False) as stack:
        r = build_redis(stack.settings())
        cache = CacheClient(r)
        reqs = [
            CacheRequest(
                f"t{i % 10}",
                "llama-3-8b",
                "v1",
                "t1",
                f"question number {i} about things",
                docs=(DocRef(doc_id=f"d{i % 50}", version=1),),
            )
            for i in range(args.entries)
        ]
        keys = []
        for q in reqs:
            res = cache.lookup(q, use_semantic=False)
            cache.store(res, "an answer of a realistic length " * 8, gpu_ms=100)
            keys.append(q.key().exact())
        ours: list[float] = []
        raw: list[float] = []
        for _ in range(args.rounds):
            for q, k in zip(reqs, keys, strict=True):
                t0 = time.perf_counter()
                r.get(k)
                t1 = time.perf_counter()
                hit = cache.lookup(q, use_semantic=False)
                answer = hit.entry.response if hit.entry else ""  # decoding is part of the lookup
                t2 = time.perf_counter()
                assert hit.outcome == "exact" and answer
                raw.append(t1 - t0)
                ours.append(t2 - t1)
        emit(
            "cache_exact_lookup",
            lookups=len(ours),
            p50_ms=pct(ours, 50),
            p99_ms=pct(ours, 99),
            raw_get_p50_ms=pct(raw, 50),
            raw_get_p99_ms=pct(raw, 99),
            ratio=pct(ours, 50) / pct(raw, 50),
            goal_ratio_max=1.3,
        )


if __name__ == "__main__":
    main()
