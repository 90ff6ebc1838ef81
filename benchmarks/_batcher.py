"""The embedder's micro-batcher alone, on the real model: should a pass be bounded in time?

Lookups (one CLINC150 question each, wanted within `deadline_ms`: what the 50 ms budget leaves
after the exact step) arrive at `lookups_per_s` from 16 threads, as the gateway's lookup pool
sends them; answers to index (~40 tokens: four questions joined) at `answers_per_s` from 4
threads, as its index pool does; and every 2 s a warm run's call of 32 prompts. Each policy
runs in turns of `turn_s`, one after the other, again and again, so a change in the machine's
load falls on all alike:
- shipped: ONNX Runtime runs a lookup pass beside a background one (two threads), a background
  pass holds ~10 ms of work while lookups come, a lookup pass what fits before its deadline;
- serial_bounded: one pass at a time (as torch runs), lookups first, background passes bounded;
- serial_unbounded: one pass at a time, background passes of up to 64 texts (as before).
Figures per policy: within_deadline_share of lookups, their wait p50/p99 (queue + pass, as
the caller waited; a lookup cut at its deadline counts its deadline), and the background
texts embedded per second.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from caches.embedders import (
    BatchingEmbedder,
    EmbedDeadlinePassed,
    Embedder,
    SentenceTransformerEmbedder,
    Vectors,
    embed_deadline,
)
from caches.passes import DEFAULT_BACKGROUND_PASS_S

# name -> (passes side by side, background pass bound in s; None: as shipped)
POLICIES: dict[str, tuple[bool, float | None]] = {
    "shipped": (True, None),
    "serial_bounded": (False, None),
    "serial_unbounded": (False, float("inf")),
}


class _Serial(Embedder):
    """The model, declared unable to run two passes at once (as torch is)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.id, self.dim = inner, inner.id, inner.dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self.inner.embed(texts)


class _Tally:
    def __init__(self) -> None:
        self.waits: list[float] = []
        self.late = 0
        self.background_texts = 0
        self.lock = threading.Lock()


def _lookup(b: BatchingEmbedder, text: str, deadline_s: float, t: _Tally) -> None:
    t0 = time.monotonic()
    try:
        with embed_deadline(t0 + deadline_s):
            b.embed([text])
        wait, late = time.monotonic() - t0, 0
    except EmbedDeadlinePassed:
        wait, late = deadline_s, 1
    with t.lock:
        t.waits.append(wait)
        t.late += late


def _background(b: BatchingEmbedder, texts: list[str], t: _Tally) -> None:
    b.embed(texts)
    with t.lock:
        t.background_texts += len(texts)


def _turn(
    b: BatchingEmbedder, prompts: list[str], answers: list[str], args: Any, t: _Tally
) -> None:
    rng = random.Random(len(t.waits))
    rate = args.lookups_per_s + args.answers_per_s
    end = time.monotonic() + args.turn_s
    next_warm = time.monotonic() + 2.0
    with ThreadPoolExecutor(16) as lookups, ThreadPoolExecutor(4) as index:
        while (now := time.monotonic()) < end:
            time.sleep(rng.expovariate(rate))
            if rng.random() < args.lookups_per_s / rate:
                lookups.submit(_lookup, b, rng.choice(prompts), args.deadline_ms / 1000, t)
            else:
                index.submit(_background, b, [rng.choice(answers)], t)
            if now >= next_warm:
                index.submit(_background, b, rng.sample(prompts, 32), t)
                next_warm += 2.0


def measure(prompts: list[str], args: Any, onnx_cache_dir: Any) -> dict[str, Any]:
    inner = SentenceTransformerEmbedder(engine="onnx", onnx_cache_dir=onnx_cache_dir)
    answers = [" ".join(prompts[i : i + 4]) for i in range(0, len(prompts) - 4, 4)]
    tallies = {name: _Tally() for name in POLICIES}
    spent = dict.fromkeys(POLICIES, 0.0)
    inner.embed(prompts[:8])  # load and run once before any turn counts
    for _ in range(args.batcher_turns):
        for name, (side_by_side, pass_s) in POLICIES.items():
            bound = DEFAULT_BACKGROUND_PASS_S if pass_s is None else pass_s
            b = BatchingEmbedder(inner if side_by_side else _Serial(inner), background_pass_s=bound)
            t0 = time.monotonic()
            _turn(b, prompts, answers, args, tallies[name])
            spent[name] += time.monotonic() - t0
            b.close()
    out: dict[str, Any] = {"engine": inner.engine}
    for name, t in tallies.items():
        w = np.asarray(t.waits) * 1000
        out[name] = {
            "lookups": len(t.waits),
            "within_deadline_share": round(1 - t.late / len(w), 4) if len(w) else None,
            "wait_ms_p50": round(float(np.percentile(w, 50)), 1) if len(w) else None,
            "wait_ms_p99": round(float(np.percentile(w, 99)), 1) if len(w) else None,
            "background_texts_per_s": round(t.background_texts / spent[name], 1),
        }
    return out
