"""Codec: every event round-trips through bytes, and every kind of bad bytes is named precisely."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, get_args

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.codec import (
    MAX_EVENT_BYTES,
    NotJsonObject,
    decode_event,
    decode_many,
    encode_event,
    json_object,
)
from schemas.common import DocRef, RequestParams, tenant_problem
from schemas.errors import EventDecodeError, PoisonError
from schemas.events import (
    EVENT_TYPES,
    MAX_REQUEST_MS,
    MAX_REQUEST_TOKENS,
    BaseEvent,
    HitAudited,
    Invalidate,
    JobStatus,
    KnowledgeBaseChanged,
    ModelDeployed,
    PromptTemplateChanged,
    RequestLogged,
)

KNOWN_TYPES = sorted(EVENT_TYPES)

# --- strategies: values the models accept and JSON can carry (finite floats, 64-bit ints) ---

ids = st.text(min_size=1, max_size=40)
refs = st.text(min_size=1, max_size=256)
tenants = st.text(st.characters(codec="utf-8"), min_size=1, max_size=128).filter(
    lambda t: tenant_problem(t) is None
)
non_neg_floats = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
non_neg_ints = st.integers(min_value=0, max_value=2**63 - 1)
request_ms = st.floats(min_value=0, max_value=MAX_REQUEST_MS)
request_tokens = st.integers(min_value=0, max_value=MAX_REQUEST_TOKENS)
# Naive and UTC-aware both: a naive ts becomes UTC at construction, so it still round-trips.
timestamps = st.datetimes(timezones=st.none() | st.just(UTC))
base_fields: dict[str, Any] = {"event_id": ids, "ts": timestamps}


@st.composite
def request_params(draw: st.DrawFn) -> RequestParams:
    extra = draw(
        st.dictionaries(
            st.sampled_from(["seed", "stop", "frequency_penalty"]),
            st.integers(-(2**31), 2**31) | st.text(max_size=8),
            max_size=2,
        )
    )
    return RequestParams(
        temperature=draw(non_neg_floats),
        max_tokens=draw(st.none() | st.integers(1, 2**31)),
        top_p=draw(st.none() | st.floats(0, 1)),
        no_cache=draw(st.booleans()),
        **extra,
    )


@st.composite
def invalidates(draw: st.DrawFn) -> Invalidate:
    by = draw(st.sampled_from(get_args(Invalidate.model_fields["by"].annotation)))
    namespace = by == "namespace"
    return Invalidate(
        **draw(st.fixed_dictionaries(base_fields)),
        tenant=draw(tenants),
        by=by,
        value=draw(st.text(min_size=0 if namespace else 1, max_size=512)),
        model_id=draw(refs if namespace else st.none() | refs),
        model_version=draw(st.none() | refs),
        template_version=draw(st.none() | refs),
        reason=draw(st.text(max_size=100)),
    )


STRATEGIES: dict[str, st.SearchStrategy[BaseEvent]] = {
    "request_logged": st.builds(
        RequestLogged,
        **base_fields,
        request_id=ids,
        tenant=tenants,
        model_id=refs,
        model_version=refs,
        template_version=refs,
        prompt=st.text(),
        params=request_params(),
        context_docs=st.lists(
            st.builds(DocRef, doc_id=st.text(min_size=1, max_size=512), version=non_neg_ints),
            max_size=4,
        ).map(tuple),
        cache_outcome=st.sampled_from(["exact", "semantic", "negative", "miss", "bypass"]),
        latency_ms=request_ms,
        gpu_ms=request_ms,
        tokens_in=request_tokens,
        tokens_out=request_tokens,
        route=st.none() | st.text(max_size=256),
        cluster_key=st.none() | st.text(max_size=256),
    ),
    "model_deployed": st.builds(
        ModelDeployed,
        **base_fields,
        deploy_id=ids,
        model_id=refs,
        version=refs,
        previous_version=st.none() | refs,
        tenants=st.none() | st.lists(tenants, min_size=1, max_size=4).map(tuple),
        grace_s=st.none() | non_neg_ints,
    ),
    "kb_changed": st.builds(
        KnowledgeBaseChanged,
        **base_fields,
        tenant=tenants,
        doc_id=st.text(min_size=1, max_size=512),
        doc_version=non_neg_ints,
        change=st.sampled_from(["updated", "retracted", "deleted"]),
    )
    | st.builds(  # v2: an update with the doc's texts
        KnowledgeBaseChanged,
        **base_fields,
        schema_version=st.just(2),
        tenant=tenants,
        doc_id=st.text(min_size=1, max_size=512),
        doc_version=non_neg_ints,
        change=st.just("updated"),
        text=st.text(min_size=1, max_size=300),
        previous_text=st.none() | st.text(min_size=1, max_size=300),
    ),
    "template_changed": st.builds(
        PromptTemplateChanged,
        **base_fields,
        tenant=tenants,
        model_id=refs,
        old_template_version=refs,
        new_template_version=refs,
    ),
    "invalidate": invalidates(),
    "job_status": st.builds(
        JobStatus,
        **base_fields,
        job_id=ids,
        job_type=st.sampled_from(["deploy", "purge", "warm", "invalidate"]),
        state=st.sampled_from(["pending", "running", "ready", "done", "failed"]),
        progress=st.floats(0, 1),
        detail=st.text(max_size=200),
        counts=st.dictionaries(st.text(max_size=20), st.integers(-(2**63), 2**63 - 1)),
    ),
    "hit_audited": st.builds(
        HitAudited,
        **base_fields,
        request_id=ids,
        tenant=tenants,
        model_id=refs,
        model_version=refs,
        template_version=refs,
        route=st.text(max_size=256),
        query=st.text(max_size=200),
        served_prompt=st.text(max_size=200),
        entry_key=st.text(min_size=1, max_size=128),
        cache_outcome=st.sampled_from(["exact", "semantic"]),
        score=st.none() | st.floats(-1, 1),
        rule=st.text(max_size=256),
        strength=st.none() | st.integers(0, 1000),
        verdict=st.sampled_from(["same", "different"]),
        cosine=st.floats(-1, 1),
        reason=st.text(max_size=256),
        counted=st.booleans(),
    ),
}


def _valid(tag: str = "kb_changed", **overrides: Any) -> dict[str, Any]:
    """A JSON-ready valid event of `tag`, with fields overridden or (value ...) removed."""
    samples: dict[str, BaseEvent] = {
        "kb_changed": KnowledgeBaseChanged(
            tenant="acme", doc_id="d1", doc_version=2, change="updated"
        ),
        "request_logged": RequestLogged(
            request_id="r1",
            tenant="acme",
            model_id="llama",
            model_version="3.1",
            template_version="t1",
            prompt="hi",
            context_docs=(DocRef(doc_id="d1", version=1),),
            cache_outcome="miss",
            latency_ms=1.0,
            gpu_ms=1.0,
            tokens_in=1,
            tokens_out=1,
        ),
    }
    obj = samples[tag].model_dump(mode="json") | overrides
    return {k: v for k, v in obj.items() if v is not ...}


def _decode_error(data: bytes, **kwargs: Any) -> EventDecodeError:
    with pytest.raises(EventDecodeError) as info:
        decode_event(data, **kwargs)
    return info.value


# --- round trips ---


def test_strategies__cover_every_event_type() -> None:
    assert set(STRATEGIES) == set(EVENT_TYPES)


@pytest.mark.parametrize("tag", KNOWN_TYPES)
@given(data=st.data())
def test_codec__round_trip(tag: str, data: st.DataObject) -> None:
    ev = data.draw(STRATEGIES[tag])
    back = decode_event(encode_event(ev))
    assert type(back) is EVENT_TYPES[tag]
    assert back == ev
    assert back.ts.tzinfo is not None


def test_encode_event__plain_json_with_tag_and_version() -> None:
    obj = orjson.loads(
        encode_event(KnowledgeBaseChanged(tenant="a", doc_id="d", doc_version=0, change="deleted"))
    )
    assert obj["type"] == "kb_changed"
    assert obj["schema_version"] == 1
    assert obj["ts"].endswith("Z")


def test_decode_event__naive_ts_assumed_utc() -> None:
    ev = decode_event(orjson.dumps(_valid(ts="2024-05-01T12:00:00")))
    assert ev.ts == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_decode_event__defaults_filled_for_minimal_event() -> None:
    ev = decode_event(
        b'{"type":"job_status","schema_version":1,"job_id":"j","job_type":"warm","state":"pending"}'
    )
    assert isinstance(ev, JobStatus)
    assert ev.progress == 0.0
    assert ev.ts.tzinfo is not None


# --- each error reason ---


def test_decode_event__too_large() -> None:
    data = orjson.dumps(_valid())
    err = _decode_error(data, max_bytes=len(data) - 1)
    assert err.reason == "too_large"
    assert f"{len(data)} bytes" in err.detail
    assert str(len(data) - 1) in err.detail
    assert decode_event(data, max_bytes=len(data)).type == "kb_changed"


def test_decode_event__too_large_checked_before_parsing() -> None:
    err = _decode_error(b"x" * (MAX_EVENT_BYTES + 1))
    assert err.reason == "too_large"


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"{not json", "expected a string key"),
        (b"", "empty document"),
        (b'{"type": "kb_changed"', "unexpected end of data"),
        (b"\xff\xfe", "not valid UTF-8"),
    ],
)
def test_decode_event__bad_json_carries_orjson_message(data: bytes, fragment: str) -> None:
    err = _decode_error(data)
    assert err.reason == "bad_json"
    assert fragment in err.detail
    assert "line 1 column" in err.detail


@pytest.mark.parametrize(
    "data, kind",
    [(b"[1, 2]", "an array"), (b'"hi"', "a string"), (b"3", "a number"), (b"null", "null")],
)
def test_decode_event__not_an_object(data: bytes, kind: str) -> None:
    err = _decode_error(data)
    assert err.reason == "not_an_object"
    assert kind in err.detail


@pytest.mark.parametrize("tag", [..., None])
def test_decode_event__missing_type_lists_known_types(tag: Any) -> None:
    err = _decode_error(orjson.dumps(_valid(type=tag)))
    assert err.reason == "missing_type"
    assert all(t in err.detail for t in KNOWN_TYPES)


@pytest.mark.parametrize("tag", ["kb_changd", "", 7, ["kb_changed"]])
def test_decode_event__unknown_type_names_it_and_lists_known_types(tag: Any) -> None:
    err = _decode_error(orjson.dumps(_valid(type=tag)))
    assert err.reason == "unknown_type"
    assert repr(tag) in err.detail
    assert all(t in err.detail for t in KNOWN_TYPES)


def test_decode_event__missing_schema_version() -> None:
    err = _decode_error(orjson.dumps(_valid(schema_version=...)))
    assert err.reason == "missing_schema_version"
    assert "kb_changed" in err.detail


@pytest.mark.parametrize("version", [3, 0, "1", True, None, 1.0])
def test_decode_event__unknown_schema_version_names_given_and_known(version: Any) -> None:
    err = _decode_error(orjson.dumps(_valid(schema_version=version)))
    assert err.reason == "unknown_schema_version"
    assert err.detail == f"kb_changed schema_version {version!r}; this build knows 1, 2"


def test_decode_event__invalid_fields_renders_path_and_message() -> None:
    bad = _valid("request_logged", tenant="", context_docs=[{"doc_id": "d", "version": -1}])
    err = _decode_error(orjson.dumps(bad))
    assert err.reason == "invalid_fields"
    assert err.detail == (
        "tenant: must be 1-128 characters, got 0; "
        "context_docs.0.version: Input should be greater than or equal to 0"
    )


def test_decode_event__extra_field_is_invalid_fields() -> None:
    data = encode_event(
        KnowledgeBaseChanged(tenant="a", doc_id="d", doc_version=1, change="updated")
    )
    err = _decode_error(data[:-1] + b',"bogus":1}')
    assert err.reason == "invalid_fields"
    assert err.detail == "bogus: Extra inputs are not permitted"


def test_decode_event__tenant_with_brace_is_invalid_fields() -> None:
    err = _decode_error(orjson.dumps(_valid(tenant="ac{me}")))
    assert err.reason == "invalid_fields"
    assert err.detail == "tenant: must not contain { or } (the Redis Cluster hash tag)"


def test_decode_event__namespace_invalidate_without_model_id_is_invalid_fields() -> None:
    data = b'{"type":"invalidate","schema_version":1,"tenant":"acme","by":"namespace","value":""}'
    err = _decode_error(data)
    assert err.reason == "invalid_fields"
    assert err.detail == '(event): Value error, by="namespace" requires model_id'


def test_decode_event__invalid_fields_detail_is_capped() -> None:
    # RequestLogged has 11 required fields; with none of them only the first 10 are listed.
    err = _decode_error(b'{"type":"request_logged","schema_version":1}')
    assert err.reason == "invalid_fields"
    assert err.detail.count("Field required") == 10
    assert err.detail.endswith("; ... and 1 more")


def test_event_decode_error__is_poison() -> None:
    err = _decode_error(b"[]")
    assert isinstance(err, PoisonError)
    assert err.kind == "poison"
    assert str(err).startswith("not_an_object: ")


# --- batches ---


def test_decode_many__keeps_order_and_turns_bad_values_into_errors() -> None:
    good = encode_event(
        KnowledgeBaseChanged(tenant="a", doc_id="d", doc_version=1, change="updated")
    )
    out = decode_many([good, b"{", good, b'{"type":"nope"}'])
    assert [type(x).__name__ for x in out] == [
        "KnowledgeBaseChanged",
        "EventDecodeError",
        "KnowledgeBaseChanged",
        "EventDecodeError",
    ]
    assert [x.reason for x in out if isinstance(x, EventDecodeError)] == [
        "bad_json",
        "unknown_type",
    ]


def test_decode_many__passes_max_bytes() -> None:
    out = decode_many([b'{"type":"kb_changed"}'], max_bytes=5)
    assert isinstance(out[0], EventDecodeError)
    assert out[0].reason == "too_large"


def test_decode_many__empty_batch() -> None:
    assert decode_many([]) == []


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"{not json", "is not JSON: "),
        (b"[1, 2]", "must be a JSON object"),
        (b'"x"', "must be a JSON object"),
    ],
)
def test_json_object__anything_but_an_object_is_named(raw: bytes, says: str) -> None:
    with pytest.raises(NotJsonObject, match=says):
        json_object(raw)


def test_json_object__an_object_comes_back_as_a_dict() -> None:
    assert json_object(b'{"model": "m", "n": 1}') == {"model": "m", "n": 1}
