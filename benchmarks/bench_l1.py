"""The in-process L1's share of exact hits under a read/write mix, and what it saves per lookup.

The mix, per round (all on one redis-server, loopback):
- every entry is written once up front (version 1);
- `--readers` serving threads share one CacheClient with the L1 (one gateway process), asking
  Zipf(s) over `--keys` distinct requests;
- a writer (another client, as another replica or the invalidation worker would be) deletes
  and re-stores a Zipf-chosen entry `--writes-per-s` times a second with the next version:
  every write is an invalidation message to the L1, and a late one can refuse a fill. Only
  the writer writes, so the newest completed write is the truth each read is checked against.
Reported: l1_share = hits served from the L1 / all exact hits (with the L1 on); p50 of a
lookup with the L1 and without it (same mix, rounds interleaved), ratio = with / without; fills
refused by late messages; stale_reads = L1 hits older than a write that had completed 50 ms
before the read began (the tracking protocol says 0: invalidations land within ~1 ms).
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass, field

from _common import emit, pct

from caches.client import CacheClient
from caches.l1 import L1Cache
from caches.policy import CachePolicy
from caches.request import CacheRequest
from stoker.embedded import EmbeddedStack
from stoker.wiring import build_redis

# A write older than this must be visible to every later read (see stale_reads above).
STALE_AFTER_S = 0.05


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    exact: int = 0
    l1: int = 0
    misses: int = 0
    stale: int = 0


class Versions:
    """The version each key's last completed write stored, and when it completed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: dict[int, tuple[int, float]] = {}

    def wrote(self, k: int, v: int) -> None:
        with self.lock:
            self.done[k] = (v, time.monotonic())

    def stale(self, k: int, seen: int, read_began: float) -> bool:
        with self.lock:
            v, at = self.done.get(k, (0, 0.0))
        return seen < v and at < read_began - STALE_AFTER_S


def zipf_picker(n: int, s: float, rng: random.Random) -> list[int]:
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    return rng.choices(range(n), weights=weights, k=200_000)


def requests(n: int) -> list[CacheRequest]:
    return [CacheRequest(f"t{i % 3}", "llama", "v1", "t1", f"question {i}?") for i in range(n)]


def one_round(
    serving: CacheClient, writer: CacheClient, args: argparse.Namespace, seed: int
) -> Tally:
    reqs = requests(args.keys)
    versions = Versions()
    tally = Tally()
    lock = threading.Lock()
    stop = threading.Event()

    def read(tid: int) -> None:
        rng = random.Random(seed * 100 + tid)
        picks = zipf_picker(args.keys, args.zipf, rng)
        mine = Tally()
        for i in range(args.reads):
            k = picks[i % len(picks)]
            t0 = time.perf_counter()
            began = time.monotonic()
            res = serving.lookup(reqs[k], use_semantic=False)
            mine.latencies.append(time.perf_counter() - t0)
            if res.outcome == "exact" and res.entry is not None:
                mine.exact += 1
                if res.rule == "exact:l1":
                    mine.l1 += 1
                    mine.stale += versions.stale(k, int(res.entry.response), began)
            else:  # between the writer's delete and its re-store
                mine.misses += 1
        with lock:
            tally.latencies += mine.latencies
            tally.exact += mine.exact
            tally.l1 += mine.l1
            tally.misses += mine.misses
            tally.stale += mine.stale

    def write() -> None:
        rng = random.Random(seed)
        picks = zipf_picker(args.keys, args.zipf, rng)
        version, i = 1, 0
        period = 1.0 / args.writes_per_s
        while not stop.wait(period):
            k = picks[i % len(picks)]
            i += 1
            version += 1
            writer.redis.delete(reqs[k].key().exact())  # an invalidation ...
            res = writer.lookup(reqs[k], use_semantic=False)
            if res.ticket is not None and writer.store(res, str(version)).landed:  # ... a re-warm
                versions.wrote(k, version)

    for k, q in enumerate(reqs):
        assert writer.store(writer.lookup(q, use_semantic=False), "1").landed
        versions.wrote(k, 1)
    readers = [threading.Thread(target=read, args=(t,)) for t in range(args.readers)]
    w = threading.Thread(target=write)
    w.start()
    for t in readers:
        t.start()
    for t in readers:
        t.join(600)
    stop.set()
    w.join(10)
    return tally


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--reads", type=int, default=20_000, help="lookups per reader per round")
    ap.add_argument("--writes-per-s", type=float, default=200.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with EmbeddedStack(kafka=False) as stack:
        s = stack.settings()
        pol = CachePolicy(exact_ttl_s=600)
        writer = CacheClient(build_redis(s), policy=pol)
        with_l1: list[Tally] = []
        without: list[Tally] = []
        refused = fills = 0
        for rnd in range(args.rounds):  # interleaved: machine noise hits both alike
            for on in (True, False):
                writer.redis.flushdb()
                r = build_redis(s)
                l1 = L1Cache(r, max_entries=args.keys, ttl_s=60.0).start() if on else None
                serving = CacheClient(r, policy=pol, l1=l1)
                (with_l1 if on else without).append(one_round(serving, writer, args, rnd))
                if l1 is not None:
                    refused += l1.refused_fills
                    fills += l1.fills
                serving.close()
        exact = sum(t.exact for t in with_l1)
        on_lat = [x for t in with_l1 for x in t.latencies]
        off_lat = [x for t in without for x in t.latencies]
        emit(
            "l1_exact_hits",
            lookups=len(on_lat),
            exact_hits=exact,
            l1_share=sum(t.l1 for t in with_l1) / max(1, exact),
            exact_hit_rate=exact / max(1, len(on_lat)),
            fills=fills,
            refused_fills=refused,
            stale_reads=sum(t.stale for t in with_l1),
            p50_ms_with_l1=pct(on_lat, 50),
            p99_ms_with_l1=pct(on_lat, 99),
            p50_ms_without=pct(off_lat, 50),
            p99_ms_without=pct(off_lat, 99),
            ratio=pct(on_lat, 50) / pct(off_lat, 50),
            keys=args.keys,
            readers=args.readers,
            writes_per_s=args.writes_per_s,
            # not the defaults (STOKER_EXACT_TTL_S, STOKER_L1_TTL_S = 5): a study of the L1
            settings="exact_ttl_s=600, l1 ttl_s=60",
        )


if __name__ == "__main__":
    main()
