"""The traffic fast path accepts only what decode_event accepts, and reads it the same way."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from confluent_kafka import Message

from schemas.codec import decode_event
from schemas.errors import EventDecodeError
from schemas.events import RequestLogged
from tests.events import encode, request
from warmers.traffic.count_batch import BatchTally
from warmers.traffic.decode import FastDecoder, observe_event, query_key
from warmers.traffic.profile import week_and_hour
from warmers.traffic.worker import TrafficHandler

# Each case: (name, overrides or a callable editing the payload). Some are valid, some not.
_DROP = object()
_REQ = {"api": "chat", "body": {"model": "llama", "messages": [{"role": "user", "content": "q"}]}}
_HIT = {"digest": "d" * 64, "vector_id": "stk:k"}
_V2 = {
    "request": _REQ,
    "answer": {"text": "an answer", "digest": "d" * 64, "finish_reason": "stop"},
    "cache_key": "k" * 32,
    "cache_rule": "exact",
    "cache_score": 1.0,
}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("naive ts", {"ts": "2025-03-03T10:15:00"}),
    ("space ts", {"ts": "2025-03-03 10:15:00.5Z"}),
    ("offset ts moves the hour", {"ts": "2025-03-03T10:45:00+05:30"}),
    ("negative offset crosses a day", {"ts": "2025-03-03T23:30:00-02:00"}),
    ("no ts", {"ts": _DROP}),
    ("null ts", {"ts": None}),
    ("unix ts", {"ts": 1741000000}),
    ("date-only ts", {"ts": "2025-03-03"}),
    ("bad date", {"ts": "2025-02-30T10:00:00Z"}),
    ("no event id", {"event_id": _DROP}),
    ("null event id", {"event_id": None}),
    ("int gpu", {"gpu_ms": 5}),
    ("string gpu (lax)", {"gpu_ms": "5.5"}),
    ("negative gpu", {"gpu_ms": -1}),
    ("bool tokens", {"tokens_in": True}),
    ("float tokens", {"tokens_in": 3.0}),
    ("string schema version", {"schema_version": "1"}),
    ("bool schema version", {"schema_version": True}),
    ("unknown field", {"colour": "red"}),
    ("brace tenant", {"tenant": "a{b}"}),
    ("empty tenant", {"tenant": ""}),
    ("long tenant", {"tenant": "x" * 129}),
    ("unicode tenant", {"tenant": "café"}),
    ("hot temperature", {"params": {"temperature": 0.7}}),
    ("no cache", {"params": {"no_cache": True}}),
    ("string no cache (lax)", {"params": {"no_cache": "true"}}),
    ("extra param", {"params": {"temperature": 0, "seed": 3}}),
    ("bad top_p", {"params": {"top_p": 2}}),
    ("zero max tokens", {"params": {"max_tokens": 0}}),
    ("null params", {"params": None}),
    ("no params", {"params": _DROP}),
    ("doc extra key", {"context_docs": [{"doc_id": "a", "version": 1, "x": 1}]}),
    ("doc negative version", {"context_docs": [{"doc_id": "a", "version": -1}]}),
    ("doc empty id", {"context_docs": [{"doc_id": "", "version": 1}]}),
    ("no docs", {"context_docs": []}),
    ("cluster key", {"cluster_key": "reset-password"}),
    ("long route", {"route": "r" * 257}),
    ("bad outcome", {"cache_outcome": "maybe"}),
    ("exact hit", {"cache_outcome": "exact", "gpu_ms": 0.0}),
    ("other event type", {"type": "kb_changed"}),
    ("v2 without its request", {"schema_version": 2}),
    ("unknown version", {"schema_version": 3}),
    ("doc by id alone", {"context_docs": [{"doc_id": "a"}]}),
    ("doc null version", {"context_docs": [{"doc_id": "a", "version": None}]}),
    ("gateway params", {"params": {"temperature": 0, "api": "chat", "history": "h" * 32}}),
    ("bad api param", {"params": {"api": "voice"}}),
    ("v2", {"schema_version": 2, **_V2}),
    ("v2 fields on v1", _V2),
    ("v2 body not an object", {"schema_version": 2, "request": {"api": "chat", "body": [1]}}),
    ("v2 bad api", {"schema_version": 2, "request": {"api": "voice", "body": {}}}),
    ("v2 request extra key", {"schema_version": 2, "request": {**_REQ, "x": 1}}),
    (
        "v2 hit answer",
        {"schema_version": 2, "request": _REQ, "cache_outcome": "exact", "answer": _HIT},
    ),
    ("v2 answer without digest", {"schema_version": 2, "request": _REQ, "answer": {"text": "a"}}),
    ("v2 score out of range", {"schema_version": 2, "request": _REQ, "cache_score": 1.5}),
    ("v2 doc generations", {"schema_version": 2, "request": _REQ, "doc_generations": {"a": 3}}),
    ("doc generations on v1", {"doc_generations": {"a": 3}}),
    ("bad doc generation", {"schema_version": 2, "request": _REQ, "doc_generations": {"a": "x"}}),
]


def _payload(overrides: dict[str, Any]) -> bytes:
    body = request(3)
    for k, v in overrides.items():
        if v is _DROP:
            body.pop(k, None)
        else:
            body[k] = v
    return encode(body)


def _strip(obs: Any) -> tuple[Any, ...]:
    # The representative is an object; compare what it renders instead.
    rep = None if obs.representative is None else orjson.loads(obs.representative.to_json())
    return tuple(obs._replace(representative=rep and (rep["prompt"], rep["context_docs"])))


@pytest.mark.parametrize(("name", "overrides"), CASES, ids=[c[0] for c in CASES])
def test_fast_decoder__agrees_with_decode_event(name: str, overrides: dict[str, Any]) -> None:
    value = _payload(overrides)
    fast = FastDecoder().observe(value, "t:0", 7)
    try:
        ev = decode_event(value)
    except EventDecodeError:
        assert fast is None, f"{name}: the fast path accepted what decode_event refuses"
        return
    if fast is None:  # allowed: the slow path handles it
        return
    assert isinstance(ev, RequestLogged)
    assert _strip(fast) == _strip(observe_event(ev, "t:0", 7))


def test_fast_decoder__offset_timezone_buckets_by_utc_hour() -> None:
    obs = FastDecoder().observe(_payload({"ts": "2025-03-03T10:45:00+05:30"}), "t:0", 0)
    assert obs is not None
    assert (obs.week, obs.how) == (obs.week, 5)  # 05:15 UTC Monday


def test_week_and_hour__monday_midnight_is_zero() -> None:
    from datetime import UTC, datetime

    week, how = week_and_hour(datetime(2025, 3, 3, 0, 0, tzinfo=UTC))
    assert how == 0
    assert week_and_hour(datetime(2025, 3, 9, 23, 59, tzinfo=UTC)) == (week, 167)
    assert week_and_hour(datetime(2025, 3, 10, 0, 0, tzinfo=UTC)) == (week + 1, 0)


def test_query_key__normalised_prompt_params_and_doc_ids_not_versions() -> None:
    a = query_key("What  is X?", {"temperature": 0}, ["d1", "d2"])
    assert a == query_key("what is x?", {"temperature": 0.0, "no_cache": False}, ["d2", "d1"])
    assert a != query_key("what is x?", {"temperature": 0, "max_tokens": 5}, ["d1", "d2"])
    assert a != query_key("what is x?", {"temperature": 0}, ["d1"])


def _msg(value: bytes, offset: int) -> Message:
    return Message(topic="inference.requests", partition=1, offset=offset, value=value)


def test_traffic_handler__poison_gets_decode_event_reason() -> None:
    h = TrafficHandler.__new__(TrafficHandler)
    h.tally = BatchTally()
    batch = [
        _msg(encode(request(1)), 10),
        _msg(b"{nope", 11),
        _msg(encode(request(2, gpu_ms="7")), 12),  # lax: counted through the slow path
        _msg(encode({"type": "kb_changed", "schema_version": 1}), 13),
        _msg(encode(request(3, type="invalidate", by="doc", value="x")), 14),
        _msg(encode(request(4, tenant="a{b")), 15),
    ]
    out = h.decode_batch(batch)
    assert out.good == 2
    [counted] = out.items
    assert counted.deltas["acme"].parts == {"inference.requests:1": [10, 12]}
    assert [o.offset for o in counted.observations()] == [10, 12]
    reasons = {p.message.offset(): p.error.reason for p in out.poison}
    assert reasons == {
        11: "bad_json",
        13: "invalid_fields",
        14: "invalid_fields",
        15: "invalid_fields",
    }


def test_traffic_handler__valid_event_of_another_type_is_unexpected() -> None:
    h = TrafficHandler.__new__(TrafficHandler)
    h.tally = BatchTally()
    kb = {"type": "kb_changed", "schema_version": 1, "tenant": "acme", "doc_id": "d"}
    kb |= {"doc_version": 3, "change": "updated"}
    out = h.decode_batch([_msg(encode(kb), 0)])
    assert out.items == [] and out.good == 0
    assert [p.error.reason for p in out.poison] == ["unexpected_type"]


def test_fast_decoder__takes_the_gateway_s_v2_events_and_keeps_their_request() -> None:
    """The gateway publishes v2 with its own params: they must stay on the fast path (the slow
    one runs at a third of the rate), and the representative must carry the upstream body."""
    value = _payload({"schema_version": 2, **_V2, "params": {"temperature": 0, "api": "chat"}})
    obs = FastDecoder().observe(value, "t:0", 1)
    assert obs is not None
    rep = orjson.loads(obs.representative.to_json())
    assert rep["request"] == _REQ and rep["params"]["api"] == "chat"
