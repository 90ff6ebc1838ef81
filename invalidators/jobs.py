"""Every job `stoker status` shows, merged from three sources, newest first:

1. job records written through streams.jobs.JobRecords (warm runs, RecordingStatusSink);
2. deploy cutover documents (invalidators/cutover.py, checkpoint keys "stk:job:{deploy}:<id>");
3. purge checkpoints ("stk:job:purge:..."), which exist only while a purge is unfinished.

Documents 2 and 3 carry no timestamp of their own; their age is Redis's OBJECT IDLETIME (read
before the GET, which would reset it). An unfinished purge idle for over STALLED_S is reported
"interrupted": its runner died or was stopped, and rerunning it resumes from the checkpoint.
"""

from __future__ import annotations

import time
from typing import Final

import orjson
import redis

from caches.boundary import as_bytes, redis_boundary
from invalidators.checkpoint import CHECKPOINT_PREFIX, DEPLOY_TAG
from streams.jobs import JobRecord, JobRecords, JobState

# A purge checkpoints every batch (~1k keys, well under a second unpaced); 5 min without one
# means a paced purge slower than 3 keys/s or a dead runner: reported "interrupted".
STALLED_S: Final = 300.0
# Progress share of a deploy's pre-warm, as cutover.py reports it (the purge is the rest).
_PREWARM_SHARE: Final = 0.2
_DEPLOY_STATE: Final[dict[str, JobState]] = {
    "prewarm": "running",
    "grace": "ready",
    "retire": "running",
    "purge": "running",
    "done": "done",
    "failed": "failed",
}


def _documents(r: redis.Redis, pattern: str, limit: int) -> list[tuple[str, float, bytes]]:
    """(key, seconds idle, value) of up to `limit` keys matching pattern."""
    keys = []
    with redis_boundary("scan job documents"):
        for k in r.scan_iter(match=pattern, count=1_000):
            keys.append(as_bytes(k).decode())
            if len(keys) >= limit:
                break
        if not keys:
            return []
        pipe = r.pipeline(transaction=False)
        for k in keys:
            pipe.object("idletime", k)
        for k in keys:
            pipe.get(k)
        replies = pipe.execute(raise_on_error=False)
    idles, values = replies[: len(keys)], replies[len(keys) :]
    return [
        (k, float(idle) if isinstance(idle, int) else 0.0, as_bytes(v))
        for k, idle, v in zip(keys, idles, values, strict=True)
        if isinstance(v, bytes | str)
    ]


def deploy_jobs(r: redis.Redis, limit: int = 200, now: float | None = None) -> list[JobRecord]:
    """Deploy cutover documents as records (running ones and those finished within a week)."""
    now = time.time() if now is None else now
    out = []
    for _, idle, raw in _documents(r, f"{CHECKPOINT_PREFIX}{DEPLOY_TAG}:*", limit):
        d = orjson.loads(raw)
        phase = str(d.get("phase", "prewarm"))
        n = max(1, len(d.get("purge_ids") or []))
        progress = {"done": 1.0, "prewarm": 0.0, "failed": 0.0}.get(
            phase, _PREWARM_SHARE + (1 - _PREWARM_SHARE) * int(d.get("purges_done", 0)) / n
        )
        labels = {k: str(d[k]) for k in ("model_id", "version", "previous_version") if d.get(k)}
        figures = {"grace_until": float(d["grace_until"])} if d.get("grace_until") else {}
        out.append(
            JobRecord(
                job_type="deploy",
                job_id=str(d.get("deploy_id", "?")),
                state=_DEPLOY_STATE.get(phase, "running"),
                progress=progress,
                detail=f"{phase}: {d.get('detail', '')}",
                counts=dict(d.get("counts") or {}),
                figures=figures,
                labels=labels | {"phase": phase},
                started_at=d.get("accepted_at"),
                updated_at=now - idle,
                source="deploy",
            )
        )
    return out


def purge_jobs(r: redis.Redis, limit: int = 200, now: float | None = None) -> list[JobRecord]:
    """Unfinished purges from their checkpoints; stalled ones are "interrupted"."""
    now = time.time() if now is None else now
    out = []
    for key, idle, raw in _documents(r, f"{CHECKPOINT_PREFIX}purge:*", limit):
        d = orjson.loads(raw)
        nodes = d.get("nodes") or {}
        done = sum(1 for n in nodes.values() if n.get("done"))
        spec = {k: str(v) for k, v in (d.get("spec") or {}).items() if v is not None}
        state: JobState = "interrupted" if idle > STALLED_S else "running"
        detail = f"no progress for {idle:.0f} s; rerun to resume" if state == "interrupted" else ""
        counts = {"matched": int(d.get("matched", 0)), "deleted": int(d.get("deleted", 0))}
        out.append(
            JobRecord(
                job_type="purge",
                job_id=key.removeprefix(CHECKPOINT_PREFIX),
                state=state,
                progress=done / len(nodes) if nodes else 0.0,
                detail=detail,
                counts=counts,
                labels=spec,
                updated_at=now - idle,
                source="checkpoint",
            )
        )
    return out


def all_jobs(r: redis.Redis, limit: int = 50) -> list[JobRecord]:
    """Every source merged, one record per (type, id) (the newest), newest first."""
    best: dict[tuple[str, str], JobRecord] = {}
    for rec in [*JobRecords(r).recent(limit), *deploy_jobs(r), *purge_jobs(r)]:
        key = (rec.job_type, rec.job_id)
        if key not in best or rec.updated_at > best[key].updated_at:
            best[key] = rec
    return sorted(best.values(), key=lambda x: x.updated_at, reverse=True)[:limit]
