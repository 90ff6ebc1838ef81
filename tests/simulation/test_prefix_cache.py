"""The simulator's KV prefix cache, over real loopback HTTP: what a caller sees is timing only."""

from __future__ import annotations

import time

import httpx
import pytest

from simulation.backend.http import SimulatorThread
from simulation.backend.prefix_cache import PrefixCache
from simulation.backend.simulator import SimConfig

# Prefill dominates here (2 ms a token, 1 ms a decoded token): 400 prompt tokens cost 0.8 s cold.
PREFILL_SIM = SimConfig(
    slots=4, prefill_ms_per_token=2.0, decode_ms_per_token=1.0, default_max_tokens=8,
    prefix_cache_tokens=4096,
)  # fmt: skip
SYSTEM = " ".join(f"rule{i}" for i in range(400))


def _chat(url: str, user: str, system: str = SYSTEM, model: str = "sim-model") -> dict:  # type: ignore[type-arg]
    body = {
        "model": model,
        "max_tokens": 1,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def _ttft_s(url: str, user: str, system: str = SYSTEM) -> float:
    """Seconds to the first content chunk of a streamed answer, as a client measures TTFT."""
    body = {
        "model": "sim-model",
        "stream": True,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=10) as r:
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - t0
    raise AssertionError("no content chunk")


def test_prefix_cache__held_prefix_pays_prefill_for_the_rest_only() -> None:
    with SimulatorThread(PREFILL_SIM) as sim:
        cold = _chat(sim.url, "first question")["usage"]["gpu_ms"]
        warm = _chat(sim.url, "another question entirely")["usage"]["gpu_ms"]
        # 402 tokens: 400 of the system prompt are 25 full blocks of 16; 2 tokens are left
        assert cold == pytest.approx(2.0 * 402 + 1.0)
        assert warm == pytest.approx(2.0 * (403 - 400) + 1.0)
        stats = sim.prefix_stats()
        assert (stats.queries, stats.hits) == (402 + 403, 400)


def test_prefix_cache__ttft_is_shorter_when_the_prefix_is_held() -> None:
    with SimulatorThread(PREFILL_SIM) as sim:
        cold = _ttft_s(sim.url, "what is a cache")
        warm = _ttft_s(sim.url, "what is a queue")
        assert cold >= 0.8  # 404 tokens at 2 ms
        assert warm < cold / 4


def test_prefix_cache__restart_and_another_model_start_empty() -> None:
    with SimulatorThread(PREFILL_SIM) as sim:
        _chat(sim.url, "q1")
        assert _chat(sim.url, "q2", model="other-model")["usage"]["gpu_ms"] > 2.0 * 400
        sim.restart()
        assert _chat(sim.url, "q3")["usage"]["gpu_ms"] > 2.0 * 400
        httpx.post(f"{sim.url}/sim/restart", timeout=5).raise_for_status()
        assert _chat(sim.url, "q4")["usage"]["gpu_ms"] > 2.0 * 400
        assert _chat(sim.url, "q5")["usage"]["gpu_ms"] < 2.0 * 10


def test_prefix_cache__a_different_first_token_shares_nothing() -> None:
    with SimulatorThread(PREFILL_SIM) as sim:
        _chat(sim.url, "q1")
        assert _chat(sim.url, "q2", system="Hello " + SYSTEM)["usage"]["gpu_ms"] > 2.0 * 400


def test_prefix_cache__capacity_in_tokens_evicts_least_recently_used() -> None:
    cfg = SimConfig(
        prefill_ms_per_token=2.0, decode_ms_per_token=1.0, default_max_tokens=8,
        prefix_cache_tokens=1000,
    )  # fmt: skip
    other = " ".join(f"other{i}" for i in range(400))
    with SimulatorThread(cfg) as sim:
        _chat(sim.url, "a")  # SYSTEM held: 400 tokens
        _chat(sim.url, "b", system=other)  # and other: 800
        _chat(sim.url, "c")  # SYSTEM used again: other is now the least recently used
        third = " ".join(f"third{i}" for i in range(400))
        _chat(sim.url, "d", system=third)  # 1200 > 1000: other's blocks go
        assert _chat(sim.url, "e")["usage"]["gpu_ms"] < 2.0 * 10
        assert _chat(sim.url, "f", system=other)["usage"]["gpu_ms"] > 2.0 * 100


def test_prefix_cache__tail_blocks_leave_before_the_shared_head() -> None:
    cache = PrefixCache(capacity_tokens=64, block_tokens=16)
    head = [f"h{i}" for i in range(32)]
    one = cache.blocks("m", [*head, *(f"x{i}" for i in range(32))])  # 4 blocks: fills it
    cache.insert(one)
    two = cache.blocks("m", [*head, *(f"y{i}" for i in range(16))])  # 3 blocks, 2 shared
    assert cache.lookup(two, 48) == 32
    cache.insert(two)  # one block over: x's tail goes first, never the shared head
    assert cache.lookup(one, 64) == 48
    assert cache.lookup(two, 48) == 48


def test_prefix_cache__metrics_use_vllm_names() -> None:
    with SimulatorThread(PREFILL_SIM) as sim:
        _chat(sim.url, "q1")
        _chat(sim.url, "q2")
        text = httpx.get(f"{sim.url}/metrics", timeout=5).text
    assert 'vllm:prefix_cache_queries_total{model_name="sim-model"} 802' in text
    assert 'vllm:prefix_cache_hits_total{model_name="sim-model"} 400' in text


def test_prefix_cache__off_with_zero_capacity_and_bad_config_refused() -> None:
    cfg = SimConfig(prefill_ms_per_token=2.0, decode_ms_per_token=1.0, prefix_cache_tokens=0)
    with SimulatorThread(cfg) as sim:
        _chat(sim.url, "q1")
        assert _chat(sim.url, "q2")["usage"]["gpu_ms"] > 2.0 * 400
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        SimConfig(prefix_cache_tokens=-1)
    with pytest.raises(ValueError, match="prefix_block_tokens"):
        SimConfig(prefix_block_tokens=0)
