"""One pass of the demo on a fresh embedded stack: replay week 1, then serve week 2 hour by hour
over HTTP through `stoker gateway` in front of `stoker sim-backend`, with the scheduler's
warming (or without it, for the baseline), a mid-week model deploy and a few knowledge-base
changes. Time is compressed: an hour of week 2 takes as long as serving it.

The gateway, the workers (traffic, invalidation, deploy) and the warm runner share this process,
as `stoker gateway` on the embedded stack does: Qdrant Edge lives inside one process. Week 1 is
replayed as the request log v2 the gateway would have published; week 2's log comes from the
gateway itself, and the traffic worker learns from it as it goes.
"""

from __future__ import annotations

import faulthandler
import math
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from rich.progress import Progress

from caches.client import CacheClient
from caches.keys import entries_pattern, normalise_prompt
from caches.request import LookupResult
from demo.client import (
    DemoClient,
    Scorer,
    ServeStats,
    Truth,
    digest_intents,
    replay_identity,
    request_of,
)
from demo.clock import SimTTL, stored_ttl_s
from demo.progress import DemoProgress
from demo.scenario import NEW_VERSION, Scenario, Traffic
from gateway.cachegate import Answer, Decision
from gateway.completions import Served, log_event
from gateway.identity import resolve
from gateway.service import GatewayServer
from invalidators.deployjob import NoPrewarmer, Prewarmer
from invalidators.handlers import InvalidationHandler
from schemas.codec import decode_event
from schemas.errors import StokerError
from schemas.events import Event, JobStatus, KnowledgeBaseChanged, ModelDeployed
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig, Simulator
from stoker.embedded import EmbeddedStack
from stoker.registry import build_handler, deploy_handler
from stoker.settings import StokerSettings
from stoker.stack import Stack
from stoker.wiring import gateway_options, worker_config
from streams.base import Handler
from streams.publisher import EventPublisher
from streams.topics import TOPICS, consumer_config, ensure_topics, producer_config, topic_name
from streams.worker import Worker

# Compressed time: the simulated GPU answers in milliseconds (0.01 ms/token prefill, 0.05 ms/token
# decode), so a whole week of warming fits in the run.
SIM = SimConfig(slots=32, queue=512, prefill_ms_per_token=0.01, decode_ms_per_token=0.05)
WAIT_S = 120.0
# The old version's purge goes in about PURGE_STEPS paced batches over PURGE_S wall seconds. With
# the production batch (1,000 keys) the demo's namespace (hundreds to a few thousand entries)
# went in one batch, and the plot showed the staggered purge as a single step. The deploy job
# reports at most one status per 0.5 s (CutoverOptions.status_every_s), so a batch gets 0.75 s;
# the purge runs while the hours after the deploy are served, so the run is no longer for it.
PURGE_STEPS, PURGE_S = 8, 6.0
_RETIRED = re.compile(r"retired \S+@(\S+) ")


@dataclass
class PassResult:
    warm: bool
    serve: ServeStats
    warm_windows: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[tuple[float, JobStatus]] = field(default_factory=list)
    deploy: dict[str, Any] = field(default_factory=dict)
    invalidations: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    expired: dict[int, int] = field(default_factory=dict)  # hour -> entries the TTL expired
    prewarms: list[Any] = field(default_factory=list)  # the deploy pre-warms (HotSetPrewarm)
    # the deploy's pre-warm sent ahead under the headroom (demo/headroom.py), per hour
    lead_warms: list[dict[str, Any]] = field(default_factory=list)


