"""Deploy cutover: one resumable job per ModelDeployed, its state in Redis, run phase by phase.

A job (deploy of model M: version V replaces U) moves through these phases, each saved before
the next begins, so a restarted worker resumes at the phase it was in:
1. prewarm: the Prewarmer warms V's namespace (NoPrewarmer, when none is wired, says so); a
            pre-warm below its bar (PrewarmReport.ok) is retried like an outage, then FAILED;
            one whose backend refuses connections (BackendUnreachable) is FAILED at once, with
            the URL: retried, it would fail the same way a minute later;
2. ready:   V becomes the live version (caches/live.py: every gateway moves to V's namespace)
            and JobStatus READY goes to stoker.status; the grace deadline (READY + grace_s) is saved and
            the job's queue score becomes that deadline, so nothing holds a thread meanwhile;
3. grace:   U's entries stay readable (a rollback to U finds a warm cache);
4. retire:  U is retired (every tenant, or the event's tenants): from that instant no write of U
            lands (caches/generations.py);
5. purge:   the staggered Purger deletes U's entries (every Redis primary, then Qdrant); it
            checkpoints its own SCAN cursors per batch, so a resumed purge never starts over;
6. done:    JobStatus DONE; the job leaves the queue, its document is kept a week.
Failures publish JobStatus FAILED with the reason; a retriable one (Redis, Kafka down) is
retried with back-off first, up to CutoverOptions.max_attempts.

Duplicates and newer deploys (decided here, in `accept`):
- the same deploy_id again does nothing but republish the job's current status;
- a newer deploy of the same model ends an older pending job's grace at once: the older job's
  U is two versions back and no longer the rollback target, so it is retired and purged now
  (and its pre-warm is skipped if it had not run: V is no longer the live version);
- a newer deploy *to* an older job's U is a rollback: that job is cancelled (FAILED, "rolled
  back"). Before its retire phase it never retires U; in its purge phase it stops at its next
  progress report (status_every_s), leaving what it had not deleted of U.
Rollback to a retired version (the deploy of V finds V retired, by a cancelled job or by one
that finished long ago): its pre-warm first waits until no unfinished job is still retiring V,
then reinstates V (Generations.reinstate_model_version: writes land again, and a write that read
the generations before the reinstatement is still refused), then warms V as any deploy does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any, Literal, Protocol

import orjson
import redis

from caches.boundary import as_bytes, redis_boundary
from caches.generations import Generations
from caches.live import LiveVersions
from invalidators.checkpoint import (
    DEPLOY_QUEUE_KEY,
    DEPLOY_SUPERSEDE_PREFIX,
    DONE_TTL_S,
    checkpoint_key,
    deploy_job_id,
)
from invalidators.deployjob import (
    TERMINAL,
    CutoverOptions,
    DeployJob,
    NoPrewarmer,
    Phase,
    Prewarmer,
    Supersede,
    supersede_action,
)
from invalidators.purge import PurgeProgress, Purger
from schemas.errors import BackendUnreachable, RetriableError
from schemas.events import JobStatus, ModelDeployed
from schemas.prewarm import PrewarmRequest

log = logging.getLogger(__name__)

# KEYS = [job document, queue]; ARGV = [document, deploy_id]. One step, so a crash can never
# leave a document the runner does not know about (or a queue entry without its document).
ACCEPT_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('ZADD', KEYS[2], 0, ARGV[2])
  return 1
end
return 0
"""

# How often a rollback's pre-warm looks again whether the cancelled job retiring its version
# has stopped (that job stops within one status_every_s of its purge).
_WAIT_RETIRING_S = 1.0

# Progress shares of the whole job, for the bar `stoker deploy --wait` draws: the pre-warm is
# the first 20 %, the purge the rest (the grace window is waiting, not work).
_PREWARM_SHARE = 0.2


class StatusSink(Protocol):
    """Where JobStatus events go (stoker.status through deploy.KafkaStatusSink)."""

    def publish(self, status: JobStatus) -> None: ...

    def close(self) -> None: ...


