"""Every event on stoker's Kafka topics: frozen, versioned, discriminated by `type`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.common import MAX_INT64, DocRef, RequestParams, Tenant, utcnow

Id = Annotated[str, Field(min_length=1, max_length=256)]
ModelRef = Annotated[str, Field(min_length=1, max_length=256)]
# What one request can cost. No served request computes for an hour (gateways time out in
# minutes) and no context holds 10M tokens (the largest windows today); a bigger figure is a
# unit bug (us sent as ms) or an attack on the warmer's ranking, where a query that "cost"
# 1e300 ms outranks every real one, and its sums would overflow the profile's int64 counters.
MAX_REQUEST_MS = 3_600_000.0
MAX_REQUEST_TOKENS = 10_000_000
# A document's text in a KB change: a retrieved chunk or page is a few KB; two of them at this
# bound still fit the codec's 1 MiB event (schemas/codec.py) when the text is ASCII.
MAX_DOC_TEXT_CHARS = 262_144


def _new_id() -> str:
    return uuid.uuid4().hex


class BaseEvent(BaseModel):
    """Fields every event carries. `ts` is always aware UTC; a naive time is assumed to be UTC."""

    # allow_inf_nan=False: JSON has no inf/NaN (orjson writes null), so they could not round-trip.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    event_id: Id = Field(default_factory=_new_id)
    ts: datetime = Field(default_factory=utcnow)

    @field_validator("ts")
    @classmethod
    def _ts_utc(cls, v: datetime) -> datetime:
        # Gateways and CDC tools often emit naive times; they are UTC in practice, and
        # rejecting them would dead-letter a whole producer over a formatting habit.
        if v.tzinfo is None:
            return v.replace(tzinfo=UTC)
        return v.astimezone(UTC)


class LoggedRequest(BaseModel):
    """The request exactly as the gateway sent it upstream: what a warm replays.

    `body` is the JSON body of POST /v1/chat/completions or /v1/completions (model, messages or
    prompt with the system prompt and inlined documents as sent, every parameter), without the
    `stoker` extension and with streaming off."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api: Literal["chat", "completion"]
    body: dict[str, Any]


class LoggedAnswer(BaseModel):
    """The answer a request got: its text (a miss's live answer, what the workers learn from),
    or only its digest (a hit: the text is the served entry's, named by vector_id)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str | None = None
    digest: str = Field(min_length=1, max_length=128)  # sha256 hex of the text
    finish_reason: str | None = Field(default=None, max_length=64)
    vector_id: str | None = Field(default=None, max_length=1024)  # the entry (semantic point) key


class RequestLogged(BaseEvent):
    """One request the serving gateway answered, and how the cache fared on it.

    Version 1 is the cache identity and outcome. Version 2 (what `stoker gateway` publishes)
    adds the replayable upstream request, the cache's decision (entry key digest, rule,
    score) and the answer; a gateway of another language can publish it too (see README)."""

    type: Literal["request_logged"] = "request_logged"
    schema_version: Literal[1, 2] = 1
    request_id: Id
    tenant: Tenant
    model_id: ModelRef
    model_version: ModelRef
    template_version: ModelRef
    # No length limit here: refusing an oversized prompt is the cache layer's job.
    prompt: str
    params: RequestParams = RequestParams()
    context_docs: tuple[DocRef, ...] = ()
    cache_outcome: Literal["exact", "semantic", "negative", "miss", "bypass"]
    latency_ms: float = Field(ge=0, le=MAX_REQUEST_MS)
    gpu_ms: float = Field(ge=0, le=MAX_REQUEST_MS)
    tokens_in: int = Field(ge=0, le=MAX_REQUEST_TOKENS)
    tokens_out: int = Field(ge=0, le=MAX_REQUEST_TOKENS)
    route: str | None = Field(default=None, max_length=256)
    # The paraphrase-cluster key, when the gateway already knows it.
    cluster_key: str | None = Field(default=None, max_length=256)
    # -- schema_version 2 --
    request: LoggedRequest | None = None  # required in v2
    answer: LoggedAnswer | None = None
    cache_key: str | None = Field(default=None, max_length=128)  # the entry key's digest
    cache_rule: str | None = Field(default=None, max_length=256)  # what accepted a hit
    # A hit's served entry came from a warm or a live miss (the calibration of the warm
    # forecast counts the warm ones: warmers/hotset/calibration.py).
    cache_source: Literal["live", "warm"] | None = None
    cache_score: float | None = Field(default=None, ge=-1.0, le=1.0)
    # The generation of each doc named by id alone when the answer was computed (caches/
    # generations.py): a warm never replays a request whose documents changed since.
    doc_generations: dict[str, int] | None = None

    @model_validator(mode="after")
    def _fields_of_the_version(self) -> Self:
        v2 = (
            self.request, self.answer, self.cache_key, self.cache_rule, self.cache_score,
            self.doc_generations, self.cache_source,
        )  # fmt: skip
        if self.schema_version == 1 and any(f is not None for f in v2):
            raise ValueError(
                "request, answer, cache_key, cache_rule, cache_score, cache_source and "
                "doc_generations are schema_version 2 fields; a v1 event cannot carry them"
            )
        if self.schema_version == 2 and self.request is None:
            raise ValueError("schema_version 2 requires request (the replayable upstream request)")
        return self


class ModelDeployed(BaseEvent):
    """A model version went live; the deploy worker pre-warms it and retires the previous one."""

    type: Literal["model_deployed"] = "model_deployed"
    schema_version: Literal[1] = 1
    deploy_id: Id = Field(default_factory=_new_id)
    model_id: ModelRef
    version: ModelRef
    previous_version: ModelRef | None
    # None = every tenant; an empty tuple would be ambiguous, so it is rejected.
    tenants: tuple[Tenant, ...] | None = Field(default=None, min_length=1)
    # None = the worker's default grace window before the old version is purged.
    grace_s: int | None = Field(default=None, ge=0)


class KnowledgeBaseChanged(BaseEvent):
    """A document behind retrieved context changed; entries computed from it are stale.

    Version 2 may carry the document's text after the change and before it (what a CDC tool
    such as Debezium emits as the after and before images of the row): the re-warmer
    (warmers/rewarm.py) then replays the hot logged requests that inlined the old text with
    the new one, so the first asks after the change are hits again."""

    type: Literal["kb_changed"] = "kb_changed"
    schema_version: Literal[1, 2] = 1
    tenant: Tenant
    doc_id: str = Field(min_length=1, max_length=512)
    doc_version: int = Field(ge=0, le=MAX_INT64)
    change: Literal["updated", "retracted", "deleted"]
    # -- schema_version 2 --
    text: str | None = Field(default=None, min_length=1, max_length=MAX_DOC_TEXT_CHARS)
    previous_text: str | None = Field(default=None, min_length=1, max_length=MAX_DOC_TEXT_CHARS)

    @model_validator(mode="after")
    def _texts(self) -> Self:
        texts = self.text is not None or self.previous_text is not None
        if self.schema_version == 1 and texts:
            raise ValueError("text and previous_text are schema_version 2 fields")
        if texts and self.change != "updated":
            raise ValueError(f'a "{self.change}" document has no new text: text is for "updated"')
        if self.previous_text is not None and self.text is None:
            raise ValueError("previous_text without text: the new text is what a re-warm sends")
        return self


class PromptTemplateChanged(BaseEvent):
    """A tenant's prompt template moved to a new version; keys built on the old one are dead."""

    type: Literal["template_changed"] = "template_changed"
    schema_version: Literal[1] = 1
    tenant: Tenant
    model_id: ModelRef
    old_template_version: ModelRef
    new_template_version: ModelRef


