"""The gateway in front of a real model server: llama.cpp's llama-server serving SmolLM2-135M,
reached with the official SDK, as a user's stack would be.

What a simulator cannot show: the chunk shapes a real server streams (a first delta with
`content: null`, the usage chunk only when asked, `timings` beside it), how it refuses a prompt
over its per-slot context (a 400 of its own), and what a client sees when the server dies in the
middle of an answer. The miss cost logged is the server's own (timings), not a wall clock.

Prompts are picked for what SmolLM2 does with them at temperature 0 (measured here): the
`STOPS` ones end on their own within 32 tokens, `RAMBLES` runs on past any small max_tokens,
`LONG_STOP` ends on its own after ~57 tokens.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import openai
import orjson
import pytest
import redis
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client import REGISTRY

from schemas.codec import decode_event
from schemas.events import RequestLogged
from stoker import modelserver
from stoker.embedded import LlamaServer
from streams.topics import topic_name
from tests.gateway.conftest import GatewayFactory, client
from tests.streams.conftest import read_topic
from tests.waiting import wait_for

MODEL = modelserver.MODEL_ALIAS
STOPS = (
    "Answer with one word: what is the capital of France?",
    "Reply with only the number: what is 2+2?",
    "Name one fruit.",
)
RAMBLES = "Tell me a long story about a dragon."
# Ends on its own, but only after ~57 tokens (~2 s): long enough to kill the server mid-answer.
LONG_STOP = "Give two reasons to drink water."
# Every SDK call is bounded: a 32-token answer takes ~1-2 s on one loaded core.
CALL_TIMEOUT_S = 60.0
TOKENS = {"prompt_tokens", "completion_tokens", "total_tokens"}
ENTRIES = "stk:{t:acme}:e:*"
NEGATIVES = "stk:{t:acme}:n:*"


def ask(content: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": content}]


def sdk(gw: Any) -> openai.OpenAI:
    return client(gw).with_options(timeout=CALL_TIMEOUT_S)


def stored_count(result: str) -> float:
    """The gateway's own count of answers offered to the cache, by result (this process)."""
    return REGISTRY.get_sample_value("stoker_gateway_stores_total", {"result": result}) or 0.0


def cost_of(timings: dict[str, Any]) -> float:
    """What llama-server says an answer cost it: prefill plus decode."""
    return round(float(timings["prompt_ms"]) + float(timings["predicted_ms"]), 3)


def stream_of(c: openai.OpenAI, content: str, **kw: Any) -> tuple[list[Any], str]:
    """(every chunk the SDK parsed, the x-stoker-cache header) of one streamed request."""
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=ask(content), temperature=0, stream=True, **kw
    )
    return list(raw.parse()), str(raw.headers["x-stoker-cache"])


def text_of(chunks: list[Any]) -> str:
    return "".join(ch.delta.content or "" for c in chunks for ch in c.choices)


def finish_of(chunks: list[Any]) -> list[str]:
    return [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]


def assert_chunk_shapes(chunks: list[Any], with_usage: bool) -> None:
    """What the SDK's users read: one id, the model's name, the role first, one finish last,
    and (when asked) a usage chunk with no choices after it, adding up."""
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert {c.model for c in chunks} == {MODEL}
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    assert finish_of(chunks) == [with_choices[-1].choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage is not None]
    if not with_usage:
        assert usage == []
        return
    assert len(usage) == 1 and chunks[-1].usage is not None and chunks[-1].choices == []
    u = usage[0]
    assert u.prompt_tokens > 0 and u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


# -- chat and streaming --


