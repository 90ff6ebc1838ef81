"""Job checkpoints in Redis: a restarted purge or cutover resumes where it stopped."""

from __future__ import annotations

from typing import Any

import orjson
import redis

from caches import constants as C
from caches.boundary import as_bytes, redis_boundary

# Outside every tenant's hash tag on purpose: a purge's MATCH patterns start "stk:{t:" and can
# never match (and so never delete) a checkpoint. A finished job's checkpoint is kept a week
# so `stoker deploy --wait` and reruns can still see DONE; an active one never expires.
CHECKPOINT_PREFIX = f"{C.KEY_ROOT}:job:"
DONE_TTL_S = 7 * 86_400


def checkpoint_key(job_id: str) -> str:
    return f"{CHECKPOINT_PREFIX}{job_id}"


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
