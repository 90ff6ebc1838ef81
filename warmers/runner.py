"""One warm run, end to end: plan the hot set for a window, then warm it through the shadow warmer.

Shared by `stoker warm`, the scheduler and the deploy pre-warm, so all three choose and send
alike. The shell builds it (stoker.wiring.build_runner); the embedder loads once per process.
With `records` set, every run leaves a job record (streams.jobs) that `stoker status` shows:
"running" when the sends begin, then "done" or "failed" with the run's figures.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Unpack

from rich.console import Console

from backends.base import Backend
from caches.client import CacheClient
from schemas.errors import StokerError
from streams.jobs import JobRecord, JobRecords, JobState
from warmers.hotset.calibration import Calibration
from warmers.hotset.plan import Plan
from warmers.hotset.select import HotSetSelector, PlanScope
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.shadow import ShadowWarmer, WarmConfig, WarmSummary

BackendFactory = Callable[[], Backend]
log = logging.getLogger(__name__)


@dataclass
class WarmRunner:
    selector: HotSetSelector
    cache: CacheClient
    backend: BackendFactory  # a fresh client per run: each run owns (and closes) its pool
    warm_config: WarmConfig
    progress: bool | None = None
    console: Console | None = None
    records: JobRecords | None = None  # None: runs leave no job record (tests, dry runs)
    # Where landed warms are noted for the forecast's calibration (None: not noted).
    calibration: Calibration | None = None
    # Where the sends go instead of the shadow warmer over `backend` (a replay's virtual
    # backend, warmers/replay/); None: the shadow warmer.
    send: Callable[[Plan], WarmSummary] | None = None

    def plan(self, window: Window, budget: Budget, **scope: Unpack[PlanScope]) -> Plan:
        """The selector's plan (HotSetSelector.plan: the keywords and what they mean)."""
        return self.selector.plan(window, budget, **scope)

    def plan_ahead(self, budget: Budget, **scope: Unpack[PlanScope]) -> Plan:
        """The scheduler's plan: what is due now of the hours ahead (HotSetSelector.plan_ahead)."""
        return self.selector.plan_ahead(budget, **scope)

    def warm(self, plan: Plan, *, labels: Mapping[str, str] | None = None) -> WarmSummary:
        """Send the plan's items (synchronously: runs its own event loop) and record the run."""
        job_id = f"warm-{uuid.uuid4().hex[:12]}"
        tags = {"window": str(plan.window), "planned": str(len(plan.items)), **(labels or {})}
        started = time.time()
        self._record(job_id, WarmSummary(), "running", started, "sending", tags)
        try:
            summary = self.send(plan) if self.send is not None else asyncio.run(self._warm(plan))
        except StokerError as e:
            self._record(job_id, WarmSummary(), "failed", started, str(e), tags)
            raise
        state, detail = outcome(summary)
        self._record(job_id, summary, state, started, detail, tags)
        if self.calibration is not None and summary.landed_keys:
            try:
                self.calibration.landed(plan, summary.landed_keys)
            except StokerError as e:  # a statistic: the warm itself must not fail for it
                log.warning("landed warms not noted for the calibration: %s", e)
        return summary

    async def _warm(self, plan: Plan) -> WarmSummary:
        if not plan.items:
            return WarmSummary()
        async with self.backend() as b:
            w = ShadowWarmer(
                b, self.cache, self.warm_config, progress=self.progress, console=self.console
            )
            return await w.run(plan.warm_items())

    def _record(
        self,
        job_id: str,
        summary: WarmSummary,
        state: JobState,
        started: float,
        detail: str,
        labels: dict[str, str],
    ) -> None:
        if self.records is None:
            return
        rec = warm_record(
            job_id, summary, state=state, started_at=started, detail=detail, labels=labels
        )
        try:
            self.records.write(rec)
        except StokerError:  # the record is for people; the warm itself must not fail for it
            return


def outcome(s: WarmSummary) -> tuple[JobState, str]:
    """("done" | "failed", a one-line detail): a run whose every send failed has failed, and
    one stopped by a backend that refuses connections says so."""
    if s.unreachable:
        return "failed", f"{s.unreachable} (sent {s.sent}, landed {s.cached})"
    if s.sent and not s.cached and s.failed == s.sent:
        return "failed", f"all {s.failed} sends failed"
    unstored = f", not stored {s.not_stored} ({s.not_stored_reason})" if s.not_stored else ""
    return "done", (
        f"sent {s.sent}, landed {s.cached}, skipped {s.skipped_cached} cached, failed {s.failed}"
        f"{unstored}"
    )


# -- warm runs as job records, so `stoker status` shows the last runs with their figures --


def warm_record(
    job_id: str,
    summary: WarmSummary,
    *,
    state: JobState = "done",
    started_at: float | None = None,
    detail: str = "",
    labels: dict[str, str] | None = None,
) -> JobRecord:
    """A finished (or failed) run's record: counts of what happened, figures of how it went."""
    s = summary
    counts = {
        "sent": s.sent,
        "landed": s.cached,
        "skipped_cached": s.skipped_cached,
        "skipped_uncacheable": s.skipped_uncacheable,
        "skipped_negative": s.skipped_negative,
        "skipped_priced": s.skipped_priced,
        "failed": s.failed,
        "overloaded": s.overloaded,
        "refused_stale": s.refused_stale,
        "not_stored": s.not_stored,
        "backoffs": s.backoffs,
    }
    figures = {
        "achieved_qps": round(s.achieved_qps, 3),
        "final_rate_qps": round(s.final_rate_qps, 3),
        "gpu_seconds": round(s.gpu_seconds, 3),
        "elapsed_s": round(s.elapsed_s, 3),
    }
    progress = 1.0 if state == "done" else 0.0
    return JobRecord("warm", job_id, state, progress, detail, counts, figures,
                     dict(labels or {}), started_at, time.time())  # fmt: skip


def record_warm_run(records: JobRecords, job_id: str, summary: WarmSummary, **kw: object) -> None:
    """Write the run's record (see warm_record for the keywords)."""
    records.write(warm_record(job_id, summary, **kw))  # type: ignore[arg-type]
