"""Replay a request log (jsonl, csv, parquet; columns as RequestLogged) into inference.requests.

Each row is validated by the same decoder the workers use (schemas.codec.decode_event), so a
row the replay accepts is one the traffic worker counts, and a bad row is reported with its
line number and decode_event's reason instead of reaching the dead-letter topic.
Pacing keeps the log's own gaps between events, divided by `speed` (None: as fast as possible);
events keep their original timestamps, so the profile learns the log's hours of the week.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import KafkaError, Message, Producer

from schemas.codec import decode_event, encode_event
from schemas.errors import BrokerUnavailable, ConfigError, EventDecodeError, StokerError
from schemas.events import RequestLogged

FORMATS = ("jsonl", "csv", "parquet")
# Columns a flat file carries as JSON text.
_JSON_COLUMNS = ("params", "context_docs")
# librdkafka's local queue holds 100k messages by default; when full, serve delivery reports
# for 50 ms and try again rather than fail the replay.
_QUEUE_FULL_WAIT_S = 0.05
_FLUSH_S = 30.0
# At most this many bad rows are kept for the summary; the count is always exact.
_KEEP_BAD = 1_000


class BadRow(StokerError):
    """A log row that is not a valid RequestLogged (raised by --strict)."""

    def __init__(self, line: int, reason: str, detail: str) -> None:
        super().__init__(f"line {line}: {reason}: {detail}")
        self.line, self.reason, self.detail = line, reason, detail


@dataclass
class ReplaySummary:
    rows: int = 0
    sent: int = 0
    skipped: int = 0  # outside --from/--to
    bad: int = 0
    failed: int = 0  # the broker refused or did not confirm
    bad_rows: list[BadRow] = field(default_factory=list)


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    fmt = {"jsonl": "jsonl", "ndjson": "jsonl", "json": "jsonl", "csv": "csv"}.get(suffix)
    if fmt is None and suffix in ("parquet", "pq"):
        fmt = "parquet"
    if fmt is None:
        raise ConfigError(f"cannot tell the format of {path.name}: use .jsonl, .csv or .parquet")
    return fmt


def count_rows(path: Path, fmt: str) -> int:
    if fmt == "jsonl":
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    return -1  # csv: unknown until read (quoted fields may span lines)


def read_rows(path: Path, fmt: str) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    """(line number, row) pairs; line numbers are 1-based file lines (csv: header = line 1)."""
    if fmt == "jsonl":
        yield from _jsonl_rows(path)
        return
    import pandas as pd

    if fmt == "csv":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        first = 2
    else:
        frame = pd.read_parquet(path)
        first = 1
    for i, row in enumerate(frame.to_dict("records")):
        yield first + i, {str(k): v for k, v in row.items()}


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    with path.open("rb") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield n, BadRow(n, "bad_json", str(exc))
                continue
            yield (
                n,
                obj if isinstance(obj, dict) else BadRow(n, "not_an_object", "not a JSON object"),
            )


def to_event(line: int, row: dict[str, Any]) -> RequestLogged:
    """Clean a flat row (empty cells, NaN, JSON-text columns, numpy scalars) and decode it."""
    clean: dict[str, Any] = {}
    for k, v in row.items():
        v = _plain(v)
        if v is None or v == "":
            continue
        if k in _JSON_COLUMNS and isinstance(v, str):
            try:
                v = orjson.loads(v)
            except orjson.JSONDecodeError as exc:
                raise BadRow(line, "bad_json", f"column {k}: {exc}") from None
        clean[k] = v
    clean.setdefault("type", "request_logged")
    version = clean.get("schema_version", 1)
    if isinstance(version, str) and version.isdigit():  # csv cells are text
        version = int(version)
    clean["schema_version"] = version
    try:
        ev = decode_event(orjson.dumps(clean, option=orjson.OPT_SERIALIZE_NUMPY))
    except EventDecodeError as exc:
        raise BadRow(line, exc.reason, exc.detail) from None
    except TypeError as exc:  # a cell orjson cannot write (a parquet struct of odd types)
        raise BadRow(line, "unsupported_value", str(exc)) from None
    if not isinstance(ev, RequestLogged):
        raise BadRow(line, "unexpected_type", f"{ev.type} is not a request_logged row")
    return ev


def _plain(v: Any) -> Any:
    """numpy / pandas cells as plain Python values; NaN and NaT as None."""
    if hasattr(v, "tolist") and not isinstance(v, str):  # numpy scalars and arrays
        v = v.tolist()
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, datetime):
        return None if v != v else v.isoformat()  # NaT != NaT
    return v


class Pacer:
    """Sleeps so that events go out `speed` times faster than their timestamps say."""

    def __init__(self, speed: float | None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.speed = speed
        self._sleep = sleep
        self._origin: tuple[float, float] | None = None  # (event ts, wall clock) of the first

    def wait(self, ts: datetime) -> None:
        if self.speed is None:
            return
        t = ts.timestamp()
        if self._origin is None:
            self._origin = (t, time.monotonic())
            return
        due = self._origin[1] + (t - self._origin[0]) / self.speed
        delay = due - time.monotonic()
        if delay > 0:  # an event out of order (or late) goes at once
            self._sleep(delay)


@dataclass
class Replayer:
    """Reads, validates, paces and produces; `on_row` is called once per row read (progress)."""

    producer: Producer
    topic: str
    speed: float | None = None
    since: datetime | None = None
    until: datetime | None = None
    strict: bool = False
    on_row: Callable[[ReplaySummary], None] = lambda _s: None
    summary: ReplaySummary = field(default_factory=ReplaySummary)

    def run(self, path: Path, fmt: str) -> ReplaySummary:
        pacer = Pacer(self.speed)
        try:
            for line, row in read_rows(path, fmt):
                self.summary.rows += 1
                ev = self._event(line, row)
                if ev is not None and self._in_window(ev):
                    pacer.wait(ev.ts)
                    self._produce(ev)
                self.on_row(self.summary)
        finally:  # --strict stops at a bad row: what was sent before it still gets delivered
            self.summary.failed += self.producer.flush(_FLUSH_S)
        return self.summary

    def _event(self, line: int, row: dict[str, Any] | BadRow) -> RequestLogged | None:
        try:
            if isinstance(row, BadRow):
                raise row
            return to_event(line, row)
        except BadRow as bad:
            if self.strict:
                raise
            self.summary.bad += 1
            if len(self.summary.bad_rows) < _KEEP_BAD:
                self.summary.bad_rows.append(bad)
            return None

    def _in_window(self, ev: RequestLogged) -> bool:
        if (self.since and ev.ts < self.since) or (self.until and ev.ts >= self.until):
            self.summary.skipped += 1
            return False
        return True

    def _produce(self, ev: RequestLogged) -> None:
        value = encode_event(ev)
        while True:
            try:
                self.producer.produce(
                    self.topic, value=value, key=ev.request_id.encode(), on_delivery=self._delivered
                )
                break
            except BufferError:
                self.producer.poll(_QUEUE_FULL_WAIT_S)
            except Exception as exc:  # KafkaException: the producer is unusable
                raise BrokerUnavailable(f"produce to {self.topic}: {exc}") from exc
        self.summary.sent += 1
        self.producer.poll(0)

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.summary.failed += 1
