"""Scheduler leader election on the real redis-server: one leader, takeover after expiry."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from tests.waiting import wait_for
from warmers.scheduler import LeaderLock, SchedulerConfig, WarmScheduler

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py

# Short enough that a takeover happens within a second, long enough that a loaded 2-core box
# (renewals every 100 ms) never lets a live leader's lock lapse.
TTL_S = 0.6
FAST = SchedulerConfig(warm_interval_s=0.05, sweep_interval_s=0.05, lock_ttl_s=TTL_S, renew_s=0.1)


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.n += 1


Scheduled = tuple[WarmScheduler, Counter, Counter]  # a scheduler, its warms, its sweeps


@pytest.fixture
def pair(redis_client: redis.Redis, unique: str) -> Iterator[list[Scheduled]]:
    key = f"stk:test-leader:{unique}"
    out = []
    for name in ("a", "b"):
        warm, sweep = Counter(), Counter()
        lock = LeaderLock(redis_client, TTL_S, key=key, owner=name)
        out.append((WarmScheduler(lock, warm, sweep, FAST), warm, sweep))
    try:
        yield out
    finally:
        for s, _, _ in out:
            s.stop()


def test_leader_lock__only_the_owner_renews_or_releases(redis_client: redis.Redis) -> None:
    a = LeaderLock(redis_client, 5.0, key="stk:test-lock", owner="a")
    b = LeaderLock(redis_client, 5.0, key="stk:test-lock", owner="b")
    assert a.acquire() and not b.acquire()
    assert not b.renew() and not b.release()
    assert a.renew() and a.holder() == "a"
    assert a.release() and a.holder() is None
    assert b.acquire() and b.holder() == "b"


def test_leader_lock__expires_when_not_renewed(redis_client: redis.Redis) -> None:
    a = LeaderLock(redis_client, 0.2, key="stk:test-lock", owner="a")
    b = LeaderLock(redis_client, 0.2, key="stk:test-lock", owner="b")
    assert a.acquire()
    wait_for(b.acquire, 2.0)
    assert not a.renew()  # the lapsed owner cannot extend someone else's lock


def test_scheduler__exactly_one_leader_warms_and_sweeps(
    pair: list[Scheduled],
) -> None:
    for s, _, _ in pair:
        s.start()
    (a, a_warm, a_sweep), (b, b_warm, b_sweep) = pair
    wait_for(lambda: a_warm.n + b_warm.n >= 3 and a_sweep.n + b_sweep.n >= 3)
    assert a.is_leader != b.is_leader
    leader_warm, follower_warm = (a_warm, b_warm) if a.is_leader else (b_warm, a_warm)
    assert follower_warm.n == 0 and leader_warm.n >= 3


def _started(pair: list[Scheduled]) -> tuple[Scheduled, Scheduled]:
    """Both schedulers started, once one of them leads: (leader, follower)."""
    for s, _, _ in pair:
        s.start()
    wait_for(lambda: pair[0][0].is_leader or pair[1][0].is_leader)
    return (pair[0], pair[1]) if pair[0][0].is_leader else (pair[1], pair[0])


def test_scheduler__a_crashed_leader_is_replaced_after_its_lock_expires(
    pair: list[Scheduled],
) -> None:
    leader, follower = _started(pair)
    leader[0].stop(release=False)  # a crash: the lock is left to expire
    stopped_at = time.monotonic()
    wait_for(lambda: follower[0].is_leader, timeout_s=TTL_S + 3.0)
    assert time.monotonic() - stopped_at >= TTL_S * 0.5  # it waited for the expiry
    before = follower[1].n
    wait_for(lambda: follower[1].n > before)  # and it warms now


def test_scheduler__a_clean_stop_hands_over_at_once(
    pair: list[Scheduled],
) -> None:
    leader, follower = _started(pair)
    leader[0].stop()  # releases the lock
    assert leader[0].lock.holder() is None or follower[0].lock.holder() == follower[0].lock.owner
    wait_for(lambda: follower[0].is_leader, timeout_s=2.0)
