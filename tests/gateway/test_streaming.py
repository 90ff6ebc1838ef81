"""Streaming through the gateway: misses stream through and are kept only when whole, hits are
replayed as SSE with everything the original answer had (the official SDK reads both)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import redis

from simulation.backend.http import SimulatorThread
from tests.gateway.conftest import GatewayFactory, client
from tests.gateway.upstreams import Script, Served
from tests.waiting import wait_for

MSG = [{"role": "user", "content": "Which tools would you call?"}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "lookup_order", "arguments": '{"order_id": "A-17", "verbose": true}'}}  # fmt: skip


def streamed(c: openai.OpenAI, model: str = "m", **kw: Any) -> tuple[dict[str, Any], str]:
    """(what the chunks add up to, the x-stoker-cache header) of one streamed request."""
    raw = c.chat.completions.with_raw_response.create(
        model=model, messages=MSG, temperature=0, stream=True, **kw
    )
    out: dict[str, Any] = {
        "content": "",
        "reasoning": "",
        "calls": {},
        "finish": None,
        "usage": None,
    }
    for chunk in raw.parse():
        if chunk.usage is not None:
            out["usage"] = chunk.usage.model_dump()
        for ch in chunk.choices:
            d = ch.delta
            out["content"] += d.content or ""
            out["reasoning"] += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or ():
                cur = out["calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                cur["id"] = tc.id or cur["id"]
                cur["name"] += tc.function.name or "" if tc.function else ""
                cur["arguments"] += (tc.function.arguments or "") if tc.function else ""
            out["finish"] = ch.finish_reason or out["finish"]
    return out, str(raw.headers["x-stoker-cache"])


def test_stream__a_miss_streams_through_then_a_hit_replays_every_field(
    make_gateway: GatewayFactory, scripted: Served, script: Script, redis_client: redis.Redis
) -> None:
    script.reasoning, script.tool_calls, script.finish_reason = "think first", [CALL], "tool_calls"
    gw = make_gateway(scripted.url)
    c = client(gw)
    live, first = streamed(c, stream_options={"include_usage": True})
    wait_for(lambda: redis_client.keys("stk:{t:acme}:e:*"), 5, "the streamed answer to land")
    replay, second = streamed(c, stream_options={"include_usage": True})
    assert (first, second) == ("miss", "exact")
    assert live["content"] == replay["content"] == script.text
    assert live["reasoning"] == replay["reasoning"] == "think first"
    assert replay["calls"][0] == {"id": "call_1", "name": "lookup_order",
                                  "arguments": CALL["function"]["arguments"]}  # fmt: skip
    assert replay["finish"] == "tool_calls"
    assert replay["usage"]["completion_tokens"] == live["usage"]["completion_tokens"] == 5
    assert script.calls() == 1


def test_stream__a_non_streamed_hit_carries_reasoning_and_tool_calls(
    make_gateway: GatewayFactory, scripted: Served, script: Script
) -> None:
    script.reasoning, script.tool_calls, script.finish_reason = "think", [CALL], "tool_calls"
    gw = make_gateway(scripted.url)
    c = client(gw)
    c.chat.completions.create(model="m", messages=MSG, temperature=0)
    msg = None
    for _ in range(50):  # the store is asynchronous: bounded retries until the hit
        raw = c.chat.completions.with_raw_response.create(model="m", messages=MSG, temperature=0)
        if raw.headers["x-stoker-cache"] == "exact":
            msg = raw.parse().choices[0]
            break
    assert msg is not None
    assert (
        msg.finish_reason == "tool_calls"
        and msg.message.tool_calls[0].function.name == "lookup_order"
    )
    assert msg.message.model_extra.get("reasoning_content") == "think"


def test_stream__a_streamed_hit_of_a_plain_answer_and_a_plain_hit_of_a_streamed_one(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    """Streaming is transport, not identity: both shapes share one entry."""
    gw = make_gateway(sim.url)
    c = client(gw)
    plain = c.chat.completions.create(model="sim-model", messages=MSG, temperature=0)
    wait_for(lambda: redis_client.keys("stk:{t:acme}:e:*"), 5, "the answer to land")
    replay, how = streamed(c, "sim-model")
    assert how == "exact" and replay["content"] == plain.choices[0].message.content
    assert replay["finish"] == "stop" and sim.stats().served == 1


def test_stream__an_answer_cut_by_length_is_streamed_but_never_stored(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    gw = make_gateway(sim.url)
    c = client(gw)
    out, how = streamed(c, "sim-model", max_tokens=3)
    assert how == "miss" and out["finish"] == "length" and out["content"]
    _again, how2 = streamed(c, "sim-model", max_tokens=3)
    assert how2 == "miss" and sim.stats().served == 2
    assert redis_client.keys("stk:{t:acme}:e:*") == []


def test_stream__an_sdk_that_hangs_up_at_done_still_gets_its_answer_stored(
    make_gateway: GatewayFactory, scripted: Served, script: Script, redis_client: redis.Redis
) -> None:
    """The SDK closes its connection as soon as it reads [DONE]; an upstream (llama-server)
    may end its body a moment later. The answer was whole at [DONE], so it is kept."""
    script.hold_after_done_s = 5.0
    gw = make_gateway(scripted.url)
    t0 = time.monotonic()
    out, how = streamed(client(gw))
    assert how == "miss" and out["content"] == script.text and out["finish"] == "stop"
    assert time.monotonic() - t0 < script.hold_after_done_s, "the client did not wait for it"
    wait_for(lambda: redis_client.keys("stk:{t:acme}:e:*"), 3, "the answer to land before the end")
    _, how2 = streamed(client(gw))
    assert how2 == "exact" and script.calls() == 1


def test_stream__an_upstream_stream_cut_short_is_never_stored(
    make_gateway: GatewayFactory, scripted: Served, script: Script, redis_client: redis.Redis
) -> None:
    script.text, script.cut_stream_after = "one two three four five", 3  # no finish, no [DONE]
    gw = make_gateway(scripted.url)
    c = client(gw)
    out, how = streamed(c)
    assert how == "miss" and out["finish"] is None
    script.cut_stream_after = None
    _, how2 = streamed(c)
    assert how2 == "miss" and script.calls() == 2
    wait_for(lambda: redis_client.keys("stk:{t:acme}:e:*"), 5, "the whole answer to land")


def test_stream__a_client_that_leaves_mid_stream_stores_nothing(
    make_gateway: GatewayFactory, sim: SimulatorThread, redis_client: redis.Redis
) -> None:
    gw = make_gateway(sim.url)
    body = {"model": "sim-model", "messages": MSG, "temperature": 0, "stream": True,
            "max_tokens": 64}  # fmt: skip
    with (
        httpx.Client(base_url=gw.url, headers={"X-Stoker-Tenant": "acme"}) as h,
        h.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        next(resp.iter_raw())  # one chunk, then hang up
    wait_for(lambda: sim.stats().busy == 0, 5, "the upstream stream to be closed")
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'stoker_gateway_served_total{api="chat",outcome="miss"}' in metrics
    assert redis_client.keys("stk:{t:acme}:e:*") == []


def test_stream__herd_of_streamed_misses_makes_one_upstream_call(
    make_gateway: GatewayFactory, scripted: Served, script: Script
) -> None:
    import asyncio

    script.delay_s = 0.3
    gw = make_gateway(scripted.url)
    body = {"model": "m", "messages": MSG, "temperature": 0, "stream": True}

    async def burst() -> list[bytes]:
        async with httpx.AsyncClient(
            base_url=gw.url, headers={"X-Stoker-Tenant": "acme"}, timeout=30
        ) as h:
            replies = await asyncio.gather(
                *(h.post("/v1/chat/completions", json=body) for _ in range(20))
            )
        return [r.content for r in replies]

    bodies = asyncio.run(burst())
    assert script.calls() == 1
    for b in bodies:
        chunks = [orjson.loads(ln[6:]) for ln in b.split(b"\n\n") if ln.startswith(b"data: {")]
        text = "".join(
            ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"]
        )
        assert text == script.text and b.endswith(b"data: [DONE]\n\n")
