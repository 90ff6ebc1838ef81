"""The demo's users: each log row as an OpenAI chat request over HTTP to `stoker gateway`, and
how each answer is scored.

A request is what a RAG application sends: a system message naming the tenant and inlining the
retrieved documents at their current versions, the user's question, the row's parameters, the
template version as a header, and the documents by id alone in the `stoker` extension (so a
document edit does not change the key: only the invalidation worker keeps answers fresh).

Scoring reads only what the gateway answered and what is true at that instant, never the key
scheme: the simulated backend cites the source markers its prompt held ([tenant:...],
[doc:...@vN]; a simulator convenience, the way a RAG model cites what it read), so a hit is
stale when it cites a document version older than the current one or a retired model version
served it, and crossed tenants when it cites another tenant. A semantic hit is false when the
cached question's intent (CLINC150's label, read here only) is not the asker's.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from caches.keys import normalise_prompt
from gateway.identity import resolve
from gateway.options import GatewayOptions
from simulation.backend.simulator import CITATION

_PATH = "/v1/chat/completions"
# Requests in flight at once: a few users at a time, as a gateway sees them.
CONCURRENCY = 8


@dataclass
class Truth:
    """What is current: every document's version (the retriever's view), retired versions."""

    doc_versions: dict[str, int] = field(default_factory=dict)
    retired_versions: set[str] = field(default_factory=set)

    def version(self, doc_id: str) -> int:
        return self.doc_versions.get(doc_id, 1)


def doc_ids(row: dict[str, Any]) -> list[str]:
    return [str(d["doc_id"]) for d in orjson.loads(row["context_docs"])]


def request_of(row: dict[str, Any], truth: Truth) -> tuple[dict[str, Any], dict[str, str]]:
    """(body, headers) of the row's request, documents inlined at their current versions."""
    system = f"You answer for [tenant:{row['tenant']}]."
    ids = doc_ids(row)
    for d in ids:
        system += f"\n[doc:{d}@v{truth.version(d)}] {d}: the steps of this article apply."
    body: dict[str, Any] = {
        "model": row["model_id"],
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": row["prompt"]},
        ],
        **orjson.loads(row["params"]),
    }
    if ids:
        body["stoker"] = {"docs": [{"doc_id": d} for d in ids]}
    headers = {
        "x-stoker-tenant": row["tenant"],
        "x-stoker-template-version": row["template_version"],
    }
    return body, headers


def digest_intents(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Entry key digest -> the CLINC150 intent of its question, for the scorer only. The digest
    comes from the gateway's own identity code, so it is the key the gateway built."""
    opts = GatewayOptions(upstream_url="http://scorer", default_temperature=0.0)
    out: dict[str, str] = {}
    truth = Truth()
    for row in rows:
        body, headers = request_of(row, truth)
        r = resolve("chat", body, headers, _PATH, opts)
        out[r.cache_request("any").key().digest] = row["intent"]
    return out


@dataclass
class HourStats:
    requests: int = 0
    exact: int = 0
    semantic: int = 0
    gpu_ms_live: float = 0.0  # what this hour's misses cost the GPU (the log's gpu_ms)
    # of it, the misses on a request logged before: what a warm could have replayed
    gpu_ms_live_replayable: float = 0.0
    # ... and of those, the misses on a request logged FREQUENT times or more before: the ones
    # a forecast can call (asked about daily, against a week of log)
    gpu_ms_live_frequent: float = 0.0
    latency_ms: list[float] = field(default_factory=list)


@dataclass
class ServeStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    cacheable: int = 0
    coalesced: int = 0
    gpu_ms_total: float = 0.0  # what the GPU would have spent with no cache at all
    gpu_ms_saved: float = 0.0  # of it, what cache hits spared
    latency_ms: list[float] = field(default_factory=list)
    stale_hits: int = 0
    cross_tenant_hits: int = 0
    false_semantic_hits: int = 0
    errors: int = 0
    hourly: dict[int, HourStats] = field(default_factory=dict)
    # the hours each served entry served a hit in, by served_entry(): the digest alone
    # (x-stoker-key) is the same for one prompt in every tenant and version
    hit_hours: dict[str, list[int]] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())


def served_entry(tenant: str, model_version: str, digest: str) -> str:
    """One cache entry's name in the report: its tenant, model version and key digest."""
    return f"{tenant}/{model_version}/{digest}"


def replay_identity(row: dict[str, Any]) -> tuple[str, ...]:
    """What makes a logged request the same request again, as a warm replays it: tenant,
    template, parameters, documents and the normalised question (no label)."""
    return (row["tenant"], row["template_version"], row["params"], row["context_docs"],
            normalise_prompt(row["prompt"]))  # fmt: skip


