"""Event models: field constraints, UTC timestamps, the Invalidate scope rule, the type registry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from schemas.events import (
    EVENT_TYPES,
    MAX_DOC_TEXT_CHARS,
    Event,
    Invalidate,
    JobStatus,
    KnowledgeBaseChanged,
    ModelDeployed,
    RequestLogged,
)


def _request(**overrides: Any) -> RequestLogged:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "tenant": "acme",
        "model_id": "llama",
        "model_version": "3.1",
        "template_version": "t1",
        "prompt": "hi",
        "cache_outcome": "miss",
        "latency_ms": 12.5,
        "gpu_ms": 10.0,
        "tokens_in": 3,
        "tokens_out": 7,
    }
    return RequestLogged(**(fields | overrides))


def test_base_event__naive_ts_is_assumed_utc() -> None:
    ev = _request(ts=datetime(2024, 5, 1, 12, 0))
    assert ev.ts == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert ev.ts.tzinfo is UTC


def test_base_event__aware_ts_is_normalised_to_utc() -> None:
    paris = timezone(timedelta(hours=2))
    ev = _request(ts=datetime(2024, 5, 1, 14, 0, tzinfo=paris))
    assert ev.ts == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert ev.ts.utcoffset() == timedelta(0)


def test_base_event__naive_iso_string_is_assumed_utc() -> None:
    ev = _request(ts="2024-05-01T12:00:00")
    assert ev.ts == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_base_event__defaults_are_fresh_id_and_aware_now() -> None:
    before = datetime.now(UTC)
    a, b = _request(), _request()
    assert a.event_id != b.event_id
    assert len(a.event_id) == 32
    assert a.ts.tzinfo is not None
    assert before <= a.ts <= datetime.now(UTC)


def test_base_event__frozen() -> None:
    ev = _request()
    with pytest.raises(ValidationError, match="frozen"):
        ev.tenant = "other"


def test_base_event__extra_field_rejected() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        _request(tenat="acme")


@pytest.mark.parametrize("tenant", ["{acme}", "ac{me", "acme}", "", "x" * 129])
def test_request_logged__bad_tenant_rejected(tenant: str) -> None:
    with pytest.raises(ValidationError) as info:
        _request(tenant=tenant)
    assert info.value.errors()[0]["loc"] == ("tenant",)


def test_request_logged__longest_tenant_accepted() -> None:
    assert _request(tenant="x" * 128).tenant == "x" * 128


@pytest.mark.parametrize(
    "field, value",
    [
        ("latency_ms", -1.0),
        ("gpu_ms", -0.1),
        ("tokens_in", -1),
        ("tokens_out", -1),
        ("latency_ms", float("inf")),
        ("gpu_ms", float("nan")),
        ("cache_outcome", "hit"),
        ("request_id", ""),
        ("model_version", "v" * 257),
    ],
)
def test_request_logged__bad_field_rejected(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        _request(**{field: value})
    assert info.value.errors()[0]["loc"] == (field,)


def test_request_logged__defaults() -> None:
    ev = _request()
    assert ev.type == "request_logged"
    assert ev.schema_version == 1
    assert ev.params.temperature == 0.0
    assert ev.context_docs == ()
    assert ev.route is None
    assert ev.cluster_key is None


def test_model_deployed__tenants_none_means_all_and_empty_is_rejected() -> None:
    ev = ModelDeployed(model_id="llama", version="3.2", previous_version=None)
    assert ev.tenants is None
    assert ev.grace_s is None
    assert len(ev.deploy_id) == 32
    with pytest.raises(ValidationError):
        ModelDeployed(model_id="llama", version="3.2", previous_version="3.1", tenants=())


def test_model_deployed__previous_version_must_be_stated() -> None:
    with pytest.raises(ValidationError, match="previous_version"):
        ModelDeployed(model_id="llama", version="3.2")  # type: ignore[call-arg]


def test_model_deployed__tenant_with_brace_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        ModelDeployed(model_id="m", version="2", previous_version="1", tenants=("ok", "{bad"))
    assert info.value.errors()[0]["loc"] == ("tenants", 1)


def test_model_deployed__negative_grace_rejected() -> None:
    with pytest.raises(ValidationError):
        ModelDeployed(model_id="m", version="2", previous_version="1", grace_s=-1)


def test_kb_changed__negative_doc_version_rejected() -> None:
    with pytest.raises(ValidationError):
        KnowledgeBaseChanged(tenant="acme", doc_id="d", doc_version=-1, change="updated")


def test_kb_changed__v2_carries_the_texts_of_an_update() -> None:
    ev = KnowledgeBaseChanged(tenant="acme", doc_id="d", doc_version=3, change="updated",
                              schema_version=2, text="new", previous_text="old")  # fmt: skip
    assert (ev.text, ev.previous_text) == ("new", "old")


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"text": "new"}, "schema_version 2 fields"),  # v1 cannot carry them
        ({"schema_version": 2, "text": "new", "change": "deleted"}, "has no new text"),
        ({"schema_version": 2, "previous_text": "old"}, "previous_text without text"),
        ({"schema_version": 2, "text": ""}, "at least 1 character"),
        ({"schema_version": 2, "text": "x" * (MAX_DOC_TEXT_CHARS + 1)}, "at most"),
    ],
)
def test_kb_changed__texts_out_of_their_version_or_bounds_rejected(
    fields: dict[str, Any], why: str
) -> None:
    base: dict[str, Any] = {"tenant": "acme", "doc_id": "d", "doc_version": 3, "change": "updated"}
    with pytest.raises(ValidationError, match=why):
        KnowledgeBaseChanged(**(base | fields))


def test_invalidate__namespace_without_model_id_rejected() -> None:
    with pytest.raises(ValidationError, match='by="namespace" requires model_id'):
        Invalidate(tenant="acme", by="namespace", value="")


def test_invalidate__namespace_with_model_id_and_empty_value_accepted() -> None:
    ev = Invalidate(tenant="acme", by="namespace", value="", model_id="llama")
    assert ev.model_version is None
    assert ev.reason == ""


@pytest.mark.parametrize("by", ["context_hash", "doc", "entity"])
def test_invalidate__empty_value_rejected_unless_namespace(by: str) -> None:
    with pytest.raises(ValidationError, match="requires a non-empty value"):
        Invalidate(tenant="acme", by=by, value="")  # type: ignore[arg-type]


@pytest.mark.parametrize("progress", [-0.01, 1.01])
def test_job_status__progress_outside_unit_interval_rejected(progress: float) -> None:
    with pytest.raises(ValidationError):
        JobStatus(job_id="j", job_type="warm", state="running", progress=progress)


def test_job_status__counts_default_is_not_shared() -> None:
    a = JobStatus(job_id="a", job_type="purge", state="pending")
    b = JobStatus(job_id="b", job_type="purge", state="pending")
    assert a.counts == {}
    assert a.counts is not b.counts


def test_event_types__one_class_per_union_member_keyed_by_its_tag() -> None:
    union_members = get_args(get_args(Event)[0])
    assert set(EVENT_TYPES.values()) == set(union_members)
    for tag, cls in EVENT_TYPES.items():
        assert cls.model_fields["type"].default == tag
    assert set(EVENT_TYPES) == {
        "request_logged",
        "model_deployed",
        "kb_changed",
        "template_changed",
        "invalidate",
        "job_status",
        "hit_audited",
    }
