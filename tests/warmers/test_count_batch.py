"""The batch tally counts exactly what per-event observation + aggregate() would count."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import decode_event
from schemas.errors import EventDecodeError
from streams.base import Decoded
from tests.events import encode, request
from warmers.traffic.count_batch import BatchTally, observe_batch
from warmers.traffic.decode import OUTCOMES
from warmers.traffic.delta import TenantDelta, aggregate

TOPIC = "inference.requests"
# Values chosen to hit every branch of the tally: hour boundaries (1 us apart), naive and
# offset times, a time before 1970 (int() truncates there), lax input, poison of each kind.
TIMES = [
    "2025-03-03T10:15:00Z",
    "2025-03-03T10:59:59.999999Z",
    "2025-03-03T11:00:00Z",
    "2025-03-03T11:30:00+05:30",
    "2025-03-03T10:15:00",
    "2025-03-09T23:59:59Z",
    "2025-03-10T00:00:00Z",
    "1969-12-31T23:30:00Z",
    "1969-12-31T23:59:59.5Z",
]
VARIANTS: list[dict[str, Any]] = [
    {},
    {"tenant": "beta"},
    {"tenant": "x{y"},  # poison: a brace in the tenant
    {"prompt": "Question  1"},  # normalises like "question 1"
    {"params": {"temperature": 0.7}},
    {"params": {"no_cache": True}},
    {"params": {"temperature": 0, "max_tokens": 64}},
    {"params": {"temperature": "0"}},  # lax: slow path, counted
    {"context_docs": [{"doc_id": "kb-1", "version": 9}]},
    {"context_docs": []},
    {"cluster_key": "pw"},
    {"cache_outcome": "exact", "gpu_ms": 0.0},
    {"cache_outcome": "bypass"},
    {"gpu_ms": 1.2345678},  # us rounded per event, not truncated
    {"gpu_ms": "12.5"},  # lax
    {"model_id": "mistral"},
    {"latency_ms": -1},  # poison
    {"ts": None},  # poison
    {"event_id": None},  # absent ts / id variants go through decode_event
]
RAW_POISON = [b"{nope", b"[]", encode({"type": "kb_changed", "schema_version": 1})]


def _value(i: int, variant: int, ts: int) -> bytes:
    if variant >= len(VARIANTS):
        return RAW_POISON[variant - len(VARIANTS)]
    return encode(request(i, ts=TIMES[ts]) | VARIANTS[variant])


def _messages(picks: list[tuple[int, int, int]]) -> list[Message]:
    """Records in the given order; each partition's offsets rise, as a consumer sees them."""
    next_offset: dict[int, int] = {}
    out = []
    for i, (partition, variant, ts) in enumerate(picks):
        offset = next_offset.get(partition, 100 * partition)
        next_offset[partition] = offset + 1 + i % 2  # gaps, as compaction leaves them
        value = _value(i, variant, ts)
        out.append(Message(topic=TOPIC, partition=partition, offset=offset, value=value))
    return out


def _plain(deltas: dict[str, TenantDelta]) -> dict[str, Any]:
    """Deltas as comparable data: representatives by what they render and identify."""
    return {
        t: (
            d.parts,
            d.queries,
            d.uncacheable,
            d.costs,
            {
                w: {q: (r.to_json(), r.fingerprint()) for q, r in per.items()}
                for w, per in d.reps.items()
            },
            d.events,
        )
        for t, d in deltas.items()
    }


def _check(tally: BatchTally, messages: list[Message]) -> Decoded:
    out = Decoded(tally=dict.fromkeys(OUTCOMES, 0))
    deltas, good = tally.add(messages, out)
    out.aggregated = good
    expected = observe_batch(messages)
    assert _plain(deltas) == _plain(aggregate(expected))
    assert good == len(expected)
    poison = []
    outcomes = dict.fromkeys(OUTCOMES, 0)
    for m in messages:
        try:
            ev = decode_event(m.value() or b"")
        except EventDecodeError:
            poison.append(m.offset())
            continue
        if ev.type != "request_logged":
            poison.append(m.offset())
        else:
            outcomes[ev.cache_outcome] += 1  # type: ignore[union-attr]
    assert [p.message.offset() for p in out.poison] == poison
    assert out.tally == outcomes
    return out


_PICK = st.tuples(
    st.integers(0, 2),
    st.integers(0, len(VARIANTS) + len(RAW_POISON) - 1),
    st.integers(0, len(TIMES) - 1),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_PICK, max_size=40), min_size=1, max_size=3))
def test_batch_tally__equals_per_event_aggregate(batches: list[list[tuple[int, int, int]]]) -> None:
    tally = BatchTally()  # one tally for all batches: its memos carry over, its counts must not
    for picks in batches:
        _check(tally, _messages(picks))


def test_batch_tally__every_variant_in_one_batch() -> None:
    picks = [(v % 3, v, t) for t in range(len(TIMES)) for v in range(len(VARIANTS) + 3)]
    out = _check(BatchTally(), _messages(picks))
    assert out.poison and out.good


def test_batch_tally__representative_is_the_latest_request() -> None:
    # The same query in two hours and two partitions: the latest record in the batch wins.
    docs = [{"doc_id": "kb-1", "version": 9}]
    payloads = [
        (0, request(1, ts=TIMES[0], prompt="q")),
        (1, request(2, ts=TIMES[2], prompt="Q", context_docs=docs)),
        (0, request(3, ts=TIMES[1], prompt="q")),
    ]
    messages = [
        Message(topic=TOPIC, partition=p, offset=i, value=encode(body))
        for i, (p, body) in enumerate(payloads)
    ]
    deltas, _ = BatchTally().add(messages, Decoded(tally=dict.fromkeys(OUTCOMES, 0)))
    [per_q] = deltas["acme"].reps.values()
    [rep] = per_q.values()
    assert '"request_id":"r3"' in rep.to_json()
    assert deltas["acme"].parts == {f"{TOPIC}:0": [0, 2], f"{TOPIC}:1": [1, 1]}


def test_batch_tally__tombstone_and_oversize_are_poison() -> None:
    big = encode(request(1, prompt="x" * 1_100_000))
    messages = [
        Message(topic=TOPIC, partition=0, offset=0, value=None),
        Message(topic=TOPIC, partition=0, offset=1, value=big),
        Message(topic=TOPIC, partition=0, offset=2, value=encode(request(2))),
    ]
    out = Decoded(tally=dict.fromkeys(OUTCOMES, 0))
    deltas, good = BatchTally().add(messages, out)
    assert good == 1 and deltas["acme"].parts == {f"{TOPIC}:0": [2, 2]}
    assert [(p.message.offset(), p.error.reason) for p in out.poison] == [
        (0, "bad_json"),
        (1, "too_large"),
    ]
