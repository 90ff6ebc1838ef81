"""KV prefix warming: TTFT in the first hour after a deploy, with and without, in one run.

Each regime runs two freshly started `stoker sim-backend` processes (a deploy: new weights, an
empty prefix cache), on loopback, default latency model (0.2 ms a prompt token, 10 ms a
decoded one, 8 slots, a 131,072-token prefix cache of 16-token blocks). Before the hour:
1. yesterday's log (RequestLogged v2 misses of the same template mix) goes through the
   prefixes worker's handler into a redis-server (warmers/prefixlog.py, real code);
2. the "with" backend gets the prefix warm (warmers/prefixwarm.py with the settings' defaults:
   the most counted prefixes within 65,536 tokens, max_tokens=1, at a capped QPS) over HTTP;
   the "without" one gets nothing;
3. the hour's requests go to both at once, in the same order, streamed; TTFT is the time to
   the first content chunk, as a client measures it.
The hour is one replica's share: a fleet behind round robin, so a replica sees 1/replicas of
the traffic. It is sent closed-loop, `--concurrency` in flight (fewer than the 8 slots: no
queue, as at the hour's real rate), so the compressed hour keeps each request's prefix-cache
state and its TTFT; only the order of requests matters to an LRU.

Traffic: `--templates` system prompts (600-2,500 tokens; Zipf 1.0 popularity, so a few are
hot and the rest a tail), a question of 10-40 tokens, and for 40% of requests a retrieved
passage of 200-800 tokens (of 300) in the user turn.

Regimes (lines):
- prefix_warm: the first hour after an off-peak deploy, `--quiet-requests` per replica
  (default 100: 400 an hour over 4 replicas). The issue's goal: ttft_p50_ratio <= 0.5.
- prefix_warm_busy: the same with `--busy-requests` per replica-hour (default 1,200). A prefix
  cache fills itself on first use, so a warm saves only each template's first request per
  replica: with many requests per template the ratio goes to 1.
Figures: ttft_p50_ratio, ttft_p99_ratio (with / without), p50/p99 ms of each, the share of
prompt tokens the prefix cache held (vllm:prefix_cache_hits / queries of each backend), and
the warm's sends, tokens and seconds. They depend on the simulator's prefix-cache model
(warmers/backends/prefixcache.py): a held block prefix costs no prefill, nothing else changes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import httpx
from _common import ROOT, emit, pct

from schemas.events import RequestLogged
from stoker.embedded import EmbeddedStack, free_port
from stoker.redisconn import connect
from warmers.prefixes import HotPrefixes
from warmers.prefixlog import PrefixLogHandler
from warmers.prefixwarm import PrefixWarmer, PrefixWarmOptions

STOKER = [sys.executable, "-m", "stoker.cli"]
MODEL = "sim-model"
# fmt: off
WORDS = (
    "account", "billing", "policy", "refund", "order", "shipping", "warranty", "device",
    "setting", "password", "network", "invoice", "contract", "support", "escalate", "customer",
    "region", "plan", "upgrade", "limit", "quota", "report", "export", "security", "audit",
    "privacy", "consent", "retention", "schedule", "reminder", "calendar", "travel", "booking",
)
# fmt: on


@dataclass(frozen=True)
class Traffic:
    templates: list[str]
    weights: list[float]
    passages: list[str]
    rng: random.Random

    def text(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(lo, hi)))

    def messages(self) -> tuple[int, list[dict[str, str]]]:
        t = self.rng.choices(range(len(self.templates)), cum_weights=self.weights)[0]
        user = f"Question: {self.text(10, 40)}?"
        if self.rng.random() < 0.4:
            user = f"Context: {self.rng.choice(self.passages)}\n{user}"
        return t, [
            {"role": "system", "content": self.templates[t]},
            {"role": "user", "content": user},
        ]


def traffic(n_templates: int, seed: int) -> Traffic:
    rng = random.Random(seed)
    templates = [
        f"You are assistant {i} of product {i}. Follow these rules. "
        + " ".join(rng.choice(WORDS) for _ in range(rng.randint(600, 2500)))
        for i in range(n_templates)
    ]
    weights = list(accumulate(1.0 / (i + 1) for i in range(n_templates)))  # Zipf 1.0
    passages = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(200, 800))) for _ in range(300)
    ]
    return Traffic(templates, weights, passages, rng)


def learn(store: HotPrefixes, tr: Traffic, n: int) -> None:
    """Step 1: yesterday's log, as the gateway publishes it, through the prefixes handler."""
    handler = PrefixLogHandler(store)
    events = []
    for i in range(n):
        _, msgs = tr.messages()
        body = {"model": MODEL, "messages": msgs, "temperature": 0, "max_tokens": 16}
        events.append(
            RequestLogged.model_validate(
                {
                    "schema_version": 2,
                    "event_id": f"e{i}",
                    "request_id": f"r{i}",
                    "ts": "2026-11-30T03:00:00Z",
                    "tenant": "acme",
                    "model_id": MODEL,
                    "model_version": "v1",
                    "template_version": "t",
                    "prompt": "q",
                    "cache_outcome": "miss",
                    "latency_ms": 500.0,
                    "gpu_ms": 500.0,
                    "tokens_in": 1000,
                    "tokens_out": 16,
                    "request": {"api": "chat", "body": body},
                }
            )
        )
    handler.apply(events)  # type: ignore[arg-type]


