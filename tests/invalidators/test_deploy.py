"""The deploy cutover on Tansu, redis-server and Qdrant Edge: phases, supersede, resume, CLI."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, Producer

from caches import keys as K
from caches.client import CacheClient
from caches.live import LiveVersions
from caches.request import CacheRequest, LookupResult
from caches.semantic.edge import EdgeSemanticStore
from invalidators.cutover import Cutover
from invalidators.deploy import DeployHandler
from invalidators.deployjob import CutoverOptions, DeployJob, PrewarmOutcome
from invalidators.purge import PurgeOptions, Purger
from schemas.codec import decode_event, encode_event
from schemas.events import JobStatus, ModelDeployed
from schemas.prewarm import PrewarmRequest
from stoker.settings import StokerSettings
from stoker.wiring import build_publisher, build_status_sink
from streams.topics import TOPICS, consumer_config, ensure_topics, producer_config, topic_name
from streams.worker import Worker, WorkerConfig
from tests.cli import run_stoker
from tests.events import UNUSED_BACKEND
from tests.waiting import wait_for

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py

TENANTS = ("acme", "globex")


class Statuses:
    """A StatusSink that keeps what it is given (the Kafka sink is tested through the worker)."""

    def __init__(self) -> None:
        self.events: list[JobStatus] = []

    def publish(self, status: JobStatus) -> None:
        self.events.append(status)

    def close(self) -> None:
        return None

    def states(self) -> list[str]:
        return [s.state for s in self.events]


class CountingWarmer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def prewarm(self, req: PrewarmRequest) -> PrewarmOutcome:
        self.calls.append((req.model_id, req.version))
        return PrewarmOutcome(warmed=3)


def fill(client: CacheClient, version: str, n: int, model: str = "llama") -> list[str]:
    keys = []
    for t in TENANTS:
        for i in range(n):
            req = CacheRequest(t, model, version, "t1", f"question {i}")
            assert client.store(client.lookup(req, use_semantic=False), f"answer {i}").landed
            keys.append(req.key().exact())
    return keys


def miss(client: CacheClient, version: str, prompt: str) -> LookupResult:
    res = client.lookup(CacheRequest("acme", "llama", version, "t1", prompt), use_semantic=False)
    assert res.outcome == "miss"
    return res


def deployed(deploy_id: str = "d1", **kw: Any) -> ModelDeployed:
    fields: dict[str, Any] = {"model_id": "llama", "version": "v2", "previous_version": "v1"}
    return ModelDeployed(deploy_id=deploy_id, **(fields | kw))


def drive(cut: Cutover, deploy_id: str) -> DeployJob:
    job = cut.step(deploy_id, threading.Event(), lambda: True)
    assert job is not None
    loaded = cut.load(deploy_id)
    assert loaded is not None
    return loaded


@pytest.fixture
def cutover(client: CacheClient, edge_store: EdgeSemanticStore) -> Cutover:
    return Cutover(client.redis, Purger(client.redis, edge_store), Statuses())


def test_cutover__grace_zero_ready_then_done_old_version_gone_new_kept(
    client: CacheClient, cutover: Cutover, edge_store: EdgeSemanticStore
):
    old = fill(client, "v1", 20)
    new = fill(client, "v2", 20)
    before = miss(client, "v1", "started before retirement")
    assert cutover.accept(deployed(grace_s=0))
    job = drive(cutover, "d1")

    assert job.phase == "done" and job.counts["deleted"] == len(old)
    states = cutover.status.states()  # type: ignore[attr-defined]
    assert states[0] == "pending" and states[-1] == "done"
    assert states.index("ready") < states.index("done")
    assert "skipped: no warmer configured" in job.prewarm
    r = client.redis
    assert r.exists(*old) == 0 and r.exists(*new) == len(new)
    assert edge_store.count({"model_id": "llama", "model_version": "v1"}) == 0
    assert edge_store.count({"model_id": "llama", "model_version": "v2"}) == len(new)
    assert not client.store(before, "late answer").landed  # began before retirement: refused
    assert not client.store(miss(client, "v1", "after"), "x").landed
    assert client.store(miss(client, "v2", "fresh"), "y").landed


def test_cutover__grace_window_keeps_old_version_until_the_deadline(
    client: CacheClient, cutover: Cutover
):
    old = fill(client, "v1", 5)
    cut = Cutover(client.redis, cutover.purger, Statuses(), prewarmer=CountingWarmer())
    cut.accept(deployed(grace_s=3600))
    job = drive(cut, "d1")
    assert job.phase == "grace" and job.grace_until is not None
    assert job.counts["warmed"] == 3 and cut.status.states()[-1] == "ready"  # type: ignore[attr-defined]
    assert client.redis.exists(*old) == len(old)
    assert cut.due(time.time()) == [] and cut.due(job.grace_until + 1) == ["d1"]
    assert client.store(miss(client, "v1", "during grace"), "x").landed  # U still serves


def test_cutover__duplicate_deploy_id_does_nothing_twice(client: CacheClient, cutover: Cutover):
    fill(client, "v1", 3)
    assert cutover.accept(deployed(grace_s=0))
    assert not cutover.accept(deployed(grace_s=0))
    drive(cutover, "d1")
    assert not cutover.accept(deployed(grace_s=0))  # a replay after DONE: no new job
    assert cutover.due(time.time()) == []
    job = cutover.load("d1")
    assert job is not None and job.phase == "done" and len(job.purge_runs) == 1


def test_cutover__newer_deploy_ends_older_grace_and_rollback_cancels(
    client: CacheClient, cutover: Cutover
):
    fill(client, "v1", 3)
    cutover.accept(deployed("a", grace_s=3600))
    assert drive(cutover, "a").phase == "grace"
    cutover.accept(deployed("b", version="v3", previous_version="v2", grace_s=3600))
    assert "a" in cutover.due(time.time())  # due now, not in an hour
    a = drive(cutover, "a")
    assert a.phase == "done" and a.superseded_by == "b"
    assert any("ended early by deploy b" in e.detail for e in cutover.status.events)  # type: ignore[attr-defined]
    assert client.redis.exists(*fill_keys("v1", 3)) == 0

    # b is in its grace (v2 kept); c rolls back to v2: b must never retire the live version.
    assert drive(cutover, "b").phase == "grace"
    cutover.accept(deployed("c", version="v2", previous_version="v3", grace_s=3600))
    b = drive(cutover, "b")
    assert b.phase == "failed" and "rolled back to v2" in b.detail
    assert client.store(miss(client, "v2", "still live"), "x").landed


def test_cutover__rollback_after_retirement_reinstates_the_version(
    client: CacheClient, cutover: Cutover
):
    fill(client, "v1", 3)
    cutover.accept(deployed("a", grace_s=0))  # v1 -> v2: v1 retired and purged
    assert drive(cutover, "a").phase == "done"
    assert not client.store(miss(client, "v1", "late write"), "x").landed
    # Taken while v1 is retired: this write must stay refused after the reinstatement.
    in_flight = miss(client, "v1", "in flight across the rollback")

    cutover.accept(deployed("b", version="v1", previous_version="v2", grace_s=3600))
    b = drive(cutover, "b")
    assert b.phase == "grace" and b.counts["tenants_reinstated"] == len(TENANTS)
    for tenant in TENANTS:
        req = CacheRequest(tenant, "llama", "v1", "t1", "after the rollback")
        assert client.store(client.lookup(req, use_semantic=False), "y").landed
    assert not client.store(in_flight, "stale").landed


def test_cutover__rollback_during_the_purge_stops_it_then_reinstates(
    client: CacheClient, edge_store: EdgeSemanticStore
):
    keys = fill(client, "v1", 400)
    slow = CutoverOptions(purge=PurgeOptions(rate=400, batch=20), status_every_s=0.05)
    cut = Cutover(client.redis, Purger(client.redis, edge_store), Statuses(), options=slow)
    cut.accept(deployed("a", grace_s=0))
    running = threading.Thread(target=drive, args=(cut, "a"))
    running.start()
    try:
        wait_for(lambda: cut.load("a").counts.get("deleted", 0) > 0, 20)  # type: ignore[union-attr]
        cut.accept(deployed("b", version="v1", previous_version="v2", grace_s=3600))
        b = drive(cut, "b")  # a is still purging v1: b waits before it reinstates
        assert b.phase == "prewarm" and "waiting for deploy a" in b.detail
    finally:
        running.join(20)
    a = cut.load("a")
    assert a is not None and a.phase == "failed" and "purge stopped at" in a.detail
    assert 0 < client.redis.exists(*keys) < len(keys)  # stopped part-way: the rest is kept
    b = drive(cut, "b")
    assert b.phase == "grace" and b.counts["tenants_reinstated"] == len(TENANTS)
    assert client.store(miss(client, "v1", "after the rollback"), "y").landed


def fill_keys(version: str, n: int) -> list[str]:
    return [
        CacheRequest(t, "llama", version, "t1", f"question {i}").key().exact()
        for t in TENANTS
        for i in range(n)
    ]


def test_cutover__tenant_list_retires_and_purges_only_those_tenants(
    client: CacheClient, cutover: Cutover
):
    fill(client, "v1", 4)
    cutover.accept(deployed(grace_s=0, tenants=("acme",)))
    assert drive(cutover, "d1").phase == "done"
    acme, globex = fill_keys("v1", 4)[:4], fill_keys("v1", 4)[4:]
    assert client.redis.exists(*acme) == 0 and client.redis.exists(*globex) == 4
    globex_miss = client.lookup(
        CacheRequest("globex", "llama", "v1", "t1", "new"), use_semantic=False
    )
    assert client.store(globex_miss, "x").landed


# -- in the worker, on Kafka --


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique: str) -> StokerSettings:
    s = StokerSettings(
        kafka_bootstrap=kafka_bootstrap,
        kafka_broker="tansu",
        topic_prefix=f"dep{unique}.",
        redis_url=redis_url,
        warm_backend_url=UNUSED_BACKEND,  # the pre-warm needs one named; none of these call it
    )
    # Created up front, as in a deployment: a reader subscribed to a topic that does not exist
    # yet would not see it until librdkafka's next metadata refresh (minutes).
    names = ("inference.deploys", "stoker.status")
    ensure_topics(kafka_bootstrap, {topic_name(n, s.topic_prefix): TOPICS[n] for n in names})
    return s


def kafka_cutover(
    client: CacheClient, store: EdgeSemanticStore, s: StokerSettings, purge: PurgeOptions
) -> Cutover:
    sink = build_status_sink(build_publisher(s))
    opts = CutoverOptions(purge=purge, status_every_s=0.0)
    return Cutover(client.redis, Purger(client.redis, store), sink, options=opts)


class RunningWorker:
    """A Worker on its own thread; stop() joins it, so no thread outlives the test."""

    def __init__(self, s: StokerSettings, handler: DeployHandler, group: str) -> None:
        cfg = WorkerConfig(
            bootstrap=s.kafka_bootstrap or "",
            group_id=group,
            embedded=True,
            topic_prefix=s.topic_prefix,
        )
        self.worker = Worker(handler, cfg)
        self.thread = threading.Thread(target=self.worker.run, name="test-deploy-worker")
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture
def running() -> Iterator[list[RunningWorker]]:
    workers: list[RunningWorker] = []
    yield workers
    for w in workers:
        w.stop()


def produce(s: StokerSettings, ev: ModelDeployed) -> None:
    p = Producer(producer_config(s.kafka_bootstrap or "", embedded=True))
    p.produce(topic_name("inference.deploys", s.topic_prefix), encode_event(ev))
    assert p.flush(10) == 0


def statuses(s: StokerSettings, job_id: str, until: str, timeout_s: float = 30) -> list[JobStatus]:
    c = Consumer(consumer_config(s.kafka_bootstrap or "", f"r{time.monotonic_ns()}", embedded=True))
    c.subscribe([topic_name("stoker.status", s.topic_prefix)])
    out: list[JobStatus] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and until not in [x.state for x in out]:
            for m in c.consume(num_messages=100, timeout=0.25):
                ev = decode_event(m.value()) if m.error() is None else None
                if isinstance(ev, JobStatus) and ev.job_id == job_id:
                    out.append(ev)
    finally:
        c.close()
    return out


def test_deploy_worker__grace_zero_on_kafka_ready_then_done(
    client: CacheClient, edge_store: EdgeSemanticStore, settings: StokerSettings, running, unique
):
    old, new = fill(client, "v1", 10), fill(client, "v2", 10)
    cut = kafka_cutover(client, edge_store, settings, PurgeOptions())
    running.append(RunningWorker(settings, DeployHandler(cut, poll_s=0.1), f"g{unique}"))
    produce(settings, deployed(f"k{unique}", grace_s=0))
    seen = statuses(settings, f"k{unique}", "done")
    states = [x.state for x in seen]
    assert "ready" in states and states[-1] == "done", states
    assert states.index("ready") < states.index("done")
    assert seen[-1].progress == 1.0 and seen[-1].counts["deleted"] == len(old)
    assert client.redis.exists(*old) == 0 and client.redis.exists(*new) == len(new)


def test_deploy_worker__stopped_mid_purge_resumes_without_rescanning(
    client: CacheClient, edge_store: EdgeSemanticStore, settings: StokerSettings, running, unique
):
    r: redis.Redis = client.redis
    ns = [K.Namespace(t, "llama", "v1", "t1") for t in TENANTS]
    keys = [K.CacheKey(n, f"p{i}", "{}", "c").exact() for n in ns for i in range(1_000)]
    pipe = r.pipeline(transaction=False)  # not MSET: the tenants' keys lie in different slots
    for k in keys:
        pipe.set(k, b"x")
    pipe.execute()
    slow = PurgeOptions(rate=500, batch=50)  # 2,000 keys: 4 s, so the stop lands mid-purge
    cut = kafka_cutover(client, edge_store, settings, slow)
    first = RunningWorker(settings, DeployHandler(cut, poll_s=0.1), f"g{unique}")
    running.append(first)
    produce(settings, deployed(f"s{unique}", grace_s=0))

    def deleted() -> int:
        job = cut.load(f"s{unique}")
        return 0 if job is None else job.counts.get("deleted", 0)

    wait_for(lambda: deleted() >= 300, 30, "the purge to delete 300 keys")
    running.remove(first)
    first.stop()
    job = cut.load(f"s{unique}")
    assert job is not None and job.phase == "purge", job
    left = r.exists(*keys)
    assert 0 < left < len(keys)

    fast = kafka_cutover(client, edge_store, settings, PurgeOptions(batch=50))
    running.append(RunningWorker(settings, DeployHandler(fast, poll_s=0.1), f"g{unique}"))
    wait_for(lambda: (j := cut.load(f"s{unique}")) is not None and j.phase == "done", 30, "done")
    job = cut.load(f"s{unique}")
    assert job is not None and r.exists(*keys) == 0
    assert job.counts["deleted"] == len(keys)
    last = job.purge_runs[-1]
    assert any(c != 0 for c in last["resumed_from"].values())  # picked up at a saved cursor
    assert last["deleted_at_start"] >= 300 and last["deleted"] == left


# -- the CLI, as CI runs it --


def stoker(
    *args: str, env: dict[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return run_stoker(*args, env=env, timeout=timeout)


def cli_env(s: StokerSettings) -> dict[str, str]:
    return {
        "STOKER_KAFKA_BOOTSTRAP": s.kafka_bootstrap or "",
        "STOKER_KAFKA_BROKER": "tansu",
        "STOKER_TOPIC_PREFIX": s.topic_prefix,
    }


@pytest.mark.standalone_only("the CLI reaches Redis only through the cutover tested above")
def test_deploy_cli__wait_until_done_exits_0_with_a_worker_and_says_so_in_json(
    client: CacheClient, edge_store: EdgeSemanticStore, settings: StokerSettings, running, unique
):
    old = fill(client, "v1", 5)
    cut = kafka_cutover(client, edge_store, settings, PurgeOptions())
    running.append(RunningWorker(settings, DeployHandler(cut, poll_s=0.1), f"g{unique}"))
    res = stoker(
        "deploy", "--model", "llama", "--version", "v2", "--previous", "v1", "--grace", "0s",
        "--wait", "--until", "done", "--timeout", "60s", "--json", env=cli_env(settings),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = orjson.loads(res.stdout)  # one object, nothing else on stdout
    assert (doc["ended"], doc["state"], doc["phase"]) == ("done", "done", "done")
    assert (doc["model_id"], doc["version"], doc["previous_version"]) == ("llama", "v2", "v1")
    assert doc["counts"]["deleted"] == len(old) and doc["progress"] == 1.0
    assert doc["detail"] == f"purged {len(old)} keys of v1"
    job = cut.load(doc["deploy_id"])
    assert job is not None and job.phase == "done"
    assert client.redis.exists(*old) == 0


@pytest.mark.standalone_only("the CLI reaches Redis only through the cutover tested above")
def test_deploy_cli__times_out_with_exit_1_when_no_worker_runs(settings: StokerSettings):
    res = stoker(
        "deploy", "--model", "llama", "--version", "v2", "--previous", "v1",
        "--wait", "--timeout", "3s", env=cli_env(settings),
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "timed out" in res.stderr and "no status from a deploy worker" in res.stderr


@pytest.mark.standalone_only("the CLI reaches Redis only through the cutover tested above")
@pytest.mark.parametrize(
    "args",
    [
        ("--model", "llama"),
        ("--model", "llama", "--version", "v2", "--grace", "5x"),
        ("--model", "llama", "--version", "v2", "--timeout", "soon"),
        ("--model", "llama", "--version", "v2", "--until", "sometime"),
        ("--model", "llama", "--version", "v2", "--tenant", "{bad}"),
    ],
)
def test_deploy_cli__bad_usage_exits_2(args: tuple[str, ...], settings: StokerSettings):
    assert stoker("deploy", *args, env=cli_env(settings)).returncode == 2


def test_cutover__failure_publishes_failed_with_the_reason(client: CacheClient, cutover: Cutover):
    class Broken:
        def prewarm(self, *a: Any) -> PrewarmOutcome:
            raise ValueError("backend said no")

    cut = Cutover(client.redis, cutover.purger, Statuses(), prewarmer=Broken())
    cut.accept(deployed(grace_s=0))
    handler = DeployHandler(cut, start=False)
    handler.runner._run_one("d1")
    job = cut.load("d1")
    assert job is not None and job.phase == "failed" and "backend said no" in job.detail
    last = cut.status.events[-1]  # type: ignore[attr-defined]
    assert last.state == "failed" and "backend said no" in last.detail
    assert cut.due(time.time()) == []


def test_deploy_registry__factory_builds_a_handler_on_the_settings(settings: StokerSettings):
    from stoker.registry import build_handler
    from stoker.stack import Stack

    s = settings.model_copy(update={"deploy_grace_s": 60, "deploy_purge_rate": 100.0})
    with Stack(s) as stack:
        handler = build_handler("deploy", stack)
        try:
            assert isinstance(handler, DeployHandler) and handler.topics == ["inference.deploys"]
            assert handler.runner.alive and handler.cutover.opts.grace_s == 60
            assert handler.cutover.opts.purge.rate == 100.0
        finally:
            handler.close()
        assert not handler.runner.alive


def _flat(text: str) -> str:
    """The CLI's output with rich's line wrapping undone."""
    return " ".join(text.split())


def _bar_cutover(client: CacheClient, store: EdgeSemanticStore, s: StokerSettings,
                 backend_url: str, bar: float, **opts: Any) -> Cutover:  # fmt: skip
    """A cutover on Kafka whose pre-warm is the real one (profile, selector, shadow warmer
    over HTTP) on tests/warmers' HOT profile: model m, tenant acme."""
    from tests.warmers.test_prewarm import bar_prewarmer

    pre = bar_prewarmer(client.redis, backend_url, bar)
    sink = build_status_sink(build_publisher(s))
    return Cutover(client.redis, Purger(client.redis, store), sink, prewarmer=pre,
                   options=CutoverOptions(**opts))  # fmt: skip


