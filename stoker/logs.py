"""Process logging for stoker's long-running commands: JSON lines for shippers, or plain text.

A log call adds context with `extra=`, and the JSON formatter lifts it to top-level fields:

    log.info("purged %d keys", n, extra={"tenant": t, "model_version": v, "job_id": job})
    -> {"ts": "2026-01-05T10:00:00.123+00:00", "level": "info", "logger": "invalidators.purge",
        "thread": "worker-deploy", "msg": "purged 1000 keys", "tenant": "acme",
        "model_version": "v2", "job_id": "purge:..."}

Only what the call passes is written (tenant, model_version, job_id, deploy_id, worker, ...):
never the prompt, which may hold personal data, unless a call puts it there on purpose.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, Literal

import orjson

# Attributes every LogRecord has; anything else on a record came in through `extra=`.
_STANDARD: Final = frozenset(
    set(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)))
    | {"message", "asctime"}
)
_TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"
# Libraries whose INFO is routine: apscheduler logs every job run twice ("Running job",
# "executed successfully"), and the scheduler's leader lease runs every 10 s: 454 of the 471
# lines of a `stoker worker all` run were that. sentence_transformers logs the embedder's path
# on each load. They log at WARNING unless the level is DEBUG.
_ROUTINE_INFO: Final = ("apscheduler", "sentence_transformers")


class JsonFormatter(logging.Formatter):
    """One JSON object per record; `extra=` fields become top-level keys (never overwriting)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "thread": record.threadName,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure(
    fmt: Literal["json", "text"], level: str = "INFO", stream: Any = None
) -> logging.Handler:
    """Route the root logger to one stderr handler in `fmt`; replaces handlers set before."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    quiet = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    for name in _ROUTINE_INFO:
        logging.getLogger(name).setLevel(quiet)
    return handler
