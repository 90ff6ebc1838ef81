"""`stoker status`: jobs from a real cutover, a stopped purge and a warm run, as CI reads them."""

from __future__ import annotations

import subprocess
import threading

import orjson
import redis

from caches.client import CacheClient
from caches.request import CacheRequest
from invalidators.cutover import Cutover
from invalidators.jobs import all_jobs
from invalidators.purge import PurgeOptions, PurgeProgress, Purger, PurgeSpec
from schemas.events import JobStatus, ModelDeployed
from streams.jobs import JobRecord, JobRecords, RecordingStatusSink
from tests.cli import run_stoker
from warmers.runner import record_warm_run
from warmers.shadow import WarmSummary

JOB_KEYS = {
    "job_type", "job_id", "state", "progress", "detail", "counts", "figures", "labels",
    "started_at", "updated_at", "source",
}  # fmt: skip


class Statuses:
    def __init__(self) -> None:
        self.seen: list[JobStatus] = []

    def publish(self, status: JobStatus) -> None:
        self.seen.append(status)


def stoker(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_stoker(*args, env=env)


def _jobs(r: redis.Redis, model: str = "llama") -> None:
    """A deploy of `model` in its grace window, a purge stopped after one batch, a finished
    warm run."""
    cut = Cutover(r, Purger(r), Statuses())
    cut.accept(ModelDeployed(deploy_id="d-1", model_id=model, version="v2",
                             previous_version="v1", grace_s=3600))  # fmt: skip
    cut.step("d-1", threading.Event(), lambda: True)
    c = CacheClient(r)
    for i in range(30):
        assert c.store(c.lookup(CacheRequest("acme", "mistral", "v1", "t1", f"q{i}")), "a").landed
    stop = threading.Event()

    def first_batch_only(_: PurgeProgress) -> None:
        stop.set()

    prog = Purger(r).run(PurgeSpec("mistral", "v1"), PurgeOptions(batch=10),
                         on_progress=first_batch_only, stop=stop)  # fmt: skip
    assert prog.state == "interrupted"
    summary = WarmSummary(sent=12, cached=11, failed=1, gpu_seconds=3.5, achieved_qps=4.9)
    record_warm_run(JobRecords(r), "warm-2025-03-03T10", summary, labels={"window": "mon 10h"})


def test_status_json__stable_shape_with_every_kind_of_job(redis_client: redis.Redis, redis_url):
    _jobs(redis_client)
    out = stoker("status", "--json", STOKER_REDIS_URL=redis_url)
    assert out.returncode == 0, out.stderr
    doc = orjson.loads(out.stdout)
    assert set(doc) == {"schema", "generated_at", "running", "jobs", "embedded"}
    assert doc["schema"] == 1 and doc["embedded"] is None  # no embedded stack runs here
    assert all(set(j) == JOB_KEYS for j in doc["jobs"])
    by_type = {j["job_type"]: j for j in doc["jobs"]}
    assert set(by_type) == {"deploy", "purge", "warm"}

    deploy = by_type["deploy"]
    assert (deploy["job_id"], deploy["state"], deploy["labels"]["phase"]) == (
        "d-1",
        "ready",
        "grace",
    )
    assert deploy["labels"]["version"] == "v2" and deploy["figures"]["grace_until"] > 0
    purge = by_type["purge"]
    assert purge["state"] == "running" and purge["counts"]["deleted"] > 0
    assert purge["labels"]["model_id"] == "mistral" and 0 <= purge["progress"] <= 1
    warm = by_type["warm"]
    assert warm["state"] == "done" and warm["counts"]["sent"] == 12
    assert warm["figures"]["gpu_seconds"] == 3.5 and warm["labels"] == {"window": "mon 10h"}
    assert doc["running"] == 1  # the purge; the deploy is READY (in grace)


def test_status__table_on_stdout_and_empty_and_no_redis(redis_client: redis.Redis, redis_url):
    empty = stoker("status", STOKER_REDIS_URL=redis_url)
    assert empty.returncode == 0 and "no running or recent jobs" in empty.stdout
    _jobs(redis_client)
    shown = stoker("status", STOKER_REDIS_URL=redis_url, COLUMNS="300")  # room for a table
    assert shown.returncode == 0, shown.stderr
    for text in ("Deploy cutovers", "Purges", "Warm runs", "d-1", "gpu_seconds=3.50"):
        assert text in shown.stdout  # the table is the verb's output
    assert "┃ job" in shown.stdout and "gpu_seconds" not in shown.stderr
    missing = stoker("status")
    assert missing.returncode == 2 and "STOKER_REDIS_URL" in missing.stderr  # configuration


def test_status__at_80_columns_in_a_pipe_every_line_fits_and_no_word_is_split(
    redis_client: redis.Redis, redis_url
):
    """The trial's 3 jobs took 117 lines at 80 columns, `smollm2-1 / 35m-instr / uct` among
    them: each job is now a block of a few lines, every word whole."""
    _jobs(redis_client, model="smollm2-135m-instruct")
    shown = stoker("status", STOKER_REDIS_URL=redis_url, COLUMNS="80")  # stdout: a pipe
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert not [line for line in lines if len(line) > 80], shown.stdout
    assert len(lines) <= 20, shown.stdout
    words = shown.stdout.split()
    assert "model_id=smollm2-135m-instruct" in words and "gpu_seconds=3.50" in words
    assert "…" not in shown.stdout
    for title in ("Deploy cutovers", "Purges", "Warm runs"):
        assert title in lines
    assert any(line.split()[:2] == ["d-1", "ready"] for line in lines), shown.stdout


def test_job_records__recording_sink_keeps_the_newest_and_drops_expired(redis_client):
    sink = RecordingStatusSink(Statuses(), JobRecords(redis_client))
    sink.publish(JobStatus(job_id="w1", job_type="warm", state="running", progress=0.5))
    sink.publish(JobStatus(job_id="w1", job_type="warm", state="done", progress=1.0))
    [rec] = all_jobs(redis_client)
    assert (rec.job_id, rec.state, rec.progress) == ("w1", "done", 1.0)
    redis_client.delete("stk:jobs:{jobs}:rec:warm:w1")  # as its TTL would
    assert JobRecords(redis_client).recent() == []
    assert JobRecord.from_dict(rec.to_dict() | {"added_later": 1}) == rec  # old readers cope
