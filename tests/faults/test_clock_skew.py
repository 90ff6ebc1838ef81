"""Clock-skewed producers: events far in the future or the past are dead-lettered with the
reason, and neither they nor the newest event ever seen move the profile's retained weeks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import redis
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import decode_event
from schemas.common import utcnow
from schemas.errors import EventDecodeError
from stoker.registry import build_handler
from stoker.settings import StokerSettings
from stoker.stack import Stack
from stoker.wiring import worker_config
from streams.base import Decoded
from streams.topics import ensure_topics
from tests.events import encode, request
from tests.faults.faults_helpers import dead_letters, done_after, headers, produce_raw, run_worker
from tests.warmers.hotset_helpers import WordsEmbedder, event, fill
from warmers.hotset.options import HotSetConfig
from warmers.hotset.select import HotSetSelector
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.traffic.count_batch import BatchTally, observe_batch
from warmers.traffic.decode import OUTCOMES
from warmers.traffic.delta import aggregate
from warmers.traffic.event_time import EventTimes
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile, week_and_hour

FUTURE = [
    "2999-01-01T00:00:00Z",
    "3000-01-01T00:00:00Z",
    "3001-06-01T12:00:00Z",
    "3002-12-31T23:00:00Z",
]  # fmt: skip  (the four events of the issue)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def test_traffic_worker__skewed_producers_are_dead_lettered_and_the_real_week_stays(
    kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, unique: str
) -> None:
    s = StokerSettings(kafka_bootstrap=kafka_bootstrap, redis_url=redis_url,
                       kafka_broker="tansu", topic_prefix=f"k{unique}.")  # fmt: skip
    topic, dlq = f"{s.topic_prefix}inference.requests", f"{s.topic_prefix}stoker.dlq"
    ensure_topics(kafka_bootstrap, {topic: 1})
    now = utcnow()
    real = [
        request(i, ts=_iso(now - timedelta(hours=1)), prompt=f"real {i % 3}") for i in range(30)
    ]
    real.append(request(30, ts=_iso(now + timedelta(seconds=60)), prompt="real 0"))  # skew: fine
    hostile = {f"f{i}": request(100 + i, request_id=f"f{i}", ts=ts, prompt="attacker")
               for i, ts in enumerate(FUTURE)}  # fmt: skip
    hostile["ahead"] = request(200, request_id="ahead", ts=_iso(now + timedelta(minutes=10)))
    hostile["naive"] = request(201, request_id="naive", ts="2999-01-01T00:00:00")  # naive = UTC
    hostile["lax"] = request(202, request_id="lax", ts=FUTURE[0], tokens_in="5")  # slow path
    hostile["epoch"] = request(203, request_id="epoch", ts="1970-01-01T00:00:00Z")
    values = [encode(x) for x in [*real[:10], *hostile.values(), *real[10:]]]
    produce_raw(kafka_bootstrap, topic, [(v, None) for v in values])

    with Stack(s) as stack:
        handler = build_handler("traffic", stack)  # the shell's handler: the settings' bounds
        run_worker(handler, worker_config(s, handler), done_after(len(real), len(hostile)))

    got = {}
    for m in dead_letters(kafka_bootstrap, dlq, len(hostile)):
        got[orjson.loads(m.value())["request_id"]] = headers(m)["dlq.reason"].decode()
    expected = dict.fromkeys(hostile, "ts_in_future") | {"epoch": "ts_too_old"}
    assert got == expected
    profile = TrafficProfile(redis_client)
    # the real requests' weeks alone (an hour ago and a minute ahead: two, on a Monday at 00:xx)
    real_weeks = {
        week_and_hour(t)[0] for t in (now - timedelta(hours=1), now + timedelta(minutes=1))
    }
    assert set(profile.weeks("acme", "llama", "t1")) == real_weeks
    top = profile.top_queries("acme", "llama", "t1", range(HOURS_PER_WEEK), 10)
    assert sum(q.count for q in top) == len(real) and len(top) == 3


def _history(tenant: str, prompts: dict[str, int], monday: datetime) -> list[Any]:
    out = []
    for day in range(5):
        for p, n in prompts.items():
            for i in range(n):
                ts = monday + timedelta(days=day, hours=10, minutes=i)
                out.append(event(len(out), tenant, p, ts))
    return out


def test_profile__retention_follows_the_clock_not_the_newest_event(
    redis_client: redis.Redis,
) -> None:
    """Events that reached the profile before the worker bounded times (or through a worker
    without bounds) are in Redis: the reads must still end at the clock's week."""
    now = datetime(2026, 11, 16, 9, 0, tzinfo=UTC)  # a Monday morning
    profile = TrafficProfile(redis_client, retention_weeks=4, clock=lambda: now)
    last_week = (now - timedelta(days=7)).replace(hour=0)  # the Monday before, 00:00
    fill(profile, _history("acme", {"reset my password": 6, "refund status": 4}, last_week))
    future = [datetime(2999 + y, 3, 1, 10, tzinfo=UTC) for y in range(5)]  # 5 weeks, all newer
    fill(profile, [event(i, "acme", "attacker", ts) for i, ts in enumerate(future)])

    assert profile.weeks("acme", "m", "t1") == [week_and_hour(last_week)[0]]
    top = profile.top_queries("acme", "m", "t1", range(HOURS_PER_WEEK), 10)
    assert sorted(q.count for q in top) == [20, 30]  # no attacker query
    # and the scheduler's plan for the hour ahead warms the real queries
    window = Window(now.replace(hour=10), now.replace(hour=11))
    sel = HotSetSelector(
        profile,
        WordsEmbedder(),
        config=HotSetConfig(cluster_threshold=0.99, matcher="static", value_model="hits"),
    )
    plan = sel.plan(window, Budget(requests=5))
    assert {i.query for i in plan.items} == {"reset my password", "refund status"}


