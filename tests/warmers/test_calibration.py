"""The forecast calibrated online against the landed warms' hits: notes of landed warms, hits
credited once inside their window and tenant, the factor, the traffic worker's part (warm
hits decoded from the request log) and the planner's (its rates scaled)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
import redis
from confluent_kafka import Message

from backends.base import GenerationRequest
from tests.events import encode, request
from tests.warmers.hotset_helpers import fill
from tests.warmers.test_hotset import NEXT_MONDAY_10, _ramp, _selector
from warmers.hotset.calibration import Calibration
from warmers.hotset.plan import Plan, PlanItem, WarmItem
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

T0 = datetime(2026, 11, 30, 10, tzinfo=UTC)
WINDOW = Window(T0, T0 + timedelta(hours=1))
NOW = (T0 - timedelta(minutes=20)).timestamp()  # the run lands before its window


def _item(tenant: str, prompt: str, *, p: float | None = None, hits: float = 0.0) -> PlanItem:
    wi = WarmItem.of(GenerationRequest(tenant, "m", "v1", "t1", prompt))
    return PlanItem(tenant, "m", "v1", "t1", prompt, prompt, 1, hits, 800.0, 800.0, "why", wi,
                    p_asked=p)  # fmt: skip


def _plan(*items: PlanItem) -> Plan:
    return Plan(WINDOW, Budget(requests=10), items=list(items))


def _digest(i: PlanItem) -> str:
    return i.item.identity.key().exact().rsplit(":", 1)[-1]


@pytest.mark.topologies
def test_calibration__a_landed_warm_counts_once_when_asked_inside_its_window_and_tenant(
    redis_client: redis.Redis,
) -> None:
    a, b = _item("acme", "a", p=0.6), _item("acme", "b", hits=2.0)
    g, never = _item("globex", "g", p=0.9), _item("acme", "never landed", p=0.5)
    cal = Calibration(redis_client, clock=lambda: NOW)
    keys = [i.item.identity.key().exact() for i in (a, b, g)]
    assert cal.landed(_plan(a, b, g, never), keys) == 3
    inside, after = T0.timestamp() + 60, WINDOW.end.timestamp() + 5
    # a twice (its first hit counts), never's digest (no note), a's digest in globex (no note)
    assert cal.hits({"acme": [(_digest(a), inside), (_digest(a), inside + 1),
                              (_digest(never), inside)],
                     "globex": [(_digest(a), inside), (_digest(g), after)]}) == 1  # fmt: skip
    assert cal.hits({"acme": [(_digest(a), inside)]}) == 0  # a re-delivered batch
    acme = cal.factor("acme")
    expected = 0.6 + (1 - math.exp(-2.0))  # b valued by hits: 1 - e^-hits
    assert acme.expected == pytest.approx(expected) and acme.realised == 1
    assert acme.factor == pytest.approx((1 + 10) / (expected + 10))
    globex = cal.factor("globex")
    assert (globex.expected, globex.realised) == (pytest.approx(0.9), 0)  # asked after its end
    assert cal.factor("initech").factor == 1.0  # nothing known: the prior
    shy = Calibration(redis_client, prior=0.0, clock=lambda: NOW).factor("globex")
    assert shy.factor == 0.25  # clipped: never below a quarter


def test_traffic__the_warm_hits_of_the_request_log_are_credited(redis_client: redis.Redis) -> None:
    a, b = _item("acme", "a", p=0.5), _item("acme", "b", p=0.5)
    cal = Calibration(redis_client, clock=lambda: NOW)
    cal.landed(_plan(a, b), [i.item.identity.key().exact() for i in (a, b)])
    v2 = {"schema_version": 2, "request": {"api": "chat", "body": {"model": "m"}},
          "ts": (T0 + timedelta(minutes=5)).isoformat()}  # fmt: skip
    events = [
        request(0, **v2, cache_outcome="exact", cache_key=_digest(a), cache_source="live"),
        request(1, **v2, cache_outcome="miss"),
        request(2, **v2, cache_outcome="semantic", cache_key=_digest(a), cache_source="warm"),
        # lax input (a number as a string): the slow path decodes it, and credits it too
        request(3, **v2, cache_outcome="exact", cache_key=_digest(b), cache_source="warm",
                latency_ms="3.5"),
    ]  # fmt: skip
    msgs = [Message(topic="inference.requests", partition=0, offset=i, value=encode(e))
            for i, e in enumerate(events)]  # fmt: skip
    handler = TrafficHandler(TrafficProfile(redis_client), calibration=cal)
    decoded = handler.decode_batch(msgs)
    assert decoded.good == 4 and not decoded.poison
    handler.apply_decoded(decoded)
    assert cal.factor("acme").realised == 2  # the warm-sourced hits, not the live one


def test_hotset__a_tenants_forecast_is_scaled_by_its_calibration(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    fill(profile, _ramp("acme", 40))
    sel = _selector(profile, value_model="prevented")
    plain = sel.plan(NEXT_MONDAY_10, Budget(requests=10))
    cal = Calibration(redis_client)
    sel.calibration = cal
    # 20 landed warms each given p 1 in a window still open, none asked yet: x 10/30
    items = [_item("acme", f"w{n}", p=1.0) for n in range(20)]
    soon = Window.next_hour()
    cal.landed(Plan(soon, Budget(requests=20), items=items),
               [i.item.identity.key().exact() for i in items])  # fmt: skip
    scaled = sel.plan(NEXT_MONDAY_10, Budget(requests=10))
    (hot,), (hot_scaled,) = plain.items, scaled.items
    assert sum(hot_scaled.rates) == pytest.approx(sum(hot.rates) * 10 / 30)
    assert plain.calibration == {}
    assert scaled.calibration["acme"] == "forecast x0.33 (landed warms: 0 asked of 20.0 expected)"
