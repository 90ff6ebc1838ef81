"""librdkafka's log lines go through logging at sane levels, not to stderr by the hundred."""

from __future__ import annotations

import logging

import pytest

from stoker.embedded import free_port
from streams.kafkalog import KafkaClientLog
from tests.cli import run_stoker


def test_deploy_wait_cli__a_broker_down_is_one_line_not_a_flood() -> None:
    """It printed ~190 "%3|...|FAIL|rdkafka#producer-1| ... Connection refused" lines first."""
    res = run_stoker(
        "deploy", "--model", "m", "--version", "v2", "--wait", "--timeout", "5s",
        env={"STOKER_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"}, timeout=120,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "rdkafka#" not in res.stderr and "%3|" not in res.stderr, res.stderr[:2000]
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) <= 3, res.stderr
    assert lines[-1].startswith("error (retriable): Kafka at 127.0.0.1:")


def test_kafka_client_log__levels_and_repeats(caplog: pytest.LogCaptureFixture) -> None:
    clock = KafkaClientLog("librdkafka.test", repeat_every_s=3600)
    fmt = "%s [%s] %s"
    with caplog.at_level(logging.DEBUG, logger="librdkafka.test"):
        for _ in range(100):  # a reconnect loop: all routine
            clock.log(logging.ERROR, fmt, "FAIL", "rdkafka#producer-1", "Connection refused")
        clock.log(logging.WARNING, fmt, "PARTCNT", "rdkafka#consumer-2", "topic gone")
        clock.log(logging.WARNING, fmt, "PARTCNT", "rdkafka#consumer-2", "topic gone again")
        clock.log(logging.INFO, fmt, "BGQUEUE", "rdkafka#producer-1", "Purging 1 events")
        clock.log(logging.CRITICAL, fmt, "FATAL", "rdkafka#producer-1", "fenced")
    levels = [(r.getMessage().split()[0], r.levelno) for r in caplog.records]
    assert levels.count(("FAIL", logging.DEBUG)) == 100
    assert [lv for fac, lv in levels if fac == "PARTCNT"] == [logging.WARNING, logging.DEBUG]
    assert ("BGQUEUE", logging.DEBUG) in levels and ("FATAL", logging.ERROR) in levels
