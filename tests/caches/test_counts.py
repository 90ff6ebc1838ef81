"""The error budget's counts in Redis: the same answers as MemoryCounts, one tenant slot, a
window that ages evidence out, and two replicas that learn from each other's verdicts."""

from __future__ import annotations

import random

import pytest
import redis

from caches.client import CacheClient
from caches.matching.bounds import Strata
from caches.matching.counts import RedisCounts, audited_key, budget_key
from caches.matching.error_budget import ErrorBudget, MemoryCounts, ServingLevels
from caches.matching.verified import Level, VerifiedMatcher
from caches.request import CacheRequest
from caches.slots import slot
from schemas.errors import CacheUnavailable
from stoker.redisconn import connect

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py

WEEK = 7 * 86_400.0


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_counts__agree_with_memory_counts(redis_client: redis.Redis):
    rng = random.Random(3)
    mem, red = MemoryCounts(), RedisCounts(redis_client)
    for _ in range(300):
        args = (rng.choice(["acme", "glo:bex{x}"]), rng.choice(["", "/v1/chat", "faq"]),
                rng.randrange(12), rng.random() < 0.1)  # fmt: skip
        audited = rng.random() < 0.3
        mem.add(*args, audited=audited)
        red.add(*args, audited=audited)
    for tenant in ("acme", "glo:bex{x}", "initech"):
        for route in ("", "/v1/chat", "faq"):
            assert red.read_strata(tenant, route, 13) == mem.read_strata(tenant, route, 13)
            assert red.read(tenant, route, 5) == mem.read(tenant, route, 5)
    assert any(c.audited and c.shadow for c in mem.read_strata("acme", "faq", 13))


