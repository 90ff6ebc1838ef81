"""The backend contract: one generation in, one answer out, errors already in stoker's tree.

Implemented by the HTTP client (backends/client.py) for every OpenAI-compatible server, and by
the tests' and benchmarks' in-process stand-ins. A Backend raises only these (every library
error is translated at its boundary):
- BackendOverloaded (429): alive but full; raised at once, never retried inside the backend,
  so the shadow warmer's AIMD sees every one;
- BackendUnavailable: timeouts, connect errors, 5xx, malformed answers (retriable);
- BackendRejected: any other 4xx; the same request would fail again (poison).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

from caches.request import CacheRequest, KeyedRequest

FinishReason = Literal["stop", "length", "tool_calls", "unknown"]


@dataclass(frozen=True)
class GenerationRequest(KeyedRequest):
    """What to generate and for whom.

    `body`, when the request log carried one (v2), is the request exactly as the gateway sent
    it upstream: system prompt, template and inlined documents included; a warm sends it as it
    is (`api` says where), so the answer is computed from the context its key names. Without
    it (a v1 log), `prompt` is sent as the one user message; `docs` only name the context for
    the cache key and are never sent.
    """

    body: Mapping[str, Any] | None = field(default=None, compare=False)
    api: Literal["chat", "completion"] | None = None
    route: str | None = None
    # Generations of the docs named by id alone when `body` was logged (None: not known).
    doc_generations: Mapping[str, int] | None = field(default=None, compare=False)

    def cache_request(self) -> CacheRequest:
        """The cache identity of this request (same tenant, namespace, prompt, params, docs)."""
        return CacheRequest(
            self.tenant,
            self.model_id,
            self.model_version,
            self.template_version,
            self.prompt,
            self.params,
            self.docs,
            self.route,
        )


@dataclass(frozen=True)
class Generation:
    """One answer. `gpu_ms` is what it cost the model server by its own account when it gives
    one (backends/client.py, backend_ms), else the latency.

    `retries` counts attempts that failed before this one succeeded (5xx, timeouts): a caller
    pacing itself on the backend's health treats them as congestion, as it does a 429.
    """

    text: str
    tokens_in: int
    tokens_out: int
    latency_ms: float
    gpu_ms: float
    finish_reason: FinishReason = "stop"
    retries: int = 0


class Backend(ABC):
    """An inference backend. Safe to call concurrently from one event loop."""

    @abstractmethod
    async def generate(self, req: GenerationRequest) -> Generation:
        """Generate one answer; raises BackendOverloaded / BackendUnavailable / BackendRejected."""

    async def aclose(self) -> None:  # noqa: B027  (most backends hold nothing to close)
        """Release connections."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
