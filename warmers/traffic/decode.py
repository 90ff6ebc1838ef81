"""RequestLogged bytes to Observations: a strict msgspec fast path, decode_event's slow path.

pydantic's decode_event alone runs below the traffic worker's 100k events/s goal (bench_ingest:
ingest_traffic; the figure is in docs/benchmarks.md, "Ingest"), so the traffic worker decodes
with msgspec into a strict mirror of RequestLogged (no coercion, unknown fields refused) and
checks the timestamp against the ISO subset pydantic surely parses. Whatever the fast path
refuses goes through decode_event: a valid event pydantic accepts in lax mode ("5" for 5) is
still counted, and poison gets decode_event's precise reason.
A test holds the fast path to "accepts only what decode_event accepts, and reads it the same".

FastDecoder.observe is the per-event reference; warmers.traffic.count_batch does the same work per batch
without an Observation per event, and a test holds the two to the same profile deltas.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from caches.keys import canonical_params, normalise_prompt
from schemas.codec import decode_event
from schemas.common import MAX_INT64, answer_params, tenant_problem
from schemas.errors import EventDecodeError
from schemas.events import MAX_REQUEST_MS, MAX_REQUEST_TOKENS, RequestLogged
from warmers.traffic.delta import Observation, observation
from warmers.traffic.event_time import TimeWindow, aware
from warmers.traffic.profile import week_and_hour

_Id = Annotated[str, Meta(min_length=1, max_length=256)]
_Short = Annotated[str, Meta(max_length=256)]
# RequestLogged's bounds (schemas/events.py says why); they also keep msgspec's inf for 1e400,
# which orjson (and so decode_event) refuses, out.
_Amount = Annotated[float, Meta(ge=0, le=MAX_REQUEST_MS)]
_Count = Annotated[int, Meta(ge=0, le=MAX_REQUEST_TOKENS)]


class _Doc(msgspec.Struct, forbid_unknown_fields=True, frozen=True):  # frozen: hashable memo key
    doc_id: Annotated[str, Meta(min_length=1, max_length=512)]
    version: Annotated[int, Meta(ge=0, le=MAX_INT64)] | None = None


class _Params(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """RequestParams without extras: a request with unknown parameters takes the slow path
    (they key answers, so they must reach query_key as pydantic keeps them)."""

    temperature: _Amount = 0.0
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    no_cache: bool = False
    api: Literal["chat", "completion"] | None = None
    history: Annotated[str, Meta(min_length=1, max_length=128)] | None = None

    def as_dict(self) -> dict[str, Any]:
        """As RequestParams.as_dict() gives it (no extras here), so both paths hash a query
        alike; called once per distinct params (params_canon, QueryKeys memoise)."""
        return answer_params(self.temperature, self.max_tokens, self.top_p, self.api, self.history)

    @property
    def cacheable(self) -> bool:
        return self.temperature == 0 and not self.no_cache


_DEFAULT_PARAMS: Final = _Params()


class _LoggedRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """schemas.events.LoggedRequest; the body stays raw bytes (it is only ever re-encoded into
    the representative), checked to be a JSON object by shape_ok."""

    api: Literal["chat", "completion"]
    body: msgspec.Raw


class _LoggedAnswer(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    digest: Annotated[str, Meta(min_length=1, max_length=128)]
    text: str | None = None
    finish_reason: Annotated[str, Meta(max_length=64)] | None = None
    vector_id: Annotated[str, Meta(max_length=1024)] | None = None


class Request(msgspec.Struct, forbid_unknown_fields=True):
    """RequestLogged as msgspec checks it: with tenant_ok(), a strict subset of what pydantic
    accepts. The tenant rule is checked apart (tenant_ok): per event it would cost ~0.35 us,
    and the batch tally checks each tenant once."""

    type: Literal["request_logged"]
    schema_version: Literal[1, 2]
    request_id: _Id
    tenant: str
    model_id: _Id
    model_version: _Id
    template_version: _Id
    prompt: str
    cache_outcome: Literal["exact", "semantic", "negative", "miss", "bypass"]
    latency_ms: _Amount
    gpu_ms: _Amount
    tokens_in: _Count
    tokens_out: _Count
    event_id: _Id | UnsetType = UNSET
    # RFC 3339 only: a subset of what pydantic parses (tested). Absent: decode_event stamps
    # "now"; left to the slow path. Known difference: more than 6 fraction digits round here
    # and truncate there, which moves a bucket only within 1 us of an hour boundary.
    ts: datetime | UnsetType = UNSET
    params: _Params = _DEFAULT_PARAMS
    context_docs: tuple[_Doc, ...] = ()
    route: _Short | None = None
    cluster_key: _Short | None = None
    request: _LoggedRequest | None = None
    answer: _LoggedAnswer | None = None
    cache_key: Annotated[str, Meta(max_length=128)] | None = None
    cache_rule: _Short | None = None
    cache_source: Literal["live", "warm"] | None = None
    cache_score: Annotated[float, Meta(ge=-1.0, le=1.0)] | None = None
    doc_generations: dict[str, int] | None = None

    def to_json(self) -> str:
        """The representative request, as the event itself (prompt, params, context_docs, and
        in v2 the upstream request a warm replays)."""
        return msgspec.json.encode(self).decode()

    def fingerprint(self) -> object:
        # What a newer request of the same query can change in the representative.
        body = bytes(self.request.body) if self.request is not None else None
        return (self.model_version, self.context_docs, self.params, self.route, body)


DECODER: Final = msgspec.json.Decoder(Request)
DECODE_ERRORS: Final = (msgspec.ValidationError, msgspec.DecodeError)
GPU_OUTCOMES: Final = frozenset({"miss", "bypass"})
OUTCOMES: Final = ("exact", "semantic", "negative", "miss", "bypass")
# Memo size: distinct queries seen recently; cleared when full (bounded memory; a cleared
# memo only costs a re-hash).
MEMO_MAX = 200_000


def shape_ok(r: Request) -> bool:
    """RequestLogged's version rule (v2 fields only in v2, whose request is required) and a
    v2 body that is a JSON object: what pydantic checks besides the field types."""
    if r.schema_version == 1:
        return (
            r.request is None
            and r.answer is None
            and r.cache_key is None
            and r.cache_rule is None
            and r.cache_score is None
            and r.cache_source is None
            and r.doc_generations is None
        )
    return r.request is not None and memoryview(r.request.body)[:1].tobytes() == b"{"


def tenant_ok(tenant: str) -> bool:
    """schemas.common's tenant rule (memoised there: the batch tally checks each tenant once)."""
    return tenant_problem(tenant) is None


