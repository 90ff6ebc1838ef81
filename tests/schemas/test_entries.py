"""Cache entries: round-trips, entries written before the msgspec switch, and clear refusals."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.entries import CacheEntry, EntryDecodeError, Provenance

text = st.text(max_size=30)
entries = st.builds(
    CacheEntry,
    tenant=text,
    prompt=text,
    response=text,
    provenance=st.builds(
        Provenance,
        model_id=text,
        model_version=text,
        template_version=text,
        generated_at=st.floats(0, 4e9),
        cached_at=st.floats(0, 4e9),
        source=st.sampled_from(["live", "warm"]),
    ),
    context_hash=text,
    docs=st.lists(st.tuples(text, st.integers(0, 10**6)), max_size=3).map(tuple),
    tokens_in=st.integers(0, 10**6),
    tokens_out=st.integers(0, 10**6),
    gpu_ms=st.floats(0, 1e7),
)


@given(e=entries)
def test_entry__round_trips_through_bytes(e):
    assert CacheEntry.from_bytes(e.to_bytes()) == e


def _older_entry() -> dict:
    # The JSON shape entries had when they were orjson-encoded dataclasses (session 1):
    # what a running Redis already holds must still decode after an upgrade.
    return {
        "tenant": "acme",
        "prompt": "reset my password",
        "response": "Open settings, then security.",
        "provenance": {
            "model_id": "llama-3-8b",
            "model_version": "v1",
            "template_version": "t1",
            "generated_at": 1764000000,
            "cached_at": 1764000001.5,
            "source": "warm",
        },
        "context_hash": "ab12",
        "docs": [["kb-1", 3]],
        "tokens_in": 4,
        "tokens_out": 6,
        "gpu_ms": 120.0,
        "schema_version": 1,
    }


def test_entry__decodes_what_earlier_builds_wrote():
    e = CacheEntry.from_bytes(orjson.dumps(_older_entry()))
    assert e.docs == (("kb-1", 3),) and e.provenance.source == "warm"
    assert e.provenance.generated_at == 1764000000.0
    assert e.provenance.generated_at_dt().year == 2025


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"schema_version": 2}, "schema_version 2; this build knows 1"),
        ({"provenance": {**_older_entry()["provenance"], "source": "cold"}}, "source"),
        ({"docs": [["kb-1", "three"]]}, "$.docs"),
        ({"tenant": None}, "$.tenant"),
    ],
)
def test_entry__foreign_shapes_are_refused_with_the_reason(change, says):
    with pytest.raises(EntryDecodeError, match=re.escape(says)):
        CacheEntry.from_bytes(orjson.dumps(_older_entry() | change))


@pytest.mark.parametrize("blob", [b"", b"{", b"[1, 2]", b"\xff\xfe", b'"an answer"'])
def test_entry__non_entries_are_refused(blob):
    with pytest.raises(EntryDecodeError, match="not a cache entry"):
        CacheEntry.from_bytes(blob)


def test_entry__missing_field_is_named():
    d = _older_entry()
    del d["response"]
    with pytest.raises(EntryDecodeError, match="response"):
        CacheEntry.from_bytes(orjson.dumps(d))
