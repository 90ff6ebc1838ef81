"""The headroom cap: a warm spends only the room under the busiest hour, and a deploy announced
ahead spreads its pre-warm over the lead hours instead of sending it all in the last one."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
import redis

from caches.keys import LOAD_RATIO_KEY
from schemas.errors import ConfigError
from schemas.prewarm import PrewarmRequest
from simulation.backend.http import SimulatorThread
from stoker.embedded import free_port
from tests.warmers.hotset_helpers import event, fill, hit_event
from tests.warmers.test_hotset import MONDAY
from tests.warmers.test_prewarm import START, bar_prewarmer
from warmers.headroom import (
    RATIO_BOUNDS,
    Headroom,
    ProfileHeadroom,
    ScheduledWarm,
    SharedRatio,
    forecast_between,
    load_ratio,
    profile_live_gpu,
)
from warmers.hotset.plan import cap_plan
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.prewarm import HotSetPrewarm, HotSetPrewarmer
from warmers.traffic.profile import TrafficProfile, week_and_hour
from warmers.traffic.worker import observe_event


def test_headroom__the_room_under_the_peak_less_the_hours_own_load() -> None:
    room = Headroom.under_peak([2.0, 5.0, 10.0, 4.0], first_hour=20)
    assert [room.cap(h) for h in range(20, 24)] == [8.0, 5.0, 0.0, 6.0]
    # an hour the forecast does not cover has no load of its own: the whole ceiling
    assert room.cap(19) == room.cap(30) == 10.0
    # aimed below the peak: the busiest hours get no room at all
    low = Headroom.under_peak([2.0, 5.0, 10.0, 4.0], share=0.5)
    assert [low.cap(h) for h in range(4)] == [3.0, 0.0, 0.0, 1.0]
    assert Headroom.under_peak([]).cap(0) == 0.0


def test_headroom__the_hours_forecast_read_against_the_load_served() -> None:
    room = Headroom.under_peak([2.0, 5.0, 10.0, 4.0])
    # the hours just served ran at 0.6 of their forecast: the peak's 10.0 is read as 6.0 and
    # hour 3's 4.0 as 2.4 (a forecast of misses learned before the cache was this warm)
    assert room.cap(3, load_ratio(6.0, 10.0) or 1.0) == pytest.approx(6.0 - 2.4)
    assert room.cap(3, 1.5) == pytest.approx(15.0 - 6.0)  # a heavier week: its peak as well
    lo, hi = RATIO_BOUNDS
    assert (load_ratio(0.0, 50.0), load_ratio(500.0, 50.0)) == (lo, hi)  # bounded
    # too little forecast to read against, or a served figure that cannot be: none
    assert load_ratio(3.0, 0.5) is None and load_ratio(-1.0, 50.0) is None
    # a span's forecast: each hour of week by the part of it covered (Monday 00:40-02:30)
    live = [6.0, 12.0, 2.0] + [0.0] * 165
    t0 = MONDAY + timedelta(minutes=40)
    assert forecast_between(live, t0, t0 + timedelta(minutes=110)) == pytest.approx(
        6.0 * 20 / 60 + 12.0 + 2.0 * 30 / 60
    )
    assert forecast_between(live, t0, t0) == 0.0


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


# -- the scheduler's headroom, from the traffic profile --


def _hour(
    h: int, prompt: str, n: int, *, hits: int = 0, temperature: float = 0.0, model_id: str = "m"
) -> list:
    """`n` GPU-reaching requests for `prompt` (800 ms each) and `hits` answered from the
    cache, in hour `h` of MONDAY's week."""
    ts = MONDAY + timedelta(hours=h)
    out = [event(i, "acme", prompt, ts, temperature=temperature, model_id=model_id)
           for i in range(n)]  # fmt: skip
    return out + [hit_event(n + i, "acme", prompt, ts) for i in range(hits)]


