"""Replay a request log (jsonl, csv, parquet; columns as RequestLogged) into inference.requests.

Each row is validated by the same decoder the workers use (schemas.codec.decode_event), so a
row the replay accepts is one the traffic worker counts, and a bad row is reported with its
line number and decode_event's reason instead of reaching the dead-letter topic. A column that
RequestLogged does not know (the sample log's `intent` label, a gateway's own extras) is left
out of the events and named once in the summary: it must not cost the row.
A file that cannot be read at all (missing, a directory, not the format its suffix says,
truncated) is an UnreadableLog: the CLI says so in one line and exits 2.
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
from schemas.errors import BrokerUnavailable, EventDecodeError, StokerError, UsageError
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


# The fields a row may carry; anything else is ignored (and named once).
FIELDS: frozenset[str] = frozenset(RequestLogged.model_fields)


class UnreadableLog(UsageError):
    """The log cannot be read at all: missing, a directory, or not the format it claims."""


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
    ignored_columns: set[str] = field(default_factory=set)  # not RequestLogged fields

    @property
    def valid(self) -> int:
        """Rows that were valid events (sent, or outside --from/--to)."""
        return self.sent + self.skipped


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    fmt = {"jsonl": "jsonl", "ndjson": "jsonl", "json": "jsonl", "csv": "csv"}.get(suffix)
    if fmt is None and suffix in ("parquet", "pq"):
        fmt = "parquet"
    if fmt is None:
        raise UnreadableLog(f"cannot tell the format of {path.name}: use .jsonl, .csv or .parquet")
    return fmt


def count_rows(path: Path, fmt: str) -> int:
    """Rows of the log (-1 for csv: unknown until read); UnreadableLog if it cannot be read."""
    _check_file(path)
    try:
        if fmt == "jsonl":
            with path.open("rb") as f:
                return sum(1 for line in f if line.strip())
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows)
    except Exception as exc:  # pyarrow and the OS each raise their own kinds
        raise UnreadableLog(f"cannot read {path.name} as {fmt}: {_why(exc)}") from exc
    return -1  # csv: unknown until read (quoted fields may span lines)


def read_rows(path: Path, fmt: str) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    """(line number, row) pairs; line numbers are 1-based file lines (csv: header = line 1).
    UnreadableLog when the file cannot be read as `fmt` at all."""
    _check_file(path)
    if fmt == "jsonl":
        yield from _jsonl_rows(path)
        return
    import pandas as pd

    try:
        if fmt == "csv":
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
            first = 2
        else:
            frame = pd.read_parquet(path)
            first = 1
    except Exception as exc:  # pandas, pyarrow and the codecs each raise their own kinds
        raise UnreadableLog(f"cannot read {path.name} as {fmt}: {_why(exc)}") from exc
    for i, row in enumerate(frame.to_dict("records")):
        yield first + i, {str(k): v for k, v in row.items()}


def _check_file(path: Path) -> None:
    if not path.exists():
        raise UnreadableLog(f"{path}: no such file")
    if not path.is_file():
        raise UnreadableLog(f"{path}: not a file")


def _why(exc: Exception) -> str:
    """The first line of a reader's error, with its type: what a person can act on."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    try:
        f = path.open("rb")
    except OSError as exc:
        raise UnreadableLog(f"cannot read {path.name}: {_why(exc)}") from exc
    with f:
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


def to_event(line: int, row: dict[str, Any], ignored: set[str] | None = None) -> RequestLogged:
    """Clean a flat row (empty cells, NaN, JSON-text columns, numpy scalars, columns that are
    no field: added to `ignored`) and decode it."""
    clean: dict[str, Any] = {}
    for k, v in row.items():
        if k not in FIELDS:
            if ignored is not None:
                ignored.add(k)
            continue
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
            return to_event(line, row, self.summary.ignored_columns)
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
