"""Hot prompt prefixes: what counts as one, and the bounded store on real Redis (and Cluster)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from caches.keys import prefix_counts_key, prefix_index_key, prefix_meta_key, tenant_tag
from schemas.events import RequestLogged
from tests.events import request
from warmers.prefix.hot import HotPrefixes, Prefix, prefix_of

pytestmark = pytest.mark.topologies

SYSTEM = " ".join(f"policy{i}" for i in range(40))


def logged(system: str | None = SYSTEM, outcome: str = "miss", **fields: Any) -> RequestLogged:
    msgs = [{"role": "user", "content": "how do I reset it?"}]
    if system is not None:
        msgs.insert(0, {"role": "system", "content": system})
    body = {"model": "served-llama", "messages": msgs, "temperature": 0}
    ev = request(schema_version=2, cache_outcome=outcome, request={"api": "chat", "body": body})
    return RequestLogged.model_validate({**ev, **fields})


def test_prefix_of__the_leading_system_messages_of_a_request_that_reached_the_gpu() -> None:
    p = prefix_of(logged())
    assert p is not None
    assert (p.model, p.messages, p.tokens) == ("served-llama", (("system", SYSTEM),), 40)
    assert prefix_of(logged(outcome="bypass")) == p
    assert prefix_of(logged(outcome="exact")) is None  # a hit paid no prefill
    assert prefix_of(logged(outcome="semantic")) is None
    assert prefix_of(logged(system=None)) is None
    assert prefix_of(logged(system="too short to hold a block")) is None
    assert prefix_of(logged(), min_tokens=41) is None
    v1 = RequestLogged.model_validate(request())
    assert prefix_of(v1) is None


def test_prefix_of__only_the_leading_run_and_never_the_question() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": SYSTEM},
            {"role": "user", "content": "earlier turn"},
            {"role": "system", "content": "a late system message is not the shared prefix"},
            {"role": "user", "content": "q"},
        ],
    }
    ev = RequestLogged.model_validate(
        request(schema_version=2, request={"api": "chat", "body": body})
    )
    p = prefix_of(ev)
    assert p is not None and p.messages == (("developer", SYSTEM),)
    only_system = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}]}
    ev = RequestLogged.model_validate(
        request(schema_version=2, request={"api": "chat", "body": only_system})
    )
    assert prefix_of(ev) is None  # the last message is the question, whatever its role


def _prefix(i: int) -> Prefix:
    return Prefix("m", (("system", f"template {i} " + SYSTEM),), 42)


def test_hot_prefixes__counts_rank_and_meta_round_trip(redis_client: redis.Redis) -> None:
    store = HotPrefixes(redis_client, capacity=10)
    store.add("acme", "llama", [(_prefix(1), 5), (_prefix(2), 9)], now=1000.0)
    store.add("acme", "llama", [(_prefix(1), 7)], now=2000.0)
    store.add("globex", "llama", [(_prefix(3), 10)], now=2000.0)
    top = store.top("llama", 10)
    assert [(h.tenant, h.prefix, h.count) for h in top] == [
        ("acme", _prefix(1), 12.0), ("globex", _prefix(3), 10.0), ("acme", _prefix(2), 9.0),
    ]  # fmt: skip
    assert store.tenants("llama") == ["acme", "globex"]
    assert store.top("llama", 10, ["globex"])[0].prefix == _prefix(3)
    assert [h.prefix for h in store.top("llama", 10, not_before=1500.0)] == [_prefix(1), _prefix(3)]
    assert store.top("other-model", 10) == []
    # every key of a tenant sits in its slot; the index has a slot of its own
    assert prefix_counts_key("acme", "llama").startswith(tenant_tag("acme") + ":")
    assert prefix_meta_key("acme", "llama").startswith(tenant_tag("acme") + ":")
    assert redis_client.ttl(prefix_counts_key("acme", "llama")) > 0
    assert redis_client.ttl(prefix_index_key("llama")) > 0


def test_hot_prefixes__bounded_and_a_new_hot_prefix_gets_in(redis_client: redis.Redis) -> None:
    store = HotPrefixes(redis_client, capacity=3)
    store.add("acme", "llama", [(_prefix(i), 10 + i) for i in range(3)], now=1.0)
    store.add("acme", "llama", [(_prefix(9), 1)], now=2.0)
    top = store.top("llama", 10)
    assert len(top) == 3  # the least counted (template 0, 10) went, with its meta
    assert _prefix(0) not in [h.prefix for h in top]
    assert [h.count for h in top if h.prefix == _prefix(9)] == [11.0]  # its count + 1: over
    assert redis_client.hlen(prefix_meta_key("acme", "llama")) == 3


def test_hot_prefixes__tenants_never_mix(redis_client: redis.Redis) -> None:
    store = HotPrefixes(redis_client)
    store.add("acme", "llama", [(_prefix(1), 3)], now=1.0)
    store.add("acme}:{t:globex", "llama", [(_prefix(2), 3)], now=1.0)  # a hostile tenant id
    assert [h.prefix for h in store.top("llama", 10, ["acme"])] == [_prefix(1)]
    assert store.top("llama", 10, ["globex"]) == []


def test_hot_prefixes__bad_options_are_refused(redis_client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="capacity"):
        HotPrefixes(redis_client, capacity=0)
