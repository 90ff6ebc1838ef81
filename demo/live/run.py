"""The main job on the real model: a day of the sample log's tenants through `stoker gateway` in
front of llama-server (SmolLM2-135M-Instruct), with a knowledge-base change and a deploy.

One process holds the gateway, the workers (traffic, prefixes, invalidation, deploy, rewarm)
and the demo's clients, as `stoker gateway` on the embedded stack does (Qdrant Edge lives in
one process); the model runs beside it, one llama-server at a time, behind the ledger relay
(demo.live.ledger) that records what it wrote. In order:
1. week 1 of the slice (demo.live.scenario) goes into Kafka as the request log the
   gateway would have published, with no answers: the traffic profile and the hot prefixes
   learn counts, and no answer enters a cache that the model did not write;
2. the day is served hour by hour, as fast as the model answers (time is compressed: the
   hours are the log's, not the wall's); the scheduler's own warm job runs at the top of each
   hour on the demo's clock (the planner's now is the served hour): it plans the hours ahead
   and sends what is due, held to the hour's headroom, as `stoker worker scheduler` does;
3. at `kb_change_h` two articles change for every tenant (a KB change of schema 2, with the
   texts): the retriever moves to the new revision at once, and serving resumes when the
   invalidation worker has applied the change. The rewarm worker keeps the new texts, which
   renew the logged requests any later warm replays; its own re-warm plans the wall clock's
   hours (it is the production worker), so on the demo's compressed day it warms little;
4. at `deploy_h` new weights go live, which restarts the model server: the old one stops, and
   the first `probes` requests of the hour are sent, streamed and timed from the client,
   to a fresh server with an empty prompt cache, then to another fresh server after the prefix
   warm; that one stays, the deploy event goes out, the deploy worker pre-warms (prefix warm,
   then the hot set of the next hours) and the gateway moves to the new version at READY;
5. after the last hour: the deploy's purge is awaited, the request log is read back for its
   gpu_ms, and everything is handed to the report (demo.live.report).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import httpx

from caches.keys import entries_pattern
from demo.live.client import (
    LiveClient,
    Probe,
    Served,
    probe,
)
from demo.live.ledger import Generation, Ledger
from demo.live.log import publish_week1, read_request_log
from demo.live.scenario import (
    NEW_VERSION,
    OLD_VERSION,
    LiveScenario,
    LiveTraffic,
    hours_after,
    load_live_traffic,
)
from demo.live.score import Cutover, Replacement
from demo.live.status import StatusFollower
from demo.live.texts import article, system_prompt
from demo.progress import DemoProgress
from gateway.service import GatewayServer
from schemas.errors import StokerError
from schemas.events import KnowledgeBaseChanged, ModelDeployed
from schemas.prewarm import PrewarmRequest
from stoker import modelserver
from stoker.embedded import LOOPBACK, EmbeddedStack, LlamaServer, free_port, serve_options
from stoker.modelserver import MODEL_ALIAS
from stoker.registry import build_handler, deploy_handler, rewarm_handler
from stoker.settings import StokerSettings
from stoker.stack import Stack
from stoker.wiring import build_headroom, default_budget, worker_config
from streams.base import Handler
from streams.worker import Worker
from warmers.headroom import ScheduledWarm
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.prewarm import HotSetPrewarm, HotSetPrewarmer
from warmers.replay.run import VirtualClock

PREFIX_TIMEOUT_S = 180.0
WAIT_S = 180.0  # the longest wait on a worker: a pre-warm of the real model on a loaded box
_POLL_S = 0.05


@dataclass
class LiveResult:
    sc: LiveScenario
    traffic: LiveTraffic
    served: list[Served] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)
    probes: dict[str, list[Probe]] = field(default_factory=dict)  # "cold", "prefix_warmed"
    prefix_warm: dict[str, Any] = field(default_factory=dict)  # the A/B's prefix warm
    warms: list[dict[str, Any]] = field(default_factory=list)  # the scheduled warms
    deploy: dict[str, Any] = field(default_factory=dict)
    kb: dict[str, Any] = field(default_factory=dict)
    replacements: list[Replacement] = field(default_factory=list)
    cutover: Cutover | None = None
    log_events: list[dict[str, Any]] = field(default_factory=list)  # the gateway's request log
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase
    seconds: float = 0.0
    load: dict[str, list[float]] = field(default_factory=dict)  # load averages, start and end
    prompt_tokens: dict[str, int] = field(default_factory=dict)  # each tenant's system prompt


class PrefixWarms(Protocol):
    """What the deploy pre-warm needs of the prefix warmer (stoker.stack.Stack.prefix_warmer)."""

    def warm(self, model_id: str, tenants: Sequence[str] | None = None) -> object: ...


class DeployPrewarm:
    """The deploy job's pre-warm as stoker.stack.Stack.deploy_prewarmer makes it (the prefix
    warm, then the hot set), planned on the demo's clock: the first hours after the cutover on
    the served day, where the wall clock's hour would plan another day of the week."""

    def __init__(self, prefix: PrefixWarms, hot: HotSetPrewarmer) -> None:
        self.prefix, self.hot = prefix, hot
        self.reports: list[tuple[str, HotSetPrewarm]] = []

    def prewarm(self, req: PrewarmRequest) -> HotSetPrewarm:
        prefix = str(self.prefix.warm(req.model_id, req.tenants or None))
        got = self.hot.prewarm(req)
        self.reports.append((prefix, got))
        return got  # READY's bar is the hot set's: a prefix warm is best effort


