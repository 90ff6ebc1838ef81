"""A hostile tenant flood against the hot-set budget: the real tenants keep their share.

The profile is written by the real traffic worker from Kafka, as a flood would reach it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from streams.topics import ensure_topics
from streams.worker import WorkerConfig
from tests.events import encode, request
from tests.faults.faults_helpers import done_after, produce_raw, run_worker
from tests.warmers.hotset_helpers import WordsEmbedder
from warmers.hotset.options import HotSetConfig
from warmers.hotset.select import HotSetSelector
from warmers.hotset.warm_budget import DEFAULT_CAP, Budget
from warmers.hotset.window import Window
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

MONDAY = datetime(2026, 11, 2, tzinfo=UTC)  # a week of history from here
WINDOW = Window(MONDAY + timedelta(days=7, hours=10), MONDAY + timedelta(days=7, hours=11))
BUDGET = 60
HONEST = {"acme": 30, "globex": 30}  # hot queries each, asked 10 times a weekday at 10:00


def _events(tenant: str, prompts: int, per_day: int, start: int) -> list[dict[str, Any]]:
    out = []
    for day in range(5):
        for q in range(prompts):
            for i in range(per_day):
                ts = MONDAY + timedelta(days=day, hours=10, minutes=(q + i) % 60)
                out.append(request(start + len(out), tenant=tenant, model_id="m",
                                   prompt=f"{tenant} question {q}", ts=ts.isoformat(),
                                   context_docs=[], params={"temperature": 0.0}))  # fmt: skip
    return out


def _profile_from_kafka(
    events: list[dict[str, Any]], kafka_bootstrap: str, r: redis.Redis, unique: str
) -> TrafficProfile:
    prefix = f"fl{unique}."
    topic = f"{prefix}inference.requests"
    ensure_topics(kafka_bootstrap, {topic: 1})
    produce_raw(kafka_bootstrap, topic, [(encode(e), None) for e in events])
    cfg = WorkerConfig(
        bootstrap=kafka_bootstrap, group_id=f"g{unique}", embedded=True, topic_prefix=prefix
    )
    run_worker(TrafficHandler(TrafficProfile(r)), cfg, done_after(len(events), 0))
    return TrafficProfile(r)


def _plan(profile: TrafficProfile) -> dict[str, int]:
    sel = HotSetSelector(
        profile,
        WordsEmbedder(),
        config=HotSetConfig(cluster_threshold=0.99, matcher="static", value_model="hits"),
    )
    plan = sel.plan(WINDOW, Budget(requests=BUDGET))
    assert len(plan.items) <= BUDGET
    return {t: sum(1 for i in plan.items if i.tenant == t) for t in (*HONEST, "evil")}


def test_hotset__a_hostile_tenant_flood_cannot_take_the_real_tenants_budget(
    kafka_bootstrap: str, redis_client: redis.Redis, unique: str
) -> None:
    honest = [e for i, (t, n) in enumerate(HONEST.items()) for e in _events(t, n, 10, i * 10**6)]
    # 60 hot prompts at 11x the real tenants' volume each: uncapped weights gave it 50 of the
    # 60 warm requests and left acme and globex 5 each of the 30 they need
    flood = _events("evil", 60, 110, 10**7)
    profile = _profile_from_kafka(honest + flood, kafka_bootstrap, redis_client, unique)
    per = _plan(profile)
    n = len(per)
    floor = BUDGET / (DEFAULT_CAP + n - 1)  # the capped flood's share leaves each this much
    assert all(per[t] >= int(floor) for t in HONEST), per
    assert per["evil"] <= BUDGET * DEFAULT_CAP / (DEFAULT_CAP + n - 1) + 1, per
    assert sum(per.values()) == BUDGET


def test_hotset__a_burst_of_one_prompt_buys_one_warm_slot(
    kafka_bootstrap: str, redis_client: redis.Redis, unique: str
) -> None:
    honest = [e for i, (t, n) in enumerate(HONEST.items()) for e in _events(t, n, 10, i * 10**6)]
    burst = _events("evil", 1, 4_000, 10**7)  # 20,000 requests of one prompt
    per = _plan(_profile_from_kafka(honest + burst, kafka_bootstrap, redis_client, unique))
    # one prompt, however hot, is one entry; the 59 requests left serve the real tenants' 60
    assert per["evil"] == 1 and sum(per.values()) == BUDGET
    assert min(per["acme"], per["globex"]) >= 29, per
