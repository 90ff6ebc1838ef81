"""The simulator's streamed answers over real loopback HTTP: SSE framing and chunk shapes as
OpenAI sends them, timing of a decoding GPU, keep-alive after a stream, hang-ups, 429s."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest

from simulation.backend.http import SimulatorThread
from simulation.backend.simulator import SimConfig, split_chunks
from tests.waiting import wait_for

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# 16-token answers at 5 ms a token: slow enough to measure, short enough for a unit test
PACED_SIM = SimConfig(
    slots=2,
    prefill_ms_per_token=2.0,
    decode_ms_per_token=5.0,
    min_answer_tokens=16,
    default_max_tokens=16,
)


def _chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": prompt}], **extra}


def _completion(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": prompt, **extra}


def _events(raw: str) -> list[str]:
    """The data of each `data: ...\\n\\n` event; fails on anything else in the body."""
    assert raw.endswith("\n\n"), raw[-40:]
    blocks = raw[:-2].split("\n\n")
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks
    return [b.removeprefix("data: ") for b in blocks]


def _stream(c: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    """POST a streamed request; the response and its chunks, parsed, [DONE] checked and cut."""
    with c.stream("POST", path, json={**body, "stream": True}) as r:
        raw = r.read().decode()
    assert r.status_code == 200, raw
    data = _events(raw)
    assert data[-1] == "[DONE]"
    assert "[DONE]" not in data[:-1]
    return r, [orjson.loads(d) for d in data[:-1]]


def _choice_chunks(chunks: list[Any]) -> list[dict[str, Any]]:
    return [c["choices"][0] for c in chunks if c["choices"]]


def _local_port(r: httpx.Response) -> int:
    port: int = r.extensions["network_stream"].get_extra_info("client_addr")[1]
    return port


def test_simhttp_stream__chat_deltas_join_to_the_plain_answer_and_keep_alive_holds(
    sim: SimulatorThread,
) -> None:
    body = _chat("What is a cache?")
    with httpx.Client(base_url=sim.url, timeout=5) as c:
        r, chunks = _stream(c, CHAT, body)
        stream_port = _local_port(r)
        plain = c.post(CHAT, json=body)  # the same client, so the same pooled connection
        plain_port = _local_port(plain)
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["transfer-encoding"] == "chunked"
    assert "connection" not in r.headers
    assert plain_port == stream_port, "the stream closed its keep-alive connection"

    answer = plain.json()["choices"][0]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["model"] == "sim-model" and "usage" not in c for c in chunks)
    choices = _choice_chunks(chunks)
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    content = [ch["delta"]["content"] for ch in choices[1:-1]]
    assert len(content) > 1, "the answer came in one piece"
    assert all(1 <= len(part.split()) <= 4 for part in content)
    assert "".join(content) == answer["message"]["content"]
    assert choices[-1]["delta"] == {}
    assert choices[-1]["finish_reason"] == answer["finish_reason"] == "stop"
    assert all(ch["finish_reason"] is None for ch in choices[:-1])


def test_simhttp_stream__include_usage_adds_one_usage_chunk_before_done(
    sim: SimulatorThread,
) -> None:
    body = _chat("How warm is the cache?")
    with httpx.Client(base_url=sim.url, timeout=5) as c:
        _, chunks = _stream(c, CHAT, {**body, "stream_options": {"include_usage": True}})
        _, without = _stream(c, CHAT, {**body, "stream_options": {"include_usage": False}})
        usage = c.post(CHAT, json=body).json()["usage"]
    with_usage = [c for c in chunks if c.get("usage") is not None]
    assert with_usage == [chunks[-1]]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == usage
    assert usage["gpu_ms"] > 0
    assert all("usage" in c for c in chunks)  # null on the others, as OpenAI sends them
    assert all(c["choices"] and "usage" not in c for c in without)


def test_simhttp_stream__completions_stream_and_finish_reason_length(
    sim: SimulatorThread,
) -> None:
    body = _completion("Name three cache policies", max_tokens=6)
    with httpx.Client(base_url=sim.url, timeout=5) as c:
        r, chunks = _stream(c, COMPLETIONS, {**body, "stream_options": {"include_usage": True}})
        plain = c.post(COMPLETIONS, json=body).json()
    assert r.headers["content-type"] == "text/event-stream"
    assert {c["object"] for c in chunks} == {"text_completion"}
    choices = _choice_chunks(chunks)
    assert all(set(ch) == {"index", "text", "finish_reason", "logprobs"} for ch in choices)
    assert [len(ch["text"].split()) for ch in choices] == [4, 2, 0]
    assert "".join(ch["text"] for ch in choices) == plain["choices"][0]["text"]
    assert choices[-1]["text"] == ""
    assert choices[-1]["finish_reason"] == plain["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == plain["usage"]
    assert plain["usage"]["completion_tokens"] == 6


def test_simhttp_stream__first_content_after_prefill_and_the_whole_stream_takes_gpu_ms() -> None:
    prompt = " ".join(f"w{i}" for i in range(20))  # 20 tokens: 40 ms of prefill
    prefill_s = PACED_SIM.prefill_ms_per_token * 20 / 1000
    with SimulatorThread(PACED_SIM) as s, httpx.Client(base_url=s.url, timeout=5) as c:
        c.get("/health")  # connect first: the measurement is of the stream only
        arrivals: list[tuple[float, dict[str, Any]]] = []
        start = time.perf_counter()
        body = _chat(prompt, stream=True, stream_options={"include_usage": True})
        with c.stream("POST", CHAT, json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append((time.perf_counter() - start, orjson.loads(line[6:])))
        total_s = time.perf_counter() - start
    gpu_ms = arrivals[-1][1]["usage"]["gpu_ms"]
    assert gpu_ms == pytest.approx(2.0 * 20 + 5.0 * 16)
    content_at = [
        t for t, c in arrivals if c["choices"] and c["choices"][0]["delta"].get("content")
    ]
    assert len(content_at) == 4  # 16 tokens, 4 a chunk
    assert content_at[0] >= prefill_s
    # decoding spaces the chunks: the last comes 12 tokens' decode time (60 ms) after the first,
    # where a burst at the end would bring them together. Half of it: a first chunk read late
    # on a loaded machine shortens the gap (CI saw 52 ms), and a burst's gap is ~0.
    assert content_at[-1] - content_at[0] >= 0.5 * 12 * PACED_SIM.decode_ms_per_token / 1000
    assert 0.95 * gpu_ms / 1000 <= total_s <= gpu_ms / 1000 + 1.0


def test_simhttp_stream__a_client_hanging_up_mid_stream_frees_its_slot() -> None:
    slow = SimConfig(slots=1, decode_ms_per_token=20.0, min_answer_tokens=16, default_max_tokens=16)
    with SimulatorThread(slow) as s:
        body = _chat("long answer", stream=True)
        with httpx.Client(base_url=s.url, timeout=5) as c, c.stream("POST", CHAT, json=body) as r:
            first = next(r.iter_lines())
            assert first.startswith("data: ")
            assert s.stats().busy == 1
            # leaving the block with the body unread closes the connection
        wait_for(lambda: s.stats().busy == 0, what="the dropped stream's slot to come back")
        wait_for(lambda: s.stats().aborted == 1, what="the dropped stream to be counted")
        with httpx.Client(base_url=s.url, timeout=5) as c:
            assert c.post(CHAT, json=_chat("next")).status_code == 200
            _, chunks = _stream(c, CHAT, _chat("next"))
        stats = s.stats()
    assert _choice_chunks(chunks)[-1]["finish_reason"] == "stop"
    assert (stats.served, stats.aborted, stats.busy) == (2, 1, 0)


def test_simhttp_stream__full_queue_answers_a_json_429_not_a_stream() -> None:
    with SimulatorThread(SimConfig(slots=0, queue=0)) as s, httpx.Client(base_url=s.url) as c:
        with c.stream("POST", CHAT, json=_chat("anyone?", stream=True)) as r:
            r.read()
        assert c.get("/health").status_code == 200  # and the connection is still fine
        stats = s.stats()
    assert r.status_code == 429
    assert r.headers["content-type"] == "application/json"
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "overloaded"
    assert (stats.rejected, stats.busy, stats.aborted) == (1, 0, 0)


def test_simhttp_stream__connection_close_gets_a_close_delimited_stream(
    sim: SimulatorThread,
) -> None:
    body = _completion("bye", stream=True)
    close = {"connection": "close"}
    with (
        httpx.Client(base_url=sim.url, timeout=5, headers=close) as c,
        c.stream("POST", COMPLETIONS, json=body) as r,
    ):
        data = _events(r.read().decode())
    assert r.headers["connection"] == "close"
    assert "transfer-encoding" not in r.headers
    assert data[-1] == "[DONE]"
    assert orjson.loads(data[-2])["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "extra",
    [
        {"stream": "yes"},
        {"stream": 1},
        {"stream": True, "stream_options": []},
        {"stream": True, "stream_options": {"include_usage": "yes"}},
        {"stream": True, "max_tokens": 0},
    ],
)
def test_simhttp_stream__bad_stream_fields_are_400(
    sim: SimulatorThread, extra: dict[str, Any]
) -> None:
    with httpx.Client(base_url=sim.url, timeout=5) as c:
        r = c.post(CHAT, json=_chat("hi", **extra))
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"


def test_simhttp_stream__null_stream_and_unused_stream_options_keep_the_plain_answer(
    sim: SimulatorThread,
) -> None:
    with httpx.Client(base_url=sim.url, timeout=5) as c:
        plain = c.post(CHAT, json=_chat("hi"))
        for extra in ({"stream": None}, {"stream": False, "stream_options": {"x": 1}}):
            r = c.post(CHAT, json=_chat("hi", **extra))
            assert r.headers["content-type"] == "application/json"
            assert r.json()["choices"] == plain.json()["choices"]


@pytest.mark.parametrize(
    "text",
    ["", "one", "a b c d", "a b c d e", "  lead  and trail  ", "x\ny\tz w v"],
)
def test_split_chunks__join_back_to_the_text_with_at_most_n_tokens_each(text: str) -> None:
    chunks = split_chunks(text, 4)
    assert "".join(c for c, _ in chunks) == text
    assert all(n == len(c.split()) <= 4 for c, n in chunks)
    assert sum(n for _, n in chunks) == len(text.split())


def test_simhttp_stream__the_openai_sdk_reads_the_streams(sim: SimulatorThread) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0, timeout=5)
    msgs = [{"role": "user", "content": "What is a cache?"}]
    with client:
        plain = client.chat.completions.create(model="sim-model", messages=msgs)
        chunks = list(
            client.chat.completions.create(
                model="sim-model",
                messages=msgs,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text_plain = client.completions.create(model="sim-model", prompt="cache", max_tokens=5)
        text_chunks = list(
            client.completions.create(model="sim-model", prompt="cache", max_tokens=5, stream=True)
        )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert chunks[-1].usage.model_extra["gpu_ms"] == plain.usage.model_extra["gpu_ms"]
    assert "".join(c.choices[0].text for c in text_chunks) == text_plain.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
