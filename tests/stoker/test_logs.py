"""Structured logs: one JSON object per line, extra= context lifted to top-level fields."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from stoker.logs import JsonFormatter, configure


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_logs__context_fields_and_exception(root_restored: None):
    out = io.StringIO()
    configure("json", "INFO", stream=out)
    log = logging.getLogger("invalidators.purge")
    log.info(
        "purged %d keys", 1000, extra={"tenant": "acme", "model_version": "v2", "job_id": "p:1"}
    )
    log.debug("not at INFO")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"deploy_id": "d-7"})
    lines = [orjson.loads(x) for x in out.getvalue().splitlines()]
    assert len(lines) == 2
    first, second = lines
    assert first["msg"] == "purged 1000 keys" and first["level"] == "info"
    assert (first["tenant"], first["model_version"], first["job_id"]) == ("acme", "v2", "p:1")
    assert first["logger"] == "invalidators.purge" and first["ts"].endswith("+00:00")
    assert "args" not in first and "prompt" not in first  # only what the call passed
    assert second["deploy_id"] == "d-7" and "ValueError: boom" in second["exc"]


def test_json_logs__extra_never_overwrites_core_fields():
    rec = logging.LogRecord("x", logging.WARNING, "f.py", 1, "real %s", ("msg",), None)
    rec.level = "spoofed"  # as extra={"level": ...} would set it
    assert orjson.loads(JsonFormatter().format(rec))["level"] == "warning"


def test_text_logs__plain_lines(root_restored: None):
    out = io.StringIO()
    configure("text", "WARNING", stream=out)
    logging.getLogger("streams.worker").warning("retrying", extra={"tenant": "acme"})
    assert "WARNING" in out.getvalue() and "retrying" in out.getvalue()
    assert not out.getvalue().startswith("{")
