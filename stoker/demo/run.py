"""One pass of the demo on a fresh embedded stack: replay week 1, then serve week 2 hour by hour
with the scheduler's warming (or without it, for the baseline), a mid-week model deploy and a
few knowledge-base changes. Time is compressed: an hour of week 2 takes as long as serving it.
"""

from __future__ import annotations

import faulthandler
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from rich.console import Console
from rich.progress import Progress

from caches.client import CacheClient
from caches.keys import normalise_prompt
from invalidators.deployjob import NoPrewarmer, Prewarmer
from schemas.codec import decode_event, encode_event
from schemas.errors import StokerError
from schemas.events import JobStatus, KnowledgeBaseChanged, ModelDeployed
from stoker.demo.gateway import (
    Gateway,
    ServeStats,
    Truth,
    intent_index,
    logged_event,
    request_of,
)
from stoker.demo.scenario import NEW_VERSION, Scenario, Traffic
from stoker.embedded import EmbeddedStack
from stoker.registry import build_handler, deploy_handler
from stoker.settings import StokerSettings
from stoker.wiring import build_cache_client, build_publisher, worker_config
from streams.base import Handler
from streams.publisher import EventPublisher
from streams.topics import TOPICS, consumer_config, ensure_topics, producer_config, topic_name
from streams.worker import Worker
from warmers.backends.simhttp import SimulatorThread
from warmers.backends.simulator import SimConfig

# Compressed time: the simulated GPU answers in milliseconds (0.01 ms/token prefill, 0.05 ms/token
# decode), so a whole week of warming fits in the run; its answers are the same function of the
# prompt the gateway uses for misses.
SIM = SimConfig(slots=32, queue=512, prefill_ms_per_token=0.01, decode_ms_per_token=0.05)
WAIT_S = 120.0


