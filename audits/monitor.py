"""The wrong-hit monitor as a worker: served hits from the request log, re-asked.

Two kinds of served hit are checked:
- semantic hits (a look-alike's answer served): is it right for this query?
- exact hits served soon after an invalidation in their tenant (within `stale_window_s` of the
  change event's time, which the invalidation worker notes: caches/changes.py): is it still
  what the backend answers? A missed or late deletion serves a stale answer exactly here.
  Verdicts go to stoker.audit and `stoker_monitor_stale_checks_total{tenant,result}`, not to
  the semantic error budget (they say nothing of the matcher).

Per batch of inference.requests (numbered as in `apply`):
1. sample: a v2 semantic hit is audited when the hash of its event id falls under `share`
   (so a re-delivered batch samples the same hits), an exact hit served soon after a change
   under `stale_share`, and only while the QPS cap has a token (a hit the cap cannot carry is
   dropped, counted "over_rate": the monitor keeps up with the log rather than falling behind
   it);
2. the served entry is read back from Redis (the log names it by namespace and key digest);
   one gone since (expired, invalidated) is skipped;
3. the backend is asked the logged request again, exactly as the gateway sent it (through the
   one backend client, backends/client.py: the gateway's HTTP stack and error tree);
4. the fresh answer and the served one are embedded and judged by meaning (AnswerJudge via
   audits/judge.py's Auditor, with the number guard on the texts): a verified hit against
   the centroid of the answers that vouched for it (found again by one search, as the matcher
   sees the store now; the centroid bar), anything else against the served answer (pair bar);
5. a verified hit's verdict goes to the error budget's shared counts in Redis, once per request
   (add_once: a re-delivered record is re-asked, never counted twice); a probe (the query's
   vector with the fresh answer's) goes to the semantic store, if this process has one;
6. one HitAudited per judged hit to stoker.audit, flushed before the batch's offsets commit.
Bad records go to stoker.dlq (the worker's decode, as for every handler). A Redis or broker
outage raises (retriable): the batch is read again. A backend outage does not: the hits of that
batch go unaudited (counted "backend_error"), a sample lost, not a stalled log.

Off-peak: the monitor adds no load to a busy backend. Its re-asks are paced by AIMD under the
QPS cap (halved on a 429, a 5xx, a timeout or a retry, grown back while answers come at their
baseline latency), and while the backend's load as its answers show it (backends/pacing.py,
Aimd.load: latency per token over the baseline, and full for a few seconds after congestion)
is at or over `busy_load`, a sampled hit is dropped, counted "busy". So at the daily peak the
monitor mostly waits, and it catches up on nothing: a dropped sample is a smaller sample, never
a backlog. Not built: a schedule that holds samples for the night.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from audits import metrics as M
from audits.judge import Auditor, ServedHit
from audits.options import MonitorOptions
from backends.base import Backend, Generation, GenerationRequest
from backends.pacing import Aimd, MonotonicClock, TokenBucket
from caches import changes, slots
from caches.boundary import as_bytes, redis_boundary
from caches.client import CacheClient
from caches.keys import CacheKey
from caches.matching.answers import Judgement
from caches.matching.base import Vector
from caches.matching.error_budget import ErrorBudget, ServingLevels
from caches.matching.verified import strength_of
from caches.request import CacheRequest
from caches.semantic.base import SemanticPoint
from schemas.entries import CacheEntry
from schemas.errors import BackendRejected, BackendUnavailable, StokerError
from schemas.events import BaseEvent, Event, HitAudited, RequestLogged
from streams.base import Handler

log = logging.getLogger(__name__)

AUDIT_TOPIC = "stoker.audit"


class AuditSink(Protocol):
    """Where HitAudited records go (streams.publisher.EventPublisher)."""

    def publish(self, logical: str, event: BaseEvent, key: str | None = None) -> None: ...

    def flush(self, timeout_s: float = ...) -> None: ...


def sampled(event_id: str, share: float) -> bool:
    """The same answer for the same event on every delivery and every replica."""
    h = int.from_bytes(hashlib.sha256(event_id.encode()).digest()[:8], "big")
    return h < share * 2**64


@dataclass(frozen=True)
class _Pick:
    event: RequestLogged
    entry_key: str
    served_prompt: str
    served_text: str


class MonitorHandler(Handler):
    name = "monitor"
    topics = ["inference.requests"]  # noqa: RUF012  (the Handler contract: a plain list)
    # A batch waits for its re-asks (a few a second): small batches commit often and let a
    # SIGTERM finish within its grace period.
    batch_size = 500

    def __init__(
        self,
        cache: CacheClient,
        backend: Callable[[], Backend],
        sink: AuditSink,
        auditor: Auditor,
        budget: ErrorBudget | None = None,
        levels: ServingLevels | None = None,
        options: MonitorOptions | None = None,
        *,
        close_clients: bool = True,
    ) -> None:
        """close_clients: False when the caller shares `cache` (the shell's Stack closes it)."""
        if cache.embedder is None:
            raise ValueError("the monitor judges answers by meaning: it needs an embedder")
        self.cache = cache
        self.backend = backend
        self.sink = sink
        self.auditor = auditor
        self.budget = budget
        self.levels = levels
        self.options = options or MonitorOptions()
        burst = max(1.0, self.options.qps)  # a second's worth after an idle spell
        clock = MonotonicClock()
        self.bucket = TokenBucket(self.options.qps, clock, burst=burst)
        self.aimd = Aimd(self.options.aimd, self.options.qps, clock)
        self._close_clients = close_clients

    def apply(self, events: list[Event]) -> None:
        picks = self._picks(events)  # 1, 2
        if not picks:
            return
        answers = asyncio.run(self._reask(picks))  # 3
        judged = [(p, g) for p, g in zip(picks, answers, strict=True) if g is not None]
        if not judged:
            return
        audits = self._judge(judged)  # 4, 5
        for a in audits:  # 6
            self.sink.publish(AUDIT_TOPIC, a, key=a.tenant)
        self.sink.flush()
        if self.levels is not None:  # the gauges this process exports read the new counts
            for pair in {(a.tenant, a.route) for a in audits}:
                self.levels.level(*pair)

    # -- 1, 2 --

    def _picks(self, events: Sequence[Event]) -> list[_Pick]:
        share = {"semantic": self.options.share, "exact": self.options.stale_share}
        hits = [
            e for e in events
            if isinstance(e, RequestLogged) and e.schema_version == 2 and e.cache_key
            and e.request is not None and e.cache_outcome in share
            and sampled(e.event_id, share[e.cache_outcome])
        ]  # fmt: skip
        exact = {e.tenant for e in hits if e.cache_outcome == "exact"}
        changed = changes.read(self.cache.redis, exact) if exact else {}
        hits = [e for e in hits if e.cache_outcome == "semantic" or self._soon_after(e, changed)]
        if not hits:
            return []
        keys = [_request(e).ns.exact_prefix + str(e.cache_key) for e in hits]
        with redis_boundary("monitor entry read"):
            blobs = slots.mget(self.cache.redis, keys)
        out = []
        for e, key, blob in zip(hits, keys, blobs, strict=True):
            if blob is None:
                M.audited("entry_gone")
                continue
            entry = CacheEntry.from_bytes(as_bytes(blob))
            out.append(_Pick(e, key, entry.prompt, entry.response))
        return out

    def _soon_after(self, e: RequestLogged, changed: dict[str, float]) -> bool:
        at = changed.get(e.tenant)
        return at is not None and 0.0 <= e.ts.timestamp() - at <= self.options.stale_window_s

    # -- 3 --

    async def _reask(self, picks: list[_Pick]) -> list[Generation | None]:
        out: list[Generation | None] = []
        busy = self.options.busy_load
        async with self.backend() as backend:
            for p in picks:
                load = self.aimd.load()
                if busy is not None and load is not None and load >= busy:
                    M.audited("busy")  # no load added to a busy backend
                    out.append(None)
                    continue
                # AIMD's floor (min_qps) may lie above a lower cap; the cap wins
                self.bucket.set_rate(min(self.aimd.rate, self.options.qps))
                if not self.bucket.try_acquire():
                    M.audited("over_rate")
                    out.append(None)
                    continue
                out.append(await self._ask(backend, p.event))
        return out

    async def _ask(self, backend: Backend, e: RequestLogged) -> Generation | None:
        assert e.request is not None
        req = GenerationRequest(
            e.tenant, e.model_id, e.model_version, e.template_version, e.prompt, e.params,
            e.context_docs, body=e.request.body, api=e.request.api, route=e.route,
        )  # fmt: skip
        try:
            g = await backend.generate(req)
        except (BackendUnavailable, BackendRejected) as err:
            if isinstance(err, BackendUnavailable):  # a 429, 5xx or timeout: the backend is full
                self.aimd.on_congestion(type(err).__name__)
            M.audited("backend_error")
            log.debug("monitor re-ask of %s failed: %s", e.request_id, err)
            return None
        if g.retries:
            self.aimd.on_congestion("retried")
        else:
            self.aimd.on_success(g.latency_ms, g.tokens_out)
        if g.finish_reason not in ("stop", "tool_calls"):
            M.audited("cut")  # an answer cut at its length is no answer to compare
            return None
        return g

    # -- 4, 5 --

    def _judge(self, judged: list[tuple[_Pick, Generation]]) -> list[HitAudited]:
        emb = self.cache.embedder
        assert emb is not None
        texts = [g.text for _, g in judged] + [p.served_text for p, _ in judged]
        vecs = emb.inner.embed(texts)
        n, now, out = len(judged), time.time(), []
        for i, (p, g) in enumerate(judged):
            e = p.event
            if e.cache_outcome == "exact":
                j = self.auditor.judge.judge(vecs[i], vecs[n + i], g.text, p.served_text)
                M.audited(j.verdict)
                M.stale_checked(e.tenant, j.verdict)
                out.append(_audited(e, p, j, rule=e.cache_rule or "exact", strength=None))
                continue
            req = _request(e)
            key = req.key()
            strength = strength_of(e.cache_rule or "")
            query_vec, reference, members = self._vouched(req, key, p.entry_key, vecs[n + i])
            hit = ServedHit(
                key.ns, e.route or "", key.context_hash, key.params_hash, key.prompt_norm,
                query_vec, p.entry_key, e.cache_score or 0.0, e.cache_rule or "", strength,
                p.served_text, reference, members,
            )  # fmt: skip
            audit, j, probe = self.auditor.audit(hit, g.text, vecs[i], now)
            M.audited(j.verdict)
            counted = False
            if self.budget is not None and strength is not None:
                counted = self.budget.record_once(
                    e.tenant, hit.route, strength, wrong=not j.same, once=e.event_id
                )
            self._leave_probe(probe)
            out.append(_audited(e, p, j, rule=audit.rule, strength=strength, counted=counted))
        return out

    def _vouched(
        self, req: CacheRequest, key: CacheKey, served_key: str, served: Vector
    ) -> tuple[Vector, Vector, int]:
        """The query's vector, and what the fresh answer is judged against: the centroid of the
        served answer and the neighbours' answers that vouched for it, as the verified matcher
        sees them now (one search), with the centroid's bar; else the served answer alone, with
        the pair bar."""
        emb = self.cache.embedder
        assert emb is not None
        assess = getattr(self.cache.matcher, "assess", None)
        found = None
        if assess is not None and self.cache.semantic is not None:
            try:
                found = self.cache.semantic_candidates(req, key)
            except StokerError as err:  # the store or Redis is down: the pair bar still judges
                log.debug("monitor could not read what vouched for %s: %s", served_key, err)
        if found is None or assess is None:
            return emb.embed_one(req.tenant, key.prompt_norm), served, 1
        q, cands, _ = found  # the search embedded the query already
        a = assess(q, cands)
        if a.index < 0 or a.reference is None or cands[a.index].entry_key != served_key:
            return q.vector, served, 1  # the neighbourhood moved since: judge what was served
        return q.vector, a.reference, a.members

    def _leave_probe(self, probe: SemanticPoint) -> None:
        store = self.cache.semantic
        if store is None:
            return
        try:
            store.upsert([probe])
        except StokerError as e:  # a probe is a hint for the matcher; the verdict stands
            log.debug("monitor probe not stored: %s", e)

    def close(self) -> None:
        if self._close_clients:
            self.cache.close()


def _audited(
    e: RequestLogged,
    p: _Pick,
    j: Judgement,
    *,
    rule: str,
    strength: int | None,
    counted: bool = False,
) -> HitAudited:
    outcome: Literal["exact", "semantic"] = "exact" if e.cache_outcome == "exact" else "semantic"
    return HitAudited(
        event_id=e.event_id,
        request_id=e.request_id,
        tenant=e.tenant,
        model_id=e.model_id,
        model_version=e.model_version,
        template_version=e.template_version,
        route=e.route or "",
        query=e.prompt,
        served_prompt=p.served_prompt,
        entry_key=str(e.cache_key),
        cache_outcome=outcome,
        score=e.cache_score,
        rule=rule,
        strength=strength,
        verdict=j.verdict,
        cosine=max(-1.0, min(1.0, j.cosine)),
        reason=j.reason,
        counted=counted,
    )


def _request(e: RequestLogged) -> CacheRequest:
    return CacheRequest(
        e.tenant, e.model_id, e.model_version, e.template_version, e.prompt, e.params,
        e.context_docs, e.route,
    )  # fmt: skip
