"""A worker's log says what happened, not that the schedule ticked: routine lines are DEBUG."""

from __future__ import annotations

import redis

from tests.cli import running_stoker, stop
from tests.events import UNUSED_BACKEND
from tests.waiting import wait_for
from warmers.scheduler import DEFAULT_LOCK_KEY


def _run_scheduler(env: dict[str, str], r: redis.Redis, renewals: int) -> list[str]:
    """`stoker worker scheduler` until its leader lease was renewed `renewals` times."""
    seen = {"renewals": 0, "last": -2}
    with running_stoker("worker", "scheduler", env=env) as (proc, lines):

        def renewed() -> bool:
            assert proc.poll() is None, "".join(lines)
            ttl = int(r.pttl(DEFAULT_LOCK_KEY))
            if ttl > seen["last"] >= 0:  # the lease's time to live went up: renewed
                seen["renewals"] += 1
            seen["last"] = ttl
            return seen["renewals"] >= renewals

        wait_for(renewed, 120, f"{renewals} lease renewals")
        code = stop(proc)
    assert code == 0, "".join(lines)
    return lines


def test_worker_scheduler_cli__routine_ticks_log_at_debug(
    kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, unique: str
) -> None:
    """apscheduler logged two INFO lines per job run, and the lease runs every 10 s: 454 of
    471 lines of a `worker all` run. Ten renewals and an empty warm run now log none."""
    env = {"STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap, "STOKER_KAFKA_BROKER": "tansu",
           "STOKER_REDIS_URL": redis_url, "STOKER_TOPIC_PREFIX": f"l{unique}.",
           "STOKER_SCHEDULER_LOCK_TTL_S": "0.6", "STOKER_SEMANTIC_ENABLED": "false",
           "STOKER_WARM_BACKEND_URL": UNUSED_BACKEND}  # fmt: skip
    lines = _run_scheduler(env, redis_client, renewals=10)
    text = "".join(lines)
    assert "apscheduler" not in text and "Running job" not in text, text
    assert "warmed " not in text, text  # the warm run planned nothing: routine
    assert len(lines) <= 6, text
    debug = _run_scheduler(env | {"STOKER_LOG_LEVEL": "DEBUG"}, redis_client, renewals=3)
    assert any("apscheduler" in x and "Running job" in x for x in debug)  # there when asked
