"""The traffic worker: RequestLogged events from inference.requests into the traffic profile.

Decoding is the hot path (one event per served request). pydantic's decode_event runs ~90k
events/s here, below the 100k/s goal on its own, so a fast path decodes with msgspec into a
strict mirror of RequestLogged (no coercion, unknown fields refused) and checks the timestamp
against the ISO subset pydantic surely parses. Whatever the fast path refuses goes through
decode_event: a valid event pydantic accepts in lax mode ("5" for 5) is still counted, and
poison gets decode_event's precise reason and goes to the dead-letter topic. A test holds the
fast path to "accepts only what decode_event accepts, and reads it the same".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

import msgspec
import redis
from confluent_kafka import Message
from msgspec import UNSET, Meta, UnsetType

from caches.keys import canonical_params, normalise_prompt
from schemas.codec import MAX_EVENT_BYTES, decode_event
from schemas.errors import EventDecodeError
from schemas.events import Event, RequestLogged
from streams.base import Decoded, Handler, Poison, message_value
from streams.metrics import count_gateway_outcomes
from warmers.profile import Observation, TrafficProfile, observation, week_and_hour

_Id = Annotated[str, Meta(min_length=1, max_length=256)]
_Short = Annotated[str, Meta(max_length=256)]
# le: msgspec reads 1e400 as inf where orjson (and so decode_event) refuses it.
_Amount = Annotated[float, Meta(ge=0, le=1.7e308)]
_Count = Annotated[int, Meta(ge=0)]


class _Doc(msgspec.Struct, forbid_unknown_fields=True, frozen=True):  # frozen: hashable memo key
    doc_id: Annotated[str, Meta(min_length=1, max_length=512)]
    version: _Count


class _Params(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """RequestParams without extras: a request with unknown parameters takes the slow path
    (they key answers, so they must reach query_key as pydantic keeps them)."""

    temperature: _Amount = 0.0
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    no_cache: bool = False

    def as_dict(self) -> dict[str, Any]:
        """As RequestParams.as_dict() gives it, so both paths hash a query alike."""
        d: dict[str, Any] = {"temperature": self.temperature}
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        if self.top_p is not None:
            d["top_p"] = self.top_p
        return d


_DEFAULT_PARAMS: Final = _Params()


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    """RequestLogged as msgspec checks it: a strict subset of what pydantic accepts."""

    type: Literal["request_logged"]
    schema_version: Literal[1]
    request_id: _Id
    tenant: Annotated[str, Meta(min_length=1, max_length=128, pattern="^[^{}]+$")]
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

    def to_json(self) -> str:
        """The representative request, as the event itself (prompt, params, context_docs, ...)."""
        return msgspec.json.encode(self).decode()

    def fingerprint(self) -> object:
        # What a newer request of the same query can change in the representative.
        return (self.model_version, self.context_docs, self.params, self.route)


class _EventRepresentative:
    def __init__(self, ev: RequestLogged) -> None:
        self.ev = ev

    def to_json(self) -> str:
        return self.ev.model_dump_json()

    def fingerprint(self) -> object:
        return (self.ev.model_version, self.ev.context_docs, self.ev.params, self.ev.route)


_DECODER: Final = msgspec.json.Decoder(_Request)
_GPU_OUTCOMES: Final = frozenset({"miss", "bypass"})
_OUTCOMES: Final = ("exact", "semantic", "negative", "miss", "bypass")
# Memo size: distinct queries seen recently; cleared when full (bounded memory; a cleared
# memo only costs a re-hash).
_MEMO_MAX = 200_000


class FastDecoder:
    """msgspec for RequestLogged; returns None whenever it is not sure (the slow path decides)."""

    def __init__(self) -> None:
        self._qkeys: dict[tuple[Any, ...], str] = {}
        # The current batch's cache outcomes (Decoded.tally), for the gateway hit-rate metric.
        self.outcomes: dict[str, int] = dict.fromkeys(_OUTCOMES, 0)

    def observe(self, value: bytes, part: str, offset: int) -> Observation | None:
        try:
            r = _DECODER.decode(value)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        ts, params = r.ts, r.params
        if ts is UNSET:
            return None
        self.outcomes[r.cache_outcome] += 1
        week, how = week_and_hour(ts if ts.tzinfo else ts.replace(tzinfo=UTC))
        cacheable = params.temperature == 0 and not params.no_cache
        if r.cache_outcome in _GPU_OUTCOMES:
            gpu_ms, tokens, rep = r.gpu_ms, r.tokens_in + r.tokens_out, r if cacheable else None
        else:
            gpu_ms, tokens, rep = 0.0, 0, None
        if r.cluster_key is not None:
            qkey = cluster_query_key(r.cluster_key)
        else:
            memo_key = (r.prompt, params, *r.context_docs)
            qkey = self._qkeys.get(memo_key) or self._new_qkey(memo_key, r)
        return observation(
            r.tenant, r.model_id, r.template_version, qkey, week, how, cacheable, gpu_ms,
            tokens, rep, part, offset,
        )  # fmt: skip

    def _new_qkey(self, memo_key: tuple[Any, ...], r: _Request) -> str:
        if len(self._qkeys) >= _MEMO_MAX:
            self._qkeys.clear()
        qkey = query_key(r.prompt, r.params.as_dict(), [d.doc_id for d in r.context_docs])
        self._qkeys[memo_key] = qkey
        return qkey


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
    raw = "\x1f".join(
        (normalise_prompt(prompt), canonical_params(shaped), "\x1e".join(sorted(set(doc_ids))))
    )
    return "q:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


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
    if ev.cache_outcome in _GPU_OUTCOMES:
        gpu_ms, tokens = ev.gpu_ms, ev.tokens_in + ev.tokens_out
        rep = _EventRepresentative(ev) if cacheable else None
    else:
        gpu_ms, tokens, rep = 0.0, 0, None
    return observation(
        ev.tenant, ev.model_id, ev.template_version, qkey, week, how, cacheable, gpu_ms, tokens,
        rep, part, offset,
    )  # fmt: skip


class TrafficHandler(Handler):
    """Counts every RequestLogged once per offset into the TrafficProfile (see its docstring)."""

    name = "traffic"
    topics = ["inference.requests"]  # noqa: RUF012  (the Handler contract: a plain list)
    pipelined = True  # decode touches only self.fast, apply only self.profile

    def __init__(self, profile: TrafficProfile) -> None:
        self.profile = profile
        self.fast = FastDecoder()

    def decode_batch(self, messages: Sequence[Message]) -> Decoded:
        out = Decoded(tally=dict.fromkeys(_OUTCOMES, 0))
        self.fast.outcomes = out.tally
        parts: dict[tuple[str | None, int | None], str] = {}
        observe = self.fast.observe
        for msg in messages:
            tp = (msg.topic(), msg.partition())
            part = parts.get(tp)
            if part is None:
                part = parts[tp] = f"{tp[0]}:{tp[1]}"
            value = msg.value()
            if type(value) is not bytes:
                value = message_value(msg)
            offset = msg.offset() or 0
            obs = observe(value, part, offset) if len(value) <= MAX_EVENT_BYTES else None
            if obs is None:
                obs = self._slow(msg, value, part, offset, out)
                if obs is None:
                    continue
            out.items.append(obs)
        return out

    @staticmethod
    def _slow(
        msg: Message, value: bytes, part: str, offset: int, out: Decoded
    ) -> Observation | None:
        try:
            ev = decode_event(value)
        except EventDecodeError as exc:
            out.poison.append(Poison(msg, exc))
            return None
        if not isinstance(ev, RequestLogged):
            why = EventDecodeError("unexpected_type", f"{ev.type} event on the requests topic")
            out.poison.append(Poison(msg, why))
            return None
        out.tally[ev.cache_outcome] += 1
        return observe_event(ev, part, offset)

    def apply_decoded(self, decoded: Decoded) -> None:
        self.profile.write(decoded.items)

    def settled(self, decoded: Decoded) -> None:
        count_gateway_outcomes(decoded.tally)

    def apply(self, events: list[Event]) -> None:
        """Count events that came without offsets (no watermark: not redelivery-safe)."""
        obs = [
            observe_event(e, "", i) for i, e in enumerate(events) if isinstance(e, RequestLogged)
        ]
        self.profile.write(obs)

    def close(self) -> None:
        self.profile.r.close()


def build_traffic_handler(settings: Any) -> TrafficHandler:
    """Registry factory: a TrafficHandler on the settings' Redis."""
    from stoker.wiring import build_redis

    r: redis.Redis = build_redis(settings)
    return TrafficHandler(TrafficProfile(r, settings.traffic_retention_weeks))
