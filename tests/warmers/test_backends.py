"""The OpenAI-compatible client: request shapes, usage, retries and error translation."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from schemas.common import DocRef, RequestParams
from schemas.errors import (
    BackendOverloaded,
    BackendRejected,
    BackendUnavailable,
    BackendUnreachable,
)
from stoker.embedded import free_port
from warmers.backends.base import Generation, GenerationRequest
from warmers.backends.openai import OpenAIBackend, RetryPolicy, Timeouts

FAST_RETRY = RetryPolicy(attempts=3, base_s=0.001, max_s=0.002)
CHAT_OK = {
    "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "gpu_ms": 12.5},
}


def _req(**params: Any) -> GenerationRequest:
    return GenerationRequest(
        "acme",
        "llama",
        "v1",
        "t1",
        "say hi",
        RequestParams(**params),
        (DocRef(doc_id="d", version=1),),
    )


class Script:
    """A scripted server: answers in order, records every request body."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(orjson.loads(request.content))
        self.paths.append(request.url.path)
        return self.answers.pop(0)


def _run(script: Script, req: GenerationRequest | None = None, **kw: Any) -> Generation:
    async def go() -> Generation:
        kw.setdefault("retry", FAST_RETRY)
        b = OpenAIBackend("http://backend/", transport=httpx.MockTransport(script), **kw)
        async with b:
            return await b.generate(req or _req())

    return asyncio.run(go())


def test_openai_backend__chat_body_and_usage() -> None:
    s = Script(httpx.Response(200, json=CHAT_OK))
    g = _run(s, _req(max_tokens=5, seed=7, no_cache=False))
    assert s.paths == ["/v1/chat/completions"]
    assert s.bodies[0] == {
        "model": "llama",
        "messages": [{"role": "user", "content": "say hi"}],
        "temperature": 0.0,
        "max_tokens": 5,
        "seed": 7,
    }
    assert (g.text, g.tokens_in, g.tokens_out, g.gpu_ms, g.finish_reason, g.retries) == (
        "hi",
        3,
        1,
        12.5,
        "stop",
        0,
    )


def test_openai_backend__completions_mode_and_served_name() -> None:
    ok = {"choices": [{"text": "yo", "finish_reason": "length"}], "usage": {}}
    s = Script(httpx.Response(200, json=ok))
    g = _run(s, mode="completions", model="served-name")
    assert s.paths == ["/v1/completions"]
    assert s.bodies[0]["prompt"] == "say hi"
    assert s.bodies[0]["model"] == "served-name"
    assert (g.text, g.finish_reason) == ("yo", "length")
    assert g.gpu_ms == g.latency_ms  # no gpu_ms reported: wall time stands in


def test_openai_backend__retries_5xx_then_reports_how_many() -> None:
    s = Script(httpx.Response(503), httpx.Response(500), httpx.Response(200, json=CHAT_OK))
    g = _run(s)
    assert g.retries == 2
    assert len(s.bodies) == 3


def test_openai_backend__gives_up_after_bounded_attempts() -> None:
    s = Script(*(httpx.Response(502) for _ in range(5)))
    with pytest.raises(BackendUnavailable, match="HTTP 502"):
        _run(s)
    assert len(s.bodies) == FAST_RETRY.attempts


def test_openai_backend__429_surfaces_at_once_with_retry_after() -> None:
    s = Script(httpx.Response(429, headers={"retry-after": "2"}), httpx.Response(200, json=CHAT_OK))
    with pytest.raises(BackendOverloaded) as e:
        _run(s)
    assert e.value.retry_after_s == 2.0
    assert len(s.bodies) == 1  # not retried: the warmer's AIMD must see it


def test_openai_backend__4xx_is_poison_and_never_retried() -> None:
    s = Script(httpx.Response(400, json={"error": "bad"}), httpx.Response(200, json=CHAT_OK))
    with pytest.raises(BackendRejected) as e:
        _run(s)
    assert e.value.status == 400
    assert len(s.bodies) == 1


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, content=b"not json"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"choices": [{"message": {"content": None}}]}),
    ],
)
def test_openai_backend__malformed_answer_is_retriable_error(answer: httpx.Response) -> None:
    s = Script(*(answer for _ in range(FAST_RETRY.attempts)))
    with pytest.raises(BackendUnavailable, match="answer"):
        _run(s, retry=RetryPolicy(attempts=1))


