"""Job records and job status: what each long job is doing or last did, in Redis and on Kafka.

Job records (warm runs, anything wrapped in RecordingStatusSink) are one of the three sources
`stoker status` merges (invalidators/jobs.py reads the other two). JobStatus events go to
stoker.status through KafkaStatusSink, for `stoker deploy --wait`.

Record keys share one hash tag, "{jobs}", so a record and the index land in one round trip on a
Redis Cluster too; none starts "stk:{t:", so no purge or invalidation pattern can touch them:

    stk:jobs:{jobs}:rec:<type>:<job_id>   JSON JobRecord; expires RECORD_TTL_S after its last write
    stk:jobs:{jobs}:recent                zset "<type>:<job_id>" -> updated_at, trimmed to MAX_RECENT
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, Protocol

import orjson
import redis

from caches import keys as K
from caches.boundary import as_bytes, redis_boundary
from schemas.errors import BrokerUnavailable
from schemas.events import JobStatus
from streams.publisher import EventPublisher

JobType = Literal["deploy", "purge", "warm", "invalidate"]
JobState = Literal["pending", "running", "ready", "done", "failed", "interrupted"]

RECORD_PREFIX: Final = K.JOB_RECORD_PREFIX
RECENT_KEY: Final = K.JOBS_RECENT_KEY
# A week, as finished cutover documents are kept: long enough to ask "what ran this weekend".
RECORD_TTL_S: Final = 7 * 86_400
# The index keeps the newest 500: far more than a terminal shows; bounds the zset.
MAX_RECENT: Final = 500


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


class KafkaStatusSink:
    """JobStatus events to stoker.status, keyed by job id, flushed one by one (a few per second)."""

    def __init__(self, publisher: EventPublisher) -> None:
        self._pub: EventPublisher | None = publisher
        self._lock = threading.Lock()  # the consume thread and a job runner both publish

    def publish(self, status: JobStatus) -> None:
        with self._lock:
            if self._pub is None:
                raise BrokerUnavailable("the status publisher is closed")
            self._pub.publish("stoker.status", status, key=status.job_id)
            self._pub.flush()

    def close(self) -> None:
        """Drop the producer (every publish was flushed already), ending its broker threads."""
        with self._lock:
            self._pub = None