class Invalidate(BaseEvent):
    """An explicit invalidation. Invariant: by="namespace" names a model, other kinds a value."""

    type: Literal["invalidate"] = "invalidate"
    schema_version: Literal[1] = 1
    tenant: Tenant
    by: Literal["context_hash", "doc", "entity", "namespace"]
    # The context hash, doc id or entity; may be empty only for by="namespace".
    value: str = Field(max_length=512)
    # None narrows nothing: the invalidation applies across every model / version / template.
    model_id: ModelRef | None = None
    model_version: ModelRef | None = None
    template_version: ModelRef | None = None
    reason: str = Field(default="", max_length=1024)

    @model_validator(mode="after")
    def _scope(self) -> Self:
        # A namespace purge without a model would wipe the whole tenant: make that impossible.
        if self.by == "namespace" and self.model_id is None:
            raise ValueError('by="namespace" requires model_id')
        # An empty doc id / hash / entity matches nothing useful and hides a producer bug.
        if self.by != "namespace" and not self.value:
            raise ValueError(f'by="{self.by}" requires a non-empty value')
        return self


class JobStatus(BaseEvent):
    """Progress of a long job, published to stoker.status for `stoker deploy --wait`."""

    type: Literal["job_status"] = "job_status"
    schema_version: Literal[1] = 1
    job_id: Id
    job_type: Literal["deploy", "purge", "warm", "invalidate"]
    state: Literal["pending", "running", "ready", "done", "failed"]
    progress: float = Field(default=0.0, ge=0.0, le=1.0)
    detail: str = ""
    counts: dict[str, int] = Field(default_factory=dict)


class HitAudited(BaseEvent):
    """The wrong-hit monitor's verdict on one served cache hit (stoker.audit): the query was
    asked again and the fresh answer judged by meaning against the one served.

    `event_id` is the audited request's event id, so a re-delivered request log record audited
    twice carries the same id (the budget counts it once: caches/matching/counts.py)."""

    type: Literal["hit_audited"] = "hit_audited"
    schema_version: Literal[1] = 1
    request_id: Id
    tenant: Tenant
    model_id: ModelRef
    model_version: ModelRef
    template_version: ModelRef
    route: str = Field(default="", max_length=256)
    query: str
    served_prompt: str  # the cached entry's prompt, whose answer was served
    entry_key: str = Field(min_length=1, max_length=128)  # the served entry's key digest
    cache_outcome: Literal["exact", "semantic"]
    score: float | None = Field(default=None, ge=-1.0, le=1.0)
    rule: str = Field(max_length=256)
    strength: int | None = Field(default=None, ge=0, le=1000)  # a verified hit's (budget evidence)
    verdict: Literal["same", "different"]
    cosine: float = Field(ge=-1.0, le=1.0)  # of the two answers' embeddings (clamped)
    reason: str = Field(max_length=256)  # "cosine>=0.52", "cosine<0.52", or the guard ("number")
    counted: bool = False  # the verdict reached the error budget (first time for this event)


Event = Annotated[
    RequestLogged
    | ModelDeployed
    | KnowledgeBaseChanged
    | PromptTemplateChanged
    | Invalidate
    | JobStatus
    | HitAudited,
    Field(discriminator="type"),
]

_EVENT_CLASSES: tuple[type[BaseEvent], ...] = (
    RequestLogged,
    ModelDeployed,
    KnowledgeBaseChanged,
    PromptTemplateChanged,
    Invalidate,
    JobStatus,
    HitAudited,
)


def _tag(cls: type[BaseEvent]) -> str:
    default: Any = cls.model_fields["type"].default
    return str(default)


EVENT_TYPES: dict[str, type[BaseEvent]] = {_tag(cls): cls for cls in _EVENT_CLASSES}