class QueryKeys:
    """Query key of a fast-path request, memoised: traffic is Zipf, most requests repeat."""

    def __init__(self) -> None:
        self._memo: dict[tuple[Any, ...], str] = {}

    def of(self, r: Request) -> str:
        if r.cluster_key is not None:
            return cluster_query_key(r.cluster_key)
        memo_key = (r.prompt, r.params, *r.context_docs)
        qkey = self._memo.get(memo_key)
        if qkey is None:
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            qkey = query_key(r.prompt, r.params.as_dict(), [d.doc_id for d in r.context_docs])
            self._memo[memo_key] = qkey
        return qkey


class FastDecoder:
    """msgspec for one RequestLogged; returns None whenever it is not sure (the slow path
    decides). The per-event reference for warmers.traffic.count_batch.BatchTally."""

    def __init__(self) -> None:
        self.qkeys = QueryKeys()

    def observe(
        self, value: bytes, part: str, offset: int, times: TimeWindow | None = None
    ) -> Observation | None:
        try:
            r = DECODER.decode(value)
        except DECODE_ERRORS:
            return None
        ts, params = r.ts, r.params
        if ts is UNSET or not tenant_ok(r.tenant) or not shape_ok(r):
            return None
        if times is not None and times.refusal(ts) is not None:
            return None  # the slow path names the reason
        week, how = week_and_hour(ts if ts.tzinfo else ts.replace(tzinfo=UTC))
        cacheable = params.cacheable
        if r.cache_outcome in GPU_OUTCOMES:
            gpu_ms, lat_ms, tokens = r.gpu_ms, r.latency_ms, r.tokens_in + r.tokens_out
            rep = r if cacheable else None
        else:
            gpu_ms, lat_ms, tokens, rep = 0.0, 0.0, 0, None
        return observation(
            r.tenant, r.model_id, r.template_version, self.qkeys.of(r), week, how, cacheable,
            gpu_ms, lat_ms, tokens, rep, part, offset,
        )  # fmt: skip


