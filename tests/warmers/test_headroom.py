"""The headroom cap: a warm spends only the room under the busiest hour, and a deploy announced
ahead spreads its pre-warm over the lead hours instead of sending it all in the last one."""

from __future__ import annotations

import pytest
import redis

from schemas.errors import ConfigError
from schemas.prewarm import PrewarmRequest
from simulation.backend.http import SimulatorThread
from tests.warmers.test_prewarm import START, bar_prewarmer
from warmers.headroom import Headroom, cap_plan, lead_prewarm
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.prewarm import HotSetPrewarmer


def test_headroom__the_room_under_the_peak_less_the_hours_own_load() -> None:
    room = Headroom.under_peak([2.0, 5.0, 10.0, 4.0], first_hour=20)
    assert [room.cap(h) for h in range(20, 24)] == [8.0, 5.0, 0.0, 6.0]
    # an hour the forecast does not cover has no load of its own: the whole ceiling
    assert room.cap(19) == room.cap(30) == 10.0
    # aimed below the peak: the busiest hours get no room at all
    low = Headroom.under_peak([2.0, 5.0, 10.0, 4.0], share=0.5)
    assert [low.cap(h) for h in range(4)] == [3.0, 0.0, 0.0, 1.0]
    assert Headroom.under_peak([]).cap(0) == 0.0


def test_headroom__bad_figures_are_refused() -> None:
    with pytest.raises(ConfigError, match="share"):
        Headroom.under_peak([1.0], share=0.0)
    with pytest.raises(ConfigError, match="share"):
        Headroom.under_peak([1.0], share=1.5)
    with pytest.raises(ConfigError, match="ceiling"):
        Headroom(-1.0, lambda h: 0.0)


def _hot_plan(redis_client: redis.Redis, url: str):  # type: ignore[no-untyped-def]
    pw = bar_prewarmer(redis_client, url, 0.8)
    win = Window(START, START.replace(hour=13))
    plan = pw.runner.plan(win, Budget(requests=5), model_id="m", model_version="v2",
                          value_model="hits")  # fmt: skip
    return pw, win, plan


def test_cap_plan__sends_no_more_than_the_cap_in_rank_order(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    _, _, plan = _hot_plan(redis_client, sim.url)
    items = list(plan.items)
    costs = [i.warm_cost_ms / 1000.0 for i in items]
    assert len(items) == 5 and min(costs) > 0
    cap = sum(costs[:2]) + 0.5 * costs[2]  # room for two and a half sends
    spent = cap_plan(plan, cap)
    assert spent <= cap and spent == pytest.approx(sum(i.warm_cost_ms for i in plan.items) / 1e3)
    # the best first: the two it keeps head the ranking (the rest are as costly or more)
    assert plan.items[:2] == items[:2]
    left = [s for s in plan.skipped if "headroom" in s.reason]
    assert len(left) == 5 - len(plan.items) > 0
    # no room: nothing is sent, everything is said to be left out
    _, _, none = _hot_plan(redis_client, sim.url)
    assert cap_plan(none, 0.0) == 0.0 and none.items == []


def test_lead_prewarm__spreads_the_sends_over_the_lead_hours_each_under_its_cap(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    pw, win, plan = _hot_plan(redis_client, sim.url)
    need = HotSetPrewarmer(pw.runner, Budget(requests=5), lambda: win, hit_bar=0.8)
    per_send = max(i.warm_cost_ms for i in plan.items) / 1000.0
    steps, sent = [], []
    for hour in range(3):  # three lead hours with room for two sends each
        s = lead_prewarm(pw.runner, Budget(requests=5), win, "m", "v2", hit_bar=0.8,
                         cap_gpu_s=2 * per_send, hour=hour)  # fmt: skip
        steps.append(s)
        sent += s.sent_keys
    assert [s.sent for s in steps][:2] == [2, 2]  # the bar needs more than one hour's room
    assert all(s.gpu_s <= s.cap_gpu_s + 1e-9 for s in steps)
    assert len(sent) == len(set(sent))  # what an earlier hour landed is not sent again
    assert steps[1].fresh == 2 and steps[-1].in_place >= 0.8 > steps[0].in_place
    # the cutover's own pre-warm, at the same bar, finds it all in place: nothing to send
    final = need.prewarm(PrewarmRequest("m", "v2", "v1", ("acme",)))
    assert final.sent == 0 and final.ok and final.reached >= 0.8
