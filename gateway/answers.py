"""OpenAI answers in both shapes: an answer (a cached entry's, or one another request got) as a
completion or as SSE chunks, and the chunks of a streamed miss assembled back into one answer.

A replay carries everything the original answer had: content, reasoning_content, tool_calls,
finish_reason and usage (LiteLLM's users report streamed hits that lose reasoning_content).
SSE framing (what OpenAI and vLLM send): `data: <json>\n\n` per chunk, `data: [DONE]\n\n` last.
What an answer cost the server is the one client's rule (backends/client.py, backend_ms).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from backends.client import backend_ms
from gateway.cachegate import Answer
from gateway.identity import Api
from schemas.entries import CacheEntry

DONE = b"data: [DONE]\n\n"
# Replayed content goes out in pieces of this many characters: a client rendering tokens as
# they come sees text flow, and one huge chunk never blocks a slow reader's buffer.
_PIECE_CHARS = 64


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def answer_of_entry(entry: CacheEntry) -> Answer:
    """What a cached entry replays: its text and everything else the original answer had."""
    return Answer(
        text=entry.response,
        finish_reason=entry.finish_reason,
        tokens_in=entry.tokens_in,
        tokens_out=entry.tokens_out,
        gpu_ms=entry.gpu_ms,
        reasoning=entry.reasoning,
        tool_calls=tuple(entry.tool_calls or ()),
    )


def _id(seed: str, api: Api) -> str:
    prefix = "chatcmpl-stk" if api == "chat" else "cmpl-stk"
    return f"{prefix}{hashlib.sha256(seed.encode()).hexdigest()[:20]}"


def _usage(a: Answer) -> dict[str, int]:
    return {
        "prompt_tokens": a.tokens_in,
        "completion_tokens": a.tokens_out,
        "total_tokens": a.tokens_in + a.tokens_out,
    }


def _message(a: Answer) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": a.text or None}
    if a.reasoning is not None:
        msg["reasoning_content"] = a.reasoning
    if a.tool_calls:
        msg["tool_calls"] = list(a.tool_calls)
    return msg


def completion_body(a: Answer, api: Api, model: str, seed: str) -> bytes:
    """An answer (a cached entry's, or another request's) as the non-streamed reply; `seed`
    (the entry key) makes the reply id."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": a.finish_reason}
    if api == "chat":
        choice["message"] = _message(a)
        choice["logprobs"] = None
    else:
        choice |= {"text": a.text, "logprobs": None}
    return orjson.dumps(
        {
            "id": _id(seed, api),
            "object": "chat.completion" if api == "chat" else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": _usage(a),
        }
    )


def replay_chunks(a: Answer, api: Api, model: str, include_usage: bool, seed: str) -> bytes:
    """An answer as the whole SSE stream the upstream would have sent."""
    base = {
        "id": _id(seed, api),
        "object": "chat.completion.chunk" if api == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
    }
    out = [sse({**base, "choices": [c]}) for c in _choices(a, api)]
    if include_usage:
        out.append(sse({**base, "choices": [], "usage": _usage(a)}))
    out.append(DONE)
    return b"".join(out)