# -- the batch tally and the per-event path agree on bounds, to the microsecond --

NOW = datetime(2025, 3, 3, 11, 0, tzinfo=UTC)
TIMES = EventTimes(max_skew_s=1800.0, max_age_s=86_400.0)  # [2025-03-02 11:00, 11:30]
STAMPS = [
    "2025-03-03T11:30:00Z",  # exactly the latest accepted
    "2025-03-03T11:30:00.000001Z",  # 1 us past it
    "2025-03-03T11:29:59",  # naive, inside
    "2025-03-03T12:15:00+01:00",  # 11:15 UTC, inside
    "2025-03-03T13:00:00+01:00",  # 12:00 UTC, ahead
    "2025-03-02T11:00:00Z",  # exactly the earliest
    "2025-03-02T10:59:59.999999Z",  # 1 us before it
    "2025-03-02T10:30:00",  # naive, too old
    "1969-12-31T23:30:00Z",  # before 1970 (no hour window in the tally)
    "2999-01-01T00:00:00Z",
]
LAX = [{}, {"tokens_in": "5"}, {"tenant": "x{y"}, {"ts": None}]


def _messages(picks: list[tuple[int, int]]) -> list[Message]:
    values = [encode(request(i, ts=STAMPS[t]) | LAX[v]) for i, (t, v) in enumerate(picks)]
    return [Message(topic="inference.requests", partition=0, offset=i, value=v)
            for i, v in enumerate(values)]  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(STAMPS) - 1), st.integers(0, len(LAX) - 1)),
                min_size=1, max_size=30))  # fmt: skip
def test_tally__time_bounds_agree_with_the_per_event_path(picks: list[tuple[int, int]]) -> None:
    window = TIMES.at(NOW)
    messages = _messages(picks)
    out = Decoded(tally=dict.fromkeys(OUTCOMES, 0))
    deltas, good = BatchTally().add(messages, out, window)
    expected = observe_batch(messages, window)
    assert good == len(expected)
    assert {t: d.parts for t, d in deltas.items()} == {
        t: d.parts for t, d in aggregate(expected).items()
    }
    for p in out.poison:  # each refusal is decode_event's, or the window's with its reason
        try:
            ev = decode_event(p.message.value() or b"")
        except EventDecodeError as e:
            assert p.error.reason == e.reason
            continue
        refusal = window.refusal(ev.ts)
        assert refusal is not None and p.error.reason == refusal.reason
    assert {p.message.offset() for p in out.poison}.isdisjoint({o.offset for o in expected})