def test_profile_headroom__the_room_under_the_forecast_peak_from_what_reached_the_gpu(
    redis_client: redis.Redis,
) -> None:
    profile = TrafficProfile(redis_client)
    # hour 0: 10 misses and 10 hits of a warmable query; hour 1: 4 sampled (never cacheable)
    fill(profile, [*_hour(0, "q", 10, hits=10), *_hour(1, "poem", 4, temperature=0.7)])
    now = [MONDAY + timedelta(days=7, hours=1, minutes=20)]  # the next week, hour 1
    room = ProfileHeadroom(profile, clock=lambda: now[0])
    # half the warmable requests reached the GPU, every sampled one did, each 0.8 GPU-s:
    # the forecast is 20 x 0.5 x 0.8 = 8.0 GPU-s in hour 0 (the peak), 4 x 0.8 = 3.2 in hour 1
    assert room.left() == pytest.approx(8.0 - 3.2)
    room.spend(3.0)
    assert room.left() == pytest.approx(8.0 - 3.2 - 3.0)
    now[0] += timedelta(hours=1)  # a new hour: its own room, nothing spent in it yet
    assert room.left() == pytest.approx(8.0)
    now[0] = MONDAY + timedelta(days=14)  # the peak hour itself (two weeks on): no room
    assert room.left() == 0.0
    half = ProfileHeadroom(profile, share=0.5, clock=lambda: MONDAY + timedelta(days=7, hours=1))
    assert half.left() == pytest.approx(4.0 - 3.2)


def test_profile_headroom__each_model_has_the_room_under_its_own_peak(
    redis_client: redis.Redis,
) -> None:
    profile = TrafficProfile(redis_client)
    # model m peaks at hour 0 (8.0 GPU-s), model big at hour 1 (16.0): each on its own servers
    fill(profile, [*_hour(0, "q", 10), *_hour(1, "q", 20, model_id="big")])
    now = [MONDAY + timedelta(days=7, hours=1, minutes=5)]
    room = ProfileHeadroom(profile, clock=lambda: now[0])
    # hour 1 is big's peak, and m's quiet hour: m has its whole ceiling, big none
    assert (room.left("m"), room.left("big")) == (pytest.approx(8.0), 0.0)
    room.spend(5.0, "m")  # what one model's warms spend is not the other's
    assert (room.left("m"), room.left("big")) == (pytest.approx(3.0), 0.0)
    assert room.left("other") is None  # a model the profile never saw: no peak known
    # as one pool (the two summed): the peak is hour 1's 16.0, and hour 1 is it
    assert room.left() == 0.0
    now[0] -= timedelta(hours=1)  # hour 0: m's peak, big's quiet hour
    assert (room.left("m"), room.left("big")) == (0.0, pytest.approx(16.0))


def _peak_then_quiet(redis_client: redis.Redis) -> TrafficProfile:
    """A profile whose forecast is 8.0 GPU-s in hour 0 of the week (the peak), 3.2 in hour 1."""
    profile = TrafficProfile(redis_client)
    fill(profile, [*_hour(0, "q", 10), *_hour(1, "poem", 4, temperature=0.7)])
    return profile


def test_profile_headroom__the_forecast_follows_the_busy_seconds_the_server_reported(
    redis_client: redis.Redis,
) -> None:
    profile = _peak_then_quiet(redis_client)
    now, busy = [MONDAY + timedelta(days=7, minutes=10)], [100.0]
    room = ProfileHeadroom(profile, clock=lambda: now[0], busy=lambda: busy[0])
    assert room.left() == 0.0  # the peak hour; the first reading
    now[0] += timedelta(minutes=20)
    busy[0] = 101.0
    assert room.ratio() == 1.0  # 20 minutes of readings: too short, the forecast stands
    # an hour after the first reading: the forecast said 8.0 x 50/60 + 3.2 x 10/60 = 7.2
    # GPU-s; the server was busy 5.6 s, 2.0 of them this process's own warms: 3.6, half
    room.spend(2.0)
    now[0] += timedelta(minutes=40)
    busy[0] = 100.0 + 3.6 + 2.0
    assert room.ratio() == pytest.approx(0.5)
    # hour 1's forecast and the peak's, both read at half: the week runs under a warmer cache
    # than the one the forecast was learned under, its peak with it
    assert room.left() == pytest.approx(0.5 * (8.0 - 3.2))
    room.spend(1.0)
    assert room.left() == pytest.approx(0.5 * (8.0 - 3.2) - 1.0)
    busy[0] += 50.0
    assert room.ratio() == pytest.approx(0.5)  # read at most once a minute
    now[0] += timedelta(minutes=1)  # the busy seconds of a much busier week
    assert room.ratio() == RATIO_BOUNDS[1]
    assert room.left() == pytest.approx(2.0 * (8.0 - 3.2) - 1.0)
    now[0] += timedelta(minutes=1)
    busy[0] = 5.0  # the counter went back: a restarted server, the readings start again
    assert room.ratio() == 1.0
    now[0] += timedelta(minutes=1)
    busy[0] = None  # type: ignore[call-overload]  # the server says nothing
    assert room.ratio() == 1.0
    # no source: the forecast as it is
    assert ProfileHeadroom(profile, clock=lambda: now[0]).ratio() == 1.0