def _choices(a: Answer, api: Api) -> list[dict[str, Any]]:
    text = a.text
    pieces = [text[i : i + _PIECE_CHARS] for i in range(0, len(text), _PIECE_CHARS)]
    if api == "completion":
        return [
            *({"index": 0, "text": p, "finish_reason": None, "logprobs": None} for p in pieces),
            {"index": 0, "text": "", "finish_reason": a.finish_reason, "logprobs": None},
        ]
    first: dict[str, Any] = {"role": "assistant", "content": ""}
    if a.reasoning is not None:
        first["reasoning_content"] = a.reasoning
    out = [{"index": 0, "delta": first, "finish_reason": None}]
    out += [{"index": 0, "delta": {"content": p}, "finish_reason": None} for p in pieces]
    if a.tool_calls:
        calls = [{"index": i, **c} for i, c in enumerate(a.tool_calls)]
        out.append({"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None})
    out.append({"index": 0, "delta": {}, "finish_reason": a.finish_reason})
    return out


def answer_of(api: Api, body: dict[str, Any], elapsed_ms: float) -> Answer | None:
    """The first choice of a non-streamed upstream answer, or None if it is not one."""
    try:
        choice = body["choices"][0]
        usage = body.get("usage") or {}
        if api == "chat":
            msg = choice["message"]
            text = msg.get("content") or ""
            reasoning = msg.get("reasoning_content")
            calls = tuple(_call(c) for c in msg.get("tool_calls") or ())
        else:
            text, reasoning, calls = choice["text"], None, ()
        return Answer(
            text=str(text),
            finish_reason=str(choice.get("finish_reason")),
            tokens_in=int(usage.get("prompt_tokens") or 0),
            tokens_out=int(usage.get("completion_tokens") or 0),
            gpu_ms=backend_ms(usage, body.get("timings"), elapsed_ms),
            reasoning=reasoning if isinstance(reasoning, str) else None,
            tool_calls=calls,
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None


def _call(c: Any) -> dict[str, Any]:
    if not isinstance(c, dict):
        raise TypeError("a tool call is an object")
    return {k: v for k, v in c.items() if k != "index"}


class SSEReader:
    """Incremental SSE parser: feed bytes, get the complete events, each as it came (with its
    blank line: comments and keep-alives too) and its `data:` payload (None if it has none)."""

    def __init__(self) -> None:
        self._buf = b""

    def events(self, data: bytes, *, last: bool = False) -> list[tuple[bytes, bytes | None]]:
        """`last`: the stream ended with `data` (a final \r ends a line; none follows)."""
        # SSE ends lines with \n, \r\n or \r (sse-starlette, behind llama-cpp-python's server,
        # writes \r\n): all become \n; a \r at the end waits, its \n may be in the next read.
        buf = self._buf + data
        held = b"\r" if buf.endswith(b"\r") and not last else b""
        buf = (buf[:-1] if held else buf).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        out: list[tuple[bytes, bytes | None]] = []
        while (end := buf.find(b"\n\n")) >= 0:
            event, buf = buf[: end + 2], buf[end + 2 :]
            lines = [ln[5:].lstrip() for ln in event[:-2].split(b"\n") if ln.startswith(b"data:")]
            out.append((event, b"\n".join(lines) if lines else None))
        self._buf = buf + held
        return out

    def feed(self, data: bytes) -> list[bytes]:
        """The `data:` payloads of the complete events."""
        return [p for _, p in self.events(data) if p is not None]

    def rest(self) -> bytes:
        """What came after the last complete event (a stream's unterminated tail)."""
        return self._buf


def usage_only(payload: bytes) -> bool:
    """The chunk `stream_options.include_usage` adds at the end: usage and no choices."""
    if b'"usage"' not in payload:  # every other chunk: no parse
        return False
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return isinstance(chunk, dict) and not chunk.get("choices") and bool(chunk.get("usage"))


@dataclass
class Assembler:
    """Collects a streamed answer's chunks into what a non-streamed answer would have held."""

    api: Api
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] | None = None  # llama.cpp's, on the last chunk or the usage chunk
    done: bool = False  # saw [DONE]
    broken: bool = False  # a chunk that is not JSON, or not of the first choice's shape

    def add(self, payload: bytes) -> None:
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(payload)
            self._add(chunk)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            self.broken = True

    def _add(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # n > 1 is never cached; only the first choice is kept
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            if self.api == "completion":
                self.text.append(choice.get("text") or "")
                continue
            delta = choice.get("delta") or {}
            self.text.append(delta.get("content") or "")
            if isinstance(delta.get("reasoning_content"), str):
                self.reasoning.append(delta["reasoning_content"])
            for c in delta.get("tool_calls") or ():
                self._add_call(c)

    def _add_call(self, c: dict[str, Any]) -> None:
        """Tool-call deltas share an index; the name comes once, the arguments in pieces."""
        cur = self.calls.setdefault(int(c.get("index", 0)), {"function": {}})
        for k in ("id", "type"):
            if c.get(k):
                cur[k] = c[k]
        fn = c.get("function") or {}
        if fn.get("name"):
            cur["function"]["name"] = fn["name"]
        if "arguments" in fn:
            cur["function"]["arguments"] = cur["function"].get("arguments", "") + (
                fn["arguments"] or ""
            )

    def answer(self, elapsed_ms: float) -> Answer | None:
        """The whole answer; None if the stream was cut short or broken (never stored)."""
        if self.broken or not self.done or self.finish_reason is None:
            return None
        u = self.usage
        return Answer(
            text="".join(self.text),
            finish_reason=self.finish_reason,
            tokens_in=int(u.get("prompt_tokens") or 0),
            tokens_out=int(u.get("completion_tokens") or 0),
            gpu_ms=backend_ms(u, self.timings, elapsed_ms),
            reasoning="".join(self.reasoning) if self.reasoning else None,
            tool_calls=tuple(self.calls[i] for i in sorted(self.calls)),
        )
