"""Fields a careless or hostile producer can set so that the profile, the hot set or the
scheduler would learn nothing, or die: out-of-range costs and tenant ids that name nobody."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest
import redis
from pydantic import ValidationError

from schemas.common import DocRef, tenant_problem
from streams.topics import ensure_topics
from streams.worker import WorkerConfig
from tests.events import encode, request
from tests.faults.faults_helpers import dead_letters, done_after, headers, produce_raw, run_worker
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile
from warmers.traffic.worker import TrafficHandler

# Each made the traffic worker die (an int past 64 bits reached the profile's JSON batch and
# orjson raised TypeError in apply, on every restart) or was counted under a tenant that is
# no one: both now dead-lettered as invalid_fields.
HOSTILE: dict[str, dict[str, Any]] = {
    "gpu_ms": {"gpu_ms": 1e300},
    "latency_ms": {"latency_ms": 1e300},
    "tokens": {"tokens_in": 2**70},
    "doc_version": {"context_docs": [{"doc_id": "kb-1", "version": 2**70}]},
    "blank_tenant": {"tenant": " "},
    "padded_tenant": {"tenant": " acme"},
    "nul_tenant": {"tenant": "ac\x00me"},
    "newline_tenant": {"tenant": "acme\n"},
}


def test_traffic_worker__out_of_range_fields_and_blank_tenants_are_poison_not_fatal(
    kafka_bootstrap: str, redis_client: redis.Redis, unique: str
) -> None:
    prefix = f"x{unique}."
    topic, dlq = f"{prefix}inference.requests", f"{prefix}stoker.dlq"
    ensure_topics(kafka_bootstrap, {topic: 1})
    # the standard library's json: orjson (rightly) cannot even write an int past 64 bits
    bad = [json.dumps(request(i, request_id=name) | fields).encode() for i, (name, fields) in
           enumerate(HOSTILE.items())]  # fmt: skip
    good = [encode(request(100 + i)) for i in range(5)]
    produce_raw(kafka_bootstrap, topic, [(v, None) for v in [good[0], *bad, *good[1:]]])
    cfg = WorkerConfig(
        bootstrap=kafka_bootstrap, group_id=f"g{unique}", embedded=True, topic_prefix=prefix
    )
    run_worker(TrafficHandler(TrafficProfile(redis_client)), cfg, done_after(len(good), len(bad)))
    got = {orjson.loads(m.value())["request_id"]: headers(m)["dlq.reason"]
           for m in dead_letters(kafka_bootstrap, dlq, len(bad))}  # fmt: skip
    assert got == dict.fromkeys(HOSTILE, b"invalid_fields")
    profile = TrafficProfile(redis_client)
    assert profile.tenants() == ["acme"]
    top = profile.top_queries("acme", "llama", "t1", range(HOURS_PER_WEEK), 10)
    assert sum(q.count for q in top) == len(good)


@pytest.mark.parametrize(
    "tenant", ["", " ", "\t", "acme ", " acme", "a{b", "a}b", "x" * 129, "a\x00b", "a\ud800"]
)
def test_tenant_rule__refuses_ids_that_name_nobody_or_two(tenant: str) -> None:
    assert tenant_problem(tenant) is not None


def test_doc_version__is_bounded_to_int64() -> None:
    with pytest.raises(ValidationError):
        DocRef(doc_id="kb-1", version=2**63)
    assert DocRef(doc_id="kb-1", version=2**63 - 1).version == 2**63 - 1


@pytest.mark.parametrize("tenant", [" ", "\u0085acme", "a{b"])
def test_gateway__a_tenant_the_events_refuse_is_refused_at_the_door(
    make_gateway: Any, sim: Any, tenant: str
) -> None:
    """The gateway had a rule of its own (length, braces): a blank tenant from the body was
    served and logged under a tenant that names nobody. Now one rule serves both."""
    gw = make_gateway(sim.url, gateway_tenant_from_body=True)
    body = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "q"}],
            "stoker": {"tenant": tenant}}  # fmt: skip
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"
