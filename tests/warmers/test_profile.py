"""The traffic profile on a real redis-server: counts, costs, representatives, exactly-once."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime

import pytest
import redis
from confluent_kafka import Message

from caches import keys as K
from tests.events import encode, request
from warmers.traffic.decode import FastDecoder
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile, week_and_hour
from warmers.traffic.worker import TrafficHandler

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py

MONDAY_10 = week_and_hour(datetime(2025, 3, 3, 10, 15, tzinfo=UTC))


def _batch(payloads: list[dict], partition: int = 0, first_offset: int = 0) -> list[Message]:
    return [
        Message(
            topic="inference.requests",
            partition=partition,
            offset=first_offset + i,
            value=encode(p),
        )
        for i, p in enumerate(payloads)
    ]


def _ingest(profile: TrafficProfile, messages: list[Message]) -> int:
    # As the worker does: the batch tally, then one write (per-event replay on a refusal).
    h = TrafficHandler(profile)
    decoded = h.decode_batch(messages)
    assert decoded.poison == []
    return sum(profile.write_deltas(b.deltas, b.observations) for b in decoded.items)


def _total(profile: TrafficProfile, tenant: str = "acme") -> int:
    stats = profile.top_queries(tenant, "llama", "t1", range(HOURS_PER_WEEK), 10_000)
    return sum(s.count for s in stats)


def test_profile__counts_per_query_and_hour(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    payloads = [request(i) for i in range(70)]  # 7 prompts x 10
    payloads += [request(100, ts="2025-03-04T11:00:00Z", prompt="tuesday question")]
    assert _ingest(profile, _batch(payloads)) == 71
    top = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 3)
    assert [s.count for s in top] == [10, 10, 10]
    assert all(s.weeks == 1 for s in top)
    tuesday = profile.top_queries("acme", "llama", "t1", [24 + 11], 10)
    assert [s.count for s in tuesday] == [1]
    hourly = profile.hourly_counts("acme", "llama", "t1")
    assert hourly[MONDAY_10[0]].warmable[MONDAY_10[1]] == 70
    assert profile.daily_counts("acme", "llama", "t1")[date(2025, 3, 4)][11] == 1
    assert profile.namespaces("acme") == [("llama", "t1")]
    assert profile.tenants() == ["acme"]


def test_profile__never_cacheable_counted_apart(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    payloads = [
        request(1, params={"temperature": 0.7}),
        request(2, params={"no_cache": True}),
        request(3),
    ]
    _ingest(profile, _batch(payloads))
    hc = profile.hourly_counts("acme", "llama", "t1")[MONDAY_10[0]]
    assert (hc.warmable[MONDAY_10[1]], hc.uncacheable[MONDAY_10[1]]) == (1, 2)
    assert _total(profile) == 1


def test_profile__miss_cost_and_representative(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    same = "what is the refund policy?"
    payloads = [
        request(1, prompt=same, gpu_ms=100.0, tokens_in=10, tokens_out=30),
        request(2, prompt="What is the  refund policy?", gpu_ms=300.0, tokens_in=10, tokens_out=50),
        request(3, prompt=same, cache_outcome="exact", gpu_ms=0.0),
        request(4, prompt=same, context_docs=[{"doc_id": "kb-1", "version": 3}], gpu_ms=200.0),
    ]
    _ingest(profile, _batch(payloads))
    [top] = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 5)
    assert top.count == 4  # normalised prompt; doc version bumps keep the count
    cost = profile.miss_costs("acme", "llama", "t1", [top.qkey])[top.qkey]
    assert (cost.misses, cost.gpu_ms, cost.tokens) == (3, 600.0, 10 + 30 + 10 + 50 + 30)
    assert cost.gpu_ms_per_miss == 200.0
    rep = profile.representative("acme", "llama", "t1", top.qkey)
    assert rep is not None
    assert rep["prompt"] == same and rep["context_docs"] == [{"doc_id": "kb-1", "version": 3}]


def test_profile__a_miss_latency_is_kept_apart_from_its_gpu_time(redis_client: redis.Redis) -> None:
    # What the caller waited (queueing, prefill, decode) is not the GPU time the answer took;
    # the value model weighs the first (STOKER_WARM_LATENCY_WEIGHT), so the profile keeps it.
    profile = TrafficProfile(redis_client)
    q = {"prompt": "why is my order late?", "gpu_ms": 200.0}
    payloads = [
        request(1, latency_ms=2_500.0, **q),
        request(2, latency_ms=500.0, **q),
        request(3, cache_outcome="exact", latency_ms=4.0, gpu_ms=0.0, prompt=q["prompt"]),
    ]
    _ingest(profile, _batch(payloads))
    [top] = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 5)
    cost = profile.miss_costs("acme", "llama", "t1", [top.qkey])[top.qkey]
    assert (cost.misses, cost.gpu_ms, cost.latency_ms) == (2, 400.0, 3_000.0)
    assert cost.latency_ms_per_miss == 1_500.0  # the hit's 4 ms is not a miss's


def test_profile__a_cost_row_from_before_latency_takes_its_gpu_time_as_latency(
    redis_client: redis.Redis,
) -> None:
    # A profile written by the previous release holds "<misses> <gpu us> <tokens>": read, and
    # added to by a new batch, its latency is its GPU time (the value model's old stand-in).
    profile = TrafficProfile(redis_client)
    q = {"prompt": "reset my password", "gpu_ms": 100.0, "tokens_in": 5, "tokens_out": 5}
    _ingest(profile, _batch([request(1, latency_ms=900.0, **q)]))
    [top] = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 5)
    key = K.profile_week_key("acme", "k", "llama", "t1", MONDAY_10[0])
    assert redis_client.hget(key, top.qkey) == b"1 100000 10 900000"
    redis_client.hset(key, top.qkey, "2 300000 20")  # as the previous release wrote it
    old = profile.miss_costs("acme", "llama", "t1", [top.qkey])[top.qkey]
    assert (old.misses, old.gpu_ms, old.latency_ms) == (2, 300.0, 300.0)
    _ingest(profile, _batch([request(2, latency_ms=900.0, **q)], first_offset=1))
    assert redis_client.hget(key, top.qkey) == b"3 400000 30 1200000"
    cost = profile.miss_costs("acme", "llama", "t1", [top.qkey])[top.qkey]
    assert (cost.misses, cost.gpu_ms, cost.latency_ms) == (3, 400.0, 1_200.0)


def test_profile__counts_and_costs_add_up_across_batches_and_weeks(
    redis_client: redis.Redis,
) -> None:
    # The second batch adds to what the first wrote (the read-modify-write of APPLY_LUA), and a
    # week later the reads sum both weeks.
    profile = TrafficProfile(redis_client)
    miss = {"prompt": "same question", "gpu_ms": 250.5, "tokens_in": 7, "tokens_out": 8}
    _ingest(profile, _batch([request(i, **miss) for i in range(3)]))
    _ingest(profile, _batch([request(i, **miss) for i in range(3, 5)], first_offset=3))
    next_week = request(9, ts="2025-03-10T10:15:00Z", **miss)
    _ingest(profile, _batch([next_week], first_offset=5))
    [top] = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 5)
    assert (top.count, top.weeks) == (6, 2)
    cost = profile.miss_costs("acme", "llama", "t1", [top.qkey])[top.qkey]
    assert (cost.misses, cost.gpu_ms, cost.tokens) == (6, 6 * 250.5, 6 * 15)
    # the weeks' summaries sum to the same, and a cell reads what top_queries summed
    assert profile.week_counts("acme", "llama", "t1") == {top.qkey: 6}
    week, how = MONDAY_10
    assert profile.hour_cells("acme", "llama", "t1", [(week, how), (week + 1, how)]) == [
        {top.qkey: 5},
        {top.qkey: 1},
    ]


def test_profile__cluster_key_groups_paraphrases(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    payloads = [
        request(1, prompt="reset my password", cluster_key="pw"),
        request(2, prompt="how to change password", cluster_key="pw"),
    ]
    _ingest(profile, _batch(payloads))
    top = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 5)
    assert [(s.qkey.startswith("c:"), s.count) for s in top] == [(True, 2)]


def test_profile__tenants_never_share_keys(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    _ingest(profile, _batch([request(1, tenant="a"), request(2, tenant="b"), request(3)]))
    assert _total(profile, "a") == 1 and _total(profile, "b") == 1
    assert profile.top_queries("nobody", "llama", "t1", [MONDAY_10[1]], 5) == []
    for key in redis_client.scan_iter(match="stk:*"):
        k = key.decode()
        assert k == "stk:p:tenants" or k.startswith(("stk:{t:a}:", "stk:{t:b}:", "stk:{t:acme}:"))
        if k != "stk:p:tenants":
            assert 0 < redis_client.ttl(key) <= profile.ttl_s  # retention: every key expires


def test_profile__redelivered_batch_is_not_counted_twice(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    msgs = _batch([request(i, tenant=f"t{i % 3}") for i in range(30)])
    assert _ingest(profile, msgs) == 30
    assert _ingest(profile, msgs) == 0  # a crash before the commit: the same batch again
    assert sum(_total(profile, f"t{i}") for i in range(3)) == 30


def test_profile__redelivery_with_other_boundaries_is_exact(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    msgs = _batch([request(i) for i in range(40)], partition=2, first_offset=1000)
    _ingest(profile, msgs[:25])
    # Redelivered from offset 1010 in a bigger batch: 1010..1024 are known, 1025..1039 new.
    assert _ingest(profile, msgs[10:]) == 15
    assert _total(profile) == 40
    assert profile.watermarks("acme") == {"inference.requests:2": 1039}


def test_profile__partitions_have_their_own_watermarks(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client)
    _ingest(profile, _batch([request(i) for i in range(5)], partition=0, first_offset=50))
    _ingest(profile, _batch([request(i) for i in range(5)], partition=1, first_offset=0))
    assert _total(profile) == 10


def test_profile__redis_down_is_cache_unavailable() -> None:
    import pytest
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from schemas.errors import CacheUnavailable
    from stoker.embedded import free_port

    # No retries: redis-py's default retry with backoff would only make the test slower.
    r = redis.Redis(
        port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), retries=0)
    )
    profile = TrafficProfile(r)
    h = TrafficHandler(profile)
    decoded = h.decode_batch(_batch([request(1)]))
    with pytest.raises(CacheUnavailable):
        h.apply_decoded(decoded)


def _asked(prompts: list[str], first_offset: int) -> list[Message]:
    return _batch([request(i, prompt=p) for i, p in enumerate(prompts)], first_offset=first_offset)


def _bounded_stream() -> list[list[str]]:
    """Four batches of one hour: 3 heavy queries asked from the start, then a tail of 30
    one-offs per batch, and "late" which grows heavy only once the week is full."""
    heavy = [f"heavy {i}" for i in range(3) for _ in range(6 - i)]  # asked 6, 5, 4 times
    tail = [[f"once {b} {i}" for i in range(30)] for b in range(4)]
    late = [[], [], ["late"] * 9, ["late"] * 9]
    return [heavy + tail[b] + late[b] for b in range(4)]


def _hour_fields(redis_client: redis.Redis, kind: str) -> int:
    keys = list(redis_client.scan_iter(match=f"stk:{{t:acme}}:p:{kind}:*"))
    return sum(int(redis_client.hlen(k)) for k in keys)


@pytest.mark.standalone_only("scans one tenant's keys; the cluster run adds nothing the rest miss")
def test_profile__a_week_keeps_at_most_its_capacity(redis_client: redis.Redis) -> None:
    profile = TrafficProfile(redis_client, week_capacity=8)
    offset = 0
    truth: dict[str, int] = {}
    for prompts in _bounded_stream():
        for p in prompts:
            truth[p] = truth.get(p, 0) + 1
        _ingest(profile, _asked(prompts, offset))
        offset += len(prompts)
        assert _hour_fields(redis_client, "s") <= 8
    # Only tracked queries have a cost and a representative (hourly counts of evicted ones
    # stay until their hour needs the room).
    assert _hour_fields(redis_client, "s") == 8
    assert _hour_fields(redis_client, "k") == _hour_fields(redis_client, "r") == 8
    top = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 100)
    assert len(top) <= 1_000  # the hour's own bound (default capacity)
    reps = profile.representatives("acme", "llama", "t1", [s.qkey for s in top])
    by_prompt = {reps[s.qkey]["prompt"]: s for s in top if s.qkey in reps}
    assert len(by_prompt) == 8  # the tracked ones
    # Tracked before the week overflowed: exact, across four batches.
    assert [by_prompt[f"heavy {i}"].count for i in range(3)] == [24, 20, 16]
    # Entered once full: counted hourly from then on (18 of 18: it stayed).
    assert by_prompt["late"].count == truth["late"] == 18
    assert top[0].qkey == by_prompt["heavy 0"].qkey and by_prompt["late"] in top[:4]
    # The hour's totals stay exact whatever the summary drops.
    hc = profile.hourly_counts("acme", "llama", "t1")[MONDAY_10[0]]
    assert hc.warmable[MONDAY_10[1]] == sum(truth.values())


def test_profile__a_query_evicted_and_asked_again_gets_a_representative(
    redis_client: redis.Redis,
) -> None:
    # The writer's memo held the representative back as already written; the week had evicted
    # it meanwhile. The script names it, and the next miss writes it again.
    profile = TrafficProfile(redis_client, week_capacity=2)
    _ingest(profile, _asked(["again"], 0))
    _ingest(profile, _asked(["x", "x", "y", "y"], 1))  # "again" (1) is evicted by x and y (2)
    stats = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 5)
    assert [s.count for s in stats] == [2, 2, 1]  # its hourly count stays while there is room
    assert stats[2].qkey not in profile.representatives("acme", "llama", "t1", [stats[2].qkey])
    _ingest(profile, _asked(["again"] * 3, 5))  # back in; its memo entry is dropped
    top = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 5)[0]
    assert top.count == 4  # 1 + 3: the truth
    _ingest(profile, _asked(["again"], 8))
    rep = profile.representative("acme", "llama", "t1", top.qkey)
    assert rep is not None and rep["prompt"] == "again"


def test_profile__capacity_must_be_positive(redis_client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="capacities"):
        TrafficProfile(redis_client, week_capacity=0)
    with pytest.raises(ValueError, match="capacities"):
        TrafficProfile(redis_client, hour_capacity=0)


def test_profile__an_hour_keeps_its_top_by_the_hours_then_the_weeks_count(
    redis_client: redis.Redis,
) -> None:
    profile = TrafficProfile(redis_client, week_capacity=100, hour_capacity=3)
    tuesday = "2025-03-04T09:00:00Z"
    # "weekly" is asked once at Monday 10:00 but 5 times on Tuesday; "one-off x" once each.
    first = [request(i, prompt="weekly", ts=tuesday) for i in range(5)]
    _ingest(profile, _batch(first))
    monday = ["top"] * 4 + ["second"] * 2 + [f"one-off {i}" for i in range(6)] + ["weekly"]
    _ingest(profile, _asked(monday, 5))
    top = profile.top_queries("acme", "llama", "t1", [MONDAY_10[1]], 10)
    reps = profile.representatives("acme", "llama", "t1", [s.qkey for s in top])
    assert [(reps[s.qkey]["prompt"], s.count) for s in top] == [
        ("top", 4),
        ("second", 2),
        ("weekly", 1),  # outranks the one-offs asked as often this hour
    ]
    hc = profile.hourly_counts("acme", "llama", "t1")[MONDAY_10[0]]
    assert hc.warmable[MONDAY_10[1]] == len(monday)  # the totals stay exact


def test_profile__a_full_hour_keeps_its_top_by_count_then_week_then_name(
    redis_client: redis.Redis,
) -> None:
    # Many ties, batch after batch: the hour keeps what a plain ranking keeps, (the hour's
    # count, the week's count) descending, then the smaller query key; an evicted query
    # comes back at its own count.
    profile = TrafficProfile(redis_client, week_capacity=100, hour_capacity=4)
    rng = random.Random(5)
    prompts = [f"tie {i}" for i in range(12)]
    qkey = {p: _qkey(p) for p in prompts}
    hour: dict[str, int] = {}
    week: dict[str, int] = {}
    offset = 0
    for _ in range(6):
        asked = rng.choices(prompts, k=rng.randrange(3, 20))
        _ingest(profile, _asked(asked, offset))
        offset += len(asked)
        for p in asked:
            hour[qkey[p]] = hour.get(qkey[p], 0) + 1
            week[qkey[p]] = week.get(qkey[p], 0) + 1
        ranked = sorted(hour, key=lambda q: (-hour[q], -week[q], q))
        hour = {q: hour[q] for q in ranked[:4]}
        key = K.profile_hour_key("acme", "llama", "t1", *MONDAY_10)
        stored = {k.decode(): int(v) for k, v in redis_client.hgetall(key).items()}
        assert stored == hour


def _qkey(prompt: str) -> str:
    obs = FastDecoder().observe(encode(request(0, prompt=prompt)), "p", 0)
    assert obs is not None
    return obs.qkey
