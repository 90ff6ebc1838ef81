"""The prefix warm before each day's peak: the busiest hour per model and weekday from a real
traffic profile, and the warm sent to the simulated backend over HTTP in the lead before it,
once a day."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import redis

from simulation.backend.http import SimulatorThread
from tests.warmers.hotset_helpers import event, fill
from warmers.prefix.before_peak import PeakPrefixWarm, busiest_hours
from warmers.prefix.hot import HotPrefixes, Prefix
from warmers.prefix.warm import PrefixWarmer, PrefixWarmOptions
from warmers.traffic.profile import TrafficProfile

MONDAY = datetime(2026, 11, 2, tzinfo=UTC)
LATER = MONDAY + timedelta(days=14)  # a Monday two weeks on: the history is retained


def _history() -> list:
    """Each day: 2 requests an hour; Mondays 30 more at 14:00, Saturdays 30 more at 10:00."""
    out = []
    for day in range(7):
        for h in range(24):
            for i in range(2):
                out.append(
                    event(
                        len(out),
                        "acme",
                        f"q {h} {i}",
                        MONDAY + timedelta(days=day, hours=h, minutes=i),
                    )
                )
        peak = {0: 14, 5: 10}.get(day)
        for i in range(30 if peak is not None else 0):
            ts = MONDAY + timedelta(days=day, hours=peak or 0, minutes=i)
            out.append(event(len(out), "acme" if i % 2 else "globex", f"peak {i}", ts))
    return out


def test_busiest_hours__per_model_and_weekday_over_every_tenant(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client, clock=lambda: LATER)
    assert busiest_hours(profile) == {}
    fill(profile, _history())
    hours = busiest_hours(profile)["m"]
    assert hours[0] == 14 and hours[5] == 10  # Monday, Saturday
    assert hours[2] == 0  # a flat day: its first hour (ties go to the earliest)


def test_peak_prefix_warm__sends_the_hot_prefixes_in_the_lead_before_the_peak_once_a_day(
    redis_client: redis.Redis,
) -> None:
    profile = TrafficProfile(redis_client, clock=lambda: LATER)
    fill(profile, _history())
    store = HotPrefixes(redis_client)
    system = " ".join(f"w{j}" for j in range(64))
    store.add("acme", "m", [(Prefix("sim-model", (("system", system),), 64), 10)], now=time.time())
    now = [LATER.replace(hour=12)]
    with SimulatorThread() as sim:
        warmer = PrefixWarmer(store, PrefixWarmOptions(backend_url=sim.url, qps=50))
        job = PeakPrefixWarm(profile, warmer.warm, lead_s=1800, clock=lambda: now[0])
        assert job() == []  # 2 h before Monday's 14:00 peak
        now[0] = LATER.replace(hour=13, minute=40)
        assert job() == ["m"]
        assert sim.stats().served == 1  # the prefix went to the backend
        now[0] = LATER.replace(hour=13, minute=55)
        assert job() == []  # once a day
        now[0] = LATER + timedelta(days=5, hours=9, minutes=35)  # Saturday, 25 min before 10:00
        assert job() == ["m"]
        assert sim.stats().served == 2
