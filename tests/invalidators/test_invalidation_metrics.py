"""Invalidation metrics: kinds counted, lag from event time, purge keys and per-job progress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis
from prometheus_client import REGISTRY

from caches.client import CacheClient
from caches.request import CacheRequest
from invalidators import metrics as M
from invalidators.handlers import InvalidationHandler
from invalidators.invalidation import Invalidator
from invalidators.purge import PurgeOptions, PurgeProgress, Purger, PurgeSpec
from schemas.events import Invalidate, KnowledgeBaseChanged


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_invalidation_metrics__kinds_and_lag_from_event_time(client: CacheClient):
    handler = InvalidationHandler(Invalidator(client.redis, client.semantic), close_clients=False)
    ten_s_ago = datetime.now(UTC) - timedelta(seconds=10)
    kb = KnowledgeBaseChanged(
        tenant="acme", doc_id="kb/r", doc_version=2, change="updated", ts=ten_s_ago
    )
    doc = Invalidate(tenant="acme", by="doc", value="kb/x")
    kb0, doc0 = (
        sample("stoker_invalidations_total", kind="kb_changed"),
        sample("stoker_invalidations_total", kind="doc"),
    )
    slow0 = sample("stoker_invalidation_lag_seconds_bucket", kind="kb_changed", le="5.0")
    n0 = sample("stoker_invalidation_lag_seconds_count", kind="kb_changed")

    handler.apply([kb, doc])

    assert sample("stoker_invalidations_total", kind="kb_changed") - kb0 == 1
    assert sample("stoker_invalidations_total", kind="doc") - doc0 == 1
    assert sample("stoker_invalidation_lag_seconds_count", kind="kb_changed") - n0 == 1
    # 10 s late: counted above the 5 s bucket, which is what the p99 alert watches
    assert sample("stoker_invalidation_lag_seconds_bucket", kind="kb_changed", le="5.0") == slow0


def test_purge_metrics__keys_deleted_and_progress_series_gone_when_done(
    redis_client: redis.Redis,
):
    c = CacheClient(redis_client)
    for i in range(25):
        res = c.lookup(CacheRequest("acme", "llama", "v1", "t1", f"question {i}"))
        assert c.store(res, "answer").landed
    spec = PurgeSpec("llama", "v1")
    seen: list[float | None] = []
    deleted0 = sample("stoker_purge_keys_deleted_total")

    def watch(p: PurgeProgress) -> None:
        seen.append(REGISTRY.get_sample_value("stoker_purge_progress_ratio", {"job": p.job_id}))

    prog = Purger(redis_client).run(spec, PurgeOptions(batch=5), on_progress=watch)

    assert prog.state == "done" and prog.deleted == 25
    assert sample("stoker_purge_keys_deleted_total") - deleted0 == 25
    assert seen[0] is not None and 0.0 <= seen[0] <= 1.0  # set while running
    assert REGISTRY.get_sample_value("stoker_purge_progress_ratio", {"job": spec.job_id}) is None


@pytest.mark.parametrize("state", ["done", "interrupted", "dry-run"])
def test_purge_reported__only_running_jobs_keep_a_series(state: str):
    p = PurgeProgress("purge:test", fraction=0.4)
    M.purge_reported(p)
    assert sample("stoker_purge_progress_ratio", job="purge:test") == 0.4
    p.state = state
    M.purge_reported(p)
    assert REGISTRY.get_sample_value("stoker_purge_progress_ratio", {"job": "purge:test"}) is None
