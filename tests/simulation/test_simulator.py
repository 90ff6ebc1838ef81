"""The simulated GPU over real loopback HTTP: latency model, slots, queue, 429s, answers."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from backends.base import Generation, GenerationRequest
from backends.client import OpenAIBackend, RetryPolicy
from schemas.common import RequestParams
from schemas.errors import BackendOverloaded, BackendRejected
from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig, Simulator
from stoker.embedded import free_port
from tests.waiting import wait_for, wait_for_async

NO_RETRY = RetryPolicy(attempts=1)


def _req(prompt: str, **params: object) -> GenerationRequest:
    return GenerationRequest("acme", "sim-model", "v1", "t1", prompt, RequestParams(**params))


async def _generate(url: str, *reqs: GenerationRequest, mode: str = "chat") -> list[Generation]:
    async with OpenAIBackend(url, mode=mode, retry=NO_RETRY) as b:  # type: ignore[arg-type]
        return list(await asyncio.gather(*(b.generate(r) for r in reqs)))


def test_simulator__same_prompt_same_answer_across_modes_and_spacing(sim: SimulatorThread) -> None:
    a, b, c = asyncio.run(
        _generate(sim.url, _req("What is a cache?"), _req("  what IS a   cache? "), _req("other"))
    )
    (d,) = asyncio.run(_generate(sim.url, _req("What is a cache?"), mode="completions"))
    assert a.text == b.text == d.text
    assert a.text != c.text
    assert a.tokens_out == len(a.text.split())


def test_simulator__answers_are_stable_across_instances() -> None:
    one = Simulator(SimConfig()).answer_for("m", "hello there", None)
    two = Simulator(SimConfig()).answer_for("m", "hello there", None)
    assert one == two
    assert Simulator(SimConfig()).answer_for("m2", "hello there", None).text != one.text


def test_simulator__answer_table_lets_paraphrases_share_one_answer() -> None:
    cfg = SimConfig(answers={"how do I reset my password": "Open settings, then security."})
    with SimulatorThread(cfg) as s:
        s.set_answer("I forgot my password, how to reset it", "Open settings, then security.")
        a, b, c = asyncio.run(
            _generate(
                s.url,
                _req("How do I reset my password"),
                _req("i forgot my password, how to reset it"),
                _req("how do I change my email"),
            )
        )
    assert a.text == b.text == "Open settings, then security."
    assert c.text != a.text


def test_simulator__latency_model_is_reported_as_gpu_ms() -> None:
    cfg = SimConfig(slots=2, prefill_ms_per_token=0.5, decode_ms_per_token=2.0)
    with SimulatorThread(cfg) as s:
        (g,) = asyncio.run(_generate(s.url, _req("one two three four", max_tokens=10)))
    assert g.tokens_in == 4
    assert g.tokens_out == 10
    assert g.finish_reason == "length"
    assert g.gpu_ms == pytest.approx(0.5 * 4 + 2.0 * 10)
    assert g.latency_ms >= g.gpu_ms


def test_simulator__answers_429_when_every_slot_is_busy_and_the_queue_is_full() -> None:
    async def scenario(s: SimulatorThread) -> tuple[Generation, BaseException | None]:
        async with OpenAIBackend(s.url, retry=NO_RETRY) as b:
            queued = asyncio.create_task(b.generate(_req("first")))
            await wait_for_async(lambda: s.stats().queued == 1)  # no slot: it waits in the queue
            overflow: BaseException | None = None
            try:
                await b.generate(_req("second"))
            except BackendOverloaded as e:
                overflow = e
            s.set_slots(1)  # capacity back: the queued request completes
            return await asyncio.wait_for(queued, 5), overflow

    with SimulatorThread(SimConfig(slots=0, queue=1, decode_ms_per_token=0.1)) as s:
        done, overflow = asyncio.run(scenario(s))
        stats = s.stats()
    assert isinstance(overflow, BackendOverloaded)
    assert overflow.retry_after_s == 1.0
    assert done.text
    assert (stats.served, stats.rejected, stats.slots) == (1, 1, 1)


def test_simulator__halving_slots_halves_concurrency() -> None:
    async def peak_busy(s: SimulatorThread, n: int) -> int:
        peak = 0
        async with OpenAIBackend(s.url, retry=NO_RETRY) as b:
            tasks = [asyncio.create_task(b.generate(_req(f"q{i}"))) for i in range(n)]
            while not all(t.done() for t in tasks):
                peak = max(peak, s.stats().busy)
                await asyncio.sleep(0.002)
            await asyncio.gather(*tasks)
        return peak

    with SimulatorThread(SimConfig(slots=4, queue=64, decode_ms_per_token=5.0)) as s:
        s.set_slots(2)
        assert asyncio.run(peak_busy(s, 12)) <= 2
        assert s.stats().served == 12


def test_simulator__bad_request_is_rejected_not_retried(sim: SimulatorThread) -> None:
    nameless = GenerationRequest("acme", "", "v1", "t1", "hello")  # the simulator needs a model
    with pytest.raises(BackendRejected) as e:
        asyncio.run(_generate(sim.url, nameless))
    assert e.value.status == 400
    assert e.value.kind == "poison"


def test_simulator__models_health_and_slots_endpoints(sim: SimulatorThread) -> None:
    with httpx.Client(base_url=sim.url, timeout=5) as c:
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["sim-model"]
        assert c.get("/health").json()["status"] == "ok"
        assert c.post("/sim/slots", json={"slots": 7}).json()["slots"] == 7
        assert c.post("/sim/slots", json={"slots": -1}).status_code == 400
        assert c.post("/v1/completions", json={"model": "m", "prompt": 3}).status_code == 400
        assert c.post("/v1/chat/completions", content=b"{nope").status_code == 400
        assert c.get("/v1/nothing").status_code == 404
    assert sim.stats().slots == 7


def test_sim_backend_cli__serves_then_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text('{"ping": "pong"}')
    port = free_port()
    cmd = [sys.executable, "-m", "stoker.cli", "sim-backend", "--port", str(port), "--slots", "2"]
    proc = subprocess.Popen(
        [*cmd, "--decode-ms-per-token", "0.1", "--answers", str(answers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        got: list[dict[str, int]] = []

        def healthy() -> bool:  # the interpreter and typer take ~1 s to start
            try:
                got.append(httpx.get(f"{url}/health", timeout=1).json())
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return bool(got)

        wait_for(healthy, 20, "sim-backend to answer /health", 0.05)
        health = got[0]
        assert health["slots"] == 2
        (g,) = asyncio.run(_generate(url, _req("PING")))
        assert g.text == "pong"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
