"""KV prefix warming end to end: the prefixes worker learns from the request log on Tansu, the
warmer sends the hot prefixes to the simulated backend over HTTP, and a request after a restart
then pays prefill only past its system prompt."""

from __future__ import annotations

import time
from dataclasses import replace

import orjson
import pytest
import redis
from typer.testing import CliRunner

from invalidators.deployjob import NoPrewarmer
from schemas.prewarm import PrewarmRequest
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig
from stoker.cli import app
from stoker.embedded import LlamaServer, free_port
from stoker.modelserver import DEFAULT_SERVE
from stoker.settings import StokerSettings
from stoker.stack import Stack
from stoker.wiring import worker_config
from streams.topics import ensure_topics, topic_name
from streams.worker import Worker
from tests.cli import run_stoker
from tests.events import UNUSED_BACKEND, encode, request
from tests.streams.conftest import produce
from warmers.prefix.hot import HotPrefixes, Prefix
from warmers.prefix.warm import PrefixWarmer, PrefixWarmingPrewarmer, PrefixWarmOptions, Room
from warmers.prefix.worker import PrefixLogHandler

# 2 ms a prompt token, 1 ms a decoded one: a 300-token system prompt costs 0.6 s of prefill.
SIM = SimConfig(slots=4, prefill_ms_per_token=2.0, decode_ms_per_token=1.0, default_max_tokens=8)
runner = CliRunner()


def system(i: int, tokens: int = 300) -> str:
    return " ".join(f"t{i}w{j}" for j in range(tokens))


def _v2(i: int, sys_i: int, outcome: str = "miss", tenant: str = "acme") -> bytes:
    msgs = [{"role": "system", "content": system(sys_i)}, {"role": "user", "content": f"q {i}"}]
    body = {"model": "sim-model", "messages": msgs, "temperature": 0, "max_tokens": 8}
    return encode(request(i, schema_version=2, tenant=tenant, cache_outcome=outcome,
                          request={"api": "chat", "body": body}))  # fmt: skip


def _live_gpu_ms(sim: SimulatorThread, sys_i: int) -> float:
    import httpx

    msgs = [{"role": "system", "content": system(sys_i)}, {"role": "user", "content": "a question"}]
    body = {"model": "sim-model", "messages": msgs, "max_tokens": 1}
    r = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10)
    r.raise_for_status()
    return float(r.json()["usage"]["gpu_ms"])


def test_prefix_worker__learns_hot_prefixes_from_the_request_log(
    kafka_bootstrap: str, unique: str, redis_url: str, redis_client: redis.Redis
) -> None:
    prefix = f"pfx{unique}."
    topic = topic_name("inference.requests", prefix)
    ensure_topics(kafka_bootstrap, {topic: 1})
    values = [_v2(i, 1) for i in range(6)] + [_v2(i, 2) for i in range(6, 9)]
    values += [_v2(i, 3, outcome="exact") for i in range(9, 19)]  # hits: no prefill paid
    values += [_v2(19, 4, tenant="globex")]
    produce(kafka_bootstrap, topic, values)
    s = StokerSettings(kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu", topic_prefix=prefix,
                       redis_url=redis_url)  # fmt: skip
    handler = PrefixLogHandler(HotPrefixes(redis.Redis.from_url(redis_url)))
    worker = Worker(handler, worker_config(s, handler, f"g{unique}"))
    assert worker.run_until(lambda st: st.events >= len(values), 30)
    assert handler.counted == 10
    top = HotPrefixes(redis_client).top("llama", 10)
    assert [(h.tenant, h.prefix.messages[0][1], h.count) for h in top] == [
        ("acme", system(1), 6.0), ("acme", system(2), 3.0), ("globex", system(4), 1.0),
    ]  # fmt: skip


def _store(r: redis.Redis, *hot: int) -> HotPrefixes:
    store = HotPrefixes(r)
    for rank, i in enumerate(hot):
        p = Prefix("sim-model", (("system", system(i)),), 300)
        store.add("acme", "llama", [(p, 100 - rank)], now=time.time())
    return store


