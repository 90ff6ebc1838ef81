"""What a cache lookup takes and gives: the request (CacheRequest: the key's parts and what
else a hit must share), the result (LookupResult: outcome, answer, score, why), and the
records a store passes between its steps (Probe, PreparedWrite, Shadow, StoreResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from caches import keys as K
from caches.generations import WriteTicket
from caches.matching.base import Vector
from schemas.common import DocRef, RequestParams
from schemas.entries import CacheEntry

Outcome = Literal["exact", "semantic", "negative", "miss", "bypass"]


@dataclass(frozen=True)
class KeyedRequest:
    """The parts of a request its cache key is built from: whose (tenant, model, version,
    template) and what (prompt, params, docs). The cache's request (CacheRequest) and the
    backend's (backends.base.GenerationRequest) both start with them, declared once here so
    that the two cannot drift apart; each adds its own fields after these."""

    tenant: str
    model_id: str
    model_version: str
    template_version: str
    prompt: str
    params: RequestParams = field(default_factory=RequestParams)
    docs: tuple[DocRef, ...] = ()


@dataclass(frozen=True)
class CacheRequest(KeyedRequest):
    # The gateway route ("/v1/chat/completions", "billing-faq", ...): per-route semantic
    # thresholds and conservative routes key on it. It never enters the cache key.
    route: str | None = None

    @property
    def ns(self) -> K.Namespace:
        return K.namespace(self.tenant, self.model_id, self.model_version, self.template_version)

    def key_parts(self) -> tuple[K.Namespace, str, str, str]:
        """(namespace, normalised prompt, canonical params, context hash): what CacheKey takes.

        Same as K.build_key(self.ns, prompt, params.as_dict(), docs), on the memoised parts."""
        ns = self.ns
        return (
            ns,
            K.normalise_prompt(self.prompt),
            K.request_params_canon(self.params),
            K.context_hash(ns.model_id, ns.template_version, self.docs),
        )

    def key(self) -> K.CacheKey:
        return K.CacheKey(*self.key_parts())


class LookupResult(msgspec.Struct, frozen=True):
    """A msgspec Struct, not a dataclass: built on every lookup, 0.2 us against 2 us frozen."""

    outcome: Outcome
    entry: CacheEntry | None = None
    score: float | None = None
    rule: str = ""  # what accepted a hit (audit trail): "exact", or the matcher's rule
    reason: str = ""  # why a request bypassed the cache
    ticket: WriteTicket | None = None
    key: str = ""  # the request's exact-entry key ("" for a bypass), for support and logs
    # A verified matcher's best candidate that fell short of the serving level: the live answer
    # the miss then gets is judged against it (caches/matching/error_budget.py, a shadow check).
    shadow: Shadow | None = None

    @property
    def hit(self) -> bool:
        return self.outcome in ("exact", "semantic")


@dataclass(frozen=True, slots=True)
class Probe:
    """A lookup between its I/O-free start (CacheClient.probe) and its Redis read."""

    req: CacheRequest
    ns: K.Namespace
    prompt_norm: str
    params_canon: str
    context_hash: str
    exact_key: str
    token: int | None  # the L1 reservation, if there is an L1

    def cache_key(self) -> K.CacheKey:
        return K.CacheKey(self.ns, self.prompt_norm, self.params_canon, self.context_hash)


@dataclass(frozen=True)
class PreparedWrite:
    """An entry that passed store's checks, and the ticket whose generations it must meet."""

    ticket: WriteTicket
    payload: bytes
    response: str = ""
    shadow: Shadow | None = None


@dataclass(frozen=True)
class Shadow:
    entry_key: str
    strength: int
    reference: Vector  # what the backend is taken to mean there (Assessment.reference)
    members: int
    tenant: str
    route: str
    # answers the live one should agree with (calibration.py's near check; Shadowed.near)
    near: tuple[Vector, ...] = ()


@dataclass(frozen=True)
class AnswerExtras:
    """What an answer carries besides its text, kept so a replayed hit has all of it."""

    reasoning: str | None = None  # reasoning_content
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class StoreResult:
    landed: bool
    reason: str
    semantic_indexed: bool = False
    # An answer refused for itself (not for its ticket): why, as later misses of the request
    # and of its look-alikes say it ("finish_reason=length"); "" for any other outcome.
    unstored: str = ""
