"""Failover on a real Redis Cluster: a primary dies, its replica takes over, and the cache
client (with its L1) recovers by itself. The figures print with `pytest -s`.

Its own cluster, not the session's: killing a primary changes the topology for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from caches import keys as K
from caches import slots
from caches.client import CacheClient
from caches.request import CacheRequest
from schemas.errors import CacheUnavailable
from stoker.embedded_cluster import NODE_TIMEOUT_MS, EmbeddedCluster
from stoker.settings import StokerSettings
from stoker.stack import Stack
from tests.waiting import wait_for

# Redis replicates asynchronously: a write acknowledged in the last moments before the crash
# may not have reached the replica. On loopback the replica trails by well under a millisecond;
# 0.5 s is the bound asserted: anything acknowledged earlier must survive.
REPLICATION_LAG_S = 0.5
# Failure detection takes NODE_TIMEOUT_MS, then the replica's election (~0.5-1.5 s): 20 s is
# far above it, so a client that never recovers fails the test instead of hanging it.
RECOVERY_S = 20.0
STEADY_S = 1.0  # of clean operations before the kill, and again after recovery


def tenant_on(cluster: EmbeddedCluster, index: int, avoid: int | None = None) -> str:
    """A tenant whose slot the given primary serves now."""
    port = cluster.primaries[index].port
    for i in range(10_000):
        t = f"tenant-{i}"
        if cluster.primary_of(slots.slot(K.tenant_tag(t))).port == port and i != avoid:
            return t
    raise AssertionError("no tenant maps to that primary")


def req(tenant: str, prompt: str) -> CacheRequest:
    return CacheRequest(tenant, "llama", "v1", "t1", prompt)


@dataclass
class Ops:
    """What one worker thread saw: (time, ok) per operation, and the writes acknowledged."""

    log: list[tuple[float, bool]] = field(default_factory=list)
    acked: list[tuple[float, str]] = field(default_factory=list)

    def outage(self, since: float) -> tuple[float, int]:
        """Seconds from `since` to the first success after the last failure, and failures."""
        failed = [t for t, ok in self.log if not ok and t >= since]
        if not failed:
            return 0.0, 0
        back = next(t for t, ok in self.log if ok and t > failed[-1])
        return back - since, len(failed)


def run_ops(stop: threading.Event, ops: Ops, step: Callable[[int], bool]) -> threading.Thread:
    def loop() -> None:
        i = 0
        while not stop.is_set():
            t = time.monotonic()
            try:
                ok = step(i)
            except CacheUnavailable:
                ok = False
            ops.log.append((t, bool(ok)))
            i += 1
            stop.wait(0.002)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    return th


def test_failover__a_dead_primary_is_replaced_and_the_cache_recovers_by_itself():
    s = StokerSettings(l1_enabled=True, semantic_enabled=False)
    with EmbeddedCluster(primaries=3, replicas=1) as cluster, ExitStack() as closing:
        s = s.model_copy(update={"redis_url": cluster.url})
        cache = closing.enter_context(Stack(s)).exact_cache
        l1 = cache.l1
        assert l1 is not None and l1.tracking
        doomed, bystander = tenant_on(cluster, 0), tenant_on(cluster, 1)
        hot = [req(doomed, f"hot {i}?") for i in range(50)]
        for r in [*hot, req(bystander, "hot?")]:
            assert cache.store(cache.lookup(r), "answer").landed

        stop = threading.Event()
        reads, writes, others = Ops(), Ops(), Ops()

        def read(i: int) -> bool:
            return cache.lookup(hot[i % len(hot)]).outcome == "exact"

        def write(i: int) -> bool:
            r = req(doomed, f"new {i}?")
            landed = cache.store(cache.lookup(r), f"answer {i}").landed
            if landed:
                writes.acked.append((time.monotonic(), r.key().exact()))
            return landed

        def other(i: int) -> bool:
            return cache.lookup(req(bystander, "hot?")).outcome == "exact"

        tracked = Ops()  # a "failure" here is the L1 being off
        threads = [run_ops(stop, reads, read), run_ops(stop, writes, write)]
        threads += [run_ops(stop, others, other), run_ops(stop, tracked, lambda i: l1.tracking)]
        try:
            wait_for(lambda: len(writes.acked) > 100, 10, "steady writes before the kill")
            t_kill = time.monotonic()
            cluster.primaries[0].kill()
            replica = cluster.replicas[0][0]
            wait_for(lambda: cluster.primary_of(0).port == replica.port, RECOVERY_S, "promotion")
            t_promoted = time.monotonic()

            def recovered(ops: Ops) -> bool:
                tail = [ok for t, ok in ops.log if t > time.monotonic() - STEADY_S]
                return bool(tail) and all(tail) and ops.log[-1][0] > t_promoted + STEADY_S

            every = (reads, writes, others, tracked)
            wait_for(lambda: all(map(recovered, every)), RECOVERY_S, "every operation to recover")
        finally:
            stop.set()
            for th in threads:
                th.join(5)

        key = cached_in_l1(cache, hot[0])
        # A client started now: its first seed is the dead primary, the others answer.
        seeds = s.model_copy(update={"l1_enabled": False, "redis_url": cluster.seeds_url})
        writer = closing.enter_context(Stack(seeds)).exact_cache
        writer.redis.unlink(key)
        wait_for(lambda: key not in l1, 5, "the L1 to drop a key deleted on the new primary")

        before = [(at, k) for at, k in writes.acked if at < t_kill]
        lost = [k for at, k in before if not writer.redis.exists(k)]
        late = [k for at, k in before if at > t_kill - REPLICATION_LAG_S]
        read_out, read_failed = reads.outage(t_kill)
        write_out, write_failed = writes.outage(t_kill)
        other_out, other_failed = others.outage(t_kill)
        l1_out, _ = tracked.outage(t_kill)
        during = sum(1 for t, _ in others.log if t_kill <= t <= t_promoted)
        print(
            f"\nfailover (cluster-node-timeout {NODE_TIMEOUT_MS} ms): promoted after "
            f"{t_promoted - t_kill:.2f} s; lookups back after {read_out:.2f} s "
            f"({read_failed} failed), writes after {write_out:.2f} s ({write_failed} failed), "
            f"another primary's tenant after {other_out:.2f} s ({other_failed} of its "
            f"{during} lookups during the failover failed); "
            f"{len(lost)} of {len(before)} writes acknowledged before the kill lost "
            f"({len(late)} of them in its last {REPLICATION_LAG_S} s), "
            f"{len(writes.acked) - len(before)} acknowledged after it; "
            f"the L1 was off for {l1_out:.2f} s"
        )
        assert all(writer.redis.exists(r.key().exact()) for r in hot[1:])  # loaded before: kept
        assert set(lost) <= set(late)
        assert read_out < RECOVERY_S and write_out < RECOVERY_S


def cached_in_l1(cache: CacheClient, r: CacheRequest) -> str:
    """Read r until the L1 holds it (a fill can be refused once by a late message)."""
    assert cache.l1 is not None
    wait_for(lambda: cache.lookup(r).rule == "exact:l1", 5, "the entry to fill the L1")
    return r.key().exact()