def test_prefix_warmer__after_a_restart_live_requests_skip_the_held_prefill(
    redis_client: redis.Redis,
) -> None:
    store = _store(redis_client, 1, 2)
    with SimulatorThread(SIM) as sim:
        sim.restart()  # a deploy: new weights, nothing held
        warmer = PrefixWarmer(store, PrefixWarmOptions(backend_url=sim.url, qps=50))
        report = warmer.warm("llama")
        assert (report.planned, report.sent, report.warmed, report.failed) == (2, 2, 2, 0)
        assert report.tokens == 600
        # 288 of 302 tokens held (18 full blocks of 16): 14 tokens of prefill and one decoded
        assert _live_gpu_ms(sim, 1) == pytest.approx(2.0 * 14 + 1.0)
        assert _live_gpu_ms(sim, 2) == pytest.approx(2.0 * 14 + 1.0)
        assert _live_gpu_ms(sim, 3) > 2.0 * 300  # never warmed: pays it all
        served = sim.stats().served
    assert served == 2 + 3
    assert redis_client.keys("stk:{t:acme}:e:*") == []  # no answer was ever cached


def test_prefix_warmer__sends_the_hottest_last_so_live_traffic_evicts_the_coldest(
    redis_client: redis.Redis,
) -> None:
    """A warm that fills the cache (2 prefixes of 300 tokens in 38 blocks of 16) leaves the
    hottest the most recently used: the first live prompt of another template evicts the
    coldest warmed one's blocks, and the hottest is still held whole."""
    store = _store(redis_client, 1, 2)
    with SimulatorThread(replace(SIM, prefix_cache_tokens=620)) as sim:
        opts = PrefixWarmOptions(backend_url=sim.url, qps=50, kv_share=1.0, concurrency=1)
        assert PrefixWarmer(store, opts).warm("llama").warmed == 2
        assert _live_gpu_ms(sim, 3) > 2.0 * 300  # never warmed: 18 blocks in, 16 out
        assert _live_gpu_ms(sim, 1) == pytest.approx(2.0 * 14 + 1.0)  # the hottest: held
        assert _live_gpu_ms(sim, 2) > 2.0 * 200  # the coldest: its blocks made the room


def test_prefix_warmer__counts_llama_cpp_host_cache_beside_its_slots(
    redis_client: redis.Redis, llama: LlamaServer
) -> None:
    """llama-server reports its slots (-np, and -c over them), not what --cache-ram keeps in
    host memory: a prompt a slot, and with a host cache the setting's share of its tokens for
    the rest."""
    store = _store(redis_client, 1)
    budgets = [
        PrefixWarmer(
            store, PrefixWarmOptions(backend_url=llama.base_url, host_cache_tokens=n)
        ).budget()
        for n in (0, 10_000)
    ]
    n, each = DEFAULT_SERVE.parallel, DEFAULT_SERVE.ctx // DEFAULT_SERVE.parallel
    assert budgets[0] == (
        Room(0, n, each),
        f"a prompt in each of its {n} slots (up to {each:,} tokens)",
    )
    assert budgets[1][0] == Room(8_000, n, each)


def test_prefix_warmer__plan_gives_llama_cpp_slots_a_prompt_each(redis_client: redis.Redis) -> None:
    """A slot holds one prompt, whatever its context: the hottest that fit one take the slots,
    and the rest share the host cache's tokens (the room the old plan counted as slots x
    context overfilled the host cache, which then dropped the coldest it had just warmed)."""
    store = _store(redis_client, *range(6))  # 300 tokens each, hottest first
    warmer = PrefixWarmer(store, PrefixWarmOptions(backend_url="http://x"))
    firsts = [h.prefix.messages[0][1] for h in warmer.plan("llama", budget=Room(700, 2, 4096))]
    assert firsts == [system(i) for i in range(4)]  # 2 slots, then 600 of 700 tokens
    # a prefix longer than a slot's context takes no slot; nor does any when there are none
    assert len(warmer.plan("llama", budget=Room(700, 2, 299))) == 2
    assert len(warmer.plan("llama", budget=Room(0, 2, 4096))) == 2
    assert warmer.plan("llama", budget=Room(0)) == []


def test_prefix_warmer__rate_is_capped_and_the_deadline_holds(redis_client: redis.Redis) -> None:
    store = _store(redis_client, *range(6))
    with SimulatorThread(SIM) as sim:
        t0 = time.monotonic()
        report = PrefixWarmer(store, PrefixWarmOptions(backend_url=sim.url, qps=5)).warm("llama")
        took = time.monotonic() - t0
        assert report.warmed == 6 and took >= 5 / 5 * 0.9  # one now, then one every 0.2 s
        late = PrefixWarmer(
            store, PrefixWarmOptions(backend_url=sim.url, qps=1, deadline_s=1.5)
        ).warm("llama")
    # one a second cannot send 6 in 1.5 s: the coldest are skipped (or left at the deadline)
    assert late.sent < 6 and late.left_by_deadline + late.skipped == 6 - late.sent
    assert late.seconds < 3


