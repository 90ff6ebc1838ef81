"""Warm runs as job records, so `stoker status` shows the last runs with their figures."""

from __future__ import annotations

import time

from streams.jobs import JobRecord, JobRecords, JobState
from warmers.shadow import WarmSummary


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