# Logged this many times before, a request counts as frequent (about daily over a week).
FREQUENT = 7


class Scorer:
    """`logged`: how often each request was logged before serving began (replay_identity);
    each served row adds to it, so a miss counts as replayable when its request was logged
    earlier, and as frequent when FREQUENT times or more."""

    def __init__(
        self,
        truth: Truth,
        intents: dict[str, str],
        logged: Counter[tuple[str, ...]] | None = None,
    ) -> None:
        self.truth, self.intents = truth, intents
        self.logged: Counter[tuple[str, ...]] = Counter(logged or ())
        self.stats = ServeStats()

    def score(self, row: dict[str, Any], resp: httpx.Response, wall_ms: float, hour: int) -> None:
        s = self.stats
        h = s.hourly.setdefault(hour, HourStats())
        h.requests += 1
        ident = replay_identity(row)
        before = self.logged[ident]
        self.logged[ident] += 1
        s.gpu_ms_total += row["gpu_ms"]
        if resp.status_code != 200:
            s.errors += 1
            s.outcomes["error"] += 1
            return
        outcome = resp.headers.get("x-stoker-cache", "miss")
        coalesced = resp.headers.get("x-stoker-coalesced") == "true"
        s.outcomes[outcome] += 1
        s.cacheable += outcome != "bypass"
        if outcome in ("exact", "semantic"):
            h.exact += outcome == "exact"
            h.semantic += outcome == "semantic"
            s.gpu_ms_saved += row["gpu_ms"]
            entry = served_entry(
                row["tenant"],
                resp.headers.get("x-stoker-model-version", ""),
                resp.headers.get("x-stoker-key", ""),
            )
            s.hit_hours.setdefault(entry, []).append(hour)
            s.latency_ms.append(wall_ms)
            h.latency_ms.append(wall_ms)
            self._judge(row, resp, outcome)
        else:
            if coalesced:  # another request's GPU call answered it: no GPU of its own
                s.coalesced += 1
                s.gpu_ms_saved += row["gpu_ms"]
            else:
                h.gpu_ms_live += row["gpu_ms"]
                h.gpu_ms_live_replayable += row["gpu_ms"] if before else 0.0
                h.gpu_ms_live_frequent += row["gpu_ms"] if before >= FREQUENT else 0.0
            # The simulator is time-compressed: a miss (or a wait on one) takes what the
            # row's request took the real GPU (conservative for a coalesced one).
            s.latency_ms.append(wall_ms + row["latency_ms"])
            h.latency_ms.append(wall_ms + row["latency_ms"])

    def _judge(self, row: dict[str, Any], resp: httpx.Response, outcome: str) -> None:
        s = self.stats
        text = resp.json()["choices"][0]["message"]["content"] or ""
        cites = [c[1:-1].split(":", 1) for c in CITATION.findall(text)]
        tenants = {v for k, v in cites if k == "tenant"}
        s.cross_tenant_hits += bool(tenants) and tenants != {row["tenant"]}
        stale_doc = any(
            int(v.rsplit("@v", 1)[1]) < self.truth.version(v.rsplit("@v", 1)[0])
            for k, v in cites
            if k == "doc"
        )
        retired = resp.headers.get("x-stoker-model-version") in self.truth.retired_versions
        s.stale_hits += stale_doc or retired
        if outcome == "semantic":
            theirs = self.intents.get(resp.headers.get("x-stoker-key", ""))
            s.false_semantic_hits += row["intent"] == "oos" or theirs != row["intent"]


class DemoClient:
    """Sends an hour's rows through the gateway, CONCURRENCY at a time, and scores them."""

    def __init__(self, gateway_url: str, scorer: Scorer) -> None:
        self.url, self.scorer = gateway_url, scorer

    def serve(self, rows: list[dict[str, Any]], hour: int) -> None:
        asyncio.run(self._serve(rows, hour))

    async def _serve(self, rows: list[dict[str, Any]], hour: int) -> None:
        gate = asyncio.Semaphore(CONCURRENCY)
        limits = httpx.Limits(max_connections=CONCURRENCY)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as http:

            async def one(row: dict[str, Any]) -> None:
                async with gate:
                    body, headers = request_of(row, self.scorer.truth)
                    t0 = time.perf_counter()
                    resp = await http.post(_PATH, content=orjson.dumps(body), headers=headers)
                    self.scorer.score(row, resp, (time.perf_counter() - t0) * 1000, hour)

            await asyncio.gather(*(one(r) for r in rows))
