"""The cache client the serving gateway imports: lookup (exact, then semantic) and store (what
they take and give: caches/request.py).

Read path, per request:
1. refuse oversized prompts; bypass what must never be cached (temperature > 0, no-cache);
2. the exact key (the in-process L1 first, when there is one), then the negative key: a hit
   costs one GET, a miss one EXISTS more;
3. semantic: embed (cached in Redis), filtered top-k over the tenant's namespace, then one MGET
   of the candidates' entries: a candidate whose entry is gone was invalidated, never served;
4. on a miss, snapshot the generations into a WriteTicket; `store` lands the answer only if no
   invalidation or retirement happened in between (see generations.py).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace
from typing import TypedDict, Unpack

import msgspec
import orjson
import redis

from caches import keys as K
from caches import metrics as M
from caches.boundary import REDIS_ERRORS, as_bytes, redis_boundary
from caches.embedding_cache import CachedEmbedder
from caches.generations import Generations, WriteTicket
from caches.l1 import L1Cache
from caches.matching.answers import AnswerJudge
from caches.matching.base import Candidate, Matcher, Query, StaticThreshold, Vector
from caches.matching.calibration import NEAR
from caches.matching.error_budget import ErrorBudget
from caches.matching.options import DEFAULT_SHADOW_SHARE
from caches.policy import (
    CachePolicy,
    not_stored_why,
    prompt_bypass_reason,
    request_bypass_reason,
    response_refusal_reason,
)
from caches.request import (
    AnswerExtras,
    CacheRequest,
    LookupResult,
    PreparedWrite,
    Probe,
    Shadow,
    StoreResult,
)
from caches.semantic.base import SemanticPoint, SemanticQuery, SemanticStore
from schemas.common import tenant_problem
from schemas.entries import CacheEntry, Provenance, Source
from schemas.errors import CacheUnavailable, RequestRejected

log = logging.getLogger(__name__)

NEGATIVE_MARK = b"1"
# A semantic miss's reason when the search found no live entry near the query (at the
# matcher's floor: the threshold for static, 0.55 for verified).
SEMANTIC_NONE = "semantic_none: no cached prompt is near this one"
# A prompt longer than the policy's max_prompt_chars is neither keyed nor stored: a bypass.
OVER_LIMIT = "bypass: prompt over the cache's limit"
# A miss whose request's (or look-alike's) last answer was refused for itself: the code of its
# reason, then why (policy.not_stored_why: "finish_reason=length").
NOT_STORED = "not_stored"


class AnswerFacts(TypedDict, total=False):
    """What CacheClient.prepare_store takes besides the answer's text (its defaults are there),
    so that store, which only adds the write, passes them on without listing them again."""

    source: Source
    tokens_in: int
    tokens_out: int
    gpu_ms: float
    generated_at: float | None
    is_error: bool
    finish_reason: str
    extras: AnswerExtras | None


class CacheClient:
    """Thread-safe for lookups and stores (redis-py pools connections; stores are atomic)."""

    def __init__(
        self,
        r: redis.Redis,
        *,
        semantic: SemanticStore | None = None,
        embedder: CachedEmbedder | None = None,
        policy: CachePolicy | None = None,
        l1: L1Cache | None = None,
        matcher: Matcher | None = None,
        budget: ErrorBudget | None = None,
        judge: AnswerJudge | None = None,
        shadow_share: float = DEFAULT_SHADOW_SHARE,
    ) -> None:
        if (semantic is None) != (embedder is None):
            raise ValueError("semantic store and embedder come together")
        self.redis = r
        self.semantic = semantic
        self.embedder = embedder
        self.policy = policy or CachePolicy()
        # Which candidate may serve; its .stats count hits per rule, guard rejections and
        # verification outcomes. Default: the policy's static threshold, as before matchers.
        self.matcher = matcher or StaticThreshold()
        # A verified matcher's evidence: each miss it nearly served is, at shadow_share, judged
        # against the live answer it then got (free: that answer is embedded for the store
        # anyway). Near misses are sampled more than the monitor samples hits; the budget
        # weighs each verdict by the inverse of its share (caches/matching/bounds.py).
        self.budget = budget
        self.judge = judge or AnswerJudge()
        self.shadow_share = shadow_share
        self._rng = random.Random()
        self.generations = Generations(r)
        self.l1 = l1  # opt-in in-process L1 for exact hits (caches/l1.py); started by the caller

    def close(self) -> None:
        """Stop the L1's listener (if any) and release the Redis connections."""
        if self.l1 is not None:
            self.l1.close()
        if self.embedder is not None:  # its write-behind thread
            self.embedder.close()
        self.redis.close()

    # -- read path --

    def lookup(
        self, req: CacheRequest, *, use_semantic: bool = True, threshold: float | None = None
    ) -> LookupResult:
        """Exact hit, semantic hit (with its score and rule), negative, miss (with a write
        ticket for `store`) or bypass. Raises RequestRejected, CacheUnavailable."""
        t0 = time.perf_counter()
        res = self._lookup(req, use_semantic, threshold)  # a raise is not tallied
        M.observe_lookup(res, time.perf_counter() - t0)
        return res

    def _lookup(
        self, req: CacheRequest, use_semantic: bool, threshold: float | None
    ) -> LookupResult:
        p = self.probe(req)
        if not isinstance(p, Probe):
            return p
        try:  # inline, not redis_boundary(): this is the hit path, every microsecond shows
            # the hit path is one GET; misses pay for the rest
            hit = self.found(p, self.redis.get(p.exact_key))
            if hit is not None:
                return hit
            key = p.cache_key()
            negative, unstored = self.redis.mget([key.negative(), key.unstored()])  # one slot
        except REDIS_ERRORS as e:
            raise CacheUnavailable(f"redis lookup failed: {type(e).__name__}: {e}") from e
        if negative:
            return self.negative(p)
        why = LookupResult("miss", reason=not_stored(unstored))
        if use_semantic and self.semantic is not None:
            got = self._semantic_lookup(req, key, threshold)
            if got.hit:
                return got
            why = msgspec.structs.replace(got, reason=why.reason or got.reason)
        ticket = self.generations.snapshot(key, req.docs)
        return msgspec.structs.replace(why, ticket=ticket, key=p.exact_key)

    # The read path's I/O-free steps: lookup() runs them around its Redis calls, and so does
    # a caller with a Redis client of its own kind (the gateway's asyncio client).

    def probe(self, req: CacheRequest) -> Probe | LookupResult:
        """Refuse what cannot be keyed (RequestRejected: a bad tenant id, text that is not
        Unicode), bypass what must never be cached or is over the cache's limit, serve an L1
        hit; else what the Redis read needs, the key reserved in the L1."""
        bypass = self._screen(req)
        if bypass:
            return LookupResult("bypass", reason=bypass)
        # The hit path builds only the key string; the CacheKey object is for misses (~1 us).
        try:
            ns, prompt_norm, params_canon, ctx = req.key_parts()
            exact_key = ns.exact_prefix + K.key_digest(prompt_norm, params_canon, ctx)
        except _UNKEYABLE as e:
            raise _unkeyable(e) from None
        l1, token = self.l1, None
        if l1 is not None:
            cached = l1.get(exact_key)
            if cached is not None:
                return LookupResult("exact", cached, 1.0, "exact:l1", key=exact_key)
            token = l1.reserve(exact_key)  # before the read: see the protocol in l1.py
        return Probe(req, ns, prompt_norm, params_canon, ctx, exact_key, token)

    def found(self, p: Probe, blob: bytes | str | None) -> LookupResult | None:
        """What the GET of p.exact_key returned, as an exact hit; None if nothing was there."""
        l1 = self.l1
        if blob is None:
            if l1 is not None:
                l1.release(p.exact_key, p.token)  # nothing to fill: don't leave the reservation
            return None
        entry = CacheEntry.from_bytes(as_bytes(blob))
        if l1 is not None:
            l1.fill(p.exact_key, p.token, entry)
        return LookupResult("exact", entry, 1.0, "exact", key=p.exact_key)

    @staticmethod
    def negative(p: Probe) -> LookupResult:
        return LookupResult("negative", reason="recent error for this request", key=p.exact_key)

    def lookup_exact(self, req: CacheRequest) -> LookupResult:
        """lookup's first half, for callers that give the semantic layer a budget of its own:
        an exact or negative hit, a bypass, or a miss already holding its write ticket (taken
        before the semantic search: earlier is only stricter). Not tallied: call observe()
        with the final result."""
        return self._lookup(req, False, None)

    def lookup_semantic(self, req: CacheRequest, miss: LookupResult) -> LookupResult:
        """lookup's second half: a semantic hit for the request, else `miss` unchanged."""
        if self.semantic is None or miss.ticket is None:
            return miss
        got = self._semantic_lookup(req, miss.ticket.key, None)
        if got.hit:
            return got
        # the request's own not_stored, if it has one, is the truer reason than a look-alike's
        reason = miss.reason or got.reason
        return msgspec.structs.replace(miss, shadow=got.shadow, score=got.score, reason=reason)

    @staticmethod
    def observe(res: LookupResult, seconds: float) -> None:
        """Tally a lookup made of lookup_exact and lookup_semantic (lookup() tallies itself)."""
        M.observe_lookup(res, seconds)

    def ticket(self, req: CacheRequest) -> LookupResult:
        """A write ticket without reading the cache (Cache-Control: no-cache): the answer
        computed next replaces whatever is cached, under the same generation checks. A bypass
        for what must never be cached; raises RequestRejected, CacheUnavailable."""
        bypass = self._screen(req)
        if bypass:
            return LookupResult("bypass", reason=bypass)
        try:
            key = req.key()
            exact_key = key.exact()
        except _UNKEYABLE as e:
            raise _unkeyable(e) from None
        return LookupResult("miss", ticket=self.generations.snapshot(key, req.docs), key=exact_key)

    def serving_key(self, req: CacheRequest) -> str | None:
        """The key of the entry that would serve `req` now: its exact entry, else the entry a
        semantic lookup would serve; None if it would miss, bypass or hit a negative entry.
        lookup's two halves, untallied (the warm planner asks what a warm would add, not a
        request). Raises RequestRejected, CacheUnavailable."""
        res = self.lookup_exact(req)
        if res.outcome == "miss":
            res = self.lookup_semantic(req, res)
        return res.key if res.hit else None

    def _screen(self, req: CacheRequest) -> str | None:
        """RequestRejected for a request no key may name; else why it bypasses, or None."""
        problem = tenant_problem(req.tenant)  # memoised: tenants are few
        if problem is not None:
            raise RequestRejected(f"bad tenant {req.tenant[:40]!r}: {problem}")
        if len(req.prompt) > self.policy.max_prompt_chars:
            # The cache's limit, not the model's: the request is still answered, uncached, and
            # an upstream that cannot take it says so itself.
            return (
                f"{OVER_LIMIT} ({len(req.prompt)} chars; the cache keys prompts of up to "
                f"{self.policy.max_prompt_chars}, max_prompt_chars)"
            )
        return request_bypass_reason(req.params) or prompt_bypass_reason(req.prompt)

    def _semantic_lookup(
        self, req: CacheRequest, key: K.CacheKey, threshold: float | None
    ) -> LookupResult:
        """A semantic hit, or a miss saying why (`reason`; `score`: the best candidate's)."""
        q, sq = self._queries(req, key, threshold)
        found = self._candidates(req, q, sq)
        if found is None:
            return LookupResult("miss", reason=self._unstored_near(sq))
        cands, alive = found
        got = self.matcher.decide(q, cands)
        if got is None:
            return self._declined(q, cands)
        c = cands[got.index]
        return LookupResult("semantic", alive[c.entry_key], c.score, got.rule, key=c.entry_key)

    def semantic_candidates(
        self, req: CacheRequest, key: K.CacheKey, threshold: float | None = None
    ) -> tuple[Query, list[Candidate], dict[str, CacheEntry]] | None:
        """What the matcher decides on for this request: its query, the candidates (live
        entries, and for a verified matcher the probes, with their answer vectors) and the live
        entries by key; None when no live entry is near. The monitor reads it again to judge a
        served hit against what vouched for it."""
        q, sq = self._queries(req, key, threshold)
        found = self._candidates(req, q, sq)
        return None if found is None else (q, *found)

    def _queries(
        self, req: CacheRequest, key: K.CacheKey, threshold: float | None
    ) -> tuple[Query, SemanticQuery]:
        """The matcher's query and the store's search for this request (embeds the prompt)."""
        assert self.embedder is not None
        route = req.route
        pol = self.policy
        thr = pol.threshold_for(req.tenant, route) if threshold is None else threshold
        vec = self.embedder.embed_one(req.tenant, key.prompt_norm)
        q = Query(
            key.prompt_norm, vec, thr, conservative=pol.conservative_for(req.tenant, route),
            tenant=req.tenant, route=route or "",
        )  # fmt: skip
        floor, limit = self.matcher.floor_for(q), self.matcher.limit
        answers = self.matcher.needs_answers
        sq = SemanticQuery(
            vec, req.ns, key.context_hash, key.params_hash, floor, time.time(), limit, answers
        )
        return q, sq

    def _candidates(
        self, req: CacheRequest, q: Query, sq: SemanticQuery
    ) -> tuple[list[Candidate], dict[str, CacheEntry]] | None:
        assert self.semantic is not None and self.embedder is not None
        matches = self.semantic.search(sq)
        entries = [m for m in matches if m.kind == "entry"]
        if not entries:
            return None
        with redis_boundary("semantic fetch"):
            blobs = self.redis.mget([m.entry_key for m in entries])
        alive: dict[str, CacheEntry] = {}
        for m, blob in zip(entries, blobs, strict=True):
            if blob is None:
                continue  # invalidated or expired in Redis: the vector is an orphan, skip it
            entry = CacheEntry.from_bytes(as_bytes(blob))
            if _same_namespace(entry, req):  # defence in depth; the filter already ensures it
                alive[m.entry_key] = entry
        if not alive:
            return None
        # Probes (and dead entries' answers) stay as evidence for a verified matcher; only a
        # live entry can be served.
        live = [
            m for m in matches if m.entry_key in alive or (sq.with_answers and m.kind == "probe")
        ]
        cands = [
            Candidate(m.entry_key, m.prompt, m.score, answer=m.answer_vector, kind=m.kind)
            for m in live
        ]
        if self.matcher.needs_vectors:
            # From the embedding cache (one MGET): each cached prompt was embedded under this
            # tenant and the same normalised text when its entry was indexed.
            vecs = self.embedder.embed(req.tenant, [c.prompt for c in cands])
            cands = [replace(c, vector=vecs[i]) for i, c in enumerate(cands)]
        return cands, alive

    def _unstored_near(self, sq: SemanticQuery) -> str:
        """A miss with no live entry near: not_stored when a look-alike's answer (prompt cosine
        >= NEAR, where look-alikes mean the same, or the matcher's floor if higher) was refused
        for itself, else semantic_none. Only a miss with nothing to serve pays this search."""
        assert self.semantic is not None
        bar = max(sq.threshold, NEAR)
        marks = self.semantic.search(replace(sq, threshold=bar, limit=1, unstored=True))
        if not marks:
            return SEMANTIC_NONE
        m = marks[0]
        why = str(m.payload.get("why") or "not stored")
        look_alike = f"a look-alike (score={m.score:.4f})"
        return f"{NOT_STORED}: {why}: the last answer to {look_alike} was not cached"

    def _declined(self, q: Query, cands: list[Candidate]) -> LookupResult:
        """The matcher served none of `cands`: a miss with the best entry's score, the
        matcher's reason, and for a verified matcher the candidate to shadow-check."""
        score = max((c.score for c in cands if c.kind == "entry"), default=None)
        reason = self.matcher.miss_reason(q, cands)
        miss = LookupResult("miss", score=score, reason=reason)
        shadow_of = getattr(self.matcher, "shadow_of", None)
        if shadow_of is None or self.budget is None:
            return miss
        a = shadow_of(q, cands)
        if a is None:
            return miss
        key = cands[a.index].entry_key if a.index >= 0 else ""
        near = getattr(a, "near", ())
        shadow = Shadow(key, a.strength, a.reference, a.members, q.tenant, q.route, near)
        return msgspec.structs.replace(miss, shadow=shadow)

    # -- write path --

    @M.observed_store
    def store(
        self, result: LookupResult, response: str, **answer: Unpack[AnswerFacts]
    ) -> StoreResult:
        """Store the answer computed after a miss; refuses stale, retired and uncacheable writes
        (and answers that did not end on their own: finish_reason other than stop/tool_calls).
        The keywords and their defaults are prepare_store's."""
        w = self.prepare_store(result, response, **answer)
        if isinstance(w, StoreResult):
            if w.unstored and result.ticket is not None:
                self._remember(result.ticket, w.unstored)
            return w
        refused_by = self.generations.write(w.ticket, w.payload, self.policy.exact_ttl_s)
        return self.finish_store(w, refused_by)

    def prepare_store(
        self,
        result: LookupResult,
        response: str,
        *,
        source: Source = "live",
        tokens_in: int = 0,
        tokens_out: int = 0,
        gpu_ms: float = 0.0,
        generated_at: float | None = None,
        is_error: bool = False,
        finish_reason: str = "stop",
        extras: AnswerExtras | None = None,
    ) -> StoreResult | PreparedWrite:
        """store's checks and entry, no I/O: a refusal, or the write to land (see store)."""
        t = result.ticket
        if t is None:
            return StoreResult(False, f"not cacheable: {result.reason or result.outcome}")
        extras = extras or AnswerExtras()
        refusal = response_refusal_reason(
            response,
            is_error=is_error,
            max_bytes=self.policy.max_response_bytes,
            finish_reason=finish_reason,
            has_tool_calls=bool(extras.tool_calls),
        )
        if refusal:
            return StoreResult(False, refusal, unstored=not_stored_why(finish_reason, refusal))
        if t.retired:
            return StoreResult(False, "retired namespace")
        entry = self._entry(t, response, source, tokens_in, tokens_out, gpu_ms, generated_at)
        if finish_reason != "stop" or extras.reasoning is not None or extras.tool_calls:
            entry = msgspec.structs.replace(
                entry,
                finish_reason=finish_reason,
                reasoning=extras.reasoning,
                tool_calls=list(extras.tool_calls) if extras.tool_calls else None,
            )
        try:
            return PreparedWrite(t, entry.to_bytes(), response, result.shadow)
        except (UnicodeEncodeError, TypeError) as e:  # a lone surrogate or a non-JSON value
            return StoreResult(False, f"answer cannot be encoded: {type(e).__name__}: {e}")

    def finish_store(self, w: PreparedWrite, refused_by: str | None) -> StoreResult:
        """After the write script ran: refused as stale, or landed and indexed for semantic
        search (this embeds the prompt: milliseconds of CPU, so not on an event loop)."""
        if refused_by is not None:
            return StoreResult(False, f"stale: generation moved at {refused_by}")
        return StoreResult(True, "landed", semantic_indexed=self._index_semantic(w))

    def store_negative(self, result: LookupResult) -> bool:
        """Remember for a few seconds that this request failed, so retries do not stampede."""
        if result.ticket is None:
            return False
        with redis_boundary("store negative"):
            self.redis.set(
                result.ticket.key.negative(), NEGATIVE_MARK, ex=self.policy.negative_ttl_s
            )
        return True

    def _remember(self, t: WriteTicket, why: str) -> None:
        """The not-stored mark, in Redis (the repeat's miss) and in the semantic store (its
        look-alikes'); a lost one only costs a reason."""
        try:
            with redis_boundary("store not-stored mark"):
                self.redis.set(*self.unstored_mark(t, why))
        except CacheUnavailable as e:
            log.debug("not-stored mark not written: %s", e)
            return
        self.index_unstored(t, why)

    def unstored_mark(self, t: WriteTicket, why: str) -> tuple[str, bytes, int]:
        """The Redis SET (key, value, ex) that makes the request's next misses say `why`."""
        return t.key.unstored(), why.encode(), self.policy.not_stored_ttl_s

    def index_unstored(self, t: WriteTicket, why: str) -> bool:
        """Mark the prompt in the semantic store as not stored, and why, for its look-alikes'
        misses (embeds the prompt, usually from the embedding cache: not on an event loop).
        Its own point (never an entry's): a later stored answer does not replace it, and no
        search for entries returns it."""
        if self.semantic is None or self.embedder is None:
            return False
        key = t.key
        try:
            point = SemanticPoint(
                entry_key=f"{NOT_STORED}:{key.exact()}",
                vector=self.embedder.embed_one(key.ns.tenant, key.prompt_norm),
                ns=key.ns,
                context_hash=key.context_hash,
                params_hash=key.params_hash,
                expires_at=time.time() + self.policy.not_stored_ttl_s,
                prompt=key.prompt_norm,
                kind="unstored",
                why=why,
            )
            self.semantic.upsert([point])
        except CacheUnavailable as e:  # only a reason is lost
            log.debug("not-stored mark not indexed: %s", e)
            return False
        return True

    def _entry(
        self,
        t: WriteTicket,
        response: str,
        source: Source,
        tokens_in: int,
        tokens_out: int,
        gpu_ms: float,
        generated_at: float | None,
    ) -> CacheEntry:
        ns = t.key.ns
        now = time.time()
        prov = Provenance(
            model_id=ns.model_id,
            model_version=ns.model_version,
            template_version=ns.template_version,
            generated_at=generated_at or now,
            cached_at=now,
            source=source,
        )
        return CacheEntry(
            tenant=ns.tenant,
            prompt=t.key.prompt_norm,
            response=response,
            provenance=prov,
            context_hash=t.key.context_hash,
            docs=tuple((d.doc_id, d.version) for d in t.docs),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            gpu_ms=gpu_ms,
        )

    def _index_semantic(self, w: PreparedWrite) -> bool:
        if self.semantic is None or self.embedder is None:
            return False
        t = w.ticket
        ttl = min(self.policy.semantic_ttl_s, self.policy.exact_ttl_s)
        try:
            vec = self.embedder.embed_one(t.key.ns.tenant, t.key.prompt_norm)
            answer = self._answer_vector(w, vec)
            point = SemanticPoint(
                entry_key=t.key.exact(),
                vector=vec,
                ns=t.key.ns,
                context_hash=t.key.context_hash,
                params_hash=t.key.params_hash,
                expires_at=time.time() + ttl,
                prompt=t.key.prompt_norm,
                docs=tuple(sorted({d.doc_id for d in t.docs})),
                answer_vector=answer,
            )
            self.semantic.upsert([point])
        except CacheUnavailable as e:
            # The exact entry landed; a missing vector only costs semantic hits until the TTL.
            log.warning("semantic index write failed, exact entry kept: %s", e)
            return False
        return True

    def _answer_vector(self, w: PreparedWrite, prompt: Vector) -> Vector | None:
        """The answer, embedded (not through the embedding cache: answers rarely repeat), when
        the matcher weighs answers; then the shadow check, if the lookup left one, and the
        matcher's answer checks (caches/matching/calibration.py), if it keeps them."""
        if not self.matcher.needs_answers or self.embedder is None:
            return None
        vec: Vector = self.embedder.inner.embed([w.response])[0]
        s = w.shadow
        checks = getattr(self.matcher, "checks", None)
        if checks is not None:
            try:
                checks.live(w.ticket.key.ns.tenant, prompt, vec, s.near if s is not None else ())
            except CacheUnavailable as e:  # a check lost; the entry is still indexed
                log.debug("answer check not recorded: %s", e)
        if s is not None and self.budget is not None and self._rng.random() < self.shadow_share:
            same = self.judge.agree(vec, s.reference, s.members)
            try:
                self.budget.record(s.tenant, s.route, s.strength, wrong=not same)
            except CacheUnavailable as e:  # one verdict lost; the entry is still indexed
                log.debug("shadow verdict not recorded: %s", e)
        return vec


# What building a key raises on text that is not Unicode (a lone surrogate: "\ud800") or on
# a value JSON cannot carry (an integer past 64 bits in a parameter): the request's fault.
_UNKEYABLE = (UnicodeEncodeError, orjson.JSONEncodeError)


def _unkeyable(e: Exception) -> RequestRejected:
    return RequestRejected(f"request cannot be keyed: {type(e).__name__}: {e}")


def _same_namespace(entry: CacheEntry, req: CacheRequest) -> bool:
    p = entry.provenance
    return (
        entry.tenant == req.tenant
        and p.model_id == req.model_id
        and p.model_version == req.model_version
        and p.template_version == req.template_version
    )


def not_stored(mark: bytes | str | None) -> str:
    """A miss's reason from its request's not-stored mark (unstored_mark); "" without one."""
    if mark is None:
        return ""
    why = as_bytes(mark).decode(errors="replace")
    return f"{NOT_STORED}: {why}: the last answer to this request was not cached"