def test_openai_backend__connection_refused_is_unavailable() -> None:
    async def go() -> None:
        url = f"http://127.0.0.1:{free_port()}"
        timeouts = Timeouts(connect_s=1.0, read_s=1.0)
        async with OpenAIBackend(url, timeouts=timeouts, retry=FAST_RETRY) as b:
            await b.generate(_req())

    with pytest.raises(BackendUnavailable, match="ConnectError"):
        asyncio.run(go())


def test_retry_policy__full_jitter_stays_under_the_cap() -> None:
    import random

    p = RetryPolicy(attempts=10, base_s=0.1, max_s=0.5)
    rng = random.Random(1)
    delays = [p.delay_s(n, rng) for n in range(1, 10) for _ in range(50)]
    assert all(0 <= d <= 0.5 for d in delays)
    assert max(p.delay_s(1, rng) for _ in range(50)) <= 0.1


@pytest.mark.parametrize(
    ("written", "path"),
    [
        ("http://backend", "/v1/chat/completions"),
        ("http://backend/v1", "/v1/chat/completions"),
        ("http://backend/v1/", "/v1/chat/completions"),
        ("http://backend/llm/v1", "/llm/v1/chat/completions"),
    ],
)
def test_openai_backend__each_form_of_base_url_posts_where_the_openai_sdk_would(
    written: str, path: str
) -> None:
    s = Script(httpx.Response(200, json=CHAT_OK))

    async def go() -> Generation:
        async with OpenAIBackend(written, transport=httpx.MockTransport(s)) as b:
            return await b.generate(_req())

    assert asyncio.run(go()).text == "hi"
    assert s.paths == [path]


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_openai_backend__the_simulated_backend_answers_at_every_form_of_its_url(
    sim: Any, suffix: str
) -> None:
    async def go() -> Generation:
        async with OpenAIBackend(sim.url + suffix, retry=FAST_RETRY) as b:
            return await b.generate(_req(max_tokens=4))

    assert asyncio.run(go()).text


def test_openai_backend__refused_connections_open_the_circuit_naming_the_url_and_setting() -> None:
    """Three refused connections in a row (one item's retries) open the circuit: the item
    fails with the URL and where it came from, and no later send connects at all."""
    attempts: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        attempts.append(str(request.url))
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    async def go() -> tuple[str, str]:
        b = OpenAIBackend(
            "http://gpu-0:8000/v1", transport=httpx.MockTransport(refuse), retry=FAST_RETRY,
            source="STOKER_WARM_BACKEND_URL",
        )  # fmt: skip
        async with b:
            with pytest.raises(BackendUnreachable) as first:
                await b.generate(_req())
            with pytest.raises(BackendUnreachable) as second:
                await b.generate(_req())
        return str(first.value), str(second.value)

    first, second = asyncio.run(go())
    assert attempts == ["http://gpu-0:8000/v1/chat/completions"] * 3
    assert first == second
    assert first.startswith("cannot connect to http://gpu-0:8000/v1 (STOKER_WARM_BACKEND_URL): ")
    assert "Connection refused" in first and "this run sends no more" in first


def test_openai_backend__an_answer_between_refusals_keeps_the_circuit_closed() -> None:
    """A replica restarting behind DNS refuses now and then: refusals count only in a row."""
    answers = iter(["refuse", "refuse", "ok", "refuse", "refuse", "ok"])

    def flaky(request: httpx.Request) -> httpx.Response:
        if next(answers) == "refuse":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=CHAT_OK)

    async def go() -> list[int]:
        async with OpenAIBackend("http://b", transport=httpx.MockTransport(flaky),
                                 retry=FAST_RETRY) as b:  # fmt: skip
            return [(await b.generate(_req())).retries for _ in range(2)]

    assert asyncio.run(go()) == [2, 2]
