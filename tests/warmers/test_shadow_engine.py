"""The shadow warmer and the engine's own gauges (backends/engine.py): a send priced at the load
the engine reports (the simulator), and the guard that keeps warming out of live traffic's way
on a real llama-server (warmers/engineguard.py)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.base import GenerationRequest
from backends.client import OpenAIBackend, RetryPolicy
from backends.engine import EngineReader, Slots, parse, read_engine
from backends.pacing import AimdConfig, MonotonicClock
from caches.client import CacheClient
from schemas.common import RequestParams
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig
from stoker.embedded import LlamaServer
from stoker.modelserver import MODEL_ALIAS as MODEL
from tests.gateway.upstreams import Served
from tests.waiting import wait_for, wait_for_async
from tests.warmers.test_shadow import FAST, _item, _warm, _worth
from warmers.engineguard import EngineGuard, GuardConfig, verdict
from warmers.hotset.plan import WarmItem
from warmers.shadow import ShadowWarmer, WarmConfig, WarmSummary


def test_shadow_engine__a_send_that_no_longer_pays_at_a_queueing_engine_is_left_out(
    cache: CacheClient,
) -> None:
    """No answer yet shows the load (no latency baseline, no 429): the engine's gauges do."""
    cheap = [_worth(_item(200 + i), 80.0) for i in range(4)]  # pays at idle (0.2), not at 1.0
    cfg = FAST.model_copy(
        update=dict(concurrency=1, idle_price=0.2, aimd=AimdConfig(baseline_samples=2))
    )
    # ~3 s an answer: the hogs outlast the warm run by seconds even on a loaded machine
    slow = SimConfig(slots=1, queue=8, decode_ms_per_token=20.0, min_answer_tokens=150,
                     default_max_tokens=160)  # fmt: skip
    with SimulatorThread(slow) as s:
        metered = cfg.model_copy(update=dict(engine_url=s.url))
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "a long one"}]}
        hogs = [threading.Thread(target=httpx.post, args=(s.url + "/v1/chat/completions",),
                                 kwargs={"json": body, "timeout": 60}) for _ in range(2)]  # fmt: skip
        for t in hogs:
            t.start()
        wait_for(lambda: s.stats().queued == 1, 10, "one request to wait for the busy slot")
        busy = _warm(s.url, cache, cheap, config=metered)
        blind = _warm(s.url, cache, cheap[:1], config=cfg)  # the answers alone: no load known
        for t in hogs:
            t.join(60)
    with SimulatorThread(SimConfig()) as s:  # an idle engine: its gauges say 0
        idle = _warm(s.url, cache, cheap[1:], config=cfg.model_copy(update=dict(engine_url=s.url)))
    assert (busy.sent, busy.skipped_priced) == (0, 4)
    assert (blind.sent, blind.skipped_priced) == (1, 0)
    assert (idle.sent, idle.skipped_priced) == (3, 0)


# -- the guard (warmers/engineguard.py) --


def test_engineguard__verdicts_from_the_engines_state() -> None:
    two = Slots(2, 4096)
    llama = "llamacpp:requests_processing %d\nllamacpp:requests_deferred %d\n"
    assert verdict(parse(llama % (0, 0), two), own=0, busy=0.5) == "go"
    assert verdict(parse(llama % (1, 0), two), own=0, busy=0.5) == "crowded"  # live holds one
    assert verdict(parse(llama % (1, 0), two), own=1, busy=0.5) == "full"  # never the last slot
    assert verdict(parse(llama % (2, 0), two), own=1, busy=0.5) == "crowded"  # live is back
    assert verdict(parse(llama % (2, 1), two), own=1, busy=0.5) == "deferred"  # live waits
    assert verdict(parse(llama % (1, 1), two), own=2, busy=0.5) == "full"  # only the warm's own
    vllm = "vllm:num_requests_waiting %d\nvllm:kv_cache_usage_perc 0.9\n"
    assert verdict(parse(vllm % 0), own=3, busy=0.5) == "go"  # no slots: the KV share prices
    assert verdict(parse(vllm % 2), own=3, busy=0.5) == "deferred"
    running = "vllm:num_requests_running 1\n" + vllm % 2
    assert verdict(parse(running), own=3, busy=0.5) == "full"  # the 3 waiting are all the warm's
    assert verdict(None, own=0, busy=0.5) == "unknown"


@pytest.mark.parametrize(("deferred", "cut"), [(1, True), (0, False)])
def test_engineguard__the_warm_makes_way_when_live_traffic_is_back(
    deferred: int, cut: bool
) -> None:
    """A /metrics as llama-server writes it, one warm in flight beside a live request (and one
    deferred or not): the warm is cancelled either way; the rate is cut only for a wait."""
    text = f"llamacpp:requests_processing 2\nllamacpp:requests_deferred {deferred}\n"

    async def metrics(_: Request) -> Response:
        return Response(text, media_type="text/plain")

    async def props(_: Request) -> Response:
        return Response(b'{"total_slots": 2}', media_type="application/json")

    app = Starlette(routes=[Route("/metrics", metrics), Route("/props", props)])
    made_way: list[int] = []
    cuts: list[int] = []

    async def go(url: str) -> None:
        guard = EngineGuard(EngineReader(url), GuardConfig(interval_s=0.01), MonotonicClock(),
                            lambda: 1)  # fmt: skip
        task = asyncio.create_task(
            guard.watch(lambda: made_way.append(1) or 1, lambda: cuts.append(1))
        )
        await wait_for_async(lambda: bool(made_way), 5, "the guard to make way")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await guard.aclose()

    with Served(app) as srv:
        asyncio.run(go(srv.url))
    assert bool(cuts) is cut


