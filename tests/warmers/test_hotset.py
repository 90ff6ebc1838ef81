"""Hot-set selection on a real redis-server: regimes, budget, fairness, skips."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis

from caches.client import CacheClient, CacheRequest
from caches.policy import CachePolicy
from schemas.common import RequestParams
from schemas.errors import ConfigError
from tests.warmers.hotset_helpers import WordsEmbedder, event, fill
from warmers.budget import Budget, fair_shares
from warmers.hotset import HotSetConfig, HotSetSelector
from warmers.profile import TrafficProfile
from warmers.window import Window

MONDAY = datetime(2026, 11, 2, tzinfo=UTC)  # history: one week from here
NEXT_MONDAY_10 = Window(MONDAY + timedelta(days=7, hours=10), MONDAY + timedelta(days=7, hours=11))
NEXT_SATURDAY_10 = Window(
    MONDAY + timedelta(days=12, hours=10), MONDAY + timedelta(days=12, hours=11)
)


def _week(tenant: str, weekday_q: dict[str, int], weekend_q: dict[str, int], **kw: object):
    """A week of history: each weekday at 10:00 asks weekday_q, each weekend day weekend_q."""
    out = []
    for day in range(7):
        qs = weekday_q if day < 5 else weekend_q
        for prompt, n in qs.items():
            for i in range(n):
                ts = MONDAY + timedelta(days=day, hours=10, minutes=i % 60)
                out.append(event(len(out), tenant, prompt, ts, **kw))  # type: ignore[arg-type]
    # background traffic so each day has a 24-hour shape (weekends at half volume)
    for day in range(7):
        for h in range(24):
            for i in range(4 if day < 5 else 2):
                ts = MONDAY + timedelta(days=day, hours=h, minutes=i)
                out.append(event(len(out), tenant, f"filler {day} {h} {i}", ts))
    return out


@pytest.fixture
def profile(redis_client: redis.Redis) -> TrafficProfile:
    return TrafficProfile(redis_client)


def _selector(profile: TrafficProfile, **cfg: object) -> HotSetSelector:
    return HotSetSelector(
        profile,
        WordsEmbedder(),
        policy=CachePolicy(),
        config=HotSetConfig(**cfg),  # type: ignore[arg-type]
    )


def test_hotset__weekday_window_draws_on_weekdays_weekend_on_weekends(
    profile: TrafficProfile,
) -> None:
    fill(profile, _week("acme", {"weekday report": 20}, {"weekend brunch places": 20}))
    sel = _selector(profile)
    mon = sel.plan(NEXT_MONDAY_10, Budget(requests=1))
    sat = sel.plan(NEXT_SATURDAY_10, Budget(requests=1))
    assert [i.query for i in mon.items] == ["weekday report"]
    assert [i.query for i in sat.items] == ["weekend brunch places"]
    assert "weekday" in mon.regimes["acme/m/t1"] and "weekend" in sat.regimes["acme/m/t1"]


def test_hotset__paraphrases_warm_one_representative(profile: TrafficProfile) -> None:
    fill(
        profile,
        _week("acme", {"what is my balance": 20, "what is my balance please": 10}, {}),
    )
    plan = _selector(profile, cluster_threshold=0.8).plan(NEXT_MONDAY_10, Budget(requests=5))
    top = plan.items[0]
    assert top.query == "what is my balance" and top.cluster_size == 2
    assert not any(i.query == "what is my balance please" for i in plan.items)


def test_hotset__budget_in_requests_and_gpu_seconds_is_respected(profile: TrafficProfile) -> None:
    fill(profile, _week("acme", {f"question {i}": 10 + i for i in range(30)}, {}))
    sel = _selector(profile, cluster_threshold=0.99)
    by_requests = sel.plan(NEXT_MONDAY_10, Budget(requests=7))
    assert len(by_requests.items) == 7
    # the most asked first: question 29 has the most requests
    assert by_requests.items[0].query == "question 29"
    by_gpu = sel.plan(NEXT_MONDAY_10, Budget(gpu_seconds=4.0))  # 0.8 s per warm send
    assert len(by_gpu.items) == 5 and by_gpu.spent <= 4.0 + 1e-9


def test_hotset__budget_is_shared_fairly_across_tenants(profile: TrafficProfile) -> None:
    fill(profile, _week("big", {f"big question {i}": 40 for i in range(40)}, {}))
    fill(profile, _week("small", {"small question": 5}, {}))
    fill(profile, _week("mid", {f"mid question {i}": 10 for i in range(40)}, {}))
    plan = _selector(profile, cluster_threshold=0.99).plan(NEXT_MONDAY_10, Budget(requests=20))
    per = {t: sum(1 for i in plan.items if i.tenant == t) for t in ("big", "small", "mid")}
    assert sum(per.values()) == 20
    assert per["small"] == 1  # needs less than its share: gets all it needs
    assert per["big"] > per["mid"] > per["small"]  # the rest split by traffic
    assert per["mid"] >= 2  # the floor: a quieter tenant is not starved


def test_fair_shares__water_filling_with_floor() -> None:
    shares = fair_shares(100, {"a": 1000, "b": 1000, "c": 5}, {"a": 90, "b": 10, "c": 0})
    assert shares["c"] == 5
    assert shares["a"] + shares["b"] == pytest.approx(95)
    # a's 90 is capped at 4 x the median weight (10) = 40; b's 10 is above the floor of
    # 0.25 x mean(40, 10, 0) = 4.2, so it keeps its own 10
    assert shares["a"] == pytest.approx(95 * 40 / 50)
    assert fair_shares(10, {"a": 0}, {"a": 1}) == {"a": 0.0}


def test_hotset__never_warms_what_must_not_be_cached(profile: TrafficProfile) -> None:
    hot_sampled = _week("acme", {"write me a poem": 50}, {}, temperature=0.8)
    fill(profile, hot_sampled + _week("acme", {"what is the refund policy": 3}, {})[:15])
    plan = _selector(profile).plan(NEXT_MONDAY_10, Budget(requests=10))
    assert "write me a poem" not in {i.query for i in plan.items}
    assert "what is the refund policy" in {i.query for i in plan.items}


def test_hotset__skips_fresh_entries_rewarms_expiring_ones(
    profile: TrafficProfile, redis_client: redis.Redis
) -> None:
    fill(profile, _week("acme", {"fresh question": 30, "stale question": 20}, {}))
    cache = CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=86_400))
    params = RequestParams(temperature=0.0, max_tokens=16)
    for prompt in ("fresh question", "stale question"):
        req = CacheRequest("acme", "m", "v1", "t1", prompt, params)
        assert cache.store(cache.lookup(req, use_semantic=False), f"answer to {prompt}").landed
    stale = CacheRequest("acme", "m", "v1", "t1", "stale question", params).key().exact()
    redis_client.pexpire(stale, 60_000)  # a minute left: under the one-hour bar
    plan = _selector(profile).plan(NEXT_MONDAY_10, Budget(requests=10))
    assert "fresh question" not in {i.query for i in plan.items}
    assert "stale question" in {i.query for i in plan.items}
    assert any(s.query == "fresh question" and s.reason.startswith("cached") for s in plan.skipped)
    # a new version's namespace holds nothing yet: both are warmed there
    moved = _selector(profile).plan(NEXT_MONDAY_10, Budget(requests=10), model_version="v2")
    assert {"fresh question", "stale question"} <= {i.query for i in moved.items}
    assert all(i.item.identity.model_version == "v2" for i in moved.items)


def test_window__parse() -> None:
    now = datetime(2026, 11, 9, 10, 42, tzinfo=UTC)
    assert Window.parse("next-hour", now) == Window(
        now.replace(hour=11, minute=0), now.replace(hour=12, minute=0)
    )
    w = Window.parse("2026-11-09T10:30..2026-11-09T12:10", now)
    assert (w.start.hour, w.end.hour, w.hours()) == (10, 13, 3)
    for bad in ("tomorrow", "2026-11-09..2026-11-30", "2026-11-09T12:00..2026-11-09T10:00"):
        with pytest.raises(ConfigError):
            Window.parse(bad, now)


def test_hotset__a_query_surging_in_the_last_hours_is_warmed_though_history_never_saw_it(
    profile: TrafficProfile,
) -> None:
    # A week of history, then, the next Monday from 07:00 to 10:00, an incident: a query no
    # day ever asked, 40 times. The regimes alone cannot know it; the live log's last hours do.
    history = _week("acme", {f"usual question {i}": 10 + i for i in range(5)}, {})
    at = MONDAY + timedelta(days=7, hours=7)
    incident = [event(10_000 + i, "acme", "is the app down", at + timedelta(minutes=4 * i))
                for i in range(40)]  # fmt: skip
    fill(profile, history + incident)  # one batch: fill numbers offsets from 0
    live = _selector(profile, cluster_threshold=0.99).plan(NEXT_MONDAY_10, Budget(requests=2))
    assert live.items[0].query == "is the app down"
    assert "the last 3 h (" in live.regimes["acme/m/t1"]
    # the mechanism, not an accident of ranking: with the live hours off, it is not planned
    off = _selector(profile, cluster_threshold=0.99, recent_hours=0)
    assert "is the app down" not in [
        i.query for i in off.plan(NEXT_MONDAY_10, Budget(requests=5)).items
    ]
