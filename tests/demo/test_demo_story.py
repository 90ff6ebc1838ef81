"""The demo's story holds together: each regime's headline and table come from the figures its
verdict reads, so a table cannot say warming saved more while the verdict says it did not pay."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from demo.client import HourStats, ServeStats
from demo.report import build_report, regime_figures, regime_verdict, table_rows
from demo.run import PassResult
from demo.scenario import Scenario

SC = replace(Scenario(), week2_hours=4, first_h=0, ttl_h=24, deploy_at_h=3)


def _serve(live_gpu_s: list[float], saved_s: float, total_s: float, hits: int) -> ServeStats:
    """A pass's served figures: `live_gpu_s` per hour, `hits` of 100 requests per hour."""
    s = ServeStats(gpu_ms_total=total_s * 1000, gpu_ms_saved=saved_s * 1000)
    n = len(live_gpu_s)
    s.outcomes = Counter(exact=hits * n, miss=(100 - hits) * n)
    for h, g in enumerate(live_gpu_s):
        s.hourly[h] = HourStats(requests=100, exact=hits, gpu_ms_live=g * 1000,
                                latency_ms=[1.0] * 100)  # fmt: skip
    return s


def _regime(scheduled_gpu_s: float, prewarm_gpu_s: float, warm_live: list[float]) -> dict[str, Any]:
    """Without warming: 1,000 GPU-s of traffic, 228 saved by the cache (22.8%), 190 a live hour.
    With warming: 240 saved by hits, minus what its sends cost (the scheduler's window at hour
    2, the deploy's pre-warm at hour 3: both go out in the hour before their window)."""
    base = PassResult(warm=False, serve=_serve([190.0] * 4, 228.0, 1000.0, 22))
    warm = PassResult(
        warm=True,
        serve=_serve(warm_live, 240.0, 1000.0, 24),
        warm_windows=[{"hour": 2, "sent": 10, "gpu_seconds": scheduled_gpu_s}],
        deploy={"hour": 3},
        prewarms=[SimpleNamespace(sent=20, sent_miss_gpu_s=prewarm_gpu_s)],
    )
    return regime_figures(warm, base, SC)


def test_story__a_pre_warm_costing_more_than_its_hits_bought_did_not_pay() -> None:
    """The user's run: the table said 24.0% saved with warming against 22.8% without, the verdict
    -0.7 points: the table had left out the deploy's pre-warm. Every cell now pays all sends."""
    f = _regime(scheduled_gpu_s=0.0, prewarm_gpu_s=19.0, warm_live=[190.0, 190.0, 180.0, 175.0])
    assert f["net_saved_delta_points"] == pytest.approx(-0.7)
    assert not f["paid"]
    assert "warming did not pay" in f["headline"] and "warming did not pay" in f["verdict"]
    rows = {label: (w, b) for label, w, b in table_rows(f)}
    assert rows["net GPU saved (warm sends paid)"] == ("22.1%", "22.8%")
    assert rows["  of it warm sends (pre-warm too)"][0] == "19.0"
    assert "22.1% with warming against 22.8% without" in f["headline"]
    report = build_report({"ttl_1d": f}, "ttl_1d", "fast")
    assert report["gpu_seconds_saved_pct"] == 22.1 and report["regime"] == "ttl_1d"
    assert report["headlines"]["ttl_1d"] == f["headline"]


@pytest.mark.parametrize(
    ("scheduled", "prewarm", "warm_live", "verb"),
    [
        (5.0, 5.0, [190.0] * 4, "paid"),  # hits bought more than the sends cost: a net saving
        (10.0, 10.0, [150.0, 150.0, 150.0, 160.0], "paid"),  # a loss, yet the peak 0.89x
        (10.0, 60.0, [150.0, 150.0, 150.0, 160.0], "did not pay"),  # the pre-warm makes a peak
    ],
)
def test_story__the_headline_says_what_the_verdict_says(
    scheduled: float, prewarm: float, warm_live: list[float], verb: str
) -> None:
    f = _regime(scheduled, prewarm, warm_live)
    assert f["headline"].startswith(f"ttl_1d (TTL 1 day, week-2 hours 0-3): warming {verb}: ")
    assert f["verdict"].startswith(f"ttl_1d: warming {verb}: ")
    assert f["verdict"] == regime_verdict("ttl_1d", f)
    # no miss of this traffic was on a request logged before: no floor below the peak, so no
    # share of a reachable reduction to report
    assert f["peak_gpu_ratio_bound_frequent"] == 1.0 and f["peak_capture"] is None
    # the table's net-saved cells differ by the verdict's points
    (w, b) = next((w, b) for label, w, b in table_rows(f) if label.startswith("net GPU saved"))
    delta = float(w.rstrip("%")) - float(b.rstrip("%"))
    assert delta == pytest.approx(f["net_saved_delta_points"], abs=0.11)
