"""The one backend client against real HTTP servers on loopback: request shapes, the cost of an
answer, retries, the error tree, the circuit, raw pass-through and streams, every URL form."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from backends.base import Generation, GenerationRequest
from backends.client import (
    OpenAIBackend,
    RetryPolicy,
    Timeouts,
    backend_ms,
    list_models,
)
from schemas.common import DocRef, RequestParams
from schemas.errors import (
    BackendOverloaded,
    BackendRejected,
    BackendTimedOut,
    BackendUnavailable,
    BackendUnreachable,
)
from simulation.backend.http import SimulatorThread
from stoker.embedded import free_port
from tests.backends.conftest import Answer, Scripted
from tests.gateway.upstreams import Served

FAST_RETRY = RetryPolicy(attempts=3, base_s=0.001, max_s=0.002)
CHAT_OK = {
    "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "gpu_ms": 12.5},
}
Start = Callable[..., tuple[str, Scripted]]


def _req(**params: Any) -> GenerationRequest:
    return GenerationRequest(
        "acme", "llama", "v1", "t1", "say hi", RequestParams(**params),
        (DocRef(doc_id="d", version=1),),
    )  # fmt: skip


def _generate(url: str, req: GenerationRequest | None = None, **kw: Any) -> Generation:
    async def go() -> Generation:
        kw.setdefault("retry", FAST_RETRY)
        async with OpenAIBackend(url, **kw) as b:
            return await b.generate(req or _req())

    return asyncio.run(go())


def test_client__chat_body_and_usage(scripted: Start) -> None:
    url, s = scripted(Answer(body=CHAT_OK))
    g = _generate(url, _req(max_tokens=5, seed=7, no_cache=False))
    assert s.paths == ["/v1/chat/completions"]
    assert s.bodies[0] == {
        "model": "llama",
        "messages": [{"role": "user", "content": "say hi"}],
        "temperature": 0.0,
        "max_tokens": 5,
        "seed": 7,
    }
    assert s.headers[0]["content-type"] == "application/json"
    assert (g.text, g.tokens_in, g.tokens_out, g.gpu_ms, g.finish_reason, g.retries) == (
        "hi", 3, 1, 12.5, "stop", 0,
    )  # fmt: skip


def test_client__completions_mode_served_name_and_headers(scripted: Start) -> None:
    ok = {"choices": [{"text": "yo", "finish_reason": "length"}], "usage": {}}
    url, s = scripted(Answer(body=ok))
    g = _generate(url, mode="completions", model="served-name", api_key="k",
                  headers={"Cache-Control": "no-store"})  # fmt: skip
    assert s.paths == ["/v1/completions"]
    assert (s.bodies[0]["prompt"], s.bodies[0]["model"]) == ("say hi", "served-name")
    assert s.headers[0]["authorization"] == "Bearer k"
    assert s.headers[0]["cache-control"] == "no-store"
    assert (g.text, g.finish_reason) == ("yo", "length")
    assert g.gpu_ms == g.latency_ms  # no figure of the server's own: wall time stands in


def test_client__an_answer_costs_what_llama_cpp_says_it_spent(scripted: Start) -> None:
    """The warmer's and the monitor's answers are costed by the gateway's rule: the server's
    timings (prefill plus decode), not the call's wall time."""
    timings = {"prompt_ms": 120.5, "predicted_ms": 30.25, "cache_n": 400, "prompt_n": 12}
    url, _ = scripted(Answer(body={**CHAT_OK, "usage": {"prompt_tokens": 3}, "timings": timings}))
    assert _generate(url).gpu_ms == 150.75