class _Workers:
    """The demo's workers, each on a thread of its own; any death stops every wait."""

    def __init__(self, settings: StokerSettings, handlers: dict[str, Handler]) -> None:
        self.by_name = {n: Worker(h, worker_config(settings, h)) for n, h in handlers.items()}
        self.dead: list[str] = []
        self._threads = [
            threading.Thread(target=self._body, args=(n, w), name=f"demo-{n}", daemon=True)
            for n, w in self.by_name.items()
        ]

    def _body(self, name: str, w: Worker) -> None:
        try:
            w.run()
        except BaseException:
            self.dead.append(name)
            raise

    def events(self, name: str) -> int:
        return self.by_name[name].stats.events

    def wait(self, cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if self.dead:
                raise StokerError(f"demo: the {', '.join(self.dead)} worker died (see above)")
            if time.monotonic() > deadline:
                raise StokerError(f"demo: timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(_POLL_S)

    @contextmanager
    def running(self) -> Iterator[_Workers]:
        for t in self._threads:
            t.start()
        try:
            yield self
        finally:
            for w in self.by_name.values():
                w.stop()
            for t in self._threads:
                t.join(30)


class LiveDemo:
    """One run of the live demo (module docstring)."""

    def __init__(self, sc: LiveScenario, bar: DemoProgress) -> None:
        self.sc, self.bar = sc, bar
        self._llama: LlamaServer | None = None
        self._port = 0
        self._installed: modelserver.Installed | None = None
        self._phase_t0 = time.perf_counter()
        self._phase = ""
        self.phases: dict[str, float] = {}  # wall seconds per phase
        self.deploy_window: Window | None = None  # what the deploy's pre-warm plans for
        self.wired: Stack | None = None  # the run's parts: one Stack, as a stoker process has
        # the planner's now: the served day's hour (its dates are the log's, not the wall's)
        self.clock = VirtualClock(datetime.now(UTC))

    # -- the whole run --

    def run(self) -> LiveResult:
        t0 = time.perf_counter()
        load = {"start": list(os.getloadavg())}
        s0 = StokerSettings()
        # first: without `make setup` the run stops here, in one line naming it
        self._installed = modelserver.installed(
            modelserver.cache_root(s0.model_cache_dir),
            server=s0.llama_server_bin,
            model=s0.llama_model_path,
        )
        self._begin("loading the sample log's slice")
        traffic = load_live_traffic(self.sc)
        res = LiveResult(self.sc, traffic, load=load)
        self._begin("starting the embedded stack, llama-server and the gateway")
        with EmbeddedStack() as stack:
            self._port = free_port()
            ledger = Ledger(f"http://{LOOPBACK}:{self._port}").start()
            try:
                self._restart(ledger, 1)
                res.prompt_tokens = self._prompt_tokens(traffic)
                self._run_stack(stack, ledger, traffic, res)
            finally:
                if self._llama is not None:
                    self._llama.stop()
                ledger.stop()
                res.generations = ledger.records()
        self._begin("")
        res.phases = self.phases
        res.seconds = time.perf_counter() - t0
        res.load["end"] = list(os.getloadavg())
        return res

    def _begin(self, phase: str) -> None:
        """Close the phase under way (its wall seconds) and name the next."""
        now = time.perf_counter()
        if self._phase:
            spent = self.phases.get(self._phase, 0.0) + now - self._phase_t0
            self.phases[self._phase] = round(spent, 1)
        self._phase, self._phase_t0 = phase, now
        if phase:
            self.bar.phase(phase)

    def _restart(self, ledger: Ledger, number: int) -> None:
        """Stop the model server that runs (if any) and start the `number`th on the same port,
        its prompt cache empty: what a deploy of new weights does to a replica."""
        if self._llama is not None:
            self._llama.stop()
        assert self._installed is not None
        opts = serve_options(StokerSettings(), port=self._port)
        self._llama = LlamaServer(self._installed.server, self._installed.model, opts)
        ledger.server = number
        self._llama.start()

    def _prompt_tokens(self, traffic: LiveTraffic) -> dict[str, int]:
        """Each tenant's system prompt in the model's own tokens (llama-server's /tokenize)."""
        out = {}
        for tenant in sorted({r["tenant"] for r in traffic.day}):
            text = system_prompt(tenant, short=self.sc.short_prompts)
            resp = httpx.post(
                f"http://{LOOPBACK}:{self._port}/tokenize", json={"content": text}, timeout=60
            )
            out[tenant] = len(resp.json()["tokens"]) if resp.status_code == 200 else -1
        return out

    def _settings(self, stack: EmbeddedStack, ledger: Ledger) -> StokerSettings:
        sc = self.sc
        return stack.settings(
            kafka_broker="tansu", topic_prefix=f"live{uuid.uuid4().hex[:4]}.", worker_poll_s=0.05,
            deploy_grace_s=sc.grace_s, deploy_purge_batch=50, deploy_purge_rate=500.0,
            # the demo's one process also runs every worker and the clients: the semantic
            # lookup gets 500 ms, as in the simulated demo, not the production 50 ms
            gateway_lookup_budget_ms=500,
            gateway_upstream_url=ledger.url("live"),
            gateway_default_model_version=OLD_VERSION,
            warm_backend_url=ledger.url("warm"), warm_backend_model=MODEL_ALIAS,
            prefix_warm_backend_url=ledger.url("prefix"), prefix_warm_top_n=sc.prefix_top_n,
            prefix_warm_max_age_s=90 * 86_400.0,  # week 1 of the log is weeks old
            rewarm_budget_requests=sc.rewarm_budget,
            # the real model answers a miss in seconds on 2 cores: each run of the scheduler
            # sends at most this many (its rule, break-even and p >= 0.9, decides how many)
            warm_budget_requests=sc.warm_budget,
            traffic_max_event_age_s=None,  # week 1 keeps the sample log's own dates
        )  # fmt: skip

    def _run_stack(
        self, stack: EmbeddedStack, ledger: Ledger, traffic: LiveTraffic, res: LiveResult
    ) -> None:
        settings = self._settings(stack, ledger)
        self.clock.now = traffic.start
        self.wired = wired = Stack(settings, clock=self.clock)
        try:
            self._run_parts(wired, ledger, traffic, res)
        finally:
            wired.close()

    def _run_parts(
        self, wired: Stack, ledger: Ledger, traffic: LiveTraffic, res: LiveResult
    ) -> None:
        """The gateway, the workers and the clients of the run, all on the parts of `wired`;
        each warm has a backend URL of its own, so the ledger tells whose requests were whose."""
        sc, settings = self.sc, wired.settings
        parts = wired.gateway(upstream_url=ledger.url("live"))
        pre = DeployPrewarm(
            prefix_warmer(wired),
            HotSetPrewarmer(
                wired.runner(progress=False, backend_url=ledger.url("deploy")),
                Budget(requests=sc.deploy_budget),
                self._deploy_window, hit_bar=settings.deploy_prewarm_hit_bar,
                min_share=settings.deploy_prewarm_min_share,
            ),
        )  # fmt: skip
        workers = _Workers(
            settings,
            {
                "traffic": build_handler("traffic", wired),
                "prefixes": build_handler("prefixes", wired),
                "invalidation": build_handler("invalidation", wired),
                "deploy": deploy_handler(wired, pre),
                "rewarm": rewarm_handler(wired, backend_url=ledger.url("rewarm")),
            },
        )
        follower = StatusFollower(settings)
        warm_runner = wired.runner(progress=False, backend_url=ledger.url("warm"))
        warm_job = ScheduledWarm(
            warm_runner, default_budget(settings),
            build_headroom(settings, warm_runner, clock=self.clock),
        )  # fmt: skip
        try:
            with workers.running(), GatewayServer(parts) as gw:
                self._replay_week1(settings, traffic, workers)
                client = LiveClient(gw.url, sc)
                self._day(settings, ledger, traffic, workers, follower, client, warm_job, res)
                res.served = client.served
                self._begin("waiting for the deploy's purge of the old version")
                self._finish_deploy(follower, parts.gate.cache.redis, res)
                self._begin("reading back the request log")
                res.log_events = read_request_log(settings, len(res.served))
            res.deploy["prewarm"] = [_prewarm_dict(p, r) for p, r in pre.reports]
        finally:
            follower.close()

    # -- week 1 --

    def _replay_week1(
        self, settings: StokerSettings, traffic: LiveTraffic, workers: _Workers
    ) -> None:
        """Week 1 as the request log v2 the gateway would have published for it: each row a
        miss with the request it sent upstream and no answer (the profile counts requests and
        the prefixes; no text the model did not write may reach a cache)."""
        self._begin("replaying week 1 of the slice into the traffic profile")
        rows = traffic.week1
        publish_week1(settings, rows, self.sc)
        n = len(rows)
        workers.wait(
            lambda: workers.events("traffic") >= n and workers.events("prefixes") >= n,
            "week 1 in the traffic profile and the hot prefixes",
        )

    # -- the day --

    def _day(
        self,
        settings: StokerSettings,
        ledger: Ledger,
        traffic: LiveTraffic,
        workers: _Workers,
        follower: StatusFollower,
        client: LiveClient,
        warm_job: ScheduledWarm,
        res: LiveResult,
    ) -> None:
        sc = self.sc
        by_hour: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        for i, r in enumerate(traffic.day):
            by_hour.setdefault(traffic.hour_of(r), []).append((i, r))
        task = self.bar.add_task("hours served", total=24)
        for hour in range(24):
            rows = by_hour.get(hour, [])
            self.clock.now = hours_after(traffic.start, hour)
            self._begin(f"hour {hour}: the scheduler's warm")
            res.warms.append(self._warm(warm_job, hour))
            if hour == sc.kb_change_h:
                self._begin(f"hour {hour}: knowledge-base change")
                self._kb_change(settings, traffic, workers, client, res)
            if hour == sc.deploy_h:
                self._deploy(settings, ledger, traffic, follower, client, res, by_hour)
            self._begin("serving the day hour by hour")
            self.bar.detail(f"hour {hour}: {len(rows)} requests")
            client.serve(rows, hour)
            self.bar.advance(task)
        self.bar.remove_task(task)

    def _warm(self, job: ScheduledWarm, hour: int) -> dict[str, Any]:
        """The scheduler's warm job (warmers/headroom.py: ScheduledWarm, as `stoker worker
        scheduler` runs it) at the top of the served hour, on the demo's clock: it plans the
        hours ahead and sends what is due now, held to the hour's headroom."""
        t0 = time.perf_counter()
        s = job()
        return {
            "hour": hour, "planned": job.last_plan, "deferred": job.last_deferred,
            "sent": s.sent, "landed": s.cached, "skipped": s.skipped,
            "priced_out": s.skipped_priced, "failed": s.failed,
            "refused_stale": s.refused_stale, "seconds": round(time.perf_counter() - t0, 1),
        }  # fmt: skip

    def _kb_change(
        self,
        settings: StokerSettings,
        traffic: LiveTraffic,
        workers: _Workers,
        client: LiveClient,
        res: LiveResult,
    ) -> None:
        """The articles change for every tenant: the retriever returns revision 2 from now on,
        and the change (schema 2: the new text and the one it replaced) reaches the
        invalidation and rewarm workers through Kafka; serving resumes once the invalidation
        worker has applied it (the demo's clock has no room for Kafka's milliseconds)."""
        tenants = sorted({r["tenant"] for r in traffic.day})
        assert self.wired is not None
        publisher = self.wired.publisher
        before = workers.events("invalidation")
        at = time.time()
        for doc in traffic.kb_docs:
            for tenant in tenants:
                ev = KnowledgeBaseChanged(
                    schema_version=2, tenant=tenant, doc_id=doc, doc_version=2, change="updated",
                    text=article(tenant, doc, 2, self.sc.titles.get(doc)),
                    previous_text=article(tenant, doc, 1, self.sc.titles.get(doc)),
                )  # fmt: skip
                publisher.publish("inference.kb-changes", ev, key=tenant)
                client.revisions[(tenant, doc)] = 2
                res.replacements.append(Replacement(tenant, doc, 1, at))
        publisher.flush()
        want = before + len(traffic.kb_docs) * len(tenants)
        workers.wait(lambda: workers.events("invalidation") >= want, "the invalidation")
        res.kb = {
            "hour": self.sc.kb_change_h, "docs": list(traffic.kb_docs), "tenants": tenants,
            "published_at": at, "applied_after_ms": round((time.time() - at) * 1000, 1),
        }  # fmt: skip

    def _deploy(
        self,
        settings: StokerSettings,
        ledger: Ledger,
        traffic: LiveTraffic,
        follower: StatusFollower,
        client: LiveClient,
        res: LiveResult,
        by_hour: dict[int, list[tuple[int, dict[str, Any]]]],
    ) -> None:
        """Step 4 of the module docstring."""
        sc = self.sc
        first = [r for h in sorted(by_hour) if h >= sc.deploy_h for _, r in by_hour[h]]
        rows = first[: sc.probes]
        self._begin(f"hour {sc.deploy_h}: deploy: a fresh model server, {len(rows)} probes cold")
        self._restart(ledger, 2)
        res.probes["cold"] = probe(ledger.url("probe"), rows, sc, client.revisions)
        self._begin(f"hour {sc.deploy_h}: deploy: a fresh model server, prefix warm, then probes")
        self._restart(ledger, 3)
        t0 = time.perf_counter()
        assert self.wired is not None
        report = prefix_warmer(self.wired).warm(MODEL_ALIAS)
        res.prefix_warm = {
            "planned": report.planned, "warmed": report.warmed, "failed": report.failed,
            "tokens": report.tokens, "seconds": round(time.perf_counter() - t0, 2),
            "summary": str(report),
        }  # fmt: skip
        res.probes["prefix_warmed"] = probe(ledger.url("probe"), rows, sc, client.revisions)
        self._begin(f"hour {sc.deploy_h}: deploy: pre-warm of {NEW_VERSION} until READY")
        start = hours_after(traffic.start, sc.deploy_h)
        self.deploy_window = Window(start, start + timedelta(hours=sc.deploy_window_h))
        ev = ModelDeployed(
            model_id=MODEL_ALIAS, version=NEW_VERSION, previous_version=OLD_VERSION,
            grace_s=sc.grace_s,
        )  # fmt: skip
        t0 = time.time()
        assert self.wired is not None
        publisher = self.wired.publisher
        publisher.publish("inference.deploys", ev, key=ev.model_id)
        publisher.flush()
        ready = follower.wait_for(ev.deploy_id, ("ready", "done"), WAIT_S)
        res.deploy = {
            "hour": sc.deploy_h, "deploy_id": ev.deploy_id, "from": OLD_VERSION,
            "to": NEW_VERSION, "ready_after_s": round(time.time() - t0, 2),
            "ready_detail": ready.detail, "started_at": t0, "ready_at": time.time(),
            "probe_rows": len(rows),
        }  # fmt: skip

    def _finish_deploy(self, follower: StatusFollower, r: Any, res: LiveResult) -> None:
        d = res.deploy
        if not d:
            return
        done = follower.wait_for(d["deploy_id"], ("done",), WAIT_S)
        at = next((t for t, st in follower.seen if st is done), time.time())
        retired_at = next(
            (
                t
                for t, st in follower.seen
                if st.job_id == d["deploy_id"] and "retired" in st.detail
            ),
            at,
        )
        d["done_after_s"] = round(at - d["started_at"], 2)
        d["done_counts"] = dict(done.counts)
        d["retired_at"] = retired_at
        d["old_version_keys_left"] = sum(
            1 for _ in r.scan_iter(match=entries_pattern(MODEL_ALIAS, OLD_VERSION), count=1000)
        )
        res.cutover = Cutover(retired_at, frozenset({1}))

    def _deploy_window(self) -> Window:
        if self.deploy_window is None:
            raise StokerError("a deploy pre-warm ran before the demo's deploy")
        return self.deploy_window


def prefix_warmer(stack: Stack) -> Any:
    """The prefix warmer of the settings, one prompt at a time with a long read timeout: a
    cold prefill of a ~700-token prompt on a loaded 2-core box takes 15-60 s, past the
    defaults' 30 s with 4 at a time (docs/demo.md, "The live demo on the real model")."""
    w = stack.prefix_warmer()
    w.options = w.options.model_copy(update={"concurrency": 1, "timeout_s": PREFIX_TIMEOUT_S})
    return w


def _prewarm_dict(prefix: str, p: HotSetPrewarm) -> dict[str, Any]:
    return {"prefix_warm": prefix, "hot_set": p.detail, "warmed": p.warmed, "ok": p.ok}
