"""`stoker replay`: jsonl / csv / parquet into inference.requests, bad rows, windows, pacing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from schemas.codec import decode_event
from schemas.events import RequestLogged
from stoker.cli import app  # the real CLI, every verb registered
from streams.replay import Pacer, Replayer, read_rows, to_event
from streams.topics import producer_config
from tests.streams.conftest import read_topic, request

runner = CliRunner()


def _rows(n: int) -> list[dict[str, Any]]:
    start = datetime(2025, 3, 3, 10, 0, tzinfo=UTC)
    return [
        request(i, ts=(start + timedelta(minutes=i)).isoformat().replace("+00:00", "Z"))
        for i in range(n)
    ]


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"\n".join(r if isinstance(r, bytes) else orjson.dumps(r) for r in rows))
    return path


def _flat(rows: list[dict[str, Any]]) -> pd.DataFrame:
    # Nested columns travel as JSON text in csv and parquet logs.
    return pd.DataFrame(
        [
            {
                **r,
                "params": orjson.dumps(r["params"]).decode(),
                "context_docs": orjson.dumps(r["context_docs"]).decode(),
            }
            for r in rows
        ]
    )


def _replay(args: list[str], bootstrap: str, prefix: str) -> Any:
    env = {"STOKER_TOPIC_PREFIX": prefix, "STOKER_KAFKA_BROKER": "tansu"}
    return runner.invoke(app, ["replay", *args, "--bootstrap", bootstrap], env=env)


def test_replay__jsonl_sends_valid_rows_and_reports_bad_lines(
    tmp_path: Path, kafka_bootstrap: str, unique: str
) -> None:
    rows: list[Any] = _rows(5)
    rows.insert(2, b"{broken")
    rows.insert(4, {**request(99), "tenant": ""})
    log = _write_jsonl(tmp_path / "log.jsonl", rows)
    result = _replay([str(log)], kafka_bootstrap, f"r{unique}.")
    assert result.exit_code == 0, result.output
    got = read_topic(kafka_bootstrap, f"r{unique}.inference.requests", 5)
    events = [decode_event(m.value() or b"") for m in got]
    assert sorted(e.request_id for e in events if isinstance(e, RequestLogged)) == [
        f"r{i}" for i in range(5)
    ]
    assert "bad_json" in result.output and "invalid_fields" in result.output
    # The same log through the Replayer: lines 3 and 5 of the file are the bad ones.
    producer = Producer(producer_config(kafka_bootstrap, embedded=True))
    summary = Replayer(producer, f"r{unique}.again").run(log, "jsonl")
    assert [(b.line, b.reason) for b in summary.bad_rows] == [
        (3, "bad_json"),
        (5, "invalid_fields"),
    ]
    assert (summary.rows, summary.sent, summary.bad, summary.failed) == (7, 5, 2, 0)


def test_replay__strict_fails_on_first_bad_row(
    tmp_path: Path, kafka_bootstrap: str, unique: str
) -> None:
    rows: list[Any] = [*_rows(2), b"{broken", *_rows(2)]
    log = _write_jsonl(tmp_path / "log.jsonl", rows)
    result = _replay([str(log), "--strict"], kafka_bootstrap, f"r{unique}.")
    assert result.exit_code == 1
    assert "line 3: bad_json" in str(result.exception)  # stoker.cli.main prints it


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_replay__csv_and_parquet_with_time_window(
    suffix: str, tmp_path: Path, kafka_bootstrap: str, unique: str
) -> None:
    frame = _flat(_rows(10))
    log = tmp_path / f"log.{suffix}"
    if suffix == "csv":
        frame.to_csv(log, index=False)
    else:
        frame.to_parquet(log)
    args = [str(log), "--from", "2025-03-03T10:02:00Z", "--to", "2025-03-03T10:07:00+00:00"]
    result = _replay(args, kafka_bootstrap, f"r{unique}.")
    assert result.exit_code == 0, result.output
    got = read_topic(kafka_bootstrap, f"r{unique}.inference.requests", 5)
    ids = sorted(int(orjson.loads(m.value() or b"{}")["request_id"][1:]) for m in got)
    assert ids == [2, 3, 4, 5, 6]


def test_replay__csv_bad_row_line_number(tmp_path: Path) -> None:
    frame = _flat(_rows(3))
    frame.loc[1, "gpu_ms"] = -5.0
    log = tmp_path / "log.csv"
    frame.to_csv(log, index=False)
    results = []
    for line, row in read_rows(log, "csv"):
        assert isinstance(row, dict)
        try:
            results.append(to_event(line, row).request_id)
        except Exception as exc:  # BadRow
            results.append(str(exc))
    assert results[0] == "r0" and results[2] == "r2"
    assert results[1].startswith("line 3: invalid_fields: gpu_ms")


@pytest.mark.parametrize(
    "args",
    [["--speed", "0"], ["--speed", "fast"], ["--from", "yesterday"], ["--format", "xml"]],
)
def test_replay__bad_arguments_exit_2(args: list[str], tmp_path: Path) -> None:
    log = _write_jsonl(tmp_path / "log.jsonl", _rows(1))
    result = runner.invoke(app, ["replay", str(log), "--bootstrap", "127.0.0.1:1", *args])
    assert result.exit_code == 2, result.output


def test_replay__no_broker_is_usage_error(tmp_path: Path) -> None:
    log = _write_jsonl(tmp_path / "log.jsonl", _rows(1))
    result = runner.invoke(app, ["replay", str(log)], env={"STOKER_KAFKA_BOOTSTRAP": ""})
    assert result.exit_code == 2


def test_pacer__keeps_gaps_divided_by_speed() -> None:
    slept: list[float] = []
    pacer = Pacer(60.0, sleep=slept.append)
    t0 = datetime(2025, 3, 3, tzinfo=UTC)
    for minutes in (0, 1, 2):
        pacer.wait(t0 + timedelta(minutes=minutes))
    # 1 minute of log = 1 s at 60x; minus the microseconds the loop itself took.
    assert len(slept) == 2
    assert 0.9 < slept[0] <= 1.0 and 1.9 < slept[1] <= 2.0
    unpaced: list[float] = []
    Pacer(None, sleep=unpaced.append).wait(t0)
    assert unpaced == []


SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "requests-2w.parquet"


@pytest.mark.skipif(not SAMPLE.exists(), reason="the shipped sample log is not in this checkout")
def test_replay_cli__the_shipped_sample_log_sends_every_row(
    kafka_bootstrap: str, unique: str
) -> None:
    """Its `intent` column (a label for scoring) once made every one of its 72,767 rows bad,
    and the replay still exited 0: an unknown column is left out and named once."""
    from tests.cli import run_stoker

    prefix = f"s{unique}."
    env = {"STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap, "STOKER_KAFKA_BROKER": "tansu",
           "STOKER_TOPIC_PREFIX": prefix, "COLUMNS": "200"}  # fmt: skip
    res = run_stoker("replay", str(SAMPLE), env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = len(pd.read_parquet(SAMPLE, columns=["ts"]))
    assert res.stderr.count("ignored column(s) that RequestLogged does not have: intent") == 1
    sent = read_topic(kafka_bootstrap, f"{prefix}inference.requests", rows, timeout_s=120)
    assert len(sent) == rows
    assert "intent" not in orjson.loads(sent[0].value() or b"{}")


def test_to_event__unknown_columns_are_left_out_and_named() -> None:
    ignored: set[str] = set()
    ev = to_event(2, request(1) | {"intent": "balance", "shard": 3}, ignored)
    assert ev.request_id == "r1" and ignored == {"intent", "shard"}