def test_profile_headroom__a_process_without_readings_takes_the_ratio_another_read(
    redis_client: redis.Redis,
) -> None:
    """The deploy worker reads its room once per deploy: the scheduler's ratio, via Redis."""
    profile = _peak_then_quiet(redis_client)
    now, busy = [MONDAY + timedelta(days=7, minutes=10)], [100.0]
    leader = ProfileHeadroom(profile, clock=lambda: now[0], busy=lambda: busy[0],
                             shared=SharedRatio(redis_client, ttl_s=60))  # fmt: skip
    deployer = ProfileHeadroom(profile, clock=lambda: now[0], busy=lambda: 7.0,
                               shared=SharedRatio(redis_client, ttl_s=60))  # fmt: skip
    assert leader.ratio() == 1.0  # nobody has read a ratio yet
    now[0] += timedelta(hours=1)
    busy[0] += 3.6  # half the 7.2 GPU-s forecast
    assert leader.ratio() == pytest.approx(0.5)
    assert 0 < redis_client.pttl(LOAD_RATIO_KEY) <= 60_000  # lapses unless read again
    now[0] += timedelta(minutes=1)
    assert deployer.ratio() == pytest.approx(0.5)  # its own readings span nothing yet
    assert deployer.left() == pytest.approx(0.5 * (8.0 - 3.2))
    redis_client.set(LOAD_RATIO_KEY, "nonsense")
    now[0] += timedelta(minutes=1)
    assert deployer.ratio() == 1.0  # what cannot be a ratio is not read as one
    redis_client.set(LOAD_RATIO_KEY, "40.0")
    now[0] += timedelta(minutes=1)
    assert deployer.ratio() == 1.0  # nor is one out of bounds


def test_profile_headroom__reads_the_busy_seconds_of_a_real_server(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    """The wiring's source of busy seconds, against the simulated backend over HTTP: the hour's
    room follows what the server carried against the forecast (less: the peak too is lower)."""
    import httpx

    from stoker.wiring import busy_seconds

    profile = _peak_then_quiet(redis_client)
    now = [MONDAY + timedelta(days=7, hours=1)]
    source = busy_seconds(sim.url)
    assert busy_seconds(f"http://127.0.0.1:{free_port()}")() is None  # nothing listens
    room = ProfileHeadroom(profile, clock=lambda: now[0], busy=source)
    assert room.left() == pytest.approx(8.0 - 3.2)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "a question"}]}
    before = source()
    gpu_ms = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=10).json()
    after = source()
    assert before is not None and after is not None
    assert after - before == pytest.approx(gpu_ms["usage"]["gpu_ms"] / 1000.0)
    now[0] += timedelta(minutes=45)  # 2.4 GPU-s forecast; the server carried a fraction of it
    ratio = max(RATIO_BOUNDS[0], (after - before) / 2.4)
    assert room.ratio() == pytest.approx(ratio) and ratio < 1.0
    assert room.left() == pytest.approx(ratio * (8.0 - 3.2))


def test_profile_headroom__the_week_under_way_is_not_read_and_no_complete_week_means_no_cap(
    redis_client: redis.Redis,
) -> None:
    profile = TrafficProfile(redis_client)
    fill(profile, _hour(0, "q", 10))
    now = [MONDAY + timedelta(hours=5)]  # MONDAY's own week: no complete week yet
    room = ProfileHeadroom(profile, clock=lambda: now[0])
    assert room.left() is None
    now[0] = MONDAY + timedelta(days=7, hours=5)
    assert room.left() == pytest.approx(8.0)
    # the week under way has a burst already: it is not a forecast of this week's hours
    burst = [event(100 + i, "acme", "burst", now[0] - timedelta(hours=1)) for i in range(50)]
    profile.write([observe_event(e, "test:0", 1_000 + i) for i, e in enumerate(burst)])
    now[0] += timedelta(hours=1)
    assert room.left() == pytest.approx(8.0)
    with pytest.raises(ConfigError, match="share"):
        ProfileHeadroom(profile, share=0.0)


