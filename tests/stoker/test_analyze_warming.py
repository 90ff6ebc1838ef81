"""`stoker analyze LOG --warming`: a log replayed through the shipped warming, in virtual time,
against a private redis-server; what a user runs on their own log."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pandas as pd
import pytest

from simulation.logs.sample import SampleSpec, generate
from stoker.settings import StokerSettings
from stoker.warming_replay import analyze_warming, load_log, split_at
from tests.cli import run_stoker

# Nine days of two tenants (a week of history, two days replayed): small enough for a test,
# with the sample log's shape (a night trough, a morning ramp, a daytime plateau).
SPEC = SampleSpec(days=9, requests_per_day=1_500, tenants=("acme", "globex"), seed=11)


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("warming") / "log.parquet"
    generate(SPEC).drop(columns=["intent"]).to_parquet(path)
    return path


@pytest.mark.timeout(600)
def test_analyze_warming__warms_in_the_trough_and_the_warmed_entries_are_asked(
    log_path: Path,
) -> None:
    log = load_log(log_path)
    assert split_at(log, None) == datetime(2026, 11, 4, tzinfo=UTC)  # all but the last 7 days
    start = split_at(log, datetime(2026, 11, 9, tzinfo=UTC))  # a week learned, 2 days replayed
    s = StokerSettings(warm_qps=7.0)
    report = analyze_warming(s, log, start, [86_400])
    f = report["regimes"]["ttl_1d"]
    assert report["settings_not_default"] == {"warm_qps": 7.0}
    assert report["history"]["requests"] + report["replayed"]["requests"] == len(log.events)
    rows = f["per_hour"]
    assert len(rows) == 48 and sum(r["requests"] for r in rows) == report["replayed"]["requests"]
    # the sends go out in the quiet hours before the ramp, not in the busy ones
    loads = {r["hour"]: r["requests"] for r in rows}
    busiest = max(loads.values())
    sent = [r for r in rows if r["sends"]]
    assert f["warm_sends"] > 0 and sent
    # (a query that surges in the ramp may be warmed the moment it is seen: a few, never at peak)
    trough = sum(r["sends"] for r in sent if loads[r["hour"]] < 0.3 * busiest)
    assert trough >= 0.9 * f["warm_sends"]
    assert all(loads[r["hour"]] < 0.8 * busiest for r in sent)
    # ... and pay: the warmed entries are asked, warming adds hits and takes no peak up
    assert f["warm_first_hits"] > 0.7 * f["warm_sends"]
    assert f["hit_rate"] > f["hit_rate_baseline"]
    assert f["peak_gpu_ratio"] <= 1.0 and f["total_gpu_ratio"] < 1.1
    assert f["scheduler_runs"] == 2 * 24 * 4  # every 15 minutes of virtual time


@pytest.mark.timeout(600)
def test_analyze_warming_cli__json_and_plots_and_a_deploy(log_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_stoker(
        "analyze", str(log_path), "--warming", "--ttls", "3h", "--from", "2026-11-10T00:00",
        "--deploy-at", "2026-11-10T12:00", "--out", str(out), "--json", timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    report = orjson.loads(res.stdout)
    f = report["regimes"]["ttl_3h"]
    assert report["deploy_at"] == "2026-11-10T12:00:00+00:00"
    assert "pre-warmed replay-deployed" in f["deploy_prewarm"]
    assert (out / "warming.json").is_file() and (out / "warming_ttl_3h.png").stat().st_size > 0
    assert report["plots"] == [str(out / "warming_ttl_3h.png")]


def test_analyze_warming_cli__bad_input_is_one_line_and_exit_2(
    log_path: Path, tmp_path: Path
) -> None:
    before = run_stoker("analyze", str(log_path), "--warming", "--from", "2020-01-01T00:00")
    assert (
        before.returncode == 2 and "--from 2020-01-01 00:00 UTC must fall inside" in before.stderr
    )
    alone = run_stoker("analyze", str(log_path), "--deploy-at", "2026-11-10T12:00")
    assert alone.returncode == 2 and "goes with --warming" in alone.stderr
    when = run_stoker("analyze", str(log_path), "--warming", "--from", "tuesday")
    assert when.returncode == 2 and "ISO 8601" in when.stderr
    labels = run_stoker("analyze", str(log_path), "--warming", "--labels", "intent")
    assert labels.returncode == 2 and "--labels" in labels.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"not": "a request"}\n')
    bad = run_stoker("analyze", str(empty), "--warming")
    assert bad.returncode == 2 and "no valid request_logged row" in bad.stderr
    # every row outside the replay: nothing to replay is said, not a crash
    frame = pd.read_parquet(log_path)
    one_day = tmp_path / "one-day.parquet"
    frame[frame.ts < frame.ts.min() + pd.Timedelta(hours=20)].to_parquet(one_day)
    short = run_stoker("analyze", str(one_day), "--warming")
    assert short.returncode == 2 and "must fall inside the log" in short.stderr
