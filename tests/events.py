"""RequestLogged payloads as a gateway sends them, for the stream and warmer tests."""

from __future__ import annotations

from typing import Any

import orjson


def request(i: int = 0, **fields: Any) -> dict[str, Any]:
    """A valid RequestLogged as the gateway would send it; fields override."""
    base: dict[str, Any] = {
        "type": "request_logged",
        "schema_version": 1,
        "event_id": f"e{i}",
        "ts": "2025-03-03T10:15:00Z",  # a Monday: hour of week 10
        "request_id": f"r{i}",
        "tenant": "acme",
        "model_id": "llama",
        "model_version": "v1",
        "template_version": "t1",
        "prompt": f"question {i % 7}",
        "params": {"temperature": 0.0},
        "context_docs": [{"doc_id": "kb-1", "version": 2}],
        "cache_outcome": "miss",
        "latency_ms": 120.0,
        "gpu_ms": 100.0,
        "tokens_in": 10,
        "tokens_out": 20,
    }
    base.update(fields)
    return base


def encode(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj)


# A model server's URL that workers built in a test need named (a warm runner, a deploy's
# pre-warm) but that the test never calls: nothing listens on port 9 of loopback.
UNUSED_BACKEND = "http://127.0.0.1:9/v1"