def test_scheduled_warm__sends_only_what_the_hour_has_room_for_and_counts_it(
    redis_client: redis.Redis, sim: SimulatorThread, caplog: pytest.LogCaptureFixture
) -> None:
    pw, _, plan = _hot_plan(redis_client, sim.url)  # HOT: weekdays at 10:00, week of MONDAY
    per_send = max(i.warm_cost_ms for i in plan.items) / 1000.0
    now = [START - timedelta(hours=1)]  # 09:00 the next week: fillers only, much room
    # a share that leaves 09:00 room for two sends: the ceiling is the 09:00 load plus that
    live = profile_live_gpu(pw.runner.selector.profile, before_week=week_and_hour(START)[0])
    assert live is not None and max(live) > live[9] + 3 * per_send
    share = (live[9] + 2.5 * per_send) / max(live)
    room = ProfileHeadroom(pw.runner.selector.profile, share=share, clock=lambda: now[0],
                           busy=lambda: 0.0)  # fmt: skip
    pw.runner.selector.profile.clock = lambda: now[0]  # the planner's now is the scheduler's
    job = ScheduledWarm(pw.runner, Budget(requests=5), room)
    with caplog.at_level(logging.INFO, logger="warmers.scheduler"):
        first = job()
    assert first.sent == 2 and 0 < room.spent["m"] <= 2.5 * per_send
    # the log says the room, and how the server's load ran against the forecast (no span yet)
    assert "under the headroom (m " in caplog.text
    assert "GPU-s; the server carrying 1.00x its forecast)" in caplog.text
    second = job()  # the same hour: what is left holds none of the rest
    assert second.sent == 0
    now[0] = START  # the peak hour: no room at all, whatever the plan holds
    full = ScheduledWarm(pw.runner, Budget(requests=5), ProfileHeadroom(
        pw.runner.selector.profile, clock=lambda: now[0]))  # fmt: skip
    assert full().sent == 0
    # uncapped (the setting at 0), the plan of the day ahead spends its whole budget: the
    # three hot ones the room held back, and the next two best
    assert ScheduledWarm(pw.runner, Budget(requests=5), None)().sent == 5


def test_prewarm__held_to_the_headroom_sends_what_fits_and_cuts_over_at_the_bar_it_reached(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    pw, win, plan = _hot_plan(redis_client, sim.url)
    per_send = max(i.warm_cost_ms for i in plan.items) / 1000.0
    profile = pw.runner.selector.profile
    live = profile_live_gpu(profile, before_week=week_and_hour(START)[0])
    assert live is not None
    # the deploy lands at 09:00 the next week, with room for two and a half sends
    share = (live[9] + 2.5 * per_send) / max(live)
    room = ProfileHeadroom(profile, share=share, clock=lambda: START - timedelta(hours=1))
    held = HotSetPrewarmer(pw.runner, Budget(requests=5), lambda: win, hit_bar=0.7, room=room)
    res = held.prewarm(PrewarmRequest("m", "v2", "v1", ("acme",)))
    assert res.sent == 2 and res.held >= 2 and 0 < room.spent["m"] <= 2.5 * per_send
    assert res.room_gpu_s == pytest.approx(2.5 * per_send)
    # READY at the bar the room let in: what was kept is in place, the 70% bar is not
    assert res.ok and res.reached == res.projected < 0.7
    assert "held to the hour's headroom" in res.detail and "(bar 70.0%)" in res.detail
    # with the room spent, a second pre-warm in the same hour sends its best item only
    assert held.prewarm(PrewarmRequest("m", "v2", "v1", ("acme",))).sent == 1
    # in the peak hour itself there is no room: the best item still goes, the rest waits
    peak = ProfileHeadroom(profile, clock=lambda: START)
    res = HotSetPrewarmer(pw.runner, Budget(requests=5), lambda: win, hit_bar=0.7, room=peak)(
        PrewarmRequest("m", "v4", "v1", ("acme",))
    )
    assert (res.sent, res.room_gpu_s) == (1, 0.0) and res.held >= 3 and res.ok
    # not held (the cap off): the same plan reaches the bar
    free = HotSetPrewarmer(pw.runner, Budget(requests=5), lambda: win, hit_bar=0.7)
    res = free.prewarm(PrewarmRequest("m", "v3", "v1", ("acme",)))
    assert res.held == 0 and res.room_gpu_s is None and res.ok and res.reached >= 0.7


def test_prewarm__held_to_the_headroom_still_fails_when_what_it_kept_did_not_land() -> None:
    def report(reached: float) -> HotSetPrewarm:
        return HotSetPrewarm(
            "m", "v2", "v1", (), "w", planned=2, sent=2, cached=0, skipped=0, failed=2,
            refused_stale=0, gpu_seconds=0.0, hit_bar=0.8, min_share=0.5, expected_requests=88,
            projected=0.4, reachable=0.9, reached=reached, held=3, room_gpu_s=1.0,
        )  # fmt: skip

    assert not report(0.1).ok and report(0.2).ok  # half of the 40% the room let in