class StatusFollower:
    """Reads stoker.status from the start into a list (for --wait-like checks and the plots)."""

    def __init__(self, settings: StokerSettings) -> None:
        bootstrap = settings.kafka_bootstrap or ""
        group = f"demo-status-{uuid.uuid4().hex[:6]}"
        topic = topic_name("stoker.status", settings.topic_prefix)
        ensure_topics(bootstrap, {topic: TOPICS["stoker.status"]})
        self._c = Consumer(consumer_config(bootstrap, group, embedded=True))
        # assigned, not subscribed: no group join, and no wait for a metadata refresh (5 min by
        # default) when the topic appeared after the subscription; one partition, from the start
        self._c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.seen: list[tuple[float, JobStatus]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="demo-status", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self._c.consume(100, timeout=0.1):
                if m.error() is None:
                    ev = decode_event(m.value() or b"")
                    if isinstance(ev, JobStatus):
                        self.seen.append((time.time(), ev))
        self._c.close()

    def wait_for(self, job_id: str, states: tuple[str, ...], timeout_s: float) -> JobStatus:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, st in reversed(self.seen):
                if st.job_id == job_id and st.state in (*states, "failed"):
                    if st.state == "failed":
                        raise StokerError(f"deploy job {job_id} failed: {st.detail}")
                    return st
            self._stop.wait(0.05)
        seen = [f"{st.state}:{st.detail}" for _, st in self.seen if st.job_id == job_id]
        faulthandler.dump_traceback(all_threads=True)  # where it is stuck, for the bug report
        raise StokerError(
            f"deploy job {job_id} did not reach {states} in {timeout_s:.0f} s; seen: {seen}"
        )

    def retired(self) -> set[str]:
        """Model versions a deploy job has retired (its status reads "retired model@version")."""
        out = set()
        for _, st in list(self.seen):
            m = _RETIRED.search(st.detail)
            if m:
                out.add(m.group(1))
        return out

    def close(self) -> None:
        self._stop.set()
        self._t.join(10)


_DEAD: list[str] = []  # names of worker threads that died (checked by every wait)


@contextmanager
def _workers(settings: StokerSettings, handlers: list[Handler]) -> Iterator[list[Worker]]:
    workers = [Worker(h, worker_config(settings, h)) for h in handlers]

    def body(w: Worker) -> None:
        try:
            w.run()
        except BaseException:
            _DEAD.append(w.handler.name)
            raise

    threads = [
        threading.Thread(target=body, args=(w,), name=f"demo-{w.handler.name}") for w in workers
    ]
    _DEAD.clear()
    for t in threads:
        t.start()
    try:
        yield workers
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(30)


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if _DEAD:
            raise StokerError(f"demo: the {', '.join(_DEAD)} worker died (see its traceback above)")
        if time.monotonic() > deadline:
            raise StokerError(f"demo: timed out waiting for {what}")
        time.sleep(0.05)


class Embeddings:
    """Every distinct prompt of the log embedded once per demo (both passes share them)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.by_tenant: dict[str, set[str]] = {}
        for r in rows:
            self.by_tenant.setdefault(r["tenant"], set()).add(normalise_prompt(r["prompt"]))
        self.texts = sorted(set().union(*self.by_tenant.values()))
        self.index: dict[str, int] = {t: i for i, t in enumerate(self.texts)}
        self.vectors: Any = None

    def compute(self, embedder: Any, bar: Progress) -> None:
        import numpy as np

        task = bar.add_task("prompts embedded", total=len(self.texts))
        parts = []
        for i in range(0, len(self.texts), 256):
            chunk = self.texts[i : i + 256]
            parts.append(embedder.embed(chunk))
            bar.advance(task, len(chunk))
        self.vectors = np.concatenate(parts) if parts else np.zeros((0, embedder.dim))
        bar.remove_task(task)

    def prime(self, cache: CacheClient) -> None:
        """Fill this pass's embedding cache, so lookups and stores never wait on the model."""
        assert cache.embedder is not None
        for tenant, texts in self.by_tenant.items():
            ordered = sorted(texts)
            vecs = self.vectors[[self.index[t] for t in ordered]]
            cache.embedder.prime(tenant, ordered, vecs)


class Pass:
    """One pass: fresh stack, same traffic, warming on or off. `forgetful_invalidation`
    breaks the invalidation worker on purpose (it drops KB changes): stale hits must show."""

    def __init__(
        self,
        sc: Scenario,
        traffic: Traffic,
        warm: bool,
        progress: DemoProgress,
        emb: Embeddings,
        *,
        forgetful_invalidation: bool = False,
    ) -> None:
        self.sc, self.traffic, self.warm, self.progress = sc, traffic, warm, progress
        self.emb = emb
        self.forgetful = forgetful_invalidation
        self.result = PassResult(warm=warm, serve=ServeStats())
        self.wired: Stack | None = None  # the pass's parts, one Stack for the whole pass
        self.name = f"{sc.regime} " + ("with warming" if warm else "without warming (baseline)")

    def run(self, warming_factory: Callable[..., Any] | None) -> PassResult:
        t0 = time.perf_counter()
        bar = self.progress
        bar.phase(f"{self.name}: starting the embedded stack and the gateway")
        purge_batch, purge_rate = purge_pace(self.sc, self.traffic)
        with EmbeddedStack() as stack, SimulatorThread(SIM) as sim:
            prefix = f"demo{uuid.uuid4().hex[:4]}."
            ttl_s = stored_ttl_s(self.sc.ttl_h * 3600)  # on the simulated clock (SimTTL)
            settings = stack.settings(
                kafka_broker="tansu", topic_prefix=prefix, worker_poll_s=0.05, deploy_grace_s=0,
                gateway_lookup_budget_ms=500,  # the demo's 2 cores also run every worker
                # The static matcher: the demo's simulated backend knows no paraphrase (each
                # prompt is its own question), so the verified matcher, the default, would serve
                # none, and embedding every answer would cost the 2 cores ~20-50 ms a miss.
                # eval-semantic measures the verified matcher (README).
                semantic_matcher="static",
                traffic_max_event_age_s=None,  # week 1 keeps the sample log's own dates
                exact_ttl_s=ttl_s, semantic_ttl_s=ttl_s,
                # entries that would expire inside the warm window are refreshed ahead
                warm_min_ttl_left_s=self.sc.warm_horizon_h * 3600.0,
                # the version the gateway serves before any deploy: the model the log ran, as
                # an operator names it (with the default, "default", scheduled warms went to
                # the log's version, a namespace no request read until the deploy)
                gateway_default_model_version=self.traffic.week1[0]["model_version"],
                deploy_purge_batch=purge_batch, deploy_purge_rate=purge_rate,
                # the model server is this pass's simulated backend, named for every part that
                # calls one (the gateway, the warms, the request log's replay)
                gateway_upstream_url=sim.url, warm_backend_url=sim.url,
            )  # fmt: skip
            self.wired = wired = Stack(settings)
            parts = wired.gateway(upstream_url=sim.url)
            cache = parts.gate.cache
            if self.emb.vectors is None:
                bar.phase(f"{self.name}: embedding week 2's distinct prompts (once)")
                assert cache.embedder is not None
                self.emb.compute(cache.embedder.inner, bar)
            self.emb.prime(cache)
            warming = warming_factory(wired, sim.url) if self.warm and warming_factory else None
            self._serve_weeks(settings, parts, sim, warming, bar)
            if self.result.deploy:  # the demo's pacing, which the purge plot names
                self.result.deploy |= {"purge_batch": purge_batch, "purge_keys_per_s": purge_rate}
            if warming is not None:
                self.result.prewarms = list(warming.prewarms)
                self.result.lead_warms = list(getattr(warming, "leads", ()))
            bar.phase(f"{self.name}: stopping the stack")
            wired.close()
        self.result.seconds = time.perf_counter() - t0
        return self.result

    def _handlers(self, settings: StokerSettings, warming: Any) -> list[Handler]:
        prewarmer: Prewarmer = warming.prewarmer() if warming is not None else NoPrewarmer()
        assert self.wired is not None
        invalidation = build_handler("invalidation", self.wired)
        if self.forgetful:
            invalidation = _Forgetful(invalidation)  # type: ignore[arg-type]
        return [
            build_handler("traffic", self.wired),
            invalidation,
            deploy_handler(self.wired, prewarmer),
        ]

    def _serve_weeks(
        self,
        settings: StokerSettings,
        parts: Any,
        sim: SimulatorThread,
        warming: Any,
        bar: DemoProgress,
    ) -> None:
        follower = StatusFollower(settings)
        try:
            with (
                _workers(settings, self._handlers(settings, warming)) as workers,
                GatewayServer(parts) as gw,
            ):
                if self.warm:
                    self._replay_week1(settings, sim.server.sim, workers[0], bar)
                self._week2(settings, gw, parts.gate.cache, warming, follower, workers, bar)
        finally:
            follower.close()
            self.result.statuses = list(follower.seen)

    def _replay_week1(
        self, settings: StokerSettings, sim: Simulator, traffic_worker: Worker, bar: DemoProgress
    ) -> None:
        """Week 1 as the request log v2 the gateway would have published for it: a miss each
        (the profile counts requests; the replayable request is what warms replay)."""
        rows = self.traffic.week1
        topic = topic_name("inference.requests", settings.topic_prefix)
        opts = gateway_options(settings)
        producer = Producer(
            producer_config(settings.kafka_bootstrap or "", embedded=True, **{"linger.ms": 5})
        )
        bar.phase(f"{self.name}: replaying week 1 through Kafka into the traffic profile")
        sent = bar.add_task("week-1 requests published", total=len(rows))
        truth = Truth()
        for i, row in enumerate(rows):
            ev = _logged_miss(row, truth, sim, opts)
            producer.produce(topic, orjson.dumps(ev), key=row["tenant"].encode())
            if i % 1000 == 0:
                producer.poll(0)
                bar.update(sent, completed=i)
        producer.flush(30)
        bar.remove_task(sent)
        task = bar.add_task("week-1 requests in the profile", total=len(rows))

        def profiled() -> bool:
            bar.update(task, completed=traffic_worker.stats.events)
            return traffic_worker.stats.events >= len(rows)

        _wait(profiled, "week 1 in the profile")
        bar.remove_task(task)

    def _week2(
        self,
        settings: StokerSettings,
        gw: GatewayServer,
        cache: CacheClient,
        warming: Any,
        follower: StatusFollower,
        workers: list[Worker],
        bar: DemoProgress,
    ) -> None:
        sc, tr = self.sc, self.traffic
        truth = Truth()
        logged = Counter(replay_identity(r) for r in tr.week1)
        scorer = Scorer(truth, digest_intents(tr.week1 + tr.week2), logged)
        self.result.serve = scorer.stats
        client = DemoClient(gw.url, scorer)
        assert self.wired is not None
        publisher = self.wired.publisher
        by_hour: dict[int, list[dict[str, Any]]] = {}
        for r in tr.week2:
            by_hour.setdefault(tr.hour_of(r), []).append(r)
        kb_queue = [
            (h, docs)
            for h, docs in zip(
                sc.kb_change_at_h, _chunks(tr.kb_docs, sc.kb_docs_per_change), strict=False
            )
            if h in sc.served_hours
        ]
        clock = SimTTL(cache.redis, cache.semantic, sorted({r["model_id"] for r in tr.week2}))
        bar.phase(f"{self.name}: serving week 2 hour by hour")
        task = bar.add_task("hours served", total=len(sc.served_hours))
        for hour in sc.served_hours:
            if hour > sc.first_h:
                self.result.expired[hour] = clock.advance(1).expired
            lead = getattr(warming, "lead_ahead", None)
            if lead is not None and sc.deploy_at_h - sc.deploy_lead_h <= hour < sc.deploy_at_h:
                bar.detail(f"hour {hour}: the announced deploy's pre-warm, under the headroom")
                lead(tr.start2, hour)
            if warming is not None and hour % sc.warm_every_h == 0:
                last = hour + sc.warm_horizon_h - 1
                bar.detail(f"hour {hour}: planning and sending the warm of hours {hour}-{last}")
                self.result.warm_windows.append(warming.warm_ahead(tr.start2, hour))
            while kb_queue and kb_queue[0][0] == hour:
                self._kb_change(publisher, truth, kb_queue.pop(0)[1], hour, workers[1])
            if hour == sc.deploy_at_h:
                bar.phase(f"{self.name}: hour {hour}: model deploy, pre-warm until READY")
                self._deploy(publisher, follower, truth, hour)
                bar.phase(f"{self.name}: serving week 2 hour by hour")
            truth.retired_versions |= follower.retired()
            bar.detail(f"hour {hour}: {len(by_hour.get(hour, [])):,} requests")
            client.serve(by_hour.get(hour, []), hour)
            observe = getattr(warming, "observe", None)
            if observe is not None:  # the load the hour put on the GPU, as its server says
                served = scorer.stats.hourly.get(hour)
                observe(hour, served.gpu_ms_live / 1000.0 if served else 0.0)
            bar.advance(task)
        bar.remove_task(task)
        bar.phase(f"{self.name}: waiting for the deploy's purge to finish")
        self._finish_deploy(follower, cache)

    def _kb_change(
        self,
        publisher: EventPublisher,
        truth: Truth,
        docs: list[str],
        hour: int,
        worker: Worker,
    ) -> None:
        """The documents change: the retriever returns the new versions from now on, and the
        change reaches the invalidation worker through Kafka; serving resumes once it has
        applied them (the demo's clock has no time for Kafka's few milliseconds)."""
        tenants = sorted({r["tenant"] for r in self.traffic.week2})
        before = worker.stats.events
        t0 = time.perf_counter()
        for doc in docs:
            version = truth.version(doc) + 1
            truth.doc_versions[doc] = version
            for tenant in tenants:
                ev = KnowledgeBaseChanged(
                    tenant=tenant, doc_id=doc, doc_version=version, change="updated"
                )
                publisher.publish("inference.kb-changes", ev, key=tenant)
            self.result.invalidations.append({"hour": hour, "doc": doc, "version": version})
        publisher.flush()
        want = before + len(docs) * len(tenants)
        _wait(lambda: worker.stats.events >= want, "the invalidation worker to apply the change")
        self.result.invalidations[-1]["applied_after_ms"] = round(
            (time.perf_counter() - t0) * 1000, 1
        )

    def _deploy(
        self, publisher: EventPublisher, follower: StatusFollower, truth: Truth, hour: int
    ) -> None:
        old = self.traffic.week1[0]["model_version"]
        ev = ModelDeployed(
            model_id=self.traffic.week1[0]["model_id"], version=NEW_VERSION, previous_version=old,
            grace_s=self.sc.grace_s,
        )  # fmt: skip
        t0 = time.time()
        publisher.publish("inference.deploys", ev, key=ev.model_id)
        publisher.flush()
        ready = follower.wait_for(ev.deploy_id, ("ready", "done"), WAIT_S)
        # READY made NEW_VERSION live: the gateway moves to it by itself within a second
        self.result.deploy = {
            "hour": hour, "deploy_id": ev.deploy_id, "from": old, "to": NEW_VERSION,
            "ready_after_s": round(time.time() - t0, 2), "ready_detail": ready.detail,
            "started_at": t0,
        }  # fmt: skip

    def _finish_deploy(self, follower: StatusFollower, cache: CacheClient) -> None:
        d = self.result.deploy
        if not d:
            return
        done = follower.wait_for(d["deploy_id"], ("done",), WAIT_S)
        # when the job said DONE, not when this wait, after the last hour, saw it
        at = next((t for t, st in follower.seen if st is done), time.time())
        d["done_after_s"] = round(at - d["started_at"], 2)
        d["done_counts"] = dict(done.counts)
        model = self.traffic.week1[0]["model_id"]
        pattern = entries_pattern(model, d["from"])
        d["old_version_keys_left"] = sum(
            1 for _ in cache.redis.scan_iter(match=pattern, count=1000)
        )


class _Forgetful(Handler):
    """The invalidation worker with a bug: it reads and commits KB changes and applies none."""

    def __init__(self, inner: InvalidationHandler) -> None:
        self.inner = inner
        self.name, self.topics = inner.name, inner.topics

    def apply(self, events: list[Event]) -> None:
        self.inner.apply([e for e in events if not isinstance(e, KnowledgeBaseChanged)])

    def close(self) -> None:
        self.inner.close()


def _logged_miss(row: dict[str, Any], truth: Truth, sim: Simulator, opts: Any) -> dict[str, Any]:
    """The v2 event the gateway publishes for a row it answered by a miss."""
    body, headers = request_of(row, truth)
    r = resolve("chat", body, headers, "/v1/chat/completions", opts)
    text = sim.answer_for(row["model_id"], _prompt_text(body), r.params.max_tokens).text
    d = Decision(LookupResult("miss"), None, row["model_version"], row["ts"].timestamp())
    answer = Answer(text, "stop", row["tokens_in"], row["tokens_out"], row["gpu_ms"])
    ev = log_event(r, d, Served("miss", answer, row["latency_ms"]), opts, row["model_version"])
    return ev | {"ts": row["ts"].isoformat(), "request_id": row["request_id"]}


def _prompt_text(body: dict[str, Any]) -> str:
    """What the simulator reads of a chat body (simhttp: the messages' contents, joined)."""
    return "\n".join(m["content"] for m in body["messages"])


def purge_pace(sc: Scenario, traffic: Traffic) -> tuple[int, float]:
    """(batch, keys/s) of the deploy's purge, sized to the namespace it will find: the distinct
    requests served in the TTL before the deploy (each miss stores one entry; the warms add a
    few, so a warming pass takes a step or two more)."""
    lo = max(sc.first_h, sc.deploy_at_h - sc.ttl_h)
    rows = (r for r in traffic.week2 if lo <= traffic.hour_of(r) < sc.deploy_at_h)
    n = max(len({replay_identity(r) for r in rows}), PURGE_STEPS)
    return math.ceil(n / PURGE_STEPS), n / PURGE_S


def _chunks(xs: list[str], n: int) -> list[list[str]]:
    return [xs[i : i + n] for i in range(0, len(xs), n)]