def test_backend_ms__the_servers_own_figure_first_then_its_timings_then_the_wall_clock() -> None:
    timings = {"prompt_ms": 12.5, "predicted_ms": 180.25, "cache_n": 24, "prompt_n": 18}
    assert backend_ms({"gpu_ms": 7.0}, timings, 500.0) == 7.0  # the simulator's
    assert backend_ms({}, timings, 500.0) == 192.75  # llama.cpp: prefill + decode
    assert backend_ms({}, None, 500.0) == 500.0  # vLLM, TGI, OpenAI: the call as seen
    assert backend_ms({"gpu_ms": 0}, {"prompt_ms": "x"}, 500.0) == 500.0  # nothing usable


def test_client__retries_5xx_then_reports_how_many(scripted: Start) -> None:
    url, s = scripted(Answer(503), Answer(500), Answer(body=CHAT_OK))
    assert _generate(url).retries == 2
    assert len(s.bodies) == 3


def test_client__gives_up_after_bounded_attempts(scripted: Start) -> None:
    url, s = scripted(Answer(502))
    with pytest.raises(BackendUnavailable, match="HTTP 502"):
        _generate(url)
    assert len(s.bodies) == FAST_RETRY.attempts


def test_client__429_surfaces_at_once_with_retry_after(scripted: Start) -> None:
    url, s = scripted(Answer(429, {}, {"retry-after": "2"}), Answer(body=CHAT_OK))
    with pytest.raises(BackendOverloaded) as e:
        _generate(url)
    assert e.value.retry_after_s == 2.0
    assert len(s.bodies) == 1  # not retried: the warmer's AIMD must see it


def test_client__4xx_is_poison_and_never_retried(scripted: Start) -> None:
    url, s = scripted(Answer(400, {"error": "bad"}), Answer(body=CHAT_OK))
    with pytest.raises(BackendRejected) as e:
        _generate(url)
    assert e.value.status == 400 and '{"error":"bad"}' in str(e.value)
    assert len(s.bodies) == 1


@pytest.mark.parametrize(
    "body",
    [b"not json", [1, 2], {"choices": []}, {"choices": [{"message": {"content": None}}]}],
)
def test_client__a_malformed_answer_is_a_retriable_error(scripted: Start, body: Any) -> None:
    url, _ = scripted(Answer(body=body))
    with pytest.raises(BackendUnavailable, match="answer"):
        _generate(url, retry=RetryPolicy(attempts=1))


def test_client__a_slow_answer_is_a_timeout(scripted: Start) -> None:
    url, _ = scripted(Answer(body=CHAT_OK, delay_s=2.0))
    with pytest.raises(BackendTimedOut, match=r"POST .*/v1/chat/completions"):
        _generate(url, timeouts=Timeouts(read_s=0.3), retry=RetryPolicy(attempts=1))


def test_client__connection_refused_is_unavailable_and_says_connect_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendUnavailable, match="ConnectError") as e:
        _generate(url, retry=RetryPolicy(attempts=1))
    assert not isinstance(e.value, BackendTimedOut)


def test_retry_policy__full_jitter_stays_under_the_cap() -> None:
    p = RetryPolicy(attempts=10, base_s=0.1, max_s=0.5)
    rng = random.Random(1)
    delays = [p.delay_s(n, rng) for n in range(1, 10) for _ in range(50)]
    assert all(0 <= d <= 0.5 for d in delays)
    assert max(p.delay_s(1, rng) for _ in range(50)) <= 0.1


@pytest.mark.parametrize(
    ("suffix", "path"),
    [("", "/v1/chat/completions"), ("/v1", "/v1/chat/completions"),
     ("/v1/", "/v1/chat/completions"), ("/llm/v1", "/llm/v1/chat/completions")],
)  # fmt: skip
def test_client__each_form_of_base_url_posts_where_the_openai_sdk_would(
    scripted: Start, suffix: str, path: str
) -> None:
    url, s = scripted(Answer(body=CHAT_OK))
    assert _generate(url + suffix).text == "hi"
    assert s.paths == [path]


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_client__the_simulated_backend_answers_at_every_form_of_its_url(
    sim: SimulatorThread, suffix: str
) -> None:
    assert _generate(sim.url + suffix, _req(max_tokens=4)).text