def _ask(url: str, content: str, max_tokens: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
    httpx.post(f"{url}/chat/completions", json=body, timeout=300).raise_for_status()


# SmolLM2 ends these on its own within 32 tokens at temperature 0 (tests/gateway/test_real_model.py)
STOPS = ("Answer with one word: what is the capital of France?",
         "Reply with only the number: what is 2+2?")  # fmt: skip


def _real_item(prompt: str, max_tokens: int) -> WarmItem:
    return WarmItem.of(GenerationRequest("acme", MODEL, "v1", "t1", prompt,
                                         RequestParams(max_tokens=max_tokens)))  # fmt: skip


GUARDED = WarmConfig(target_qps=5, capacity_qps=25, ramp_s=0, concurrency=1, seed=3,
                     jitter_frac=0.0)  # fmt: skip


def test_shadow_engine__the_warmer_holds_back_while_llama_server_defers_live_requests(
    llama: LlamaServer, cache: CacheClient
) -> None:
    """Three long live answers on llama-server's two slots: one is deferred. The warmer, given
    the engine, sends nothing while the engine defers or live traffic holds a slot, then warms
    every item once it has room."""
    url = llama.base_url
    hogs = [threading.Thread(target=_ask, args=(url, f"Tell me story {i} about a dragon.", 48))
            for i in range(3)]  # fmt: skip
    for t in hogs:
        t.start()
    items = [_real_item(p, 32) for p in STOPS]
    cfg = GUARDED.model_copy(update=dict(engine_url=url))

    async def go() -> tuple[WarmSummary, int]:
        async with OpenAIBackend(url, retry=RetryPolicy(attempts=1)) as b:
            w = ShadowWarmer(b, cache, cfg, progress=False)
            seen_deferred = 0
            run = asyncio.create_task(w.run(items))
            while not run.done():
                state = await asyncio.to_thread(read_engine, url)
                if state is not None and state.waiting:
                    seen_deferred += 1
                    assert w.summary is not None and w.summary.sent == 0, "sent while deferred"
                await asyncio.sleep(0.1)
            return await run, seen_deferred

    try:
        wait_for(lambda: bool((st := read_engine(url)) and st.waiting), 60,
                 "a live request deferred behind two busy slots", 0.05)  # fmt: skip
        summary, seen_deferred = asyncio.run(asyncio.wait_for(go(), 300))
    finally:
        for t in hogs:
            t.join(300)
    assert seen_deferred >= 1
    assert summary.held_s > 1.0  # it waited for the live answers, not only the deferral
    assert (summary.sent, summary.cached, summary.yielded) == (2, 2, 0)


def _running(url: str) -> bool:
    """Does the server run a request now? (read_engine runs its own event loop: in a thread.)"""
    with ThreadPoolExecutor(1) as pool:
        st = pool.submit(read_engine, url).result(10)
    return bool(st and st.running)


def test_shadow_engine__a_warm_in_flight_makes_way_for_live_requests(
    llama: LlamaServer, cache: CacheClient
) -> None:
    """A long warm answer is under way on an idle server when two live requests come: the
    warm is cancelled as soon as the guard sees them (its connection closed, llama-server stops
    decoding it: streamed, as warm runs send, at its next token), and the live ones run; if
    one of them was deferred meanwhile, the rate is cut as for a 429."""
    url = llama.base_url
    cfg = GUARDED.model_copy(update=dict(engine_url=url))
    item = _real_item("Tell me a long story about a dragon.", 400)  # ~10 s: under way still
    predicted = "llamacpp:tokens_predicted_total"

    async def go() -> tuple[WarmSummary, list[str]]:
        async with OpenAIBackend(url, retry=RetryPolicy(attempts=1), stream=True) as b:
            w = ShadowWarmer(b, cache, cfg, progress=False)
            run = asyncio.create_task(w.run([item]))
            await wait_for_async(lambda: bool(w.summary and w.summary.sent), 30,
                                 "the warm to be sent")  # fmt: skip
            await wait_for_async(lambda: _running(url), 30,
                                 "the warm to hold a slot on the server", 0.1)  # fmt: skip
            live = [asyncio.to_thread(_ask, url, f"Tell me story {i} about the sea.", 16)
                    for i in range(2)]  # fmt: skip
            await asyncio.wait_for(asyncio.gather(*live), 120)
            summary = await asyncio.wait_for(run, 60)
            assert w.aimd is not None
            return summary, [b.reason for b in w.aimd.backoffs]

    before = read_engine(url)
    summary, backoffs = asyncio.run(go())
    after = read_engine(url)
    assert (summary.sent, summary.yielded, summary.cached) == (1, 1, 0)
    assert set(backoffs) <= {"engine_deferred"}
    assert before is not None and after is not None and after.running == 0
    decoded = dict(after.counters)[predicted] - dict(before.counters)[predicted]
    assert decoded < 2 * 16 + 200, "the cancelled warm decoded on towards its 400 tokens"
