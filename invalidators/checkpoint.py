"""Job checkpoints in Redis: a restarted purge or cutover resumes where it stopped."""

from __future__ import annotations

from typing import Any

import orjson
import redis

from caches import keys as K
from caches.boundary import as_bytes, redis_boundary

# Outside every tenant's hash tag on purpose: a purge's MATCH patterns start "stk:{t:" and can
# never match (and so never delete) a checkpoint. A finished job's checkpoint is kept a week
# so `stoker deploy --wait` and reruns can still see DONE; an active one never expires.
CHECKPOINT_PREFIX = K.CHECKPOINT_PREFIX
DONE_TTL_S = 7 * 86_400


# Deploy cutover jobs (cutover.py). The job document (a checkpoint), the due queue and the
# runner's lease share one hash tag, "{deploy}", so accepting a job (document + queue entry) is
# one atomic script on a Redis Cluster too. None of them starts "stk:{t:", so no purge or
# invalidation pattern can touch them. The queue is a ZSET deploy_id -> due time (epoch s): a job
# in its grace window is due at the deadline, an unfinished one at 0; a finished job leaves it.
DEPLOY_TAG = K.DEPLOY_TAG
DEPLOY_QUEUE_KEY = K.DEPLOY_QUEUE_KEY
# A newer deploy's verdict on an older pending one (deployjob.Supersede), kept apart from the job
# document so the runner's whole-document saves can never overwrite it.
DEPLOY_SUPERSEDE_PREFIX = K.DEPLOY_SUPERSEDE_PREFIX
# Who runs a job now: one runner per job across every deploy worker; see deploy.LEASE_S.
DEPLOY_LEASE_PREFIX = K.DEPLOY_LEASE_PREFIX


def checkpoint_key(job_id: str) -> str:
    return f"{CHECKPOINT_PREFIX}{job_id}"


def deploy_job_id(deploy_id: str) -> str:
    """The checkpoint id of a deploy's cutover (JobStatus.job_id stays the bare deploy id)."""
    return f"{DEPLOY_TAG}:{deploy_id}"


class Checkpoints:
    """One JSON document per job id. Writes are whole-document SETs: last writer wins, which is
    right because a job has one runner at a time (the worker that owns its partition)."""

    def __init__(self, r: redis.Redis) -> None:
        self._r = r

    def load(self, job_id: str) -> dict[str, Any] | None:
        with redis_boundary("load checkpoint"):
            raw = self._r.get(checkpoint_key(job_id))
        if raw is None:
            return None
        state: dict[str, Any] = orjson.loads(as_bytes(raw))
        return state

    def save(self, job_id: str, state: dict[str, Any], *, done: bool = False) -> None:
        with redis_boundary("save checkpoint"):
            self._r.set(
                checkpoint_key(job_id), orjson.dumps(state), ex=DONE_TTL_S if done else None
            )

    def save_in(self, pipe: Any, job_id: str, state: dict[str, Any]) -> None:
        """Queue the save on a pipeline, so it lands in the same round trip as the deletes."""
        pipe.set(checkpoint_key(job_id), orjson.dumps(state))

    def clear(self, job_id: str) -> None:
        with redis_boundary("clear checkpoint"):
            self._r.delete(checkpoint_key(job_id))