def test_real_model__a_chat_miss_then_an_exact_hit_with_the_same_answer(
    make_gateway: GatewayFactory, llama: LlamaServer, redis_client: redis.Redis
) -> None:
    gw = make_gateway(llama.base_url)
    c = sdk(gw)
    first = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=ask(STOPS[0]), temperature=0, max_tokens=32
    )
    miss = first.parse()
    assert first.headers["x-stoker-cache"] == "miss"
    assert miss.choices[0].finish_reason == "stop", "the prompt is picked to end on its own"
    assert miss.choices[0].message.content and miss.model == MODEL
    assert miss.usage is not None and miss.usage.completion_tokens > 0
    assert "timings" in (miss.model_extra or {}), "llama-server's own cost, passed through"
    wait_for(lambda: redis_client.keys(ENTRIES), 5, "the answer to land")
    second = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=ask(STOPS[0]), temperature=0, max_tokens=32
    )
    hit = second.parse()
    assert second.headers["x-stoker-cache"] == "exact"
    assert hit.choices[0].message.content == miss.choices[0].message.content
    assert hit.choices[0].finish_reason == "stop" and hit.model == MODEL
    assert hit.usage is not None
    assert hit.usage.model_dump(include=TOKENS) == miss.usage.model_dump(include=TOKENS)


def test_real_model__a_model_it_does_not_serve_is_answered_with_a_warning(
    make_gateway: GatewayFactory, llama: LlamaServer
) -> None:
    """llama-server answers any model name with the one it serves: the client is told so."""
    gw = make_gateway(llama.base_url)
    wait_for(lambda: gw.parts.health.models is not None, 10, "the server's models")
    assert MODEL in (gw.parts.health.models or ())
    raw = sdk(gw).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=ask(STOPS[1]), temperature=0, max_tokens=8
    )
    assert raw.parse().choices[0].message.content
    said = raw.headers["x-stoker-warning"]
    assert said == f"model 'gpt-4o' is not listed by the upstream {gw.parts.upstream.shown}"


def test_real_model__a_streamed_miss_with_usage_then_a_streamed_hit_replays_it(
    make_gateway: GatewayFactory, llama: LlamaServer, redis_client: redis.Redis
) -> None:
    gw = make_gateway(llama.base_url)
    c = sdk(gw)
    usage = {"stream_options": {"include_usage": True}, "max_tokens": 32}
    live, how = stream_of(c, STOPS[1], **usage)
    assert how == "miss" and finish_of(live) == ["stop"]
    assert_chunk_shapes(live, with_usage=True)
    wait_for(lambda: redis_client.keys(ENTRIES), 5, "the streamed answer to land")
    replay, how2 = stream_of(c, STOPS[1], **usage)
    assert how2 == "exact"
    assert_chunk_shapes(replay, with_usage=True)
    assert text_of(replay) == text_of(live) and text_of(live)
    assert finish_of(replay) == ["stop"]
    assert replay[-1].usage == live[-1].usage.model_copy(update={"prompt_tokens_details": None})
    # Streaming is transport, not identity: the plain request reads the same entry.
    plain = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=ask(STOPS[1]), temperature=0, max_tokens=32
    )
    assert plain.headers["x-stoker-cache"] == "exact"
    assert plain.parse().choices[0].message.content == text_of(live)


