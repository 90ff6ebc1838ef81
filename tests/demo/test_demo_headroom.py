"""The demo's headroom forecast: last week's requests through a TTL cache, cold at the regime's
first hour and at the announced deploy; and the caps the scheduler and the lead share."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from demo.headroom import HourCaps, forecast_live_gpu
from demo.scenario import Scenario, Traffic
from demo.seeds import over_seeds, run_seeds, spread
from warmers.headroom import Headroom

START2 = datetime(2026, 11, 9, tzinfo=UTC)  # week 2's first instant
SC = replace(Scenario(), ttl_h=2, first_h=0, week2_hours=6, deploy_at_h=4)


def _row(hour: float, prompt: str, gpu_ms: float, params: str = "{}") -> dict[str, Any]:
    """A week-1 request `hour` hours into its week (the same hour of week 2's)."""
    ts = START2 - timedelta(days=7) + timedelta(hours=hour)
    return {"ts": ts, "tenant": "acme", "template_version": "t1", "params": params,
            "context_docs": "[]", "prompt": prompt, "gpu_ms": gpu_ms}  # fmt: skip


def test_forecast__a_request_misses_once_per_ttl_and_again_after_the_deploy() -> None:
    rows = [
        _row(0.1, "q", 1000), _row(0.5, "q", 1000),  # a miss, then a hit
        _row(1.5, "q", 1000),  # still cached (2 h TTL)
        _row(2.2, "q", 1000),  # expired at 2.1: a miss
        _row(3.5, "q", 1000),  # cached since 2.2
        _row(4.1, "q", 1000),  # the deploy at hour 4 emptied the cache: a miss
        _row(5.9, "other", 500),
    ]  # fmt: skip
    tr = Traffic(week1=rows, week2=[], start2=START2)
    assert forecast_live_gpu(tr, SC) == pytest.approx([1.0, 0.0, 1.0, 0.0, 1.0, 0.5])
    # without the deploy in the served hours, hour 4 still hits
    no_deploy = replace(SC, deploy_at_h=99)
    assert forecast_live_gpu(tr, no_deploy) == pytest.approx([1.0, 0.0, 1.0, 0.0, 0.0, 0.5])


def test_forecast__uncacheable_requests_miss_every_time_and_hours_outside_are_left_out() -> None:
    sampled = '{"temperature": 0.7}'
    rows = [_row(1.1, "q", 1000, sampled), _row(1.2, "q", 1000, sampled), _row(7.5, "q", 9000)]
    tr = Traffic(week1=rows, week2=[], start2=START2)
    assert forecast_live_gpu(tr, SC) == pytest.approx([0.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    # a regime serving hours 1-5 starts cold at its first hour: index 0 is hour 1
    assert forecast_live_gpu(tr, replace(SC, first_h=1)) == pytest.approx([2.0, 0, 0, 0, 0])


def test_hour_caps__the_scheduler_and_the_lead_share_an_hours_room() -> None:
    caps = HourCaps(Headroom.under_peak([10.0, 4.0, 8.0]))
    assert caps.left(1) == 6.0
    caps.spend(1, 4.5)  # the lead took most of it
    assert caps.left(1) == pytest.approx(1.5)
    caps.spend(1, 3.0)  # sends that went over (priced at the profile's cost) leave none
    assert caps.left(1) == 0.0 and caps.left(2) == 2.0


def test_hour_caps__an_hours_forecast_is_read_against_the_hours_served_before_it() -> None:
    caps = HourCaps(Headroom.under_peak([10.0, 4.0, 8.0, 6.0, 6.0, 9.0], first_hour=40))
    assert caps.left(44) == 4.0  # nothing served yet: the forecast as it is
    caps.observe(40, 5.0)
    caps.observe(41, 2.0)
    caps.observe(42, 4.0)  # hours 40-42 carried 11 of the 22 forecast
    assert caps.ratio(43) == pytest.approx(0.5) and caps.left(43) == pytest.approx(7.0)
    caps.observe(43, 6.0)  # 40 falls out of the 3 hours read: 12 of 18
    assert caps.left(44) == pytest.approx(10.0 - 6.0 * 12 / 18)
    assert caps.ratio(41) == pytest.approx(0.5)  # only hours before it are read
    caps.observe(44, 60.0)  # a far busier hour: bounded, and no room at all
    assert caps.ratio(45) == 2.0 and caps.left(45) == 0.0


def test_headroom_warming__the_deploys_pre_warm_plans_the_entries_ttl() -> None:
    from types import SimpleNamespace

    from demo.headroom import HeadroomWarming

    start2 = datetime(2026, 3, 9, tzinfo=UTC)
    day, short = Scenario(first_h=48, week2_hours=96).regimes()

    def hours(sc: Scenario) -> float:
        w = HeadroomWarming.deploy_window(SimpleNamespace(sc=sc), start2)  # type: ignore[arg-type]
        assert w.start == start2 + timedelta(hours=sc.deploy_at_h)  # from the cutover
        return (w.end - w.start).total_seconds() / 3600

    # a day's TTL: the day the warmed entries live, not the scheduler's 6-hour horizon
    assert (day.ttl_h, day.warm_horizon_h, hours(day)) == (24, 6, 24)
    assert (short.ttl_h, hours(short)) == (3, 3)
    assert hours(replace(day, ttl_h=48)) == 24  # no longer than the pre-warm plans at most
    assert hours(replace(short, ttl_h=1)) == 3  # nor shorter than the horizon


def test_over_seeds__mean_and_spread_per_regime_skipping_undefined_figures() -> None:
    def report(ratio: float, capture: float | None) -> dict[str, Any]:
        return {"regimes": {"ttl_1d": {"peak_gpu_ratio": ratio, "peak_capture": capture}}}

    got = over_seeds([report(0.9, 0.5), report(1.1, None), report(1.0, 0.1)])["ttl_1d"]
    assert got["peak_gpu_ratio"] == {"mean": 1.0, "sd": 0.1, "min": 0.9, "max": 1.1, "runs": 3}
    assert got["peak_capture"]["mean"] == pytest.approx(0.3) and got["peak_capture"]["runs"] == 2
    assert got["total_gpu_ratio"] is None  # no run reported it
    # one run: no spread to speak of
    assert spread([0.7]) == {"mean": 0.7, "sd": 0.0, "min": 0.7, "max": 0.7, "runs": 1}


def test_run_seeds__each_run_in_its_folder_and_the_first_report_with_the_spread(
    tmp_path: Path,
) -> None:
    folders = []

    def fake_run(out: Path, sc: Scenario, mode: str, console: Console) -> dict[str, Any]:
        folders.append(out)
        ratio = 0.9 + 0.1 * len(folders)
        return {"mode": mode, "regimes": {"ttl_3h": {"peak_gpu_ratio": ratio}}}

    reports = run_seeds(tmp_path, SC, "default", Console(file=io.StringIO()), 3, fake_run)
    assert folders == [tmp_path / f"seed-{i}" for i in (1, 2, 3)] and len(reports) == 3
    written = orjson.loads((tmp_path / "report.json").read_bytes())
    assert written["seeds"] == 3 and written["regimes"] == reports[0]["regimes"]
    assert written["over_seeds"]["ttl_3h"]["peak_gpu_ratio"]["mean"] == pytest.approx(1.1)
