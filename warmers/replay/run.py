"""A request log replayed in virtual time, with the shipped warming and without it.

`stoker analyze LOG --warming` (the shell builds the parts: stoker/replay.py). The log before
`start` is the history: it fills the traffic profile as the traffic worker would have. From
`start`, time moves in steps of the scheduler's interval; in each step, in order:
1. the clock is the step's start; a deploy due in it (`deploy_at`, rounded down to the step)
   runs first: the new version goes live and its pre-warm (the deploy worker's, through the
   same runner) sends before any request reads it;
2. the scheduler's warm job runs (warmers/headroom.py: ScheduledWarm, with the shipped
   planner, headroom and pacing; its sends land in the virtual cache);
3. the step's requests are served from the virtual cache at their own times: a hit, or a
   miss that costs the GPU the log's `gpu_ms` and fills the entry for the TTL;
4. they are written to the profile as the gateway would have logged them (a hit as a hit), so
   the next plans learn the week as it goes, surges included; the first hit of each warmed
   entry is credited to the planner's calibration.
The baseline (`warming=False`) serves the same requests from an empty cache with no warm and no
pre-warm. Everything is counted per virtual hour in a Ledger (warmers/replay/cache.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from caches.policy import request_bypass_reason
from schemas.events import RequestLogged
from warmers.hotset.plan import logged_request
from warmers.replay.cache import Entry, Ledger, VirtualCache
from warmers.traffic.decode import observe_event
from warmers.traffic.profile import TrafficProfile

# Rows written to the profile per call (the traffic worker's batches are of this order).
_WRITE_BATCH = 5_000


class VirtualClock:
    """The replay's now: the planner, the profile, the headroom and the sender read it."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@dataclass(frozen=True)
class Row:
    """One logged request, as the replay serves it."""

    t: float  # epoch seconds
    event: RequestLogged
    cacheable: bool
    keys: tuple[str, str]  # its exact key, and its digest, under the log's own version
    deployed: tuple[str, str] | None = None  # ... under the deployed version
    novel: bool = False  # no earlier row of the log asked it: no forecast could warm it


def rows_of(events: Sequence[RequestLogged], deploy_version: str | None = None) -> list[Row]:
    """The events in time order with their exact keys (the ones the gateway and the warmer
    build from the same request: warmers/hotset/plan.py logged_request)."""
    out = []
    seen: set[str] = set()
    for ev in sorted(events, key=lambda e: e.ts):
        cacheable = request_bypass_reason(ev.params) is None
        fields = ev.model_dump(mode="json")
        key = logged_request(fields).cache_request().key()
        new = None
        if deploy_version is not None:
            k2 = logged_request(fields, deploy_version).cache_request().key()
            new = (k2.exact(), k2.digest)
        novel = key.exact() not in seen
        seen.add(key.exact())
        out.append(Row(ev.ts.timestamp(), ev, cacheable, (key.exact(), key.digest), new, novel))
    return out


class WarmHits(Protocol):
    def hits(self, warm_hits: dict[str, list[tuple[str, float]]]) -> int: ...


@dataclass
class Arm:
    """One arm's run: its ledger and its counts."""

    warming: bool
    ledger: Ledger = field(default_factory=Ledger)
    scheduler_runs: int = 0
    prewarm: object | None = None  # what the deploy's pre-warm returned
    # the baseline's outcome of each replayed request (a hit?), by row index: a warm entry's
    # first hit on a request the baseline missed is a hit the warm added
    hits: list[bool] = field(default_factory=list)
    sent: list[Entry] = field(default_factory=list)  # the entries the warm sends put there
    invalidated: int = 0  # entries the knowledge-base changes deleted


