"""Staggered purge against a raw SCAN + UNLINK loop over the same keys, same process, same run.

purge_unthrottled: ratio = our keys/s / raw keys/s (goal >= 0.8). The raw loop is what an
operator writes by hand: SCAN MATCH COUNT 1000, then one multi-key UNLINK of what came back.
Ours adds the checkpoint (in the same pipeline as the UNLINK) and progress accounting.
purge_throttled: achieved keys/s at a set rate (goal within +-5%).
The keys are reloaded before each run; 10% of them belong to another version and must stay.
"""

from __future__ import annotations

import argparse
import time

import redis
from _common import emit

from caches import keys as K
from invalidators.purge import PurgeOptions, Purger, PurgeSpec
from stoker.embedded import EmbeddedStack
from stoker.wiring import build_redis

TENANTS = 10
MSET_CHUNK = 2_000


def load(r: redis.Redis, n: int) -> float:
    """n keys of llama@v1 over TENANTS tenants, plus n/10 of llama@v2; returns seconds taken."""
    t0 = time.perf_counter()
    r.flushdb()
    for version, count in (("v1", n), ("v2", n // 10)):
        for t in range(TENANTS):
            ns = K.Namespace(f"tenant-{t}", "llama", version, "t1")
            prefix = ns.exact_prefix
            per = count // TENANTS
            pipe = r.pipeline(transaction=False)
            for start in range(0, per, MSET_CHUNK):
                stop = min(per, start + MSET_CHUNK)
                pipe.mset({f"{prefix}{i:032x}": b"x" * 64 for i in range(start, stop)})
            pipe.execute()
    return time.perf_counter() - t0


def raw_purge(r: redis.Redis, pattern: str, count: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    cursor, deleted = 0, 0
    while True:
        cursor, keys = r.scan(cursor, match=pattern, count=count)
        if keys:
            deleted += int(r.unlink(*keys))
        if cursor == 0:
            return deleted, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=2, help="raw/ours pairs; best of each kept")
    ap.add_argument("--rate", type=float, default=20_000)
    ap.add_argument("--throttled-keys", type=int, default=200_000)
    args = ap.parse_args()
    spec = PurgeSpec("llama", "v1")
    with EmbeddedStack(kafka=False) as stack:
        r = build_redis(stack.settings())
        raw_rates, our_rates, load_s = [], [], 0.0
        for _ in range(args.rounds):
            load_s += load(r, args.keys)
            deleted, secs = raw_purge(r, spec.pattern, args.batch)
            assert deleted == args.keys, deleted
            raw_rates.append(deleted / secs)
            load_s += load(r, args.keys)
            prog = Purger(r).run(spec, PurgeOptions(batch=args.batch))
            assert prog.state == "done" and prog.deleted == args.keys, prog
            assert r.dbsize() == args.keys // 10  # the other version stayed
            our_rates.append(prog.keys_per_s)
        emit(
            "purge_unthrottled",
            keys=args.keys,
            keys_per_s=round(max(our_rates)),
            raw_keys_per_s=round(max(raw_rates)),
            ratio=round(max(our_rates) / max(raw_rates), 3),
            goal_ratio_min=0.8,
            load_s=round(load_s, 1),
        )
        load(r, args.throttled_keys)
        prog = Purger(r).run(spec, PurgeOptions(rate=args.rate, batch=args.batch))
        assert prog.state == "done" and prog.deleted == args.throttled_keys
        emit(
            "purge_throttled",
            keys=args.throttled_keys,
            target=args.rate,
            achieved=round(prog.keys_per_s),
            ratio=round(prog.keys_per_s / args.rate, 3),
            goal="within +-5%",
        )


if __name__ == "__main__":
    main()
