"""The foresight bound: the lowest peak any warming could reach, checked against hand cases and
against a linear program that solves the same schedule independently."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from demo.client import FREQUENT, HourStats, Scorer, ServeStats, Truth, replay_identity
from demo.foresight import fits, min_peak
from demo.report import foresight_bound, peak_capture
from demo.scenario import Scenario


def test_foresight__a_spike_spreads_over_the_idle_hours_it_may_move_into() -> None:
    assert min_peak([0, 0, 0, 0], [0, 0, 0, 12], lead_h=3) == pytest.approx(3.0)
    assert min_peak([0, 0, 0, 0], [0, 0, 0, 12], lead_h=1) == pytest.approx(6.0)


def test_foresight__no_lead_moves_nothing_and_fixed_work_stays_put() -> None:
    assert min_peak([1, 2, 3], [4, 0, 1], lead_h=0) == pytest.approx(5.0)
    # a plateau as long as the lead: its work has nowhere lower to go
    assert min_peak([5, 5, 5], [2, 2, 2], lead_h=2) == pytest.approx(7.0)
    assert min_peak([9, 1, 1], [0, 0, 3], lead_h=2) == pytest.approx(9.0)


def test_foresight__bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="same hours"):
        fits([1, 2], [1], 3.0, 1)
    with pytest.raises(ValueError, match="lead_h"):
        fits([1], [1], 3.0, -1)
    assert min_peak([], [], 3) == 0.0


def _lp_peak(fixed: list[float], movable: list[float], lead: int) -> float:
    """The same schedule as a linear program: x[h, t] of hour h's movable work runs in hour t."""
    n = len(fixed)
    pairs = [(h, t) for h in range(n) for t in range(max(0, h - lead), h + 1)]
    nv = len(pairs) + 1  # the last variable is the peak
    c = np.zeros(nv)
    c[-1] = 1.0
    a_eq = np.zeros((n, nv))
    for i, (h, _) in enumerate(pairs):
        a_eq[h, i] = 1.0
    a_ub = np.zeros((n, nv))
    for i, (_, t) in enumerate(pairs):
        a_ub[t, i] = 1.0
    a_ub[:, -1] = -1.0
    res = linprog(c, A_ub=a_ub, b_ub=-np.asarray(fixed, dtype=float), A_eq=a_eq,
                  b_eq=np.asarray(movable, dtype=float), bounds=(0, None), method="highs")  # fmt: skip
    assert res.success
    return float(res.x[-1])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 100, allow_nan=False)),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 4),
)
def test_foresight__equals_the_linear_programs_optimum(
    hours: list[tuple[float, float]], lead: int
) -> None:
    fixed, movable = [f for f, _ in hours], [m for _, m in hours]
    got = min_peak(fixed, movable, lead)
    assert got == pytest.approx(_lp_peak(fixed, movable, lead), rel=1e-6, abs=1e-6)


def _row(prompt: str, gpu_ms: float) -> dict[str, Any]:
    return {"tenant": "acme", "template_version": "t1", "params": "{}", "context_docs": "[]",
            "prompt": prompt, "gpu_ms": gpu_ms, "latency_ms": 1.0, "intent": "x"}  # fmt: skip


def test_foresight__the_scorer_splits_misses_by_how_often_their_request_was_logged() -> None:
    old = replay_identity(_row("How do I  reset my password?", 0))
    scorer = Scorer(Truth(), {}, Counter({old: FREQUENT}))
    miss = httpx.Response(200, headers={"x-stoker-cache": "miss"})
    scorer.score(_row("how do i reset my password?", 100), miss, 1.0, 0)  # logged 7 times
    scorer.score(_row("a new question", 10), miss, 1.0, 0)  # never logged
    scorer.score(_row("a new question", 1), miss, 1.0, 0)  # logged once, just now
    h = scorer.stats.hourly[0]
    assert (h.gpu_ms_live, h.gpu_ms_live_replayable, h.gpu_ms_live_frequent) == (111, 101, 100)


def test_foresight__the_report_moves_the_replayable_misses_within_the_lead() -> None:
    sc = replace(Scenario(), ttl_h=3, warm_horizon_h=3, first_h=0, week2_hours=4)
    stats = ServeStats()
    for hour, (live, replayable, frequent) in enumerate(
        [(0, 0, 0), (0, 0, 0), (1000, 0, 0), (9000, 6000, 3000)]
    ):
        stats.hourly[hour] = HourStats(gpu_ms_live=live, gpu_ms_live_replayable=replayable,
                                       gpu_ms_live_frequent=frequent)  # fmt: skip
    got = foresight_bound(stats, sc)
    # 6 of the last hour's 9 GPU-s may spread over hours 0-2 (1 already in hour 2): peak 3
    assert got["peak_gpu_ratio_bound"] == pytest.approx(3 / 9, abs=1e-4)
    # only 3 may move: 6 stay in the last hour
    assert got["peak_gpu_ratio_bound_frequent"] == pytest.approx(6 / 9, abs=1e-4)
    assert got["replayable_miss_share"] == pytest.approx(0.6)
    assert got["frequent_miss_share"] == pytest.approx(0.3)
    assert got["peak_bound_lead_h"] == 3


def test_peak_capture__the_share_of_the_reachable_reduction_taken() -> None:
    # the floor a forecast could reach is 0.8x: 0.9x took half of the 0.2 it could
    assert peak_capture(0.9, 0.8) == pytest.approx(0.5)
    assert peak_capture(0.8, 0.8) == pytest.approx(1.0)
    assert peak_capture(1.0, 0.8) == pytest.approx(0.0)
    # warming that raised the peak took a negative share
    assert peak_capture(1.17, 0.8) == pytest.approx(-0.85)


def test_peak_capture__undefined_without_a_peak_or_a_reachable_reduction() -> None:
    assert peak_capture(None, 0.8) is None  # no baseline GPU: no ratio
    assert peak_capture(0.9, None) is None  # no floor measured
    # the floor at the baseline's peak: nothing was reachable, so no share of it
    assert peak_capture(0.9, 1.0) is None
    assert peak_capture(1.0, 1.0) is None