@pytest.mark.standalone_only("the CLI reaches Redis only through the cutover tested above")
def test_deploy_cli__wait_reports_the_projected_and_reached_hit_rates_at_ready(
    client: CacheClient, edge_store: EdgeSemanticStore, settings: StokerSettings, running, unique
):
    from simulation.backend.http import SimulatorThread
    from tests.conftest import FAST_SIM  # answers fit the logged max_tokens (16)

    with SimulatorThread(FAST_SIM) as sim:
        cut = _bar_cutover(client, edge_store, settings, sim.url, 0.5)
        running.append(RunningWorker(settings, DeployHandler(cut, poll_s=0.1), f"g{unique}"))
        res = stoker(
            "deploy", "--model", "m", "--version", "v2", "--previous", "v1", "--grace", "1h",
            "--wait", "--timeout", "60s", env=cli_env(settings),
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = cut.load(res.stdout.strip())
    assert job is not None and job.phase == "grace"
    out = _flat(res.stderr)
    assert re.search(r"deploy \w{12} ready after [\d.]+ s: m v1 -> v2", out), out
    for part in job.prewarm.split("; "):  # the whole verdict, figures and all, a line each
        assert f"\n  {part}\n" in res.stderr, res.stderr
    m = re.search(r"hit rate projected ([\d.]+)%, reached ([\d.]+)% \(bar 50.0%\)", out)
    assert m is not None, out
    assert float(m[1]) == float(m[2]) >= 50.0
    assert "planned 2 of 5 in budget" in out  # stopped at the bar, short of the budget
    assert len(client.redis.keys("stk:{t:acme}:e:m@v2:*")) == 2


@pytest.mark.standalone_only("the CLI reaches Redis only through the cutover tested above")
def test_deploy_cli__a_backend_failing_most_sends_misses_the_bar_and_the_deploy_fails(
    client: CacheClient, edge_store: EdgeSemanticStore, settings: StokerSettings, running, unique
):
    from simulation.backend.http import SimulatorThread
    from tests.conftest import FAST_SIM
    from tests.warmers.test_prewarm import most_refused

    old = fill(client, "v1", 3, model="m")
    with SimulatorThread(FAST_SIM) as sim, most_refused(sim.url) as broken:
        cut = _bar_cutover(client, edge_store, settings, broken.url, 0.7, max_attempts=2,
                           retry_s=0.1)  # fmt: skip
        running.append(RunningWorker(settings, DeployHandler(cut, poll_s=0.1), f"g{unique}"))
        res = stoker(
            "deploy", "--model", "m", "--version", "v2", "--previous", "v1", "--grace", "0s",
            "--wait", "--timeout", "60s", env=cli_env(settings),
        )  # fmt: skip
    assert res.returncode == 1, res.stderr
    out = _flat(res.stderr)
    assert re.search(r"deploy \w{12} failed after [\d.]+ s: m v1 -> v2", out), out
    assert "\n  gave up after 2 attempts: pre-warm of v2 below its bar" in res.stderr, out
    m = re.search(r"hit rate projected ([\d.]+)%, reached ([\d.]+)% \(bar 70.0%\)", out)
    assert m is not None and float(m[2]) < 50.0 <= 70.0 <= float(m[1]), out
    job = cut.load(res.stdout.strip())
    assert job is not None and job.phase == "failed" and job.attempts == 2
    assert client.redis.exists(*old) == len(old)  # v1 neither retired nor purged
    assert LiveVersions(client.redis).get("m") == {}  # no gateway moved to v2


@pytest.mark.standalone_only("the CLI reaches Redis only through the cutover tested above")
def test_deploy_cli__a_backend_that_refuses_connections_fails_the_deploy_at_once_naming_it(
    client: CacheClient, edge_store: EdgeSemanticStore, settings: StokerSettings, running, unique
):
    """The repro: with nothing at the warm backend's URL the deploy retried its pre-warm five
    times and exited 1 after 183 s ("failed 62"), never naming the URL. Now the first pre-warm
    stops at its third refused connection and the job fails at once, with the URL."""
    from stoker.embedded import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    old = fill(client, "v1", 3, model="m")
    cut = _bar_cutover(client, edge_store, settings, url, 0.7)  # 5 attempts, 2 s back-off
    running.append(RunningWorker(settings, DeployHandler(cut, poll_s=0.1), f"g{unique}"))
    res = stoker(
        "deploy", "--model", "m", "--version", "v2", "--previous", "v1", "--grace", "1m",
        "--wait", "--timeout", "3m", env=cli_env(settings),
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert f"pre-warm of v2: cannot connect to {url}: ConnectError" in _flat(res.stderr)
    job = cut.load(res.stdout.strip())
    assert job is not None and job.phase == "failed" and job.attempts == 0  # never retried
    assert client.redis.exists(*old) == len(old)  # v1 neither retired nor purged


@pytest.mark.standalone_only("the CLI reaches Redis only through the cutover tested above")
def test_deploy_cli__wait_follows_every_partition_of_the_status_topic(
    kafka_bootstrap: str, unique: str
):
    """An operator's stoker.status may have more partitions than stoker creates; a job's
    statuses land on whichever its key hashes to."""
    prefix = f"parts{unique}."
    status_topic = topic_name("stoker.status", prefix)
    ensure_topics(kafka_bootstrap, {status_topic: 3, topic_name("inference.deploys", prefix): 1})
    ready = JobStatus(job_id=f"job-{unique}", job_type="deploy", state="ready", detail="warm")
    p = Producer(producer_config(kafka_bootstrap, embedded=True))
    p.produce(status_topic, encode_event(ready), partition=2)
    assert p.flush(10) == 0
    env = {"STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap, "STOKER_KAFKA_BROKER": "tansu",
           "STOKER_TOPIC_PREFIX": prefix}  # fmt: skip
    res = stoker(
        "deploy", "--model", "m", "--version", "v2", "--deploy-id", ready.job_id,
        "--wait", "--timeout", "20s", env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "ready" in res.stderr
