"""Helpers for the hot-set tests: a profile written through the traffic worker's observe path,
and a small deterministic embedder (hashed bag of words) that is a real Embedder, not a mock."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from caches.embedders import Embedder, Vectors
from schemas.events import RequestLogged
from streams.replay import to_event
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import observe_event


class WordsEmbedder(Embedder):
    """Bag of words, one dimension per word (no hash collisions): texts sharing most words get
    a high cosine, texts sharing none get 0; loads in no time."""

    id = "words"
    dim = 1024

    def __init__(self) -> None:
        self.calls = 0
        self.vocab: dict[str, int] = {}

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, self.vocab.setdefault(w, len(self.vocab) % self.dim)] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        result: Vectors = out / norms
        return result


def event(
    n: int,
    tenant: str,
    prompt: str,
    ts: datetime,
    *,
    temperature: float = 0.0,
    gpu_ms: float = 800.0,
    model_version: str = "v1",
    latency_ms: float | None = None,  # None: the GPU time
    outcome: str = "miss",
    model_id: str = "m",
) -> RequestLogged:
    return to_event(
        n,
        {
            "request_id": f"r{n}",
            "tenant": tenant,
            "model_id": model_id,
            "model_version": model_version,
            "template_version": "t1",
            "prompt": prompt,
            "params": {"temperature": temperature, "max_tokens": 16},
            "cache_outcome": outcome,
            "latency_ms": gpu_ms if latency_ms is None else latency_ms,
            "gpu_ms": gpu_ms,
            "tokens_in": 10,
            "tokens_out": 20,
            "ts": ts.isoformat(),
        },
    )


def hit_event(n: int, tenant: str, prompt: str, ts: datetime) -> RequestLogged:
    """A request the exact cache answered: it reached no GPU."""
    return event(n, tenant, prompt, ts, gpu_ms=0.0, latency_ms=2.0, outcome="exact")


def fill(profile: TrafficProfile, events: Sequence[RequestLogged]) -> None:
    profile.write([observe_event(e, "test:0", i) for i, e in enumerate(events)])