def test_prefix_warmer__plan_keeps_the_token_budget_and_top_n(redis_client: redis.Redis) -> None:
    store = _store(redis_client, *range(5))
    plan = PrefixWarmer(store, PrefixWarmOptions(backend_url="http://x", token_budget=700)).plan(
        "llama"
    )
    assert [h.prefix.messages[0][1] for h in plan] == [system(0), system(1)]  # 600 of 700
    plan = PrefixWarmer(store, PrefixWarmOptions(backend_url="http://x", top_n=3)).plan("llama")
    assert len(plan) == 3
    old = PrefixWarmer(store, PrefixWarmOptions(backend_url="http://x", max_age_s=60))
    assert old.plan("llama", now=time.time() + 3600) == []


@pytest.mark.parametrize(
    ("cache_tokens", "kv_share", "warmed", "source"),
    [
        (1_000, 0.8, 2, "0.8 of the backend's 992-token KV cache"),  # 62 blocks of 16
        (1_000, 0.0, 5, "the fixed budget of 65,536 tokens"),  # sized by hand
        (0, 0.8, 0, "the backend says its prefix caching is off"),
    ],
)
def test_prefix_warmer__sized_to_the_kv_cache_the_backend_reports(
    redis_client: redis.Redis, cache_tokens: int, kv_share: float, warmed: int, source: str
) -> None:
    """300-token prefixes: 2 fit in 0.8 of a ~1,000-token cache; a third would evict the
    hottest. A backend without prefix caching keeps nothing a warm sends: none is sent."""
    store = _store(redis_client, *range(5))
    sim_cfg = replace(SIM, prefix_cache_tokens=cache_tokens)
    with SimulatorThread(sim_cfg) as sim:
        opts = PrefixWarmOptions(backend_url=sim.url, qps=50, kv_share=kv_share)
        report = PrefixWarmer(store, opts).warm("llama")
        assert sim.stats().served == warmed
    assert (report.warmed, report.budget_from) == (warmed, source)


def test_prefix_warmer__a_backend_that_is_down_fails_the_warms_not_the_run(
    redis_client: redis.Redis,
) -> None:
    store = _store(redis_client, 1)
    report = PrefixWarmer(store, PrefixWarmOptions(backend_url="http://127.0.0.1:1", qps=50)).warm(
        "llama"
    )
    assert (report.warmed, report.failed) == (0, 1) and "ConnectError" in report.errors[0]


def test_prefix_warmer__bad_options_are_refused() -> None:
    for bad in (
        {"qps": 0},
        {"top_n": 0},
        {"token_budget": 0},
        {"deadline_s": 0},
        {"kv_share": 1.5},
    ):
        with pytest.raises(ValueError):
            PrefixWarmOptions(backend_url="http://x", **bad)  # type: ignore[arg-type]


def test_deploy_prewarm__warms_prefixes_first_and_keeps_the_hot_sets_verdict(
    redis_client: redis.Redis,
) -> None:
    store = _store(redis_client, 1)
    with SimulatorThread(SIM) as sim:
        pre = PrefixWarmingPrewarmer(
            NoPrewarmer(), PrefixWarmer(store, PrefixWarmOptions(backend_url=sim.url))
        )
        res = pre.prewarm(PrewarmRequest("llama", "v2", "v1", None))
        assert _live_gpu_ms(sim, 1) < 2.0 * 20
    assert res.ok and res.warmed == 0
    assert res.detail.startswith("skipped: no warmer configured; prefix warm of llama: planned 1")


def test_wiring__deploy_prewarmer_has_prefix_warming_unless_turned_off(redis_url: str) -> None:
    s = StokerSettings(redis_url=redis_url, semantic_enabled=False, warm_backend_url=UNUSED_BACKEND)
    with Stack(s) as stack:
        on = stack.deploy_prewarmer()
        assert isinstance(on, PrefixWarmingPrewarmer)
        assert on.warmer.store is stack.hot_prefixes  # the deploy's Redis, not one of its own
    with Stack(s.model_copy(update={"prefix_warm_on_deploy": False})) as stack:
        assert not isinstance(stack.deploy_prewarmer(), PrefixWarmingPrewarmer)


