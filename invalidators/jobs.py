"""Job records: what each long job (deploy cutover, purge, warm run) is doing or last did.

`stoker status` reads three sources and merges them, newest first:
1. job records written through JobRecords (warm runs, anything wrapped in RecordingStatusSink);
2. deploy cutover documents (invalidators/cutover.py, checkpoint keys "stk:job:{deploy}:<id>");
3. purge checkpoints ("stk:job:purge:..."), which exist only while a purge is unfinished.

Record keys share one hash tag, "{jobs}", so a record and the index land in one round trip on a
Redis Cluster too; none starts "stk:{t:", so no purge or invalidation pattern can touch them:

    stk:jobs:{jobs}:rec:<type>:<job_id>   JSON JobRecord; expires RECORD_TTL_S after its last write
    stk:jobs:{jobs}:recent                zset "<type>:<job_id>" -> updated_at, trimmed to MAX_RECENT

Documents 2 and 3 carry no timestamp of their own; their age is Redis's OBJECT IDLETIME (read
before the GET, which would reset it). An unfinished purge idle for over STALLED_S is reported
"interrupted": its runner died or was stopped, and rerunning it resumes from the checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, Protocol

import orjson
import redis

from caches import constants as C
from caches.boundary import as_bytes, redis_boundary
from invalidators.checkpoint import CHECKPOINT_PREFIX, DEPLOY_TAG
from schemas.events import JobStatus

JobType = Literal["deploy", "purge", "warm", "invalidate"]
JobState = Literal["pending", "running", "ready", "done", "failed", "interrupted"]

JOBS_TAG: Final = "{jobs}"
RECORD_PREFIX: Final = f"{C.KEY_ROOT}:jobs:{JOBS_TAG}:rec:"
RECENT_KEY: Final = f"{C.KEY_ROOT}:jobs:{JOBS_TAG}:recent"
# A week, as finished cutover documents are kept: long enough to ask "what ran this weekend".
RECORD_TTL_S: Final = 7 * 86_400
# The index keeps the newest 500: far more than a terminal shows; bounds the zset.
MAX_RECENT: Final = 500
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


@dataclass(frozen=True)
class JobRecord:
    """One job as `stoker status` shows it. counts are integers (keys deleted, requests sent),
    figures are measurements (achieved QPS, GPU-seconds), labels say what the job is about
    (model_id, version, tenant): never a prompt."""

    job_type: JobType
    job_id: str
    state: JobState
    progress: float = 0.0
    detail: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    started_at: float | None = None
    updated_at: float = field(default_factory=time.time)
    source: Literal["record", "deploy", "checkpoint"] = "record"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobRecord:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    @classmethod
    def from_status(cls, s: JobStatus) -> JobRecord:
        return cls(s.job_type, s.job_id, s.state, s.progress, s.detail, dict(s.counts),
                   updated_at=s.ts.timestamp())  # fmt: skip


class JobRecords:
    """Writes and reads job records. A writer owns its job id (one runner per job)."""

    def __init__(self, r: redis.Redis) -> None:
        self._r = r

    def write(self, rec: JobRecord) -> None:
        """Save the record and index it; one round trip, idempotent (last write wins)."""
        member = f"{rec.job_type}:{rec.job_id}"
        with redis_boundary("write job record"):
            pipe = self._r.pipeline(transaction=False)
            pipe.set(RECORD_PREFIX + member, orjson.dumps(rec.to_dict()), ex=RECORD_TTL_S)
            pipe.zadd(RECENT_KEY, {member: rec.updated_at})
            pipe.zremrangebyrank(RECENT_KEY, 0, -(MAX_RECENT + 1))
            pipe.execute()

    def recent(self, limit: int = 50) -> list[JobRecord]:
        """Newest first; records that expired drop out of the index here."""
        with redis_boundary("read job records"):
            raw: list[bytes] = self._r.zrevrange(RECENT_KEY, 0, limit - 1)  # type: ignore[assignment]
            members = [as_bytes(m).decode() for m in raw]
            blobs = self._r.mget([RECORD_PREFIX + m for m in members]) if members else []
            gone = [m for m, b in zip(members, blobs, strict=True) if b is None]
            if gone:
                self._r.zrem(RECENT_KEY, *gone)
        return [JobRecord.from_dict(orjson.loads(as_bytes(b))) for b in blobs if b is not None]


class StatusSink(Protocol):
    def publish(self, status: JobStatus) -> None: ...


class RecordingStatusSink:
    """Publishes a JobStatus where it went before and keeps it as a job record for status."""

    def __init__(self, inner: StatusSink, records: JobRecords) -> None:
        self.inner, self.records = inner, records

    def publish(self, status: JobStatus) -> None:
        self.inner.publish(status)
        self.records.write(JobRecord.from_status(status))


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
