"""The engine-metrics reader: vLLM's names and llama.cpp's, read from their Prometheus text,
from the simulated backend over HTTP, and from a real llama-server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from backends.engine import (
    EngineReader,
    EngineState,
    Slots,
    parse,
    read_engine,
    restarted,
    slots_of,
)
from simulation.backend.http import SimulatorThread
from stoker.embedded import LlamaServer, free_port
from tests.waiting import wait_for, wait_for_async

V1 = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %s
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.37
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.52
"""
CACHE_INFO = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
    'gpu_memory_utilization="0.9",num_gpu_blocks="27264",num_cpu_blocks="2048"} 1.0\n'
)
# As llama-server --metrics writes it (b1-0c1e570), after two requests sharing a system prompt.
LLAMA = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 438
llamacpp:prompt_tokens_cached_total 414
llamacpp:prompt_seconds_total 12.8393
llamacpp:tokens_predicted_total 40
llamacpp:tokens_predicted_seconds_total 3.25
llamacpp:n_decode_total 40
llamacpp:requests_processing %s
llamacpp:requests_deferred %s
llamacpp:n_busy_slots_per_decode 1
"""
MODEL = "smollm2-135m-instruct"


def test_engine__reads_vllms_load() -> None:
    assert parse(V1 % "0.0").load == pytest.approx(0.52)  # the fuller of two engines
    assert parse(V1 % "3.0").load == 1.0  # requests queue: full, whatever the KV use
    v0 = "vllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.25\n"
    assert parse(v0).load == pytest.approx(0.25)
    assert parse("vllm:kv_cache_usage_perc 1.7\n").load == 1.0
    # nothing said: no gauges, waiting alone (not full, but how full?), NaN, other metrics
    for text in ("", "vllm:num_requests_waiting 0\n", "vllm:kv_cache_usage_perc NaN\n",
                 "process_cpu_seconds_total 12\n"):  # fmt: skip
        assert parse(text).load is None, text


def test_engine__reads_llama_cpps_load_from_its_slots() -> None:
    two = Slots(2, 4096)
    assert parse(LLAMA % (0, 0), two).load == 0.0
    assert parse(LLAMA % (1, 0), two).load == 0.5
    assert parse(LLAMA % (2, 0), two).load == 1.0
    assert parse(LLAMA % (1, 3), two).load == 1.0  # deferred: full
    assert parse(LLAMA % (1, 3)).load == 1.0  # deferred is full even with the slots unknown
    assert parse(LLAMA % (1, 0)).load is None  # busy, but out of how many?
    state = parse(LLAMA % (2, 0), two)
    assert state.load_beside(1) == 0.5  # one of the two is the caller's own
    assert (state.engine, state.running, state.waiting, state.slots) == ("llama.cpp", 2, 0, 2)


def test_engine__reads_the_prefix_cache_of_each() -> None:
    llama = parse(LLAMA % (0, 0), Slots(2, 4096))
    # prompt_tokens_total counts only what was prefilled: asked = prefilled + held
    assert (llama.prompt_tokens, llama.held_tokens) == (438 + 414, 414)
    assert llama.held_share == pytest.approx(414 / 852)
    assert llama.cache_tokens == 2 * 4096  # what its slots hold
    vllm = parse(CACHE_INFO + "vllm:prefix_cache_queries_total 100\n"
                 "vllm:prefix_cache_hits_total 25\n")  # fmt: skip
    assert (vllm.engine, vllm.cache_tokens, vllm.held_share) == ("vllm", 27_264 * 16, 0.25)
    assert parse(CACHE_INFO.replace('caching="True"', 'caching="False"')).cache_tokens == 0
    no_blocks = CACHE_INFO.replace('num_gpu_blocks="27264"', 'num_gpu_blocks="None"')
    assert parse(no_blocks).cache_tokens is None
    assert parse("vllm:prefix_cache_hits_total 5\n").cache_tokens is None  # older vLLM, SGLang


def test_engine__reads_the_seconds_each_spent_on_requests() -> None:
    assert parse(LLAMA % (0, 0)).busy_s == pytest.approx(12.8393 + 3.25)  # prefill + decode
    v1 = ('vllm:request_inference_time_seconds_sum{engine="0",model_name="m"} 7.5\n'
          'vllm:request_inference_time_seconds_sum{engine="1",model_name="m"} 2.5\n'
          'vllm:request_inference_time_seconds_count{engine="0",model_name="m"} 9\n')  # fmt: skip
    assert parse(v1).busy_s == pytest.approx(10.0)  # summed over the engines
    assert parse("vllm:num_requests_waiting 0\n").busy_s is None  # not said: not 0
    assert parse("vllm:request_inference_time_seconds_sum NaN\n").busy_s is None


def test_engine__slots_from_llama_cpps_props() -> None:
    assert slots_of(b'{"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}') == (
        Slots(2, 4096)
    )
    assert slots_of(b'{"total_slots": 4}') == Slots(4, None)
    for bad in (b"", b"[]", b'{"total_slots": 0}', b'{"total_slots": "x"}'):
        assert slots_of(bad) is None


def test_engine__when_a_cache_must_be_empty() -> None:
    vllm = "process_start_time_seconds 1.7e+09\nvllm:prefix_cache_queries_total %s\n"
    busy, fresh = parse(vllm % 500), parse(vllm % 0)
    assert restarted(None, fresh) == "a new replica: it has prefilled nothing yet"
    assert restarted(None, busy) is None  # first seen with traffic behind it: left alone
    assert restarted(None, parse("")) is None
    moved = parse(vllm.replace("1.7e+09", "1.8e+09") % 900)
    assert restarted(busy, moved) == "restarted: its process start time moved"
    went_back = parse("vllm:prefix_cache_queries_total 10\n")
    assert restarted(busy, went_back) == (
        "restarted: its vllm:prefix_cache_queries_total counter went back"
    )
    assert restarted(busy, parse(vllm % 900)) is None
    # llama.cpp exports no start time: its counters tell
    before, after = parse(LLAMA % (0, 0)), parse(LLAMA.replace("438", "12") % (0, 0))
    assert (
        restarted(before, after) == "restarted: its llamacpp:prompt_tokens_total counter went back"
    )
    assert restarted(before, parse(LLAMA.replace("438", "900") % (1, 0))) is None
    zero = "\n".join(f"{n} 0" for n in ("llamacpp:prompt_tokens_total",
                                        "llamacpp:prompt_tokens_cached_total"))  # fmt: skip
    assert restarted(None, parse(zero)) == "a new replica: it has prefilled nothing yet"


def _read(url: str, **kw: Any) -> EngineState | None:
    async def go() -> EngineState | None:
        r = EngineReader(url, **kw)
        try:
            return await r.latest()
        finally:
            await r.aclose()

    return asyncio.run(go())


def test_engine_reader__a_server_without_metrics_says_nothing(sim: SimulatorThread) -> None:
    assert _read(f"http://127.0.0.1:{free_port()}") is None  # nothing listens
    assert _read(sim.url + "/sim/v1") is None  # /sim/metrics: 404
    state = _read(sim.url + "/v1")  # read at the root, whatever form the base takes
    assert state is not None and (state.engine, state.load) == ("vllm", 0.0)
    assert read_engine(sim.url) == state


def test_engine_reader__latest_reads_in_the_background_at_most_every_interval(
    sim: SimulatorThread,
) -> None:
    now = [0.0]
    words = " ".join(f"w{i}" for i in range(40))  # over one 16-token block: looked up
    body = {"model": "sim-model", "messages": [{"role": "user", "content": words}]}

    def asked(s: EngineState | None) -> float | None:
        return s.prompt_tokens if s is not None else None

    async def go() -> list[float | None]:
        r = EngineReader(sim.url, interval_s=1.0, clock=lambda: now[0])
        try:
            seen = [asked(await r.latest())]  # the first call waits for its read
            await asyncio.to_thread(httpx.post, sim.url + "/v1/chat/completions", json=body)
            seen.append(asked(await r.latest()))  # within the interval: no read
            now[0] = 1.5
            seen.append(asked(await r.latest()))  # a read starts; what was known comes back
            await wait_for_async(lambda: asked(r.last) != seen[0], 2, "the background read", 0.01)
            seen.append(asked(r.last))
            return seen
        finally:
            await r.aclose()

    first, same, stale, fresh = asyncio.run(go())
    assert first == same == stale == 0
    assert fresh is not None and fresh > 0


def test_engine_reader__the_simulator_reports_the_gpu_time_it_answered_with(
    sim: SimulatorThread,
) -> None:
    before = read_engine(sim.url)
    got = [httpx.post(sim.url + "/v1/chat/completions", timeout=10, json={
        "model": "sim-model", "messages": [{"role": "user", "content": f"question {i}"}]},
    ).json()["usage"]["gpu_ms"] for i in range(3)]  # fmt: skip
    after = read_engine(sim.url)
    assert before is not None and after is not None and before.busy_s is not None
    assert after.busy_s == pytest.approx(before.busy_s + sum(got) / 1000.0)


# -- against a real llama-server --


def _chat(url: str, content: str, max_tokens: int, system: str | None = None) -> dict[str, Any]:
    msgs = [{"role": "user", "content": content}]
    if system:
        msgs.insert(0, {"role": "system", "content": system})
    body = {"model": MODEL, "messages": msgs, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{url}/chat/completions", json=body, timeout=180)
    r.raise_for_status()
    return dict(r.json())


def test_engine_reader__llama_server_load_prefix_cache_and_a_queue(llama: LlamaServer) -> None:
    """llama-server as the fixture runs it (2 slots of 4,096 tokens): idle it is 0; two long
    answers fill both slots; a third waits for one (deferred): full."""
    url = llama.base_url
    idle = read_engine(url)
    assert idle is not None and idle.engine == "llama.cpp"
    assert (idle.slots, idle.cache_tokens, idle.load) == (2, 8192, 0.0)
    system = "You answer questions about invoices. " * 20
    answers = [
        _chat(url, "What is an invoice?", 2, system),
        _chat(url, "What is a refund?", 2, system),
    ]
    held = read_engine(url)
    assert held is not None and held.held_tokens is not None and idle.held_tokens is not None
    # the time it spent on them: each answer's own timings (prompt_ms + predicted_ms), summed
    took = sum(a["timings"]["prompt_ms"] + a["timings"]["predicted_ms"] for a in answers) / 1e3
    assert idle.busy_s is not None and held.busy_s is not None and took > 0
    assert held.busy_s - idle.busy_s == pytest.approx(took, rel=0.01, abs=0.005)
    assert held.held_tokens - idle.held_tokens >= 100  # the second found the system prompt

    long = [threading.Thread(target=_chat, args=(url, f"Tell me story {i} about a dragon.", 64))
            for i in range(3)]  # fmt: skip
    for t in long:
        t.start()
    try:
        states: list[EngineState] = []

        def queued() -> bool:
            s = read_engine(url)
            states.append(s) if s is not None else None
            return s is not None and bool(s.waiting)

        wait_for(queued, 60, "a third request deferred behind two busy slots", 0.05)
        full = states[-1]
        assert (full.running, full.load) == (2, 1.0)
    finally:
        for t in long:
            t.join(180)
    assert (after := read_engine(url)) is not None and after.load == 0.0


def test_engine_reader__a_restarted_llama_server_shows_its_counters_gone_back(
    restartable_llama: tuple[Callable[[], LlamaServer], int],
) -> None:
    start, port = restartable_llama
    url = f"http://127.0.0.1:{port}/v1"
    first = start()
    _chat(url, "Name one fruit.", 4)
    before = read_engine(url)
    first.stop()
    assert read_engine(url, timeout_s=1.0) is None  # down: nothing said
    start()
    after = read_engine(url)
    assert before is not None and after is not None
    assert restarted(before, after) == (
        "restarted: its llamacpp:prompt_tokens_total counter went back"
    )
    assert restarted(None, after) == "a new replica: it has prefilled nothing yet"
