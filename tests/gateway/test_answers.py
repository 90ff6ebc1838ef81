"""Narrow tests of gateway/answers.py: what a miss cost, by whose account."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.answers import Assembler, answer_of, backend_ms

CHAT = {"choices": [{"message": {"content": "Paris."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 42, "completion_tokens": 8}}  # fmt: skip
LLAMA_TIMINGS = {"prompt_ms": 12.5, "predicted_ms": 180.25, "cache_n": 24, "prompt_n": 18}


def test_backend_ms__the_servers_own_figure_first_then_its_timings_then_the_wall_clock() -> None:
    assert backend_ms({"gpu_ms": 7.0}, LLAMA_TIMINGS, 500.0) == 7.0  # the simulator's
    assert backend_ms({}, LLAMA_TIMINGS, 500.0) == 192.75  # llama.cpp: prefill + decode
    assert backend_ms({}, None, 500.0) == 500.0  # vLLM, TGI, OpenAI: the call as seen
    assert backend_ms({"gpu_ms": 0}, {"prompt_ms": "x"}, 500.0) == 500.0  # nothing usable


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
