"""The replay's virtual cache, sender and loop (warmers/replay/): what `stoker analyze --warming`
serves from. The planner itself is the shipped one; these test what is the replay's own."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.warmers.hotset_helpers import event
from tests.warmers.test_hotset import MONDAY
from warmers.hotset.plan import Plan, PlanItem, WarmItem, logged_request
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.replay.cache import Ledger, VirtualCache
from warmers.replay.report import regime_figures
from warmers.replay.run import Arm, Replay, VirtualClock, rows_of
from warmers.replay.sender import VirtualSender

HOUR = 3600.0


def test_virtual_cache__an_entry_is_read_from_its_landing_until_its_expiry() -> None:
    clock = VirtualClock(MONDAY)
    cache = VirtualCache(ttl_s=HOUR, clock=clock)
    t = MONDAY.timestamp()
    cache.put("k", t + 10, warm=True)
    assert cache.get("k", t) is None  # not landed yet
    assert cache.get("k", t + 10) is not None and cache.get("k", t + 10 + HOUR - 1) is not None
    assert cache.get("k", t + 10 + HOUR) is None  # expired
    clock.now = MONDAY + timedelta(seconds=1_810)
    assert cache.ttl_left_ms(["k", "absent"]) == [1_800_000, -2]  # as Redis's PTTL
    cache.forget_expired(t + 2 * HOUR)
    assert cache.entries == {}


def _item(prompt: str, *, temperature: float = 0.0, p: float = 0.9) -> PlanItem:
    ev = event(1, "acme", prompt, MONDAY, temperature=temperature)
    req = logged_request(ev.model_dump(mode="json"))
    return PlanItem(
        "acme", "m", "v1", "t1", f"q:{prompt}", prompt, 1, 2.0, 800.0, 600.0, "test",
        WarmItem.of(req), p_asked=p, prevented_ms=700.0,
    )  # fmt: skip


def test_virtual_sender__paces_the_sends_skips_what_is_cached_or_uncacheable_and_bills_them() -> (
    None
):
    clock = VirtualClock(MONDAY + timedelta(minutes=30))
    cache, ledger = VirtualCache(3 * HOUR, clock), Ledger()
    sender = VirtualSender(cache, ledger, clock, qps=2.0, min_ttl_left_s=HOUR)
    fresh, stale, poem = (
        _item("cached long"),
        _item("cached briefly"),
        _item("poem", temperature=0.7),
    )
    t0 = clock.now.timestamp()
    cache.put(fresh.item.identity.key().exact(), t0 - 60, warm=False)  # ~3 h left: skipped
    cache.put(stale.item.identity.key().exact(), t0 - 2.5 * HOUR, warm=False)  # 30 min left
    plan = Plan(Window(MONDAY + timedelta(hours=1), MONDAY + timedelta(hours=2)), Budget(5))
    plan.items = [fresh, stale, poem, _item("new one")]
    s = sender(plan)
    assert (s.sent, s.skipped_cached, s.skipped_uncacheable) == (2, 1, 1)
    landed = [cache.get(k, t0 + 10) for k in s.landed_keys]
    assert [e.landed - t0 for e in landed if e is not None] == [0.0, 0.5]  # one every 1/qps
    assert all(e is not None and e.warm for e in landed)
    hour = ledger.hours[int(t0 // HOUR)]
    assert (hour.sends, hour.send_gpu_s) == (2, pytest.approx(1.2)) and ledger.busy() == 1.2
    # a plan that valued a refresh: re-sent while the cached entry has less than the plan says
    plan.items = [fresh]
    plan.made_at, plan.window = clock.now, Window(plan.window.start, MONDAY + timedelta(hours=5))
    assert sender(plan).sent == 1


def _rows(spec: list[tuple[float, str]], **kw: object) -> list:
    return [
        event(i, "acme", prompt, MONDAY + timedelta(hours=h), **kw)  # type: ignore[arg-type]
        for i, (h, prompt) in enumerate(spec)
    ]


def test_replay__the_baseline_fills_on_each_miss_and_expires_after_the_ttl() -> None:
    # history: one ask at 00:00; replayed from 01:00 with a 2-hour TTL
    events = _rows([(0, "q"), (1.1, "q"), (1.5, "q"), (3.2, "q"), (3.5, "other")])
    events.append(event(9, "acme", "poem", MONDAY + timedelta(hours=3.6), temperature=0.9))
    rows = rows_of(events)
    replay = Replay(rows, MONDAY + timedelta(hours=1), MONDAY + timedelta(hours=4), 2 * HOUR, 900)
    assert [r.event.prompt for r in replay.history()] == ["q"]
    clock = VirtualClock(replay.start)
    base = replay.run(Arm(False), VirtualCache(2 * HOUR, clock), clock)
    # 01:06 miss (the history filled no cache), 01:30 hit, 03:12 miss (expired at 03:06),
    # 03:30 miss (another query), 03:36 miss (never cacheable)
    assert base.hits == [False, True, False, False, False]
    hours = base.ledger.hours
    assert (hours[int(rows[1].t // HOUR)].requests, hours[int(rows[1].t // HOUR)].hits) == (2, 1)
    assert hours[int(rows[3].t // HOUR)].live_gpu_s == pytest.approx(3 * 0.8)
    f = regime_figures(base, base, 2 * HOUR, 1.0, replay.end.timestamp())
    assert f["peak_gpu_ratio"] == f["total_gpu_ratio"] == 1.0 and f["warm_sends"] == 0


def test_replay__a_deploy_moves_every_request_to_the_new_versions_keys() -> None:
    events = _rows([(1.1, "q"), (1.5, "q"), (2.6, "q"), (2.9, "q")])
    rows = rows_of(events, "v2")
    replay = Replay(
        rows, MONDAY + timedelta(hours=1), MONDAY + timedelta(hours=4), 6 * HOUR, 900,
        deploy_at=MONDAY + timedelta(hours=2, minutes=20),
    )  # fmt: skip
    clock = VirtualClock(replay.start)
    called = []
    arm = replay.run(Arm(True), VirtualCache(6 * HOUR, clock), clock,
                     deploy=lambda: called.append(clock.now))  # fmt: skip
    # the old version's entry serves until the deploy; the new version starts cold
    assert arm.hits == [False, True, False, True]
    assert called == [MONDAY + timedelta(hours=2, minutes=15)]  # the deploy's step
    assert rows[2].deployed is not None and rows[2].deployed[0] != rows[2].keys[0]