@contextlib.contextmanager
def sim_backend() -> Iterator[str]:
    """`stoker sim-backend` with its defaults, as its own process; its URL once /health answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOKER_")}
    proc = subprocess.Popen(
        [*STOKER, "sim-backend", "--port", str(port)], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sim-backend did not start: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            time.sleep(0.05)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def ttft(client: httpx.AsyncClient, msgs: list[dict[str, str]]) -> float | None:
    """Seconds to the first content chunk; None if the request failed."""
    body = {"model": MODEL, "messages": msgs, "stream": True, "max_tokens": 16, "temperature": 0}
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return None
        async for line in r.aiter_lines():
            if '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - t0
    return None


async def replay(
    url: str, hour: list[list[dict[str, str]]], concurrency: int, deadline: float
) -> tuple[list[float], int]:
    """Step 3 on one backend: closed loop, `concurrency` in flight, requests in order."""
    out: list[float] = []
    failed = 0
    it = iter(hour)  # shared by the tasks of one loop: next() never yields, so no lock

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failed
        while time.monotonic() < deadline:
            msgs = next(it, None)
            if msgs is None:
                return
            try:
                t = await ttft(client, msgs)
            except httpx.HTTPError:
                t = None
            if t is None:
                failed += 1
            else:
                out.append(t)

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return out, failed


def regime(name: str, n: int, store: HotPrefixes, tr: Traffic, args: argparse.Namespace) -> None:
    hour = [tr.messages()[1] for _ in range(n)]
    used = {m[0]["content"] for m in hour}
    with sim_backend() as with_url, sim_backend() as without_url:
        opts = PrefixWarmOptions(with_url, qps=args.warm_qps, top_n=args.top_n)
        warm = PrefixWarmer(store, opts).warm(MODEL)  # step 2, on the "with" backend only
        # the warm's own queries are not the hour's: read the counters' start after it
        before = _counts(with_url)
        deadline = time.monotonic() + args.max_seconds
        loop_out = asyncio.run(_both(with_url, without_url, hour, args.concurrency, deadline))
        (with_s, with_failed), (without_s, without_failed) = loop_out
        after = _counts(with_url)
        with_held = (after[1] - before[1]) / max(1, after[0] - before[0])
        queries, hits = _counts(without_url)
        without_held = hits / max(1, queries)
    p50w, p99w = pct(with_s, 50), pct(with_s, 99)
    p50o, p99o = pct(without_s, 50), pct(without_s, 99)
    emit(
        name,
        ttft_p50_ratio=round(p50w / p50o, 3),
        ttft_p99_ratio=round(p99w / p99o, 3),
        with_p50_ms=round(p50w, 1), with_p99_ms=round(p99w, 1),
        without_p50_ms=round(p50o, 1), without_p99_ms=round(p99o, 1),
        requests=n, measured=[len(with_s), len(without_s)],
        failed=with_failed + without_failed,
        templates=len(tr.templates), templates_used=len(used),
        prompt_tokens_held_with=round(with_held, 3),
        prompt_tokens_held_without=round(without_held, 3),
        warmed=warm.warmed, warm_failed=warm.failed, warm_tokens=warm.tokens,
        warm_seconds=round(warm.seconds, 1),
        depends_on="the simulator's prefix-cache model (warmers/backends/prefixcache.py)",
    )  # fmt: skip


def _counts(url: str) -> tuple[int, int]:
    vals = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        m = re.match(r"vllm:prefix_cache_(queries|hits)_total\{.*\} (\d+)", line)
        if m:
            vals[m.group(1)] = int(m.group(2))
    return vals.get("queries", 0), vals.get("hits", 0)


async def _both(
    with_url: str, without_url: str, hour: list[Any], concurrency: int, deadline: float
) -> list[tuple[list[float], int]]:
    return list(
        await asyncio.gather(
            replay(with_url, hour, concurrency, deadline),
            replay(without_url, hour, concurrency, deadline),
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--templates", type=int, default=80)
    ap.add_argument("--quiet-requests", type=int, default=100)
    ap.add_argument("--busy-requests", type=int, default=1200)
    ap.add_argument("--learn-requests", type=int, default=4000, help="yesterday's log")
    ap.add_argument("--top-n", type=int, default=200, help="prefixes at most (the default's)")
    ap.add_argument("--warm-qps", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-seconds", type=float, default=240.0, help="per regime, both arms")
    ap.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()
    if min(args.templates, args.quiet_requests, args.busy_requests, args.concurrency) < 1:
        ap.error("--templates, --*-requests and --concurrency must be >= 1")
    with EmbeddedStack(kafka=False) as stack:
        assert stack.redis_url is not None
        r = connect(stack.redis_url)
        store = HotPrefixes(r)
        tr = traffic(args.templates, args.seed)
        learn(store, tr, args.learn_requests)
        regime("prefix_warm", args.quiet_requests, store, tr, args)
        regime("prefix_warm_busy", args.busy_requests, store, tr, args)
        r.close()


if __name__ == "__main__":
    main()