def test_cli__warm_prefixes_dry_run_and_warm(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(redis_client, 1, 2)
    monkeypatch.setenv("STOKER_REDIS_URL", redis_url)
    res = runner.invoke(app, ["warm-prefixes", "--model", "llama", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    out = orjson.loads(res.stdout)
    assert [(p["tenant"], p["tokens"]) for p in out["plan"]] == [("acme", 300), ("acme", 300)]
    assert out["budget_from"] == "the fixed budget of 65,536 tokens"  # no backend answers
    with SimulatorThread(SIM) as sim:
        res = runner.invoke(
            app, ["warm-prefixes", "--model", "llama", "--backend", sim.url, "--qps", "50"]
        )
        assert res.exit_code == 0, res.output
        said = " ".join(res.output.split())  # the console wraps long lines
        assert "warmed 2 (600 tokens of 104,857: 0.8 of the backend's 131,072-token" in said
        assert "failed 0" in said
        assert sim.stats().served == 2
        # one every 2 s cannot send 2 in 1.5 s: the run says what it skipped, and fails
        monkeypatch.setenv("STOKER_PREFIX_WARM_DEADLINE_S", "1.5")
        res = runner.invoke(
            app, ["warm-prefixes", "--model", "llama", "--backend", sim.url, "--qps", "0.5"]
        )
        assert res.exit_code == 1, res.output
        said = " ".join(res.output.split())
        assert "warmed 1" in said and "the 1 coldest skipped to end by the deadline" in said
        # a prefill (~0.6 s here) longer than the send's timeout: the run names the setting
        monkeypatch.delenv("STOKER_PREFIX_WARM_DEADLINE_S")
        for timeout, code in (("0.2", 1), ("5", 0)):
            sim.restart()  # nothing held: each send prefills its whole prompt
            monkeypatch.setenv("STOKER_PREFIX_WARM_TIMEOUT_S", timeout)
            res = runner.invoke(
                app, ["warm-prefixes", "--model", "llama", "--backend", sim.url, "--qps", "50"]
            )
            assert res.exit_code == code, res.output
            said = " ".join(res.output.split())
            assert ("no answer within 0.2 s" in said) == (code == 1), said
            assert ("STOKER_PREFIX_WARM_TIMEOUT_S" in said) == (code == 1), said


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["warm-prefixes"], "--model"),
        (["warm-prefixes", "--model", "m", "--qps", "0"], "--qps"),
        (["warm-prefixes", "--model", "m", "--top", "0"], "--top"),
        (["sim-backend", "--port", "0", "--prefix-cache-tokens", "-1"], "--prefix-cache-tokens"),
        (["sim-backend", "--port", "0", "--prefix-block-tokens", "0"], "--prefix-block-tokens"),
    ],
)
def test_cli__bad_arguments_exit_2_naming_them(args: list[str], says: str) -> None:
    res = run_stoker(*args)
    assert res.returncode == 2, res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("STOKER_PREFIX_WARM_QPS", "0"),
        ("STOKER_PREFIX_WARM_TOP_N", "0"),
        ("STOKER_PREFIX_CAPACITY", "-3"),
        ("STOKER_PREFIX_WARM_DEADLINE_S", "nope"),
        ("STOKER_PREFIX_WARM_TIMEOUT_S", "0"),
    ],
)
def test_settings__bad_prefix_settings_fail_naming_them(variable: str, value: str) -> None:
    res = run_stoker("warm-prefixes", "--model", "m", "--dry-run", env={variable: value})
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().count("\n") == 0 and variable in res.stderr, res.stderr