@dataclass
class Replay:
    """The rows from `start` to `end`, served in steps of `interval_s` against a cache whose
    entries live `ttl_s`; `deploy_at`: when the model version changes (None: never)."""

    rows: list[Row]
    start: datetime
    end: datetime
    ttl_s: float
    interval_s: float
    deploy_at: datetime | None = None
    # knowledge-base changes: at each time, the tenant's entries built on the document are
    # deleted (both arms), as the invalidation worker deletes them
    kb_changes: Sequence[tuple[datetime, str, str]] = ()
    progress: Callable[[float], None] | None = None  # the share of the replay done

    def history(self) -> list[Row]:
        return self.rows[: self._index(self.start.timestamp())]

    def feed(self, profile: TrafficProfile, rows: Sequence[Row], first: int = 0) -> None:
        """Write `rows` as logged (the history) to the profile, in batches."""
        obs = [observe_event(r.event, "replay:0", first + i) for i, r in enumerate(rows)]
        for i in range(0, len(obs), _WRITE_BATCH):
            profile.write(obs[i : i + _WRITE_BATCH])

    def run(
        self,
        arm: Arm,
        cache: VirtualCache,
        clock: VirtualClock,
        *,
        warm: Callable[[], object] | None = None,
        deploy: Callable[[], object] | None = None,
        profile: TrafficProfile | None = None,
        calibration: WarmHits | None = None,
        base: Arm | None = None,
    ) -> Arm:
        """Serve the replay's span (module docstring); `warm`: the scheduler's job, `deploy`:
        the deploy's cutover and pre-warm (called at the deploy's step), `profile`: where the
        served requests are written, `base`: the baseline run, whose outcomes say which hits
        a warm added. Without them, the baseline."""
        t, stop = self.start.timestamp(), self.end.timestamp()
        step = self.interval_s
        deploy_t = self._deploy_step()
        deployed = False
        changes = sorted((c.timestamp(), tenant, doc) for c, tenant, doc in self.kb_changes)
        i = self._index(t)
        offset = i  # the profile's offsets for the served rows follow the history's
        while t < stop:
            clock.now = datetime.fromtimestamp(t, UTC)
            if deploy_t is not None and not deployed and t >= deploy_t:
                deployed = True
                if deploy is not None:
                    arm.prewarm = deploy()
            while changes and changes[0][0] <= t:
                _, tenant, doc = changes.pop(0)
                arm.invalidated += cache.invalidate(tenant, doc)
            if warm is not None:
                warm()
                arm.scheduler_runs += 1
            j = self._index(min(t + step, stop))
            logged, hits = self._serve(i, j, cache, arm, deployed, base)
            if profile is not None and logged:
                obs = [observe_event(ev, "replay:0", offset + n) for n, ev in enumerate(logged)]
                profile.write(obs)
                offset += len(obs)
            if calibration is not None and hits:
                calibration.hits(hits)
            cache.forget_expired(t - self.ttl_s)
            i, t = j, t + step
            if self.progress is not None:
                self.progress((t - self.start.timestamp()) / max(stop - self.start.timestamp(), 1))
        return arm

    def _serve(
        self, i: int, j: int, cache: VirtualCache, arm: Arm, deployed: bool, base: Arm | None
    ) -> tuple[list[RequestLogged], dict[str, list[tuple[str, float]]]]:
        """Serve rows i..j; returns the events as the gateway would log them, and the warmed
        entries' first hits per tenant (key digest, time)."""
        logged: list[RequestLogged] = []
        warm_hits: dict[str, list[tuple[str, float]]] = {}
        ledger = arm.ledger
        offset = self._index(self.start.timestamp())
        for n in range(i, j):
            r = self.rows[n]
            ev = r.event
            if deployed and r.deployed is not None:
                key, digest = r.deployed
                ev = ev.model_copy(update={"model_version": self.deployed_version(r)})
            else:
                key, digest = r.keys
            e = cache.get(key, r.t) if r.cacheable else None
            arm.hits.append(e is not None)
            if e is None:
                ledger.served(r.t, False, ev.gpu_ms, fixed=r.novel or not r.cacheable)
                if r.cacheable:
                    cache.put(key, r.t, warm=False, docs=tuple(d.doc_id for d in ev.context_docs))
                logged.append(ev if ev.cache_outcome == "miss" else _as(ev, "miss"))
                continue
            first = e.warm and not e.hit
            e.hit = True
            ledger.served(r.t, True, 0.0, first)
            if e.warm and base is not None and not base.hits[n - offset]:
                e.added = True  # it served a request that missed without warming
            if first:
                warm_hits.setdefault(ev.tenant, []).append((digest, r.t))
            logged.append(_as(ev, "exact"))
        return logged, warm_hits

    def deployed_version(self, r: Row) -> str:
        return _DEPLOYED

    def _deploy_step(self) -> float | None:
        if self.deploy_at is None:
            return None
        t0 = self.start.timestamp()
        k = int((self.deploy_at.timestamp() - t0) // self.interval_s)
        return t0 + max(0, k) * self.interval_s

    def _index(self, t: float) -> int:
        return bisect.bisect_left(self.rows, t, key=lambda r: r.t)


# The version a replayed deploy moves to (the log knows only its own).
_DEPLOYED = "replay-deployed"
DEPLOYED_VERSION = _DEPLOYED


def _as(ev: RequestLogged, outcome: str) -> RequestLogged:
    """The event as the gateway logs a request with this outcome: a hit costs no GPU."""
    if outcome == "miss":
        return ev.model_copy(update={"cache_outcome": "miss"})
    return ev.model_copy(update={"cache_outcome": outcome, "gpu_ms": 0.0, "tokens_out": 0})


def floor_to(t: datetime, step: timedelta) -> datetime:
    s = step.total_seconds()
    return datetime.fromtimestamp(t.timestamp() // s * s, UTC)
