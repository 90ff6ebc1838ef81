"""`stoker worker traffic` as deployed: /metrics on STOKER_METRICS_PORT, JSON logs, clean SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import httpx
import orjson

from stoker.embedded import free_port
from tests.cli import STOKER, clean_env
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _metrics(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None


def test_worker_cli__serves_metrics_and_logs_json(kafka_bootstrap: str, redis_url: str, unique):
    port = free_port()
    env = clean_env() | {
        "STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "STOKER_KAFKA_BROKER": "tansu",
        "STOKER_REDIS_URL": redis_url,
        "STOKER_TOPIC_PREFIX": f"t{unique}.",
        "STOKER_METRICS_PORT": str(port),
        "STOKER_LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [*STOKER, "worker", "traffic"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        lines.extend(raw.decode() for raw in proc.stderr)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        scraped: list[str] = []

        def scrape() -> bool:  # the endpoint comes up before the consumer joins
            got = _metrics(port)
            if got is not None:
                scraped.append(got)
            return got is not None or proc.poll() is not None

        wait_for(scrape, 60, "the worker's metrics endpoint", 0.1)
        assert scraped, "".join(lines)
        body = scraped[0]
        # every package's families are registered from the first scrape
        for family in ("stoker_worker_events", "stoker_gateway_requests", "stoker_cache_lookups",
                       "stoker_warm_requests_sent", "stoker_invalidation_lag_seconds"):  # fmt: skip
            assert f"# TYPE {family}" in body, family
        # SIGTERM once the consumer runs (before that the default handler would just kill it)
        wait_for(lambda: any("joined group" in x for x in lines), 60,
                 "the consumer to join its group", 0.1)  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
    assert proc.returncode == 0, "".join(lines)
    records = [orjson.loads(x) for x in lines if x.startswith("{")]
    joined = [r for r in records if "joined group" in r["msg"]]
    assert joined and joined[0]["logger"] == "streams.worker" and joined[0]["level"] == "info"
    assert _metrics(port) is None  # the endpoint went with the process
