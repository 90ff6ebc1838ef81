"""Hot-set selection on a real redis-server: regimes, budget, fairness, skips."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from caches.client import CacheClient
from caches.embedding_cache import CachedEmbedder
from caches.live import LiveVersions
from caches.policy import CachePolicy
from caches.request import CacheRequest
from caches.semantic.edge import EdgeSemanticStore
from schemas.common import RequestParams
from schemas.errors import ConfigError
from tests.warmers.hotset_helpers import WordsEmbedder, event, fill
from warmers.hotset.options import HotSetConfig
from warmers.hotset.select import HotSetSelector
from warmers.hotset.value import Worth
from warmers.hotset.warm_budget import Budget, fair_shares
from warmers.hotset.window import Window
from warmers.traffic.decode import query_key
from warmers.traffic.profile import TrafficProfile

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
        # these tests were written for the static matcher's clustering and count hits (the
        # owner's defaults are the product's, "verified" and "prevented"); a test of another
        # matcher or value model passes it
        config=HotSetConfig(**({"matcher": "static", "value_model": "hits"} | cfg)),  # type: ignore[arg-type]
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


def test_hotset__past_break_even_the_budget_tail_goes_to_the_most_asked_of_other_days(
    profile: TrafficProfile,
) -> None:
    # Saturday's window: the weekend asks brunch 20 times a day and a one-off once a day; the
    # weekdays ask their report 100 times, never on a weekend. A budget of K buys K items:
    # after brunch, the most asked query of any day (as a naive top-K would), not the one-off.
    week = _week(
        "acme", {"weekday report": 20}, {"weekend brunch places": 20, "weekend one-off": 1}
    )
    fill(profile, week)
    ranked = _selector(profile, min_value_ms=None).plan(NEXT_SATURDAY_10, Budget(requests=2))
    assert [i.query for i in ranked.items] == ["weekend brunch places", "weekday report"]
    # with the value bar, a query the matching days never asked is not expected in the window
    hits = _selector(profile).forecaster.expected_hits("acme", "m", "t1", NEXT_SATURDAY_10).hits

    def expected(prompt: str) -> float:
        return hits[query_key(prompt, {"temperature": 0.0, "max_tokens": 16}, [])]

    assert expected("weekday report") < 0.01 < expected("weekend one-off")


def test_hotset__paraphrases_warm_one_representative(profile: TrafficProfile) -> None:
    fill(
        profile,
        _week("acme", {"what is my balance": 20, "what is my balance please": 10}, {}),
    )
    plan = _selector(profile, cluster_threshold=0.8).plan(NEXT_MONDAY_10, Budget(requests=5))
    top = plan.items[0]
    assert top.query == "what is my balance" and top.cluster_size == 2
    assert not any(i.query == "what is my balance please" for i in plan.items)


def test_hotset__under_the_verified_matcher_each_asked_phrasing_is_warmed_as_itself(
    profile: TrafficProfile,
) -> None:
    # A warmed entry serves a paraphrase under the verified matcher only where other entries
    # near it vouch with agreeing answers: a lone representative serves none of its cluster.
    # So the plan warms the phrasings themselves, most asked first, and they vouch for each other.
    fill(
        profile,
        _week("acme", {"what is my balance": 20, "what is my balance please": 10}, {}),
    )
    plan = _selector(profile, matcher="verified").plan(NEXT_MONDAY_10, Budget(requests=5))
    assert [(i.query, i.cluster_size) for i in plan.items] == [
        ("what is my balance", 1),
        ("what is my balance please", 1),
    ]
    assert plan.items[0].expected_hits > plan.items[1].expected_hits > 0  # its own hits only
    # a radius set explicitly merges them again, as under the static matcher
    merged = _selector(profile, matcher="verified", cluster_threshold=0.8)
    items = merged.plan(NEXT_MONDAY_10, Budget(requests=5)).items
    assert (items[0].query, items[0].cluster_size) == ("what is my balance", 2)
    assert "what is my balance please" not in [i.query for i in items]


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
    fill(profile, hot_sampled + _week("acme", {"what is the refund policy": 10}, {})[:50])
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


def test_hotset__an_incident_of_many_phrasings_each_asked_once_surges_as_a_group(
    profile: TrafficProfile,
) -> None:
    # The incident comes as 6 phrasings of one question, each asked once between 07:00 and
    # 10:00, and 6 one-offs that share no words: none is asked 3 times, so none surges alone.
    history = _week("acme", {f"usual question {i}": 10 + i for i in range(40)}, {})
    at = MONDAY + timedelta(days=7, hours=7)
    said = ["is the app down now", "is the app down today", "is the app down again",
            "is the app down for you", "is the app down at all", "is the app down or not"]  # fmt: skip
    noise = ["weather in paris", "recipe for soup", "flights to rome", "tax forms due",
             "jokes about cats", "convert miles km"]  # fmt: skip
    recent = [event(10_000 + i, "acme", p, at + timedelta(minutes=14 * i))
              for i, p in enumerate(said + noise)]  # fmt: skip
    fill(profile, history + recent)
    budget = Budget(requests=50)  # a named budget: every expected query, down to the floor
    # off by default (it cost a drifting load's hot queries their places: options.py)
    grouped = _selector(profile, recent_paraphrase_radius=0.7).plan(
        NEXT_MONDAY_10, budget, named=True
    )
    assert "6 with their paraphrases" in grouped.regimes["acme/m/t1"]
    rank = {i.query: n for n, i in enumerate(grouped.items)}
    assert set(said) <= set(rank) and max(rank[p] for p in said) < 12  # near the head
    assert all(rank.get(p, 99) > max(rank[s] for s in said) for p in noise)
    # the mechanism: linked only at a radius no paraphrase reaches, none of them is expected
    alone = _selector(profile, recent_paraphrase_radius=1.0).plan(
        NEXT_MONDAY_10, budget, named=True
    )
    assert _selector(profile).cfg.recent_paraphrase_radius is None  # the default: off
    assert "with their paraphrases" not in alone.regimes["acme/m/t1"]
    ranked = {i.query: n for n, i in enumerate(alone.items)}
    assert all(ranked.get(p, len(ranked)) > 12 for p in said)


# -- valued by the miss it prevents (warmers/hotset/value.py) --


def test_hotset__nothing_learned_yet_plans_nothing_over_a_whole_span_of_send_hours(
    redis_client: redis.Redis,
) -> None:
    """With the shipped defaults a send may go out any hour of the entries' TTL before the
    window. A scheduler's first run, before any request was learned, priced a span of one hour
    against 24 send hours and failed its run with a ConfigError."""
    now = NEXT_MONDAY_10.start
    empty = TrafficProfile(redis_client, clock=lambda: now)
    sel = HotSetSelector(empty, WordsEmbedder(), policy=CachePolicy(), config=HotSetConfig())
    plan = sel.plan_ahead(Budget(requests=10))  # the scheduler's: the next TTL's 24 hours
    assert plan.window == Window(now, now + timedelta(days=1))
    assert plan.items == [] and plan.deferred == []
    assert "candidates" in plan.unused_reason()


def _flat(tenant: str, per_hour: dict[str, int]) -> list:
    """A week asking `per_hour` every hour of every day: the load never moves."""
    out = []
    for h in range(7 * 24):
        for prompt, n in per_hour.items():
            for i in range(n):
                ts = MONDAY + timedelta(hours=h, minutes=i)
                out.append(event(len(out), tenant, prompt, ts))
    return out


def test_hotset__a_flat_load_plans_nothing_when_valued_by_the_miss_prevented(
    profile: TrafficProfile,
) -> None:
    # The send hour costs what the window's hours cost: a warm buys a miss at the price the
    # miss would have cost, less the chance it is never asked. No latency weight: none pays.
    # (the warm question is asked twice an hour: once an hour, valued by hits, it would sit
    # exactly at break-even, 1 hit x 800 ms against its 800 ms send)
    fill(profile, _flat("acme", {"flat hot question": 4, "flat warm question": 2}))
    plan = _selector(profile, value_model="prevented").plan(NEXT_MONDAY_10, Budget(requests=10))
    assert plan.items == []
    assert "only 0 candidates" in plan.unused_reason()
    assert "2 below break-even" in plan.unused_reason()
    below = {s.query: s for s in plan.skipped if s.reason.startswith("below break-even")}
    assert set(below) == {"flat hot question", "flat warm question"}
    hot = below["flat hot question"]
    assert hot.value_ms is not None and -800 < hot.value_ms < 0  # P < 1 at price 1 == send
    assert "at price 1.00; its warm send costs 800 at price 1.00" in hot.reason
    # valued by hits, the same profile warms both: the model is what left them out
    hits = _selector(profile).plan(NEXT_MONDAY_10, Budget(requests=10))
    assert {"flat hot question", "flat warm question"} <= {i.query for i in hits.items}
    # ... and a latency weight makes the prevented first miss worth its send
    lat = _selector(profile, value_model="prevented", latency_weight=0.5)
    assert "flat hot question" in {
        i.query for i in lat.plan(NEXT_MONDAY_10, Budget(requests=10)).items
    }


def test_hotset__the_latency_weight_weighs_each_query_by_the_latency_its_misses_had(
    profile: TrafficProfile,
) -> None:
    # Two queries alike in count and GPU time (800 ms); one's misses kept their callers
    # waiting 4 s (queued behind a full batch), the other's 50 ms (a short answer, streamed).
    # On a flat load only the latency term can pay for the send: it does for the slow one.
    out = []
    for h in range(7 * 24):
        for i in range(4):
            ts = MONDAY + timedelta(hours=h, minutes=i)
            out.append(event(len(out), "acme", "a slow question", ts, latency_ms=4_000.0))
            out.append(event(len(out), "acme", "a quick question", ts, latency_ms=50.0))
    fill(profile, out)
    sel = _selector(profile, value_model="prevented", latency_weight=0.1)
    plan = sel.plan(NEXT_MONDAY_10, Budget(requests=10))
    assert [i.query for i in plan.items] == ["a slow question"]
    [slow] = plan.items
    assert slow.miss_latency_ms == pytest.approx(4_000, rel=0.02)  # shrunk toward the mean
    quick = next(s for s in plan.skipped if s.query == "a quick question")
    assert quick.reason.startswith("below break-even")
    # the GPU time standing in for the latency (as before the profile kept it) would warm both
    alike = [e.model_copy(update={"latency_ms": 800.0}) for e in out]
    profile.r.flushdb()
    fresh = TrafficProfile(profile.r)  # a writer that has not written these representatives
    fill(fresh, alike)
    both = _selector(fresh, value_model="prevented", latency_weight=0.1)
    assert {i.query for i in both.plan(NEXT_MONDAY_10, Budget(requests=10)).items} == {
        "a slow question",
        "a quick question",
    }


def _ramp(tenant: str, hot: int, question: str = "hot question") -> list:
    """Weekdays: 4 one-offs an hour all day (each its own word, so no two are paraphrases),
    and at 10:00 the hot question `hot` times more; weekends the one-offs only."""
    out = []
    for h in range(7 * 24):
        for i in range(4):
            ts = MONDAY + timedelta(hours=h, minutes=i)
            out.append(event(len(out), tenant, f"background {h}-{i}", ts))
        if h % 24 == 10 and h < 5 * 24:
            out += [event(len(out) + n, tenant, question, MONDAY + timedelta(hours=h, minutes=n))
                    for n in range(hot)]  # fmt: skip
    return out


def test_hotset__before_a_ramp_up_the_hot_query_pays_and_a_one_off_does_not(
    profile: TrafficProfile,
) -> None:
    # 09:00 asks 4 requests, 10:00 the hot question 40 times more (the week's peak): the warm
    # goes out at near-idle prices to prevent a miss at peak prices. A query asked once is
    # expected 0.15 times at 10:00, asked with p 0.14: under the send's price over the window's.
    once = event(90_000, "acme", "a one-off question", MONDAY + timedelta(days=2, hours=10))
    fill(profile, [*_ramp("acme", 40), once])
    plan = _selector(profile, value_model="prevented").plan(NEXT_MONDAY_10, Budget(requests=10))
    assert [i.query for i in plan.items] == ["hot question"]  # no background one-off either
    hot = plan.items[0]
    assert hot.p_asked is not None and hot.p_asked == pytest.approx(1.0, abs=1e-6)
    assert hot.price_send == pytest.approx(0.2 + 0.8 * 4 / 45, rel=0.02)  # 4 of the peak's 45
    assert hot.price_window is not None and hot.price_window > 0.95
    assert hot.value_ms == pytest.approx(800 * (hot.price_window - hot.price_send), rel=0.01)
    # the rates span the send hours (09:00, the last cheap one) and then the window's, the
    # window's summing to its expected hits
    assert plan.span_start == NEXT_MONDAY_10.start - timedelta(hours=1)
    assert plan.send_at(hot) == plan.span_start
    assert sum(hot.rates[1:]) == pytest.approx(hot.expected_hits)
    assert "first asked with p 1.00" in hot.reason and "sent 09:00" in hot.reason
    # the send carries its worth, to be priced again at the backend's load when it goes out
    (sent,) = plan.warm_items()
    assert sent.worth == Worth(hot.prevented_ms, hot.warm_cost_ms)
    assert sent.worth.value_at(hot.price_send) == pytest.approx(hot.value_ms)
    # a named budget's sends are not: a person chose to spend it past break-even
    named = _selector(profile, value_model="prevented").plan(
        NEXT_MONDAY_10, Budget(requests=10), named=True
    )
    assert named.items and all(i.prevented_ms is not None for i in named.items)
    assert all(s.worth is None for s in named.warm_items())
    (one,) = [s for s in plan.skipped if s.query == "a one-off question"]
    assert one.reason.startswith("below break-even") and one.value_ms is not None
    assert one.value_ms < 0


def test_hotset__an_entry_expiring_inside_the_window_is_valued_after_its_expiry(
    redis_client: redis.Redis,
) -> None:
    # Weekdays ask the steady question 4 times at 10:00 and 4 times at 11:00; planned at 09:30
    # for 10:00-12:00. Cached until 10:25, a warm prevents only a miss after 10:25.
    window = Window(MONDAY + timedelta(days=7, hours=10), MONDAY + timedelta(days=7, hours=12))
    now = window.start - timedelta(minutes=30)
    profile = TrafficProfile(redis_client, clock=lambda: now)
    steady = [event(80_000 + n, "acme", "steady question", MONDAY + timedelta(days=d, hours=h, minutes=n))
              for d in range(5) for h in (10, 11) for n in range(4)]  # fmt: skip
    fill(profile, [*_week("acme", {}, {}), *steady])
    sel = _selector(profile, value_model="prevented", min_ttl_left_s=6 * 3600)
    (uncached,) = sel.plan(window, Budget(requests=5)).items
    cache = CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=86_400))
    req = CacheRequest("acme", "m", "v1", "t1", "steady question", RequestParams(max_tokens=16))
    assert cache.store(cache.lookup(req, use_semantic=False), "steady answer").landed
    redis_client.pexpire(req.key().exact(), 55 * 60_000)  # expires at 10:25

    (cached,) = sel.plan(window, Budget(requests=5)).items
    assert len(uncached.rates) == 3  # 09:00 (half of it ahead: a send may go out in it), then
    lam = uncached.rates[1:]  # the window's two hours
    assert min(lam) > 1  # both hours asked
    assert cached.p_asked == pytest.approx(1 - math.exp(-(lam[0] * 35 / 60 + lam[1])), rel=1e-3)
    assert cached.p_asked < (uncached.p_asked or 0)
    # its first miss can only fall after 10:25, at the window's price; uncached, it may fall
    # in the cheaper half hour before 10:00 (the kernel spreads 10:00 there)
    assert cached.value_ms > 0
    assert (cached.price_window or 0) > (uncached.price_window or 1)
    assert "cached until 10:25 UTC" in cached.reason
    # cached past the window's end: nothing to prevent in it, skipped as fresh
    redis_client.pexpire(req.key().exact(), 3 * 3600_000)
    later = sel.plan(window, Budget(requests=5))
    assert later.items == [] and [i.query for i in later.fresh] == ["steady question"]


def test_hotset__a_cluster_a_cached_paraphrase_serves_prevents_no_miss_until_it_expires(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # The hot question before a ramp-up pays (test above). Live traffic cached a paraphrase
    # the static 0.92 serves it from (its 6 words of 7: cosine 0.926): warming the representative
    # prevents no miss while that entry lives, and a miss only after it expires.
    window = NEXT_MONDAY_10
    now = window.start - timedelta(minutes=30)
    profile = TrafficProfile(redis_client, clock=lambda: now)
    fill(profile, _ramp("acme", 40, "how can i reset my password"))
    words = WordsEmbedder()
    store = EdgeSemanticStore(tmp_path / "edge", dim=words.dim)
    cache = CacheClient(
        redis_client, semantic=store, embedder=CachedEmbedder(words, redis_client, 600),
        policy=CachePolicy(exact_ttl_s=86_400, semantic_ttl_s=86_400),
    )  # fmt: skip
    sel = HotSetSelector(
        profile, words, policy=CachePolicy(), cache=cache,
        config=HotSetConfig(value_model="prevented", matcher="static"),
    )  # fmt: skip
    try:
        (alone,) = sel.plan(window, Budget(requests=10)).items
        assert alone.query == "how can i reset my password"
        para = CacheRequest(
            "acme", "m", "v1", "t1", "how can i reset my password now", RequestParams(max_tokens=16)
        )
        assert cache.store(cache.lookup(para), "the answer").landed
        rep = alone.item.identity
        assert cache.serving_key(rep) == para.key().exact()  # the mechanism: a semantic hit

        # the paraphrase outlives the window: nothing to prevent, and the plan says why
        served = sel.plan(window, Budget(requests=10))
        assert served.items == []
        (why,) = [s.reason for s in served.skipped if s.query == alone.query]
        assert why.startswith("served by a cached paraphrase (")
        assert [i.query for i in served.fresh] == [alone.query]
        assert redis_client.exists(rep.key().exact()) == 0  # checked, not written

        # it expires at 10:25: the warm prevents only a miss after that
        redis_client.pexpire(para.key().exact(), 55 * 60_000)
        (later,) = sel.plan(window, Budget(requests=10)).items
        lam = alone.rates[1]  # the window's hour (the first is the send hour before it)
        assert later.p_asked == pytest.approx(-math.expm1(-lam * 35 / 60), rel=1e-3)
        # first asked after 10:25 only, at the peak's price; uncached, its first ask was
        # likely still in the cheap half hour before 10:00 (the kernel spreads 10:00 there)
        assert later.price_window == pytest.approx(1.0)
        assert alone.price_window is not None and alone.price_window < 0.9
        assert "served by a cached paraphrase until 10:25 UTC" in later.reason

        # valued by hits (the deploy pre-warm's model), the representative is still warmed:
        # it serves its paraphrases whatever else is cached
        hits = sel.plan(window, Budget(requests=10), value_model="hits")
        assert alone.query in {i.query for i in hits.items}
    finally:
        store.close()


def test_hotset__after_a_deploy_went_ready_the_plan_warms_the_live_version(
    profile: TrafficProfile, redis_client: redis.Redis
) -> None:
    # The profile's representatives were served under v1; once a deploy made v2 live, a warm
    # of v1 would be refused as retired (the demo's 3-hour regime lost 30 of 40 sends so).
    fill(profile, _week("acme", {"how do i reset my password": 5}, {}))
    fill(profile, _week("globex", {"where is my parcel": 5}, {}))
    before = _selector(profile).plan(NEXT_MONDAY_10, Budget(requests=4))
    assert {i.model_version for i in before.items} == {"v1"}
    lv = LiveVersions(redis_client)
    lv.set("m", "v2", deploy_id="d1", accepted_at=1.0)
    lv.set("m", "v3", deploy_id="d2", accepted_at=2.0, tenants=["globex"])  # a canary
    after = _selector(profile).plan(NEXT_MONDAY_10, Budget(requests=4))
    got = {i.tenant: (i.model_version, i.item.identity.model_version) for i in after.items}
    assert got == {"acme": ("v2", "v2"), "globex": ("v3", "v3")}
    # a plan for a named version (the deploy pre-warm's) keeps it
    named = _selector(profile).plan(NEXT_MONDAY_10, Budget(requests=4), model_version="v9")
    assert {i.model_version for i in named.items} == {"v9"}
