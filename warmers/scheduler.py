"""The warm scheduler: one leader among replicas warms ahead of every window and sweeps vectors.

Leadership is a Redis lock with expiry (SET key owner NX PX ttl). Every `renew_s` (a third of
the TTL) each replica either renews its lock (a Lua compare-and-extend: only the owner extends)
or tries to take it. A leader that crashes stops renewing, its lock expires within one TTL and
the next replica to try takes over. A leader that fails to renew (Redis unreachable, or the key
now names someone else) stops acting as leader at once: two leaders for up to one renew period
would warm twice, which wastes GPU but never corrupts the cache (writes are generation-checked
and idempotent), so the lock only has to be right almost always, not always.

Jobs (apscheduler 3.x BackgroundScheduler, one instance of each job at a time, missed runs
coalesced): lead (renew/acquire), warm (plan the next hour, send what the hour under way has
room for, warmers/headroom.py: ScheduledWarm; leader only), sweep
(SemanticStore.sweep_expired; leader only), prefixes (the KV prefix warm before each day's
peak, warmers/prefix/before_peak.py; leader only, when given), replicas (the prefix warm of a replica that
restarted or is new, warmers/prefix/after_restart.py; leader only, when given).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis
from apscheduler.schedulers.background import BackgroundScheduler
from pydantic import BaseModel, ConfigDict, Field

from caches.boundary import redis_boundary
from caches.keys import SCHEDULER_LOCK_KEY
from schemas.errors import StokerError
from warmers import metrics as M

log = logging.getLogger(__name__)

DEFAULT_LOCK_KEY = SCHEDULER_LOCK_KEY

# KEYS = [lock]; ARGV = [owner, ttl ms]. Extends only the caller's own lock: a plain PEXPIRE
# after the lock expired and another replica took it would extend the other replica's lock.
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class LeaderLock:
    """One owner at a time; every call is one round trip and never blocks."""

    def __init__(
        self, r: redis.Redis, ttl_s: float, key: str = DEFAULT_LOCK_KEY, owner: str | None = None
    ) -> None:
        self.r, self.key, self.ttl_ms = r, key, max(1, int(ttl_s * 1000))
        self.owner = owner or uuid.uuid4().hex
        self._renew = r.register_script(RENEW_LUA)
        self._release = r.register_script(RELEASE_LUA)

    def acquire(self) -> bool:
        with redis_boundary("leader acquire"):
            return bool(self.r.set(self.key, self.owner, nx=True, px=self.ttl_ms))

    def renew(self) -> bool:
        with redis_boundary("leader renew"):
            return bool(self._renew(keys=[self.key], args=[self.owner, self.ttl_ms]))

    def release(self) -> bool:
        with redis_boundary("leader release"):
            return bool(self._release(keys=[self.key], args=[self.owner]))

    def holder(self) -> str | None:
        with redis_boundary("leader holder"):
            v: Any = self.r.get(self.key)
        return None if v is None else (v.decode() if isinstance(v, bytes) else str(v))


class SchedulerConfig(BaseModel):
    """The owner of the schedule's settings' defaults and bounds (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # four plans per hour: the next hour is warmed ~4 times, each later run skipping what the
    # earlier ones cached (so it costs little)
    warm_interval_s: float = Field(default=900.0, gt=0)
    sweep_interval_s: float = Field(default=600.0, gt=0)
    # is a peak near? (a prefix warm's lead is longer than this)
    prefix_check_s: float = Field(default=300.0, gt=0)
    # has a watched replica restarted?
    replica_check_s: float = Field(default=30.0, gt=0, le=3_600)
    lock_ttl_s: float = Field(default=30.0, gt=0)
    # a warm sends to a model in an hour only what fits under this share of its busiest hour
    # the traffic profile forecasts, less the hour's own load (warmers/headroom.py); 0: no cap
    headroom_share: float = Field(default=1.0, ge=0, le=1)
    # default: a third of the TTL, so two renewals may fail in a row
    renew_s: float | None = Field(default=None, gt=0)

    @property
    def renew_every_s(self) -> float:
        return self.renew_s if self.renew_s is not None else self.lock_ttl_s / 3


class WarmScheduler:
    """start() / stop(); `warm` and `sweep` are plain callables run in the scheduler's threads."""

    def __init__(
        self,
        lock: LeaderLock,
        warm: Callable[[], object],
        sweep: Callable[[], object] | None = None,
        config: SchedulerConfig | None = None,
        prefixes: Callable[[], object] | None = None,
        replicas: Callable[[], object] | None = None,
    ) -> None:
        self.lock, self.warm, self.sweep, self.prefixes = lock, warm, sweep, prefixes
        self.replicas = replicas
        self.cfg = config or SchedulerConfig()
        self.is_leader = False
        self.runs = {"warm": 0, "sweep": 0, "prefixes": 0, "replicas": 0}
        self.errors = 0
        self._sched = BackgroundScheduler(
            timezone="UTC", job_defaults={"coalesce": True, "max_instances": 1}
        )

    def start(self) -> None:
        self._lead()  # at once: a fresh replica need not wait one period to be counted
        s = self._sched
        s.add_job(self._lead, "interval", seconds=self.cfg.renew_every_s, id="lead")
        s.add_job(self._leader_only("warm", self.warm), "interval",
                  seconds=self.cfg.warm_interval_s, id="warm", next_run_time=_now())  # fmt: skip
        if self.sweep is not None:
            s.add_job(self._leader_only("sweep", self.sweep), "interval",
                      seconds=self.cfg.sweep_interval_s, id="sweep")  # fmt: skip
        if self.prefixes is not None:
            s.add_job(self._leader_only("prefixes", self.prefixes), "interval",
                      seconds=self.cfg.prefix_check_s, id="prefixes", next_run_time=_now())  # fmt: skip
        if self.replicas is not None:
            s.add_job(self._leader_only("replicas", self.replicas), "interval",
                      seconds=self.cfg.replica_check_s, id="replicas", next_run_time=_now())  # fmt: skip
        s.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop the jobs (waits for a running one); release=False leaves the lock to expire,
        as a crash would."""
        if self._sched.running:
            self._sched.shutdown(wait=True)
        if release and self.is_leader:
            try:
                self.lock.release()
            except StokerError as e:
                log.warning("leader lock not released (it expires by itself): %s", e)
        self.is_leader = False
        M.set_leader(False)

    def _lead(self) -> None:
        try:
            self.is_leader = self.lock.renew() if self.is_leader else self.lock.acquire()
        except StokerError as e:
            log.warning("leader lock unreachable, acting as follower: %s", e)
            self.is_leader = False
        M.set_leader(self.is_leader)  # the "scheduler leader missing" alert reads it

    def _leader_only(self, name: str, job: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            if not self.is_leader:
                return
            try:
                job()
                self.runs[name] += 1
            except StokerError as e:  # the next period tries again; the worker stays up
                self.errors += 1
                log.warning("%s failed (%s): %s", name, e.kind, e)

        return run


def _now() -> datetime:
    return datetime.now(UTC)


class SchedulerService:
    """`stoker worker scheduler`: run() blocks until stop(); not a Kafka consumer, so not a
    Handler (stoker/registry.py lists it as a service)."""

    name = "scheduler"

    def __init__(self, scheduler: WarmScheduler) -> None:
        self.scheduler = scheduler
        self._stop = threading.Event()

    def run(self) -> None:
        self.scheduler.start()
        try:
            self._stop.wait()
        finally:
            self.scheduler.stop()

    def stop(self) -> None:
        self._stop.set()

    def report(self) -> str:
        s = self.scheduler
        return f"{s.runs['warm']} warm runs, {s.runs['sweep']} sweeps, {s.errors} failed runs"