def test_client__refused_connections_open_the_circuit_naming_the_url_and_setting() -> None:
    """Three refused connections in a row (one item's retries) open the circuit: the item
    fails with the URL and where it came from, and no later send connects at all, not even
    once something listens there again."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    script = Scripted([Answer(body=CHAT_OK)])

    async def go() -> tuple[str, str, str]:
        async with OpenAIBackend(url, retry=FAST_RETRY, source="STOKER_WARM_BACKEND_URL") as b:
            with pytest.raises(BackendUnreachable) as first:
                await b.generate(_req())
            with pytest.raises(BackendUnreachable) as second:
                await b.generate(_req())
            with Served(script.app(), port=port), pytest.raises(BackendUnreachable) as third:
                await b.generate(_req())
        return str(first.value), str(second.value), str(third.value)

    first, second, third = asyncio.run(go())
    assert first == second == third
    assert first.startswith(f"cannot connect to {url} (STOKER_WARM_BACKEND_URL): ConnectError")
    assert "3 attempts in a row, so this run sends no more" in first
    assert script.paths == []


def test_client__refusals_count_only_in_a_row() -> None:
    """A replica restarting behind DNS refuses now and then: an answer between refusals
    keeps the circuit closed."""
    port = free_port()
    twice = RetryPolicy(attempts=2, base_s=0.001, max_s=0.002)
    script = Scripted([Answer(body=CHAT_OK)])

    async def go() -> list[str]:
        seen = []
        async with OpenAIBackend(f"http://127.0.0.1:{port}", retry=twice) as b:
            for up in (False, True, False, False):
                try:
                    if up:
                        with Served(script.app(), port=port):
                            await b.generate(_req())
                    else:
                        await b.generate(_req())
                    seen.append("answered")
                except BackendUnavailable as e:
                    seen.append(type(e).__name__)
        return seen

    # 2 refusals, an answer, 2 refusals (not 4 in a row: still closed), then the third opens it
    assert asyncio.run(go()) == [
        "BackendUnavailable", "answered", "BackendUnavailable", "BackendUnreachable",
    ]  # fmt: skip


def test_client__raw_calls_pass_any_status_and_keep_what_an_sdk_reads(scripted: Start) -> None:
    url, s = scripted(Answer(503, {"error": {"message": "busy"}}, {"retry-after": "3",
                                                                   "x-other": "dropped"}))  # fmt: skip

    async def go() -> Any:
        async with OpenAIBackend(url) as b:
            return await b.post(b.url("chat/completions"), b'{"a": 1}', {"x-mine": "yes"})

    reply = asyncio.run(go())
    assert reply.status == 503 and reply.content == b'{"error":{"message":"busy"}}'
    assert reply.headers == {"retry-after": "3", "content-type": "application/json"}
    assert s.bodies == [{"a": 1}] and s.headers[0]["x-mine"] == "yes"


def test_client__a_stream_comes_as_it_is_sent_and_a_broken_one_is_an_error() -> None:
    async def events(n: int, whole: bool) -> Any:
        for i in range(n):
            yield f"data: {i}\n\n".encode()
            await asyncio.sleep(0.01)
        if whole:
            yield b"data: [DONE]\n\n"
        else:
            raise RuntimeError("the server died mid-answer")

    async def chat(request: Any) -> StreamingResponse:
        whole = (await request.body()) == b"whole"
        return StreamingResponse(events(3, whole), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

    async def read(b: OpenAIBackend, body: bytes) -> bytes:
        out = b""
        async with b.stream(b.url("chat/completions"), body) as st:
            assert st.status == 200 and st.headers["content-type"].startswith("text/event-")
            async for chunk in st.chunks():
                out += chunk
        return out

    async def go(url: str) -> tuple[bytes, BaseException | None]:
        async with OpenAIBackend(url) as b:
            whole = await read(b, b"whole")
            try:
                await read(b, b"broken")
            except BackendUnavailable as e:
                return whole, e
        return whole, None

    with Served(app) as s:
        whole, broken = asyncio.run(go(s.url))
    assert whole == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert isinstance(broken, BackendUnavailable)
    assert "/v1/chat/completions" in str(broken)


def test_client__serves_one_loop_after_another(sim: SimulatorThread) -> None:
    """A client closed on one event loop opens anew on the next (the monitor's batches, the
    replica watch's checks: one asyncio.run each)."""
    b = OpenAIBackend(sim.url, retry=FAST_RETRY)

    async def once() -> str:
        try:
            return (await b.generate(_req(max_tokens=2))).text
        finally:
            await b.aclose()

    assert asyncio.run(once()) and asyncio.run(once())


def test_list_models__from_code_without_a_loop(sim: SimulatorThread, scripted: Start) -> None:
    assert list_models(sim.url, 5.0) == ["sim-model"]
    url, _ = scripted(Answer(body=b"not the list"), Answer(404, {"error": "no"}))
    assert list_models(url, 5.0) is None
    with pytest.raises(BackendRejected, match="HTTP 404"):
        list_models(url, 5.0)
    with pytest.raises(BackendUnavailable, match="ConnectError"):
        list_models(f"http://127.0.0.1:{free_port()}", 5.0)


@pytest.mark.parametrize("mode", ["chat", "completions"])
def test_client__a_streamed_generation_is_the_plain_one(sim: SimulatorThread, mode: str) -> None:
    """stream=True (warm runs: a cancelled warm stops the server's work) assembles the same
    answer, tokens and cost as the plain call."""
    plain = _generate(sim.url, _req(max_tokens=12), mode=mode)
    streamed = _generate(sim.url, _req(max_tokens=12), mode=mode, stream=True)
    assert streamed.text and streamed.retries == 0
    fields = ("text", "tokens_in", "tokens_out", "gpu_ms", "finish_reason")
    assert [getattr(streamed, f) for f in fields] == [getattr(plain, f) for f in fields]


def test_client__a_streamed_answer_costs_its_timings_and_a_broken_one_is_an_error() -> None:
    timings = {"prompt_ms": 10.0, "predicted_ms": 5.5}
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"content": "Par"}}]},
        {"choices": [{"index": 0, "delta": {"content": "is."}, "finish_reason": "stop"}],
         "timings": timings},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
    ]  # fmt: skip
    framed = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)

    async def whole() -> Any:
        for i in range(0, len(framed), 7):  # split anywhere, as the network does
            yield framed[i : i + 7]
        yield b"data: [DONE]\r\n\r\n"

    async def cut() -> Any:
        yield framed[:40]

    async def chat(request: Any) -> StreamingResponse:
        body = orjson.loads(await request.body())
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        gen = whole() if body["messages"][0]["content"] == "say hi" else cut()
        return StreamingResponse(gen, media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    broken = GenerationRequest("acme", "llama", "v1", "t1", "cut me", RequestParams())
    with Served(app) as s:
        g = _generate(s.url, stream=True)
        with pytest.raises(BackendUnavailable, match="broke off"):
            _generate(s.url, broken, stream=True, retry=RetryPolicy(attempts=1))
    assert (g.text, g.tokens_in, g.tokens_out, g.gpu_ms, g.finish_reason) == (
        "Paris.", 9, 2, 15.5, "stop",
    )  # fmt: skip


def test_client__a_refused_stream_is_the_same_error_as_a_plain_one(scripted: Start) -> None:
    url, _ = scripted(Answer(400, {"error": "too long"}), Answer(429, {}, {"retry-after": "1"}))
    with pytest.raises(BackendRejected, match="too long"):
        _generate(url, stream=True)
    with pytest.raises(BackendOverloaded):
        _generate(url, stream=True)
