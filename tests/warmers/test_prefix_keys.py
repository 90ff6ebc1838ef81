"""Keys of the traffic profile and the hot prefixes on a real Redis: models named like the
profile's own keys never share a key with it, and prefix counts written in the old layout
are still read."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis
from confluent_kafka import Message

from caches import keys as K
from tests.events import encode, request
from warmers.prefix.hot import HotPrefixes, Prefix
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile, week_and_hour
from warmers.traffic.worker import TrafficHandler

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py

MONDAY_10 = week_and_hour(datetime(2025, 3, 3, 10, 15, tzinfo=UTC))
SYSTEM = "You are the support assistant of a bank; answer in two sentences, " * 2


def _prefix(i: int) -> Prefix:
    return Prefix("m", (("system", f"template {i} " + SYSTEM),), 42)


def _ingest(profile: TrafficProfile, payloads: list[dict]) -> int:
    msgs = [
        Message(topic="inference.requests", partition=0, offset=i, value=encode(p))
        for i, p in enumerate(payloads)
    ]
    decoded = TrafficHandler(profile).decode_batch(msgs)
    return sum(profile.write_deltas(b.deltas, b.observations) for b in decoded.items)


@pytest.mark.parametrize("model", ["ns", "wm"])
def test_hot_prefixes__model_named_like_a_profile_key_keeps_both_stores(
    redis_client: redis.Redis, model: str
) -> None:
    # Both workers write the same tenant: the profile its namespace set and watermarks, the
    # prefixes worker the counts of a model whose name is one of those keys' last part.
    profile = TrafficProfile(redis_client)
    store = HotPrefixes(redis_client)
    store.add("acme", model, [(_prefix(1), 4)], now=1.0)
    assert _ingest(profile, [request(i, model_id=model) for i in range(3)]) == 3
    store.add("acme", model, [(_prefix(1), 1)], now=2.0)
    assert [(h.prefix, h.count) for h in store.top(model, 5)] == [(_prefix(1), 5.0)]
    assert profile.namespaces("acme") == [(model, "t1")]
    assert profile.watermarks("acme") == {"inference.requests:0": 2}
    stats = profile.top_queries("acme", model, "t1", range(HOURS_PER_WEEK), 10)
    assert sum(s.count for s in stats) == 3
    profile_keys = {K.profile_namespaces_key("acme"), K.profile_watermarks_key("acme")}
    assert K.prefix_counts_key("acme", model) not in profile_keys


def _legacy_counts_key(tenant: str, model: str) -> str:
    # The layout stoker wrote before prefix counts had a kind of their own.
    return f"{K.tenant_tag(tenant)}:p:{K.enc(model)}"


def test_hot_prefixes__prefix_counts_in_the_old_layout_are_read_and_moved(
    redis_client: redis.Redis,
) -> None:
    # Written as an older stoker left them, with raw commands: counts under the old key, the
    # meta (unchanged layout) beside them, the model's tenant index.
    old = _legacy_counts_key("acme", "llama")
    redis_client.zadd(old, {_prefix(1).digest: 7, _prefix(2).digest: 3})
    redis_client.expire(old, 3_600)
    store = HotPrefixes(redis_client)
    for p, seen in ((_prefix(1), 10.0), (_prefix(2), 11.0)):
        meta = {"model": p.model, "messages": p.messages, "tokens": p.tokens, "last_seen": seen}
        redis_client.hset(K.prefix_meta_key("acme", "llama"), p.digest, encode(meta))
    redis_client.sadd(K.prefix_index_key("llama"), "acme")
    # a reader started on the new code sees them, before any write
    top = store.top("llama", 5)
    assert [(h.prefix, h.count) for h in top] == [(_prefix(1), 7.0), (_prefix(2), 3.0)]
    assert redis_client.exists(old) == 0  # moved, not copied
    assert 0 < redis_client.ttl(K.prefix_counts_key("acme", "llama")) <= 3_600  # kept its TTL
    # idempotent: a second process reading again finds them where they went
    assert [h.count for h in HotPrefixes(redis_client).top("llama", 5)] == [7.0, 3.0]


def test_hot_prefixes__old_and_new_prefix_counts_merge_on_the_first_write(
    redis_client: redis.Redis,
) -> None:
    # A new writer already counted under the new key while an old one was still running.
    old = _legacy_counts_key("acme", "llama")
    redis_client.zadd(old, {_prefix(1).digest: 7})
    HotPrefixes(redis_client).add("acme", "llama", [(_prefix(1), 2), (_prefix(2), 1)], now=5.0)
    redis_client.zadd(old, {_prefix(1).digest: 4})  # the old writer, once more
    fresh = HotPrefixes(redis_client)  # a restarted worker
    fresh.add("acme", "llama", [(_prefix(2), 1)], now=6.0)
    assert [(h.prefix, h.count) for h in fresh.top("llama", 5)] == [
        (_prefix(1), 13.0), (_prefix(2), 2.0),
    ]  # fmt: skip
    assert redis_client.exists(old) == 0


def test_hot_prefixes__profile_keys_of_the_old_layout_never_pass_for_prefix_counts(
    redis_client: redis.Redis,
) -> None:
    # Under the old layout a model named "ns" pointed the prefix counts at the profile's
    # namespace set: the move takes only sorted sets, and leaves the profile's keys alone.
    profile = TrafficProfile(redis_client)
    assert _ingest(profile, [request(i) for i in range(2)]) == 2
    store = HotPrefixes(redis_client)
    assert store.top("ns", 5, ["acme"]) == []
    assert store.top("wm", 5, ["acme"]) == []
    assert profile.namespaces("acme") == [("llama", "t1")]
    assert profile.watermarks("acme") == {"inference.requests:0": 1}


def test_hot_prefixes__merged_prefix_counts_stay_within_capacity(redis_client: redis.Redis) -> None:
    store = HotPrefixes(redis_client, capacity=2)
    store.add("acme", "llama", [(_prefix(1), 5), (_prefix(2), 4)], now=1.0)
    redis_client.zadd(_legacy_counts_key("acme", "llama"), {_prefix(3).digest: 1})
    redis_client.hset(K.prefix_meta_key("acme", "llama"), _prefix(3).digest, b"{}")
    top = HotPrefixes(redis_client, capacity=2).top("llama", 5)
    assert [(h.prefix, h.count) for h in top] == [(_prefix(1), 5.0), (_prefix(2), 4.0)]
    assert redis_client.zcard(K.prefix_counts_key("acme", "llama")) == 2
    assert redis_client.hlen(K.prefix_meta_key("acme", "llama")) == 2  # the least went whole