def test_deploy_worker__a_deploy_on_kafka_warms_the_new_replicas_prefixes(
    kafka_bootstrap: str, unique: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """The registry's deploy worker as `stoker worker deploy` builds it (settings -> wiring),
    a ModelDeployed on Tansu, and the simulated backend over HTTP: after READY the backend's
    prefix cache holds the hot system prompt, and the job's detail says what was warmed."""
    from confluent_kafka import Producer

    from schemas.codec import encode_event
    from schemas.events import ModelDeployed
    from stoker.registry import deploy_handler
    from streams.topics import TOPICS, producer_config
    from tests.invalidators.test_deploy import RunningWorker, statuses

    _store(redis_client, 1)
    with SimulatorThread(SIM) as sim:
        s = StokerSettings(
            kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu", topic_prefix=f"pw{unique}.",
            redis_url=redis_url, semantic_enabled=False, warm_backend_url=sim.url,
        )  # fmt: skip
        names = ("inference.deploys", "stoker.status")
        ensure_topics(kafka_bootstrap, {topic_name(n, s.topic_prefix): TOPICS[n] for n in names})
        stack = Stack(s)
        worker = RunningWorker(s, deploy_handler(stack), f"g{unique}")  # type: ignore[arg-type]
        try:
            p = Producer(producer_config(kafka_bootstrap, embedded=True))
            ev = ModelDeployed(deploy_id=f"d{unique}", model_id="llama", version="v2",
                               previous_version=None)  # fmt: skip
            p.produce(topic_name("inference.deploys", s.topic_prefix), encode_event(ev))
            assert p.flush(10) == 0
            seen = statuses(s, f"d{unique}", "ready", timeout_s=60)
        finally:
            worker.stop()
            stack.close()
        assert "ready" in [x.state for x in seen], [x.detail for x in seen]
        said = "prefix warm of llama: planned 1, warmed 1 (300 tokens of 104,857: 0.8 of the"
        assert said in seen[-1].detail
        assert _live_gpu_ms(sim, 1) == pytest.approx(2.0 * 14 + 1.0)  # held since the deploy


def test_prefix_warmer__a_refused_connection_stops_the_run_naming_the_url(
    redis_client: redis.Redis,
) -> None:
    """Before, a deploy's prefix warm sent every planned prefix (2 a second) to a URL nothing
    listened on; the first refusal now ends the run, and the report says where."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    store = _store(redis_client, *range(6))
    report = PrefixWarmer(store, PrefixWarmOptions(backend_url=url, qps=2, concurrency=1)).warm(
        "llama"
    )
    assert (report.planned, report.sent, report.warmed, report.left_by_deadline) == (6, 1, 0, 0)
    assert report.unreachable.startswith(f"cannot connect to {url}: ConnectError")
    assert report.unreachable in str(report)


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_prefix_warmer__reaches_the_backend_and_its_metrics_at_every_form_of_its_url(
    redis_client: redis.Redis, suffix: str
) -> None:
    store = _store(redis_client, *range(5))
    with SimulatorThread(replace(SIM, prefix_cache_tokens=1_000)) as sim:
        report = PrefixWarmer(store, PrefixWarmOptions(backend_url=sim.url + suffix, qps=50)).warm(
            "llama"
        )
    assert report.warmed == 2  # sized by the KV cache read from <root>/metrics, not /v1/metrics
    assert report.budget_from == "0.8 of the backend's 992-token KV cache"


def _gauge(llama: LlamaServer, name: str) -> float:
    import httpx

    text = httpx.get(llama.base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    return next(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + " "))


def test_prefix_warmer__sends_llama_cpp_no_more_at_once_than_its_slots(
    redis_client: redis.Redis, llama: LlamaServer
) -> None:
    """A send beyond llama-server's slots waits in its queue, its timeout running: whatever its
    concurrency, the warm keeps at most a send a slot in flight, so none is ever deferred."""
    import threading

    store = HotPrefixes(redis_client)  # 4 prompts, more than its 2 slots
    for i in range(60, 64):  # short: a send takes a few seconds, yet any overlap is seen
        p = Prefix("sim-model", (("system", system(i, 40)),), 40)
        store.add("acme", "llama", [(p, i)], now=time.time())
    # what is checked is where a send waits, not how fast it is: a loaded CI box may be slow
    opts = PrefixWarmOptions(
        backend_url=llama.base_url, qps=100, concurrency=8, host_cache_tokens=100_000,
        timeout_s=300, deadline_s=600,
    )  # fmt: skip
    deferred: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            deferred.append(_gauge(llama, "llamacpp:requests_deferred"))
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        report = PrefixWarmer(store, opts).warm("llama")
    finally:
        done.set()
        watcher.join()
    assert (report.planned, report.warmed, report.failed) == (4, 4, 0)
    assert len(deferred) > 10 and max(deferred) == 0


def test_prefix_warmer__a_deadline_too_short_skips_the_coldest_never_the_hottest(
    redis_client: redis.Redis,
) -> None:
    """The hottest are sent last (the backend then evicts the coldest first), so a deadline
    that cannot fit the plan would cut the hottest: once sends come back, the warm skips the
    coldest so that the rest end by the deadline."""
    store = _store(redis_client, *range(20, 28))  # 8 prefixes, 20 the hottest: ~0.6 s each
    with SimulatorThread(SIM) as sim:
        sim.restart()
        opts = PrefixWarmOptions(backend_url=sim.url, qps=50, concurrency=1, deadline_s=2.5)
        report = PrefixWarmer(store, opts).warm("llama")
        assert report.skipped >= 1 and report.failed == 0
        assert report.sent + report.skipped + report.left_by_deadline == 8
        assert f"the {report.skipped} coldest skipped to end by the deadline" in str(report)
        assert _live_gpu_ms(sim, 20) == pytest.approx(2.0 * 14 + 1.0)  # the hottest: held
        assert _live_gpu_ms(sim, 21) == pytest.approx(2.0 * 14 + 1.0)
        assert max(_live_gpu_ms(sim, i) for i in range(22, 27)) > 2.0 * 300  # a skipped one