def test_real_model__a_miss_streamed_without_usage_still_replays_the_true_usage(
    make_gateway: GatewayFactory, llama: LlamaServer, redis_client: redis.Redis
) -> None:
    """llama-server (as vLLM and OpenAI) sends usage on a stream only when asked; a hit asked
    for it later must still count the tokens the answer took, not zeros."""
    gw = make_gateway(llama.base_url)
    c = sdk(gw)
    live, how = stream_of(c, STOPS[2], max_tokens=32)
    assert how == "miss" and finish_of(live) == ["stop"]
    assert_chunk_shapes(live, with_usage=False)  # the client did not ask: none reaches it
    wait_for(lambda: redis_client.keys(ENTRIES), 5, "the streamed answer to land")
    replay, how2 = stream_of(c, STOPS[2], max_tokens=32, stream_options={"include_usage": True})
    assert how2 == "exact" and text_of(replay) == text_of(live)
    assert_chunk_shapes(replay, with_usage=True)
    plain = c.chat.completions.create(
        model=MODEL, messages=ask(STOPS[2]), temperature=0, max_tokens=32, extra_headers={
            "Cache-Control": "no-cache, no-store"})  # fmt: skip
    assert replay[-1].usage is not None and plain.usage is not None
    assert replay[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert replay[-1].usage.prompt_tokens == plain.usage.prompt_tokens


# -- answers that must not be kept --


def test_real_model__an_answer_cut_by_length_streamed_is_never_stored(
    make_gateway: GatewayFactory, llama: LlamaServer, redis_client: redis.Redis
) -> None:
    gw = make_gateway(llama.base_url)
    c = sdk(gw)
    refused = stored_count("refused")
    chunks, how = stream_of(c, RAMBLES, max_tokens=8, stream_options={"include_usage": True})
    assert how == "miss" and finish_of(chunks) == ["length"] and text_of(chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    # The relay offers the answer once the stream is over: wait for that, then look.
    wait_for(lambda: stored_count("refused") > refused, 10, "the cut answer to be refused")
    assert redis_client.keys(ENTRIES) == []
    again, how2 = stream_of(c, RAMBLES, max_tokens=8)
    assert how2 == "miss" and finish_of(again) == ["length"]
    assert redis_client.keys(ENTRIES) == []
    # and the misses say why, the repeat's and a paraphrase's (the response ended: no wait)
    for prompt in (RAMBLES, "Tell me a long story about dragons."):
        rep = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=ask(prompt), temperature=0, max_tokens=8
        )
        assert rep.headers["x-stoker-reason"].startswith("not_stored: finish_reason=length: ")


def test_real_model__a_prompt_over_the_context_is_the_servers_400_and_not_cached(
    make_gateway: GatewayFactory, llama: LlamaServer, redis_client: redis.Redis
) -> None:
    """llama-server refuses a prompt longer than one slot's context (8,192 / 2 slots); the
    client gets that refusal, OpenAI-shaped, with its status, streamed or not, every time:
    a client's mistake is neither an answer to keep nor an outage to pause retries for."""
    gw = make_gateway(llama.base_url)
    c = sdk(gw)
    too_long = "word " * 5000  # ~5,000 tokens against 4,096 per slot
    for stream in (False, True, False):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(
                model=MODEL, messages=ask(too_long), temperature=0, max_tokens=8, stream=stream
            )
        err = e.value
        assert err.status_code == 400
        assert err.response.headers["content-type"].startswith("application/json")
        assert err.response.headers["x-stoker-cache"] == "miss"  # it was asked for, not paused
        body = orjson.loads(err.response.content)
        assert isinstance(body["error"]["message"], str) and "context" in body["error"]["message"]
        assert isinstance(body["error"]["type"], str) and body["error"]["type"]
    assert redis_client.keys(ENTRIES) == [] and redis_client.keys(NEGATIVES) == []


# -- the cost of a miss --


def test_real_model__a_miss_logs_the_servers_own_cost_as_gpu_ms(
    make_gateway: GatewayFactory,
    llama: LlamaServer,
    redis_client: redis.Redis,
    kafka_bootstrap: str,
    unique: str,
) -> None:
    prefix = f"real{unique}."
    gw = make_gateway(llama.base_url, kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu",
                      topic_prefix=prefix)  # fmt: skip
    c = sdk(gw)
    plain = c.chat.completions.create(
        model=MODEL, messages=ask(STOPS[0]), temperature=0, max_tokens=32
    )
    chunks, how = stream_of(c, STOPS[1], max_tokens=32, stream_options={"include_usage": True})
    assert how == "miss"
    plain_cost = cost_of((plain.model_extra or {})["timings"])
    timed = [ch.model_extra["timings"] for ch in chunks if "timings" in (ch.model_extra or {})]
    assert len(timed) == 1, "llama-server puts its timings beside the usage"
    streamed_cost = cost_of(timed[0])
    topic = topic_name("inference.requests", prefix)
    events = [decode_event(m.value() or b"") for m in read_topic(kafka_bootstrap, topic, 2)]
    by_prompt = {e.prompt: e for e in events if isinstance(e, RequestLogged)}
    assert by_prompt[STOPS[0]].cache_outcome == "miss" == by_prompt[STOPS[1]].cache_outcome
    assert by_prompt[STOPS[0]].gpu_ms == plain_cost > 0
    assert by_prompt[STOPS[1]].gpu_ms == streamed_cost > 0
    # The cost a hit saves is the one the entry keeps (what the planner weighs warming by).
    wait_for(lambda: len(redis_client.keys(ENTRIES)) == 2, 5, "both answers to land")
    kept = sorted(orjson.loads(redis_client.get(k) or b"{}")["gpu_ms"]
                  for k in redis_client.keys(ENTRIES))  # fmt: skip
    assert kept == pytest.approx(sorted([plain_cost, streamed_cost]), abs=0.001)


# -- the server dies mid-answer --


def test_real_model__a_server_killed_mid_stream_is_a_clean_error_and_nothing_is_kept(
    make_gateway: GatewayFactory, restartable_llama: tuple[Any, int], redis_client: redis.Redis
) -> None:
    start, port = restartable_llama
    first = start()
    gw = make_gateway(f"http://127.0.0.1:{port}/v1")
    c = sdk(gw)
    # An answer from the first server, kept, and a pooled connection to it that dies with it.
    warm = c.chat.completions.create(model=MODEL, messages=ask(STOPS[0]), temperature=0,
                                     max_tokens=32)  # fmt: skip
    assert warm.choices[0].finish_reason == "stop"
    wait_for(lambda: redis_client.keys(ENTRIES), 5, "the first answer to land")
    entries = set(redis_client.keys(ENTRIES))

    stream = c.chat.completions.create(
        model=MODEL, messages=ask(LONG_STOP), temperature=0, max_tokens=96, stream=True
    )
    seen, t0 = [], time.monotonic()
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            seen.append(chunk)
            if len(seen) == 2:  # the role, then the first token: the answer is under way
                assert first.pid is not None
                os.killpg(first.pid, signal.SIGKILL)
    assert time.monotonic() - t0 < CALL_TIMEOUT_S / 2, "the error came at once, not by timeout"
    assert not isinstance(e.value, openai.APITimeoutError)
    assert "upstream stopped mid-answer" in e.value.message
    assert finish_of(seen) == []  # it never claimed to have finished
    wait_for(lambda: not first.alive, 10, "the killed server to be gone")
    assert set(redis_client.keys(ENTRIES)) == entries, "the broken answer was never kept"
    assert redis_client.keys(NEGATIVES) == [], "nor did it pause the retry"

    # While it is down: an OpenAI-shaped 502 at once, for another question.
    with pytest.raises(openai.APIStatusError) as down:
        c.chat.completions.create(model=MODEL, messages=ask(STOPS[2]), temperature=0,
                                  max_tokens=32)  # fmt: skip
    assert down.value.status_code == 502
    assert orjson.loads(down.value.response.content)["error"]["type"] == "upstream_error"
    first.stop()

    # The refused call pauses its own retries (30 s); the broken stream paused nothing.
    wait_for(lambda: len(redis_client.keys(NEGATIVES)) == 1, 5, "the refused call's pause")

    start()  # the same port: the gateway's upstream is back
    chunks, how = stream_of(c, LONG_STOP, max_tokens=96)
    assert how == "miss" and finish_of(chunks) == ["stop"] and text_of(chunks)
    wait_for(lambda: len(redis_client.keys(ENTRIES)) == len(entries) + 1, 5, "the whole answer")
    again = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=ask(STOPS[0]), temperature=0, max_tokens=32
    )
    assert again.headers["x-stoker-cache"] == "exact"
