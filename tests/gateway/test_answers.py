"""Narrow tests of gateway/answers.py: what a miss cost (by backends/client.py's rule), and SSE
read in any framing a server writes, however the network splits it."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.answers import Assembler, SSEReader, answer_of, usage_only

CHAT = {"choices": [{"message": {"content": "Paris."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 42, "completion_tokens": 8}}  # fmt: skip
LLAMA_TIMINGS = {"prompt_ms": 12.5, "predicted_ms": 180.25, "cache_n": 24, "prompt_n": 18}


def test_answer_of__a_plain_answer_costs_what_its_timings_say() -> None:
    a = answer_of("chat", CHAT | {"timings": LLAMA_TIMINGS}, elapsed_ms=500.0)
    assert a is not None and a.gpu_ms == 192.75 and (a.tokens_in, a.tokens_out) == (42, 8)


def test_assembler__a_streamed_answer_costs_what_its_timings_say_wherever_they_come() -> None:
    """llama-server puts its timings on the finish chunk, or on the usage chunk when asked."""
    for with_usage in (False, True):
        asm = Assembler("chat")
        finish: dict[str, Any] = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        usage: dict[str, Any] = {
            "choices": [],
            "usage": {"prompt_tokens": 42, "completion_tokens": 8},
        }
        (usage if with_usage else finish)["timings"] = LLAMA_TIMINGS
        chunks = [{"choices": [{"index": 0, "delta": {"content": "Paris."}}]}, finish, usage]
        for c in chunks:
            asm.add(orjson.dumps(c))
        asm.add(b"[DONE]")
        a = asm.answer(elapsed_ms=500.0)
        assert a is not None and a.gpu_ms == 192.75 and a.text == "Paris."


def test_usage_only__is_the_chunk_include_usage_adds_and_no_other() -> None:
    assert usage_only(b'{"choices":[],"usage":{"prompt_tokens":3}}')
    assert not usage_only(b'{"choices":[{"index":0,"delta":{}}],"usage":null}')
    assert not usage_only(b'{"choices":[{"index":0,"delta":{"content":"the usage"}}]}')
    assert not usage_only(b"[DONE]")


EVENTS = [b'data: {"a":1}', b": keep-alive", b'data: {"b":\ndata: 2}', b"data: [DONE]"]


@given(
    end=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_sse_reader__every_line_ending_and_every_split_give_the_same_events(
    end: bytes, cuts: list[int]
) -> None:
    stream = b"".join(e.replace(b"\n", end) + end + end for e in EVENTS)
    reader, got = SSEReader(), []
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    for a, b in itertools.pairwise(points):
        got += reader.events(stream[a:b])
    got += reader.events(b"", last=True)
    assert [p for _, p in got] == [b'{"a":1}', None, b'{"b":\n2}', b"[DONE]"]
    assert b"".join(e for e, _ in got) == b"".join(e + b"\n\n" for e in EVENTS)
    assert reader.rest() == b""