def cluster_query_key(cluster_key: str) -> str:
    return "c:" + hashlib.sha256(cluster_key.encode()).hexdigest()[:32]


def query_key(prompt: str, params: dict[str, Any], doc_ids: Sequence[str]) -> str:
    """Normalised prompt + canonical answer-shaping params + the retrieved doc ids, hashed.

    Doc *versions* are left out on purpose: a doc update is the same question asked again,
    and its count must carry over; the representative keeps the latest versions to warm with.
    Params are taken as RequestParams.as_dict() would give them (no_cache is a directive).
    """
    shaped = {k: v for k, v in params.items() if k != "no_cache" and v is not None}
    shaped.setdefault("temperature", 0.0)
    return query_key_canon(prompt, canonical_params(shaped), doc_ids)


def query_key_canon(prompt: str, canon_params: str, doc_ids: Sequence[str]) -> str:
    """query_key with the params already canonical (params_canon for a fast-path request)."""
    raw = "\x1f".join((normalise_prompt(prompt), canon_params, "\x1e".join(sorted(set(doc_ids)))))
    return "q:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=4096)
def params_canon(params: _Params) -> str:
    """canonical_params of a fast-path request's params, as query_key shapes them; memoised:
    requests share few params, and rebuilding the sorted JSON is ~4 of a new query's ~12 us."""
    return canonical_params({"temperature": 0.0} | params.as_dict())


class _EventRepresentative:
    def __init__(self, ev: RequestLogged) -> None:
        self.ev = ev

    def to_json(self) -> str:
        return self.ev.model_dump_json()

    def fingerprint(self) -> object:
        ev = self.ev
        body = ev.request.model_dump_json() if ev.request is not None else None
        return (ev.model_version, ev.context_docs, ev.params, ev.route, body)


def observe_event(ev: RequestLogged, part: str, offset: int) -> Observation:
    """The slow path's twin of FastDecoder.observe, from a validated event."""
    week, how = week_and_hour(ev.ts)
    p = ev.params
    cacheable = not p.no_cache and p.temperature == 0
    qkey = (
        cluster_query_key(ev.cluster_key)
        if ev.cluster_key is not None
        else query_key(ev.prompt, p.as_dict(), [d.doc_id for d in ev.context_docs])
    )
    if ev.cache_outcome in GPU_OUTCOMES:
        gpu_ms, lat_ms, tokens = ev.gpu_ms, ev.latency_ms, ev.tokens_in + ev.tokens_out
        rep = _EventRepresentative(ev) if cacheable else None
    else:
        gpu_ms, lat_ms, tokens, rep = 0.0, 0.0, 0, None
    return observation(
        ev.tenant, ev.model_id, ev.template_version, qkey, week, how, cacheable, gpu_ms, lat_ms,
        tokens, rep, part, offset,
    )  # fmt: skip


def observe_slow(
    value: bytes, part: str, offset: int, times: TimeWindow | None = None
) -> tuple[Observation, str, tuple[str, float] | None]:
    """decode_event's path for what the fast path refused: (observation, cache outcome, the
    warm hit: entry key digest and time, for the calibration) of a valid RequestLogged (lax
    input included) whose time lies inside `times`; EventDecodeError with its reason for
    poison."""
    ev = decode_event(value)
    if not isinstance(ev, RequestLogged):
        raise EventDecodeError("unexpected_type", f"{ev.type} event on the requests topic")
    refusal = None if times is None else times.refusal(ev.ts)
    if refusal is not None:
        raise refusal
    warm = None
    if (
        ev.cache_source == "warm"
        and ev.cache_key is not None
        and ev.cache_outcome not in GPU_OUTCOMES
    ):
        warm = (ev.cache_key, aware(ev.ts).timestamp())
    return observe_event(ev, part, offset), ev.cache_outcome, warm