@dataclass
class PassResult:
    warm: bool
    serve: ServeStats
    warm_windows: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[tuple[float, JobStatus]] = field(default_factory=list)
    deploy: dict[str, Any] = field(default_factory=dict)
    invalidations: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


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

        task = bar.add_task("embedding distinct prompts (once)", total=len(self.texts))
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
    """One pass: fresh stack, same traffic, warming on or off."""

    def __init__(
        self, sc: Scenario, traffic: Traffic, warm: bool, console: Console, emb: Embeddings
    ) -> None:
        self.sc, self.traffic, self.warm, self.console = sc, traffic, warm, console
        self.emb = emb
        self.result = PassResult(warm=warm, serve=ServeStats())

    def run(self, warming_factory: Callable[..., Any] | None) -> PassResult:
        t0 = time.perf_counter()
        with EmbeddedStack() as stack, SimulatorThread(SIM) as sim:
            prefix = f"demo{uuid.uuid4().hex[:4]}."
            settings = stack.settings(
                kafka_broker="tansu", topic_prefix=prefix, worker_poll_s=0.05, deploy_grace_s=0
            )
            cache = build_cache_client(settings)
            with Progress(console=self.console, transient=True) as bar:
                if self.emb.vectors is None:
                    assert cache.embedder is not None
                    self.emb.compute(cache.embedder.inner, bar)
                self.emb.prime(cache)
                warming = (
                    warming_factory(settings, cache, sim.url)
                    if self.warm and warming_factory
                    else None
                )
                self._serve_weeks(settings, cache, sim, warming, bar)
        self.result.seconds = time.perf_counter() - t0
        return self.result

    def _serve_weeks(
        self,
        settings: StokerSettings,
        cache: CacheClient,
        sim: SimulatorThread,
        warming: Any,
        bar: Progress,
    ) -> None:
        prewarmer: Prewarmer = warming.prewarmer() if warming is not None else NoPrewarmer()
        handlers: list[Handler] = [
            build_handler("traffic", settings),
            build_handler("invalidation", settings),
            deploy_handler(settings, prewarmer),
        ]
        follower = StatusFollower(settings)
        producer = Producer(
            producer_config(settings.kafka_bootstrap or "", embedded=True, **{"linger.ms": 5})
        )
        try:
            with _workers(settings, handlers) as workers:
                if self.warm:
                    self._replay_week1(settings, producer, workers[0], bar)
                self._week2(settings, cache, sim, warming, producer, follower, bar)
        finally:
            producer.flush(10)
            follower.close()
            self.result.statuses = list(follower.seen)

    def _replay_week1(
        self, settings: StokerSettings, producer: Producer, traffic_worker: Worker, bar: Progress
    ) -> None:
        rows = self.traffic.week1
        topic = topic_name("inference.requests", settings.topic_prefix)
        task = bar.add_task("replaying week 1 into the traffic profile", total=len(rows))
        for i, row in enumerate(rows):
            producer.produce(
                topic,
                encode_event(logged_event(row, request_of(row, row["model_version"]))),
                key=row["tenant"].encode(),
            )
            if i % 1000 == 0:
                producer.poll(0)
        producer.flush(30)

        def profiled() -> bool:
            bar.update(task, completed=traffic_worker.stats.events)
            return traffic_worker.stats.events >= len(rows)

        _wait(profiled, "week 1 in the profile")
        bar.remove_task(task)

    def _week2(
        self,
        settings: StokerSettings,
        cache: CacheClient,
        sim: SimulatorThread,
        warming: Any,
        producer: Producer,
        follower: StatusFollower,
        bar: Progress,
    ) -> None:
        sc, tr = self.sc, self.traffic
        truth = Truth(model_version=tr.week1[0]["model_version"])
        gw = Gateway(
            cache, sim.server.sim, truth, intent_index(tr.week1 + tr.week2), producer,
            topic_name("inference.requests", settings.topic_prefix),
        )  # fmt: skip
        self.result.serve = gw.stats
        publisher = build_publisher(settings)
        by_hour: dict[int, list[dict[str, Any]]] = {}
        for r in tr.week2:
            by_hour.setdefault(tr.hour_of(r), []).append(r)
        kb_queue = list(
            zip(sc.kb_change_at_h, _chunks(tr.kb_docs, sc.kb_docs_per_change), strict=False)
        )
        label = "serving week 2 " + ("with warming" if self.warm else "without warming (baseline)")
        task = bar.add_task(label, total=sc.week2_hours)
        for hour in range(sc.week2_hours):
            if warming is not None and hour % sc.warm_every_h == 0:
                self.result.warm_windows.append(warming.warm_ahead(tr.start2, hour))
            while kb_queue and kb_queue[0][0] == hour:
                self._kb_change(publisher, truth, kb_queue.pop(0)[1], hour)
            if hour == sc.deploy_at_h:
                self._deploy(publisher, follower, truth, hour)
            for row in by_hour.get(hour, []):
                gw.serve(row, hour)
            bar.advance(task)
        bar.remove_task(task)
        self._finish_deploy(follower, cache)

    def _kb_change(
        self, publisher: EventPublisher, truth: Truth, docs: list[str], hour: int
    ) -> None:
        for doc in docs:
            version = truth.doc_versions.get(doc, 1) + 1
            truth.doc_versions[doc] = version  # the retriever now returns the new version
            for tenant in sorted({r["tenant"] for r in self.traffic.week2}):
                ev = KnowledgeBaseChanged(
                    tenant=tenant, doc_id=doc, doc_version=version, change="updated"
                )
                publisher.publish("inference.kb-changes", ev, key=tenant)
            self.result.invalidations.append({"hour": hour, "doc": doc, "version": version})
        publisher.flush()

    def _deploy(
        self, publisher: EventPublisher, follower: StatusFollower, truth: Truth, hour: int
    ) -> None:
        old = truth.model_version
        ev = ModelDeployed(
            model_id=self.traffic.week1[0]["model_id"], version=NEW_VERSION, previous_version=old,
            grace_s=self.sc.grace_s,
        )  # fmt: skip
        t0 = time.time()
        publisher.publish("inference.deploys", ev, key=ev.model_id)
        publisher.flush()
        ready = follower.wait_for(ev.deploy_id, ("ready", "done"), WAIT_S)
        truth.model_version = NEW_VERSION  # the gateway routes to v2 once its cache is ready
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
        d["done_after_s"] = round(time.time() - d["started_at"], 2)
        d["done_counts"] = dict(done.counts)
        pattern = f"stk:{{t:*}}:e:*@{d['from']}:*"
        d["old_version_keys_left"] = sum(
            1 for _ in cache.redis.scan_iter(match=pattern, count=1000)
        )


def _chunks(xs: list[str], n: int) -> list[list[str]]:
    return [xs[i : i + n] for i in range(0, len(xs), n)]
