"""The deploy worker: accepts ModelDeployed events and runs their cutover jobs beside the loop.

The consume loop only *accepts* a deploy (one atomic Redis script, then the offset commit): a
24 h grace window or a 40M-key purge must not hold the loop, nor outlive a consumer session.
The jobs run on the handler's JobRunner thread, which
1. takes every job whose queue score is due (cutover.Cutover.due), each under a lease, so one
   runner in the whole fleet steps a job at a time;
2. steps it (cutover.Cutover.step) until its grace deadline, its end, or stop;
3. sleeps until the earliest deadline, a new accept (wake), or POLL_S, whichever comes first.
A restarted worker's runner finds unfinished jobs in the queue and resumes them; a killed one's
lease expires after LEASE_S and another runner takes over.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from confluent_kafka import Message

from caches.boundary import redis_boundary
from invalidators.checkpoint import DEPLOY_LEASE_PREFIX
from invalidators.cutover import Cutover
from schemas.errors import EventDecodeError, RetriableError, StokerError
from schemas.events import ModelDeployed
from streams.base import Decoded, Handler, Poison

log = logging.getLogger(__name__)

# A runner renews its lease at least every LEASE_S / 3 while it works; a killed runner's job is
# picked up by another runner LEASE_S later at most. 30 s: long against a purge batch (~ms),
# short against a 24 h grace window.
LEASE_S = 30.0
# The runner looks at the queue at least this often: another worker's accepts and expired
# leases are seen within a second; its own accepts wake it at once.
POLL_S = 1.0
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lease:
    """One runner per job: SET NX PX with this runner's token; renew and release only if ours."""

    def __init__(self, r: redis.Redis, ttl_s: float = LEASE_S) -> None:
        self._r = r
        self.ttl_ms = int(ttl_s * 1000)
        self.token = uuid.uuid4().hex
        self._renew = r.register_script(RENEW_LUA)
        self._release = r.register_script(RELEASE_LUA)
        self._renewed_at = 0.0

    def acquire(self, job: str) -> bool:
        with redis_boundary("acquire lease"):
            got = self._r.set(DEPLOY_LEASE_PREFIX + job, self.token, nx=True, px=self.ttl_ms)
        self._renewed_at = time.monotonic()
        return bool(got)

    def keep(self, job: str) -> bool:
        """Renew if a third of the lease has passed; False once another runner holds it."""
        if time.monotonic() - self._renewed_at < self.ttl_ms / 3000:
            return True
        with redis_boundary("renew lease"):
            ok = int(self._renew(keys=[DEPLOY_LEASE_PREFIX + job], args=[self.token, self.ttl_ms]))
        self._renewed_at = time.monotonic()
        return ok == 1

    def release(self, job: str) -> None:
        with redis_boundary("release lease"):
            self._release(keys=[DEPLOY_LEASE_PREFIX + job], args=[self.token])


class JobRunner:
    """The thread that steps due cutover jobs; start() once, stop() joins it (bounded)."""

    def __init__(self, cutover: Cutover, lease: Lease, poll_s: float = POLL_S) -> None:
        self.cutover = cutover
        self.lease = lease
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deploy-jobs", daemon=True)
        self.steps = 0  # jobs stepped, for tests and metrics
        self.last_error = ""

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the current purge batch (checkpointed); 10 s bounds a stuck dependency."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before scanning: a wake() during the scan is not lost
            wait = self.poll_s
            try:
                for deploy_id in self.cutover.due(time.time()):
                    if self._stop.is_set():
                        return
                    self._run_one(deploy_id)
                nxt = self.cutover.next_due()
                if nxt is not None:
                    wait = max(0.0, min(self.poll_s, nxt - time.time()))
            except RetriableError as exc:  # the queue itself is unreachable: try again later
                self.last_error = str(exc)
                log.warning("deploy runner: %s", exc)
            except Exception as exc:  # a bug must not silently end the runner
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("deploy runner")
            self._wake.wait(wait)

    def _run_one(self, deploy_id: str) -> None:
        if not self.lease.acquire(deploy_id):
            return  # another runner has it
        try:
            self.steps += 1
            self.cutover.step(deploy_id, self._stop, lambda: self.lease.keep(deploy_id))
        except RetriableError as exc:
            self.last_error = str(exc)
            log.warning("deploy %s: %s; retrying later", deploy_id, exc)
            self._quietly(self.cutover.retry_or_fail, deploy_id, str(exc))
        except StokerError as exc:
            self.last_error = str(exc)
            self._quietly(self.cutover.fail, deploy_id, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("deploy %s failed", deploy_id)
            self._quietly(
                self.cutover.fail, deploy_id, f"internal error: {type(exc).__name__}: {exc}"
            )
        finally:
            self._quietly(self.lease.release, deploy_id)

    @staticmethod
    def _quietly(fn: Any, *args: Any) -> None:
        """Bookkeeping after a failure may fail too (Redis down); the job stays queued then."""
        try:
            fn(*args)
        except StokerError as exc:
            log.warning("deploy runner bookkeeping: %s", exc)


class DeployHandler(Handler):
    """Accepts ModelDeployed events; its JobRunner thread runs the cutovers."""

    name = "deploy"
    topics = ["inference.deploys"]  # noqa: RUF012  (the contract)

    def __init__(
        self,
        cutover: Cutover,
        *,
        lease_s: float = LEASE_S,
        poll_s: float = POLL_S,
        start: bool = True,
        owns: Sequence[Any] = (),
    ) -> None:
        self.cutover = cutover
        self._owns = owns  # clients to close with the handler (the factory's, not a test's)
        self.runner = JobRunner(cutover, Lease(cutover.redis, lease_s), poll_s)
        if start:  # resumes unfinished jobs now, before any event arrives
            self.runner.start()

    def decode_batch(self, messages: Sequence[Message]) -> Decoded:
        decoded = super().decode_batch(messages)
        out = Decoded(poison=decoded.poison)
        for ev, msg in zip(decoded.items, decoded.messages, strict=True):
            if isinstance(ev, ModelDeployed):
                out.items.append(ev)
                out.messages.append(msg)
            else:
                why = EventDecodeError("unexpected_type", f"{ev.type} event on inference.deploys")
                out.poison.append(Poison(msg, why))
        return out

    def apply(self, events: list[Any]) -> None:
        """Accept each deploy (idempotent); the offsets are committed once all are in Redis."""
        for ev in events:
            if isinstance(ev, ModelDeployed):
                new = self.cutover.accept(ev)
                log.info(
                    "deploy %s %s@%s: %s",
                    ev.deploy_id,
                    ev.model_id,
                    ev.version,
                    "accepted" if new else "duplicate",
                )
        self.runner.wake()

    def close(self) -> None:
        """Stop the runner (its purge checkpoints first), then release the clients."""
        self.runner.stop()
        self.cutover.status.close()
        for client in self._owns:
            client.close()
