"""The demo's serving gateway: what a real gateway does per request, and what the demo scores.

Per request (time order): look the cache up (exact, then semantic); on a miss, get the answer
from the simulated backend's answer function and store it through the cache client (the
generation check applies), then log the request to Kafka as RequestLogged with its outcome, as
a production gateway would. Scoring uses what the gateway knows to be true at that instant
(the live model version, the current version of each document) and the CLINC intent labels,
which nothing that serves or warms ever reads.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Producer

from caches.client import CacheClient, CacheRequest, LookupResult, Outcome
from caches.keys import normalise_prompt
from schemas.codec import encode_event
from schemas.common import DocRef, RequestParams
from schemas.events import RequestLogged
from warmers.backends.simulator import Simulator


@dataclass
class Truth:
    """What is current: the live model version and every document's version (the retriever's view)."""

    model_version: str
    doc_versions: dict[str, int] = field(default_factory=dict)
    retired_versions: set[str] = field(default_factory=set)

    def docs_for(self, raw_docs: list[dict[str, Any]]) -> tuple[DocRef, ...]:
        return tuple(
            DocRef(doc_id=d["doc_id"], version=self.doc_versions.get(d["doc_id"], d["version"]))
            for d in raw_docs
        )


@dataclass
class HourStats:
    requests: int = 0
    exact: int = 0
    semantic: int = 0


@dataclass
class ServeStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    cacheable: int = 0
    gpu_ms_total: float = 0.0  # what the GPU would have spent with no cache at all
    gpu_ms_saved: float = 0.0  # of it, what cache hits spared
    latency_ms: list[float] = field(default_factory=list)
    stale_hits: int = 0
    cross_tenant_hits: int = 0
    false_semantic_hits: int = 0
    refused_writes: Counter[str] = field(default_factory=Counter)
    hourly: dict[int, HourStats] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())


class Gateway:
    def __init__(
        self,
        cache: CacheClient,
        sim: Simulator,
        truth: Truth,
        intent_of: dict[str, str],
        producer: Producer | None,
        requests_topic: str,
    ) -> None:
        self.cache = cache
        self.sim = sim
        self.truth = truth
        self.intent_of = intent_of
        self.producer = producer
        self.topic = requests_topic
        self.stats = ServeStats()

    def serve(self, row: dict[str, Any], hour: int) -> None:
        req = request_of(row, self.truth.model_version, self.truth)
        t0 = time.perf_counter()
        res = self.cache.lookup(req)
        lookup_ms = (time.perf_counter() - t0) * 1000.0
        s = self.stats
        s.outcomes[res.outcome] += 1
        s.gpu_ms_total += row["gpu_ms"]
        s.cacheable += res.outcome != "bypass"
        h = s.hourly.setdefault(hour, HourStats())
        h.requests += 1
        if res.hit:
            self._score_hit(req, res, row)
            s.gpu_ms_saved += row["gpu_ms"]
            s.latency_ms.append(lookup_ms)
            h.exact += res.outcome == "exact"
            h.semantic += res.outcome == "semantic"
        else:
            s.latency_ms.append(lookup_ms + row["latency_ms"])
            self._compute_and_store(req, res, row)
        self._log(row, req, res, lookup_ms)

    def _score_hit(self, req: CacheRequest, res: LookupResult, row: dict[str, Any]) -> None:
        e = res.entry
        assert e is not None
        s = self.stats
        s.cross_tenant_hits += e.tenant != req.tenant
        stale_doc = any((v or 0) < self.truth.doc_versions.get(d, v or 0) for d, v in e.docs)
        stale_version = e.provenance.model_version in self.truth.retired_versions
        s.stale_hits += (
            stale_doc or stale_version or e.provenance.model_version != req.model_version
        )
        if res.outcome == "semantic":
            mine = row["intent"]
            theirs = self.intent_of.get(e.prompt)
            s.false_semantic_hits += mine == "oos" or theirs != mine

    def _compute_and_store(self, req: CacheRequest, res: LookupResult, row: dict[str, Any]) -> None:
        if res.ticket is None:
            return
        # compressed time: the simulator's answer function, without its latency; GPU cost
        # comes from the log row (what this request cost the real GPU)
        answer = self.sim.answer_for(req.model_id, req.prompt, req.params.max_tokens).text
        out = self.cache.store(
            res,
            answer,
            gpu_ms=row["gpu_ms"],
            tokens_in=row["tokens_in"],
            tokens_out=row["tokens_out"],
        )
        if not out.landed:
            self.stats.refused_writes[out.reason.split(":")[0]] += 1

    def _log(self, row: dict[str, Any], req: CacheRequest, res: LookupResult, ms: float) -> None:
        if self.producer is None:
            return
        ev = logged_event(row, req, res.outcome, ms)
        self.producer.produce(self.topic, encode_event(ev), key=req.tenant.encode())
        self.producer.poll(0)


def request_of(row: dict[str, Any], model_version: str, truth: Truth | None = None) -> CacheRequest:
    """A log row as the gateway asks the cache (the retriever's current doc versions if known)."""
    raw_docs = orjson.loads(row["context_docs"])
    docs = truth.docs_for(raw_docs) if truth else tuple(DocRef(**d) for d in raw_docs)
    params = RequestParams(**orjson.loads(row["params"]))
    return CacheRequest(
        row["tenant"], row["model_id"], model_version, row["template_version"], row["prompt"],
        params, docs,
    )  # fmt: skip


def logged_event(
    row: dict[str, Any], req: CacheRequest, outcome: Outcome = "miss", lookup_ms: float = 0.0
) -> RequestLogged:
    """The RequestLogged a gateway publishes for the row, served as `outcome`."""
    hit = outcome in ("exact", "semantic")
    return RequestLogged(
        request_id=row["request_id"],
        ts=row["ts"],
        tenant=req.tenant,
        model_id=req.model_id,
        model_version=req.model_version,
        template_version=req.template_version,
        prompt=req.prompt,
        params=req.params,
        context_docs=req.docs,
        cache_outcome=outcome,
        latency_ms=lookup_ms if hit else row["latency_ms"],
        gpu_ms=0.0 if hit else row["gpu_ms"],
        tokens_in=row["tokens_in"],
        tokens_out=0 if hit else row["tokens_out"],
    )


def intent_index(rows: list[dict[str, Any]]) -> dict[str, str]:
    """normalised prompt -> intent, for scoring false semantic hits (labels score, never serve)."""
    return {normalise_prompt(r["prompt"]): r["intent"] for r in rows}