def test_counts__a_tenant_s_keys_share_its_slot_and_expire(redis_client: redis.Redis):
    clock = Clock()
    c = RedisCounts(redis_client, WEEK, clock=clock)
    keys = {budget_key("acme", "faq", b) for b in range(100)} | {budget_key("acme", "x", 1)}
    assert len({slot(k) for k in keys}) == 1
    c.add("acme", "faq", 2, wrong=True)
    key = budget_key("acme", "faq", int(clock.t // c.bucket_s))
    assert key.startswith("stk:{t:acme}:b:faq:")
    assert redis_client.hgetall(key) == {b"c2": b"1", b"w2": b"1"}
    c.add("acme", "faq", 10, wrong=False, audited=True)  # audits: fields of their own
    assert redis_client.hgetall(key) == {b"c2": b"1", b"w2": b"1", b"ac10": b"1"}
    assert 0 < redis_client.ttl(key) <= c.ttl_s <= WEEK * 1.125 + 1


def test_counts__what_was_counted_before_the_strata_reads_as_shadow_checks(
    redis_client: redis.Redis,
):
    # An older writer counted every verdict, audit or shadow check, in c<s>/w<s>; a field
    # no strength parses from is no count.
    clock = Clock()
    c = RedisCounts(redis_client, WEEK, clock=clock)
    key = budget_key("acme", "old", int(clock.t // c.bucket_s))
    redis_client.hset(key, mapping={"c1": 7, "w1": 2, "x1": 5, "c": 9, "acx": 4})
    redis_client.expire(key, 60)
    c.add("acme", "old", 1, wrong=True, audited=True)
    assert c.read_strata("acme", "old", 3)[1] == Strata(7, 2, 1, 1)
    assert c.read("acme", "old", 3) == [(0, 0), (8, 3), (0, 0)]


def test_counts__evidence_ages_out_after_its_window(redis_client: redis.Redis):
    clock = Clock()
    c = RedisCounts(redis_client, WEEK, clock=clock)
    c.add("acme", "faq", 1, wrong=False)
    clock.t += WEEK / 2
    c.add("acme", "faq", 1, wrong=True)
    assert c.read("acme", "faq", 3) == [(0, 0), (2, 1), (0, 0)]
    clock.t += WEEK * 0.6 + c.bucket_s  # the first verdict is over a window and a bucket old
    assert c.read("acme", "faq", 3) == [(0, 0), (1, 1), (0, 0)]
    clock.t += WEEK
    assert c.read("acme", "faq", 3) == [(0, 0), (0, 0), (0, 0)]


def test_counts__refuse_a_window_or_strength_that_is_none(redis_client: redis.Redis):
    with pytest.raises(ValueError, match="window"):
        RedisCounts(redis_client, 0)
    with pytest.raises(ValueError, match="strength"):
        RedisCounts(redis_client).add("acme", "", -1, wrong=False)


@pytest.mark.standalone_only("a refused connection is the same on either topology")
def test_serving_levels__cached_and_kept_when_redis_cannot_say(redis_client: redis.Redis):
    clock = Clock(0.0)
    budget = ErrorBudget(RedisCounts(redis_client), levels=3, max_wrong_rate=0.5)
    levels = ServingLevels(budget, refresh_s=10, clock=clock)
    assert levels.level("acme", "") == 2  # no evidence: strictest
    for _ in range(5):  # 0.5 ** 5 < 5%: five clean verdicts show a 50% budget
        budget.record("acme", "", 2, wrong=False)
    assert levels.level("acme", "") == 2  # read 0 s ago: cached
    clock.t = 10
    assert levels.level("acme", "") == 0
    [s] = levels.serving()
    assert (s.level, s.evidence.checked, s.evidence.wrong) == (0, 5, 0)
    # Redis gone: the last level read serves on, and a pair never read serves strict
    down = ErrorBudget(RedisCounts(connect("redis://127.0.0.1:1")), levels=3, max_wrong_rate=0.5)
    with pytest.raises(CacheUnavailable):
        down.bounds("acme", "")
    levels.budget = down
    clock.t = 20
    assert levels.level("acme", "") == 0
    assert levels.level("globex", "") == 2


def _replica(base: CacheClient, url: str) -> tuple[CacheClient, ServingLevels]:
    """One gateway replica: its own Redis connections and counts, the shared stores."""
    r = connect(url, decode_responses=False)
    budget = ErrorBudget(RedisCounts(r), levels=2, max_wrong_rate=0.5)
    levels = ServingLevels(budget, refresh_s=0)
    ladder = (Level(0.6, 1), Level(0.99, 1))
    client = CacheClient(
        r, semantic=base.semantic, embedder=base.embedder, policy=base.policy, budget=budget,
        shadow_share=1.0, matcher=VerifiedMatcher(levels, ladder=ladder),
    )  # fmt: skip
    return client, levels


def _req(prompt: str) -> CacheRequest:
    return CacheRequest("acme", "llama-3-8b", "v1", "t1", prompt)


WEATHER = "Sunny and 21 degrees all afternoon."


def test_replicas__one_s_shadow_verdicts_loosen_the_other(cache_client: CacheClient, redis_url):
    a, a_levels = _replica(cache_client, redis_url)
    b, b_levels = _replica(cache_client, redis_url)
    for prompt in ("what is the weather like today", "how is the weather today"):
        res = a.lookup(_req(prompt))
        assert res.outcome == "miss"
        assert a.store(res, WEATHER).semantic_indexed
    query = _req("tell me today's weather please")
    assert b.lookup(query).outcome == "miss"  # no evidence anywhere: the strict level
    # Replica a misses near the cached answers at the strict level; each live answer it then
    # gets agrees with the candidate's: five verdicts, in Redis.
    asked = ["what's the weather today", "weather today?", "what will the weather be today",
             "today's weather forecast", "how's the weather looking today"]  # fmt: skip
    for prompt in asked:
        miss = a.lookup(_req(prompt))
        assert miss.outcome == "miss" and miss.shadow is not None, prompt
        assert a.store(miss, "Sunny, 21 degrees this afternoon.").landed
    assert a.budget is not None and a.budget.bounds("acme", "")[0].checked >= 5
    # Replica b never saw any of it, and now serves the look-alike at the loose level.
    hit = b.lookup(query)
    assert hit.outcome == "semantic" and hit.rule.startswith("verified:L0:")
    assert b_levels.level("acme", "") == 0 == a_levels.level("acme", "")
    a.redis.close()
    b.redis.close()


def test_counts__add_once_counts_a_request_once_in_its_tenant_slot(redis_client: redis.Redis):
    c, mem = RedisCounts(redis_client), MemoryCounts()
    for counts in (c, mem):
        assert counts.add_once("acme", "faq", 1, True, "e1")
        assert not counts.add_once("acme", "faq", 1, True, "e1")  # re-delivered: not again
        assert counts.add_once("globex", "faq", 1, False, "e1")  # another tenant's e1
        assert counts.read("acme", "faq", 2) == [(0, 0), (1, 1)]
        assert counts.read_strata("acme", "faq", 2)[1] == Strata(0, 0, 1, 1)  # an audit
    assert slot(audited_key("acme", "e1")) == slot(budget_key("acme", "faq", 0))
    assert 0 < redis_client.ttl(audited_key("acme", "e1")) <= c.ttl_s
    budget = ErrorBudget(c, levels=2, max_wrong_rate=0.5)
    assert not budget.record_once("acme", "faq", 5, False, "e2")  # no such level: ignored