class PrewarmBelowBar(RetriableError):
    """The pre-warm did not meet its bar (the backend down or refusing, most likely): the job
    is retried with back-off like any outage, then FAILED; the previous version is never
    retired on a failed pre-warm, so a rollback still finds its cache."""


class JobFailed(Exception):
    """Raised inside a phase to end the job FAILED with this reason (not a StokerError: it
    never leaves the cutover)."""


class Cutover:
    """Accepts deploys and steps their jobs. `step` has one caller per job at a time (the
    runner holding its lease); `accept` runs on the consuming thread."""

    def __init__(
        self,
        r: redis.Redis,
        purger: Purger,
        status: StatusSink,
        *,
        prewarmer: Prewarmer | None = None,
        options: CutoverOptions | None = None,
    ) -> None:
        self.redis = r
        self.purger = purger
        self.status = status
        self.prewarmer: Prewarmer = prewarmer or NoPrewarmer()
        self.opts = options or CutoverOptions()
        self.generations = Generations(r)
        self.live = LiveVersions(r)
        self._accept = r.register_script(ACCEPT_LUA)

    # -- the job store --

    def load(self, deploy_id: str) -> DeployJob | None:
        with redis_boundary("load deploy job"):
            raw = self.redis.get(checkpoint_key(deploy_job_id(deploy_id)))
        return None if raw is None else DeployJob(**orjson.loads(as_bytes(raw)))

    def _save(self, job: DeployJob, due: float | None = None) -> None:
        """Save the document; `due` re-queues it at that time, a terminal phase dequeues it."""
        key = checkpoint_key(deploy_job_id(job.deploy_id))
        with redis_boundary("save deploy job"):
            pipe = self.redis.pipeline(transaction=True)
            if job.phase in TERMINAL:
                pipe.set(key, job.to_bytes(), ex=DONE_TTL_S)
                pipe.zrem(DEPLOY_QUEUE_KEY, job.deploy_id)
            else:
                pipe.set(key, job.to_bytes())
                if due is not None:
                    pipe.zadd(DEPLOY_QUEUE_KEY, {job.deploy_id: due})
            pipe.execute()

    def due(self, now: float) -> list[str]:
        """Unfinished jobs due by `now`, earliest first."""
        with redis_boundary("due deploy jobs"):
            ids: list[bytes] = self.redis.zrangebyscore(DEPLOY_QUEUE_KEY, "-inf", now)  # type: ignore[assignment]
        return [as_bytes(i).decode() for i in ids]

    def next_due(self) -> float | None:
        with redis_boundary("next deploy job"):
            first = self.redis.zrange(DEPLOY_QUEUE_KEY, 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    def _verdict(self, deploy_id: str) -> Supersede | None:
        with redis_boundary("load supersede"):
            raw = self.redis.get(DEPLOY_SUPERSEDE_PREFIX + deploy_id)
        return None if raw is None else Supersede(**orjson.loads(as_bytes(raw)))

    def _rolled_back(self, job: DeployJob) -> Supersede | None:
        """The verdict of a newer deploy that rolls back to this job's previous version."""
        verdict = self._verdict(job.deploy_id)
        return verdict if verdict is not None and verdict.action == "cancel" else None

    def _queued(self) -> Iterator[tuple[str, DeployJob]]:
        """The unfinished jobs, as (deploy_id, job)."""
        with redis_boundary("list deploy jobs"):
            raw: list[bytes] = self.redis.zrange(DEPLOY_QUEUE_KEY, 0, -1)  # type: ignore[assignment]
        for deploy_id in [as_bytes(i).decode() for i in raw]:
            job = self.load(deploy_id)
            if job is not None:
                yield deploy_id, job

    # -- accepting deploys (the consuming thread) --

    def accept(self, ev: ModelDeployed) -> bool:
        """Register the job (idempotent: False for a deploy_id seen before) and apply the
        supersede rules to the older unfinished jobs of the model."""
        job = DeployJob.from_event(ev, self.opts.grace_s)
        key = checkpoint_key(deploy_job_id(job.deploy_id))
        with redis_boundary("accept deploy"):
            created = int(
                self._accept(keys=[key, DEPLOY_QUEUE_KEY], args=[job.to_bytes(), job.deploy_id])
            )
        if not created:
            seen = self.load(job.deploy_id)
            if seen is not None:  # a CI retry gets an answer without waiting for a change
                self.publish(seen)
            return False
        self._supersede_older(job)
        self.publish(job, state="pending", detail="accepted")
        return True

    def _supersede_older(self, newer: DeployJob) -> None:
        for deploy_id, older in self._queued():
            action = supersede_action(older, newer)
            if action is None:
                continue
            if action.action == "cancel" and older.phase in ("retire", "purge"):
                log.warning(
                    "deploy %s rolls %s back to %s, which deploy %s is already retiring: "
                    "that retirement stops, and %s is reinstated before it is warmed",
                    newer.deploy_id,
                    newer.model_id,
                    newer.version,
                    deploy_id,
                    newer.version,
                )
            with redis_boundary("supersede deploy"):
                pipe = self.redis.pipeline(transaction=True)
                pipe.set(
                    DEPLOY_SUPERSEDE_PREFIX + deploy_id, orjson.dumps(asdict(action)), ex=DONE_TTL_S
                )
                pipe.zadd(DEPLOY_QUEUE_KEY, {deploy_id: 0}, xx=True)  # due now: act on it
                pipe.execute()

    # -- running a job (the runner thread) --

    def step(
        self, deploy_id: str, stop: threading.Event, keep: Callable[[], bool]
    ) -> DeployJob | None:
        """Run the job as far as it can go now: to its grace deadline, to the end, or until
        `stop` is set or `keep()` (the lease renewal) says another runner took it over."""
        job = self.load(deploy_id)
        if job is None or job.phase in TERMINAL:
            with redis_boundary("drop deploy job"):
                self.redis.zrem(DEPLOY_QUEUE_KEY, deploy_id)
            return job
        self.publish(job)  # after a restart, followers learn where the job stands
        try:
            self._advance(job, stop, keep)
        except JobFailed as exc:
            self._fail(job, str(exc))
        return job

    def _advance(self, job: DeployJob, stop: threading.Event, keep: Callable[[], bool]) -> None:
        verdict = self._verdict(job.deploy_id)
        if verdict is not None and verdict.action == "cancel":
            raise JobFailed(_cancelled(job, verdict))
        if job.phase == "prewarm":
            if verdict is None and not self._reinstated(job):
                return  # re-queued: an older job is still retiring this version
            self._prewarm(job, skip=verdict is not None)
        if job.phase == "grace":
            now = time.time()
            assert job.grace_until is not None
            if verdict is None and now < job.grace_until:
                self._save(job, due=job.grace_until)  # re-queued at the deadline
                return
            job.superseded_by = verdict.by if verdict else None
            job.detail = f"grace ended early by deploy {verdict.by}" if verdict else "grace over"
            job.phase = "retire"
            self._save(job)
        if job.phase == "retire":
            self._retire(job)
        if job.phase == "purge" and not self._purge(job, stop, keep):
            return
        job.phase = "done"
        self._save(job)
        self.publish(job)

    def _reinstated(self, job: DeployJob) -> bool:
        """Make V writable before warming it (a rollback to a retired version); False (and
        re-queued shortly) while a cancelled older job has not yet stopped retiring V."""
        blocker = self._retiring(job)
        if blocker is not None:
            job.detail = f"waiting for deploy {blocker} to stop retiring {job.version}"
            self._save(job, due=time.time() + _WAIT_RETIRING_S)
            self.publish(job)
            return False
        # A no-op unless V was retired: only "retired" generations and the marker change.
        n = self.generations.reinstate_model_version(job.model_id, job.version, job.tenants)
        if n:
            job.counts["tenants_reinstated"] = n
            log.info("deploy %s reinstated %s@%s", job.deploy_id, job.model_id, job.version)
        return True

    def _retiring(self, job: DeployJob) -> str | None:
        """An unfinished job of the model that retires (or is about to retire) job's version."""
        for deploy_id, other in self._queued():
            if (
                deploy_id != job.deploy_id
                and other.model_id == job.model_id
                and other.previous_version == job.version
                and other.phase in ("retire", "purge")
            ):
                return deploy_id
        return None

    def _prewarm(self, job: DeployJob, *, skip: bool) -> None:
        if skip:
            job.prewarm = "skipped: superseded by a newer deploy"
        else:
            tenants = tuple(job.tenants) if job.tenants is not None else None
            req = PrewarmRequest(job.model_id, job.version, job.previous_version, tenants)
            try:
                res = self.prewarmer.prewarm(req)
            except BackendUnreachable as e:
                raise JobFailed(str(e)) from e
            job.prewarm = res.detail or f"warmed {res.warmed}, failed {res.failed}"
            job.counts |= {"warmed": res.warmed, "warm_failed": res.failed}
            if not res.ok:  # READY would promise a warm cache: retried, then FAILED
                raise PrewarmBelowBar(job.prewarm)
            # READY: gateways serve V from now on (an older deploy's READY, had it come
            # later, would not override a newer one; a superseded job never gets here).
            self.live.set(
                job.model_id, job.version, deploy_id=job.deploy_id, accepted_at=job.accepted_at,
                tenants=job.tenants,
            )  # fmt: skip
        if job.previous_version is None or job.previous_version == job.version:
            # Nothing to retire (a first deploy, or the same version again): never retire V.
            job.phase, job.detail = "done", f"{job.prewarm}; no previous version to retire"
            self._save(job)
            self.publish(job, state="ready")
            return
        job.phase = "grace"
        job.grace_until = time.time() + job.grace_s
        job.detail = f"{job.prewarm}; keeping {job.previous_version} for {job.grace_s} s"
        self._save(job, due=job.grace_until)
        self.publish(job)

    def _retire(self, job: DeployJob) -> None:
        assert job.previous_version is not None
        if (back := self._rolled_back(job)) is not None:  # again: it may have come since
            raise JobFailed(_cancelled(job, back))
        if job.tenants is None:
            tenants = self.generations.retire_model_version(job.model_id, job.previous_version)
        else:
            tenants = list(job.tenants)
            for t in tenants:
                self.generations.retire_tenant_version(t, job.model_id, job.previous_version)
        job.counts["tenants_retired"] = len(tenants)
        job.purge_ids = [s.job_id for s in job.specs()]
        job.phase = "purge"
        job.detail = f"retired {job.model_id}@{job.previous_version} ({job.detail}); purging"
        self._save(job)
        self.publish(job)

    def _purge(self, job: DeployJob, stop: threading.Event, keep: Callable[[], bool]) -> bool:
        """Each spec in turn (one per tenant, or one for all); False if stopped or lost."""
        specs = job.specs()
        while job.purges_done < len(specs):
            spec = specs[job.purges_done]
            watch = _PurgeWatch(self, job, len(specs), keep)
            job.purge_runs.append(watch.run)
            halt = _Either(stop, watch.lost)
            prog = self.purger.run(spec, self.opts.purge, on_progress=watch, stop=halt)
            back = self._rolled_back(job) if prog.state != "done" else None
            if back is not None:  # a rollback stopped it
                deleted = job.counts.get("deleted", 0)
                raise JobFailed(f"{_cancelled(job, back)}; purge stopped at {deleted} keys")
            if prog.state != "done":
                job.detail = f"purge interrupted at {job.counts.get('deleted', 0)} keys"
                self._save(job)
                return False
            done = job.counts.get("deleted_done", 0) + prog.deleted
            job.counts |= {"deleted_done": done, "deleted": done}
            job.purges_done += 1
            self._save(job)
        job.detail = f"purged {job.counts.get('deleted', 0)} keys of {job.previous_version}"
        return True

    def _fail(self, job: DeployJob, reason: str) -> None:
        job.phase, job.detail = "failed", reason
        self._save(job)
        self.publish(job)

    def retry_or_fail(self, deploy_id: str, reason: str) -> None:
        """After a retriable error: back off (doubling from retry_s), or fail after too many."""
        job = self.load(deploy_id)
        if job is None or job.phase in TERMINAL:
            return
        job.attempts += 1
        if job.attempts >= self.opts.max_attempts:
            self._fail(job, f"gave up after {job.attempts} attempts: {reason}")
            return
        job.detail = f"retrying ({job.attempts}/{self.opts.max_attempts}): {reason}"
        self._save(job, due=time.time() + self.opts.retry_s * 2 ** (job.attempts - 1))
        self.publish(job)  # `stoker deploy --wait` shows why it is taking longer

    def fail(self, deploy_id: str, reason: str) -> None:
        job = self.load(deploy_id)
        if job is not None and job.phase not in TERMINAL:
            self._fail(job, reason)

    # -- status --

    def publish(
        self,
        job: DeployJob,
        *,
        state: Literal["pending", "running", "ready", "done", "failed"] | None = None,
        detail: str | None = None,
        progress: float | None = None,
    ) -> None:
        self.status.publish(
            JobStatus(
                job_id=job.deploy_id,
                job_type="deploy",
                state=state or _state_of(job.phase),
                progress=_progress_of(job) if progress is None else min(1.0, progress),
                detail=f"{job.phase}: {job.detail if detail is None else detail}",
                counts=dict(job.counts),
            )
        )


def _cancelled(job: DeployJob, verdict: Supersede) -> str:
    return f"cancelled: deploy {verdict.by} rolled back to {job.previous_version}"


def _state_of(phase: Phase) -> Literal["running", "ready", "done", "failed"]:
    if phase in ("grace", "retire", "purge"):
        return "ready" if phase == "grace" else "running"
    return "running" if phase == "prewarm" else phase  # type: ignore[return-value]


def _progress_of(job: DeployJob) -> float:
    if job.phase == "done":
        return 1.0
    if job.phase in ("prewarm", "failed"):
        return 0.0
    n = max(1, len(job.purge_ids) or 1)
    return _PREWARM_SHARE + (1 - _PREWARM_SHARE) * job.purges_done / n


class _PurgeWatch:
    """The Purger's progress callback for one run of one spec: counts, lease, throttled status."""

    def __init__(
        self, cutover: Cutover, job: DeployJob, n_specs: int, keep: Callable[[], bool]
    ) -> None:
        self.cutover, self.job, self.n_specs, self.keep = cutover, job, n_specs, keep
        self.spec_i = job.purges_done
        self.base = job.counts.get("deleted_done", 0)
        spec = job.specs()[self.spec_i]
        # Where this run picks up, read before it starts (its first report comes after a batch).
        saved = cutover.purger.checkpoints.load(spec.job_id) or {"nodes": {}, "deleted": 0}
        self.run: dict[str, Any] = {
            "spec": spec.job_id,
            "resumed_from": {n: st["cursor"] for n, st in saved["nodes"].items() if st["cursor"]},
            "deleted_at_start": int(saved["deleted"]),
            "deleted": 0,
        }
        self.lost = threading.Event()
        self._last = 0.0

    def __call__(self, p: PurgeProgress) -> None:
        run, job = self.run, self.job
        run["deleted"] = p.deleted - run["deleted_at_start"]
        job.counts |= {"deleted": self.base + p.deleted, "batches": p.batches}
        if not self.keep():
            self.lost.set()  # another runner holds the lease now: stop after this batch
        now = time.monotonic()
        if now - self._last >= self.cutover.opts.status_every_s:
            self._last = now
            if self.cutover._rolled_back(job) is not None:
                self.lost.set()  # rolled back: stop deleting the version now live again
            self.cutover._save(job)
            share = (self.spec_i + p.fraction) / self.n_specs
            self.cutover.publish(job, progress=_PREWARM_SHARE + (1 - _PREWARM_SHARE) * share)


class _Either(threading.Event):
    """An Event set when either of two is: the Purger polls is_set() and waits on wait()."""

    def __init__(self, a: threading.Event, b: threading.Event) -> None:
        super().__init__()
        self._a, self._b = a, b

    def is_set(self) -> bool:
        return self._a.is_set() or self._b.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        # The purge's pacing waits are short (one batch at the target rate); polling both in
        # 50 ms slices keeps a stop within 50 ms of being asked.
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                return False
            self._a.wait(left)
        return True
