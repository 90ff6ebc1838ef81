"""KV prefix warming: TTFT in the first hour after a deploy, with and without, in one run.

Each regime runs two freshly started `stoker sim-backend` processes (a deploy: new weights, an
empty prefix cache), on loopback, default latency model (0.2 ms a prompt token, 10 ms a
decoded one, 8 slots, a 131,072-token prefix cache of 16-token blocks). Before the hour:
1. yesterday's log (RequestLogged v2 misses of the same template mix) goes through the
   prefixes worker's handler into a redis-server (warmers/prefix/worker.py, real code);
2. the "with" backend gets the prefix warm (warmers/prefix/warm.py with the settings' defaults:
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
(simulation/backend/prefix_cache.py): a held block prefix costs no prefill, nothing else changes.

prefix_warm_real, the twin on a real prefix cache: llama-server serving SmolLM2-135M-Instruct
as stoker runs it (one thread, 2 slots of 4,096 tokens, a 256 MiB host-memory prompt cache).
`--real-templates` system prompts (20) of 500 to 2,000 tokens (counted by the server's
tokenizer; Zipf popularity, sizes shuffled over it), ~25,000 tokens in all: more than the
prompt cache and the warm's budget hold, so the warm must choose. They are hot in yesterday's
log (the same learn step, into the same store). Each of `--real-runs` runs (3) draws
`--real-requests` live requests (30) by popularity and restarts the server on one port, twice:
- without: the live requests, one at a time (the first requests after a restart arrive
  apart), TTFT as above, each answer read to its end (llama-server keeps nothing of a request
  cut short);
- with: the scheduler's replica watch (warmers/prefix/after_restart.py), which read the server
  before the restart, finds it restarted from what llama.cpp exports (it has no start time:
  its counters went back) and sends the hot system prompts (the prefix warm with the settings'
  defaults, max_tokens=1, coldest first; its room: a prompt in each slot, which llama.cpp
  reports, and 0.8 of the host-memory prompt cache, which the setting
  STOKER_PREFIX_WARM_HOST_CACHE_TOKENS says, by default this server's); then the same requests.
Only the first request of each prompt is scored: a later one finds its prompt held either
way. `first_requests` counts them (with, without) over the runs; `ttft_p50_ratio` is the p50
of the scored TTFTs with the warm over without (goal <= 0.2). Why a first request was slow
is in the line too: `first_requests_held` counts those whose prompt llama-server held (its
last chunk's `timings.cache_n`, at least half the prompt), with and without;
`first_requests_sent` those of a prompt the warm sent, and `first_requests_sent_held` those of
them still held when they came (the rest were dropped from the host cache first). The first
requests come once the warm is done (its seconds are reported): as after a deploy's
pre-warm, or a replica whose warm ends before the load balancer sends it traffic. A slow row
(~15 min on this 2-core machine), so `make bench` runs it only with BENCH_SLOW=1. The load
average before and after is in the line. `--real-cache-ram-mib` is a study, not the goal's
row: the server's host cache of another size, and the warm told of it by
STOKER_PREFIX_WARM_HOST_CACHE_TOKENS (the line names both in `settings`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
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
import orjson
from _common import ROOT, emit, pct

from backends.engine import EngineState, read_engine
from schemas.events import RequestLogged
from stoker import modelserver
from stoker.embedded import EmbeddedStack, LlamaServer, free_port, installed_llama, serve_options
from stoker.redisconn import connect
from stoker.settings import StokerSettings
from stoker.wiring import prefix_warm_options
from warmers.prefix.after_restart import ReplicaWatch
from warmers.prefix.hot import HotPrefixes
from warmers.prefix.warm import PrefixWarmer, PrefixWarmOptions, PrefixWarmReport
from warmers.prefix.worker import PrefixLogHandler

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
        if self.passages and self.rng.random() < 0.4:
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


def learn(store: HotPrefixes, tr: Traffic, n: int, model: str = MODEL) -> None:
    """Step 1: yesterday's log, as the gateway publishes it, through the prefixes handler."""
    handler = PrefixLogHandler(store)
    events = []
    for i in range(n):
        _, msgs = tr.messages()
        body = {"model": model, "messages": msgs, "temperature": 0, "max_tokens": 16}
        events.append(
            RequestLogged.model_validate(
                {
                    "schema_version": 2,
                    "event_id": f"e{i}",
                    "request_id": f"r{i}",
                    "ts": "2026-11-30T03:00:00Z",
                    "tenant": "acme",
                    "model_id": model,
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


async def ttft(
    client: httpx.AsyncClient, msgs: list[dict[str, str]], model: str = MODEL, whole: bool = False
) -> float | None:
    """Seconds to the first content chunk; None if the request failed (`reply`)."""
    return (await reply(client, msgs, model, whole))[0]


async def reply(
    client: httpx.AsyncClient, msgs: list[dict[str, str]], model: str = MODEL, whole: bool = False
) -> tuple[float | None, int | None]:
    """Seconds to the first content chunk (None if the request failed), and the prompt tokens
    the server found held, as llama-server says in its last chunk (`timings.cache_n`; None
    from a server that does not say). `whole`: read the answer to its end, as a client does;
    llama-server keeps nothing of a request whose client went away (cut at the first chunk, a
    prompt's second request found 0.2% of its tokens held), so a cut stream would leave each
    request cold."""
    body = {"model": model, "messages": msgs, "stream": True, "max_tokens": 16, "temperature": 0}
    t0 = time.perf_counter()
    first = held = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            if whole:
                print(
                    f"request failed: {r.status_code} {(await r.aread())[:200]!r}", file=sys.stderr
                )
            return None, None
        async for line in r.aiter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - t0
                if not whole:
                    return first, None
            elif first is None and whole and '"finish_reason":"' in line:
                first = time.perf_counter() - t0  # an empty answer: its end is its first token
            if '"timings":' in line and line.startswith("data: "):
                held = orjson.loads(line[6:]).get("timings", {}).get("cache_n", held)
    return first, held


async def replay(
    url: str,
    hour: list[list[dict[str, str]]],
    concurrency: int,
    deadline: float,
    model: str = MODEL,
    timeout_s: float = 30.0,
    whole: bool = False,
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
                t = await ttft(client, msgs, model, whole)
            except httpx.HTTPError as e:
                if whole:
                    print(f"request failed: {e!r}", file=sys.stderr)
                t = None
            if t is None:
                failed += 1
            else:
                out.append(t)

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return out, failed


def regime(name: str, n: int, store: HotPrefixes, tr: Traffic, args: argparse.Namespace) -> None:
    hour = [tr.messages()[1] for _ in range(n)]
    used = {m[0]["content"] for m in hour}
    with sim_backend() as with_url, sim_backend() as without_url:
        opts = PrefixWarmOptions(backend_url=with_url, qps=args.warm_qps, top_n=args.top_n)
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
        depends_on="the simulator's prefix-cache model (simulation/backend/prefix_cache.py)",
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


# -- the twin on a real prefix cache --

REAL = modelserver.MODEL_ALIAS


def count_tokens(root: str, text: str) -> int:
    """Tokens of `text` as the server's own tokenizer counts them (llama-server /tokenize)."""
    r = httpx.post(root + "/tokenize", json={"content": text}, timeout=30)
    r.raise_for_status()
    return len(r.json()["tokens"])


def sized_templates(root: str, sizes: list[int], rng: random.Random) -> list[tuple[str, int]]:
    """A system prompt of each size, within 2% as the server counts it: (text, tokens)."""
    out = []
    for i, size in enumerate(sizes):
        words = [rng.choice(WORDS) for _ in range(size)]
        for _ in range(4):  # a word is a token or two: two or three rounds get within 2%
            text = " ".join([f"You are assistant {i} of product {i}. Follow these rules.", *words])
            got = count_tokens(root, text)
            if abs(got - size) <= size * 0.02:
                break
            keep = int(len(words) * size / got)
            words = words[:keep] + [rng.choice(WORDS) for _ in range(keep - len(words))]
        out.append((text, got))
    return out


class Restarts:
    """llama-server as stoker runs it (`cache_ram_mib`: a --cache-ram of its own), stopped and
    started again on one port."""

    def __init__(self, cache_ram_mib: int | None = None) -> None:
        self.cache_ram_mib = cache_ram_mib
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.servers: list[LlamaServer] = []

    def restart(self) -> float:
        """Stop the server (if up), start it on the same port; seconds until it answers."""
        t0 = time.monotonic()
        if self.servers:
            self.servers[-1].stop()
        srv = installed_llama(StokerSettings(), port=self.port)
        if self.cache_ram_mib is not None:
            srv.opts = dataclasses.replace(srv.opts, cache_ram_mib=self.cache_ram_mib)
        self.servers.append(srv)
        self.servers[-1].start()
        return time.monotonic() - t0

    def stop(self) -> None:
        for srv in self.servers:
            srv.stop()


async def in_order(
    root: str, seq: list[list[dict[str, str]]], deadline: float, timeout_s: float
) -> list[tuple[float | None, int | None]]:
    """Each request's TTFT in order, one at a time (None: failed, or past the deadline), and
    the prompt tokens the server found held (`reply`). Each
    on a connection of its own: llama-server closes a kept-alive one after 5 s idle, and on a
    loaded box a request sent as it closed failed with "Server disconnected" (23 of 180)."""
    out: list[tuple[float | None, int | None]] = []
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=root, timeout=timeout_s, limits=fresh) as client:
        for msgs in seq:
            got: tuple[float | None, int | None] = (None, None)
            if time.monotonic() < deadline:
                try:
                    got = await reply(client, msgs, REAL, whole=True)
                except httpx.HTTPError as e:
                    print(f"request failed: {e!r}", file=sys.stderr)
            out.append(got)
    return out


@dataclass(frozen=True)
class First:
    """A prompt's first request of a run: its template, TTFT, and whether the server held the
    prompt (llama-server reused at least half of its tokens; None: it did not say)."""

    template: int
    ttft_s: float
    held: bool | None


def firsts(
    drawn: list[int], replies: list[tuple[float | None, int | None]], tokens: list[int]
) -> list[First]:
    """Each prompt's first request in `drawn` (its template index per request) that was
    answered: what a prefill costs without the warm. `tokens`: each template's."""
    seen: set[int] = set()
    out = []
    for t, (got, cached) in zip(drawn, replies, strict=True):
        if t not in seen:
            seen.add(t)
            if got is not None:
                held = None if cached is None else cached >= tokens[t] / 2
                out.append(First(t, got, held))
    return out


def real_regime(store: HotPrefixes, args: argparse.Namespace) -> None:
    rng = random.Random(args.seed + 1)
    n = args.real_templates
    sizes = [round(500 + 1500 * i / max(1, n - 1)) for i in range(n)]
    rng.shuffle(sizes)  # the hottest prompt is not always the shortest
    load_before = os.getloadavg()[0]
    server = Restarts(args.real_cache_ram_mib)
    url = server.root + "/v1"
    o = serve_options(StokerSettings())
    study: dict[str, Any] = {}  # a --cache-ram of its own: the host cache the warm is told of
    if args.real_cache_ram_mib is not None:
        o = dataclasses.replace(o, cache_ram_mib=args.real_cache_ram_mib)
        named = {"llama --cache-ram": f"{o.cache_ram_mib} MiB",
                 "STOKER_PREFIX_WARM_HOST_CACHE_TOKENS": o.host_cache_tokens}  # fmt: skip
        study = {"settings": named}
    warms: list[PrefixWarmReport] = []
    planned: list[set[str]] = []  # each warm's plan: its system prompts
    t_start = time.monotonic()

    def warm(model: str, replica: str) -> PrefixWarmReport:
        """The scheduler's warm of one replica (stoker/registry.py), with the settings'
        defaults: its QPS, concurrency (a send a slot here), timeout and deadline."""
        opts = prefix_warm_options(StokerSettings(), backend_url=replica)
        if study:
            opts = opts.model_copy(update={"host_cache_tokens": o.host_cache_tokens})
        warmer = PrefixWarmer(store, opts)
        plan = warmer.plan(model, budget=warmer.budget()[0])  # what warm() is about to send
        planned.append({c for h in plan for r, c in h.prefix.messages if r == "system"})
        warms.append(warmer.warm(model))
        return warms[-1]

    def measure(seq: list[list[dict[str, str]]]) -> list[tuple[float | None, int | None]]:
        deadline = time.monotonic() + args.real_max_seconds
        return asyncio.run(in_order(server.root, seq, deadline, args.real_max_seconds))

    runs: list[dict[str, Any]] = []
    try:
        server.restart()
        templates = sized_templates(server.root, sizes, rng)
        tokens = [t for _, t in templates]
        zipf = list(accumulate(1.0 / (i + 1) for i in range(n)))
        tr = Traffic([t for t, _ in templates], zipf, [], rng)
        learn(store, tr, args.real_learn_requests, REAL)
        for run in range(args.real_runs):
            draws = [tr.messages() for _ in range(args.real_requests)]
            drawn, seq = [t for t, _ in draws], [m for _, m in draws]
            # without: restarted, and nothing tells stoker
            server.restart()
            without = measure(seq)
            held_without = _held(url)
            # with: the watch read the server (the traffic above behind it), then it restarts
            watch = ReplicaWatch({REAL: [url]}, warm, timeout_s=10.0)
            seen_busy = watch() == []
            restart_s = server.restart()
            t0, plans = time.monotonic(), len(planned)
            found = watch()
            detect_warm_s = time.monotonic() - t0
            before = read_engine(url)
            with_s = measure(seq)
            sent = planned[-1] if len(planned) > plans else set()
            runs.append({
                "with": firsts(drawn, with_s, tokens), "without": firsts(drawn, without, tokens),
                "planned": {i for i in set(drawn) if tr.templates[i] in sent},
                "first": len(set(drawn)),
                "failed": sum(t is None for t, _ in with_s + without),
                "with_all": with_s, "without_all": without,
                "held_with": _held(url, before), "held_without": held_without,
                "seen_busy": seen_busy, "found": found, "restart_s": restart_s,
                "detect_warm_s": detect_warm_s, "warm": warms[-1] if warms else None,
            })  # fmt: skip
            print(f"prefix_warm_real: run {run + 1}/{args.real_runs} done", file=sys.stderr)
    finally:
        server.stop()
    with_s = [f.ttft_s for r in runs for f in r["with"]]
    without = [f.ttft_s for r in runs for f in r["without"]]
    if not with_s or not without:
        raise SystemExit("prefix_warm_real: no first request answered with the warm or without")
    p50w, p99w, p50o, p99o = pct(with_s, 50), pct(with_s, 99), pct(without, 50), pct(without, 99)
    w = runs[-1]["warm"] or PrefixWarmReport(REAL)
    emit(
        "prefix_warm_real",
        twin="prefix_warm",
        server=f"llama-server (llama-cpp-python {modelserver.LLAMA_CPP.version}), {REAL}, "
        f"-t {o.threads} -np {o.parallel} -c {o.ctx} --cache-ram {o.cache_ram_mib}",
        ttft_p50_ratio=round(p50w / p50o, 3),
        ttft_p99_ratio=round(p99w / p99o, 3),
        ttft_p50_ratio_per_run=[
            round(pct([f.ttft_s for f in r["with"]], 50)
                  / pct([f.ttft_s for f in r["without"]], 50), 3)
            for r in runs if r["with"] and r["without"]
        ],
        with_p50_ms=round(p50w, 1), with_p99_ms=round(p99w, 1),
        without_p50_ms=round(p50o, 1), without_p99_ms=round(p99o, 1),
        runs=args.real_runs,
        prompts=n,
        prompt_tokens_total=sum(t for _, t in templates),
        # each run's live requests, drawn by popularity; only the first of each prompt is
        # scored (a later one finds its prompt held with the warm or without)
        requests_per_run=args.real_requests,
        first_requests=[len(with_s), len(without)],
        distinct_prompts_per_run=[r["first"] for r in runs],
        failed=sum(r["failed"] for r in runs),
        failed_with_without=[
            sum(t is None for r in runs for t, _ in r[arm]) for arm in ("with_all", "without_all")
        ],
        # of the scored first requests: those whose prompt llama-server held (it reused at
        # least half of its tokens), with the warm and without; those of a prompt the warm
        # sent; and those held of them (a sent prompt not held at its first request was
        # dropped from the host cache before it came)
        first_requests_held=[
            sum(bool(f.held) for r in runs for f in r[arm]) for arm in ("with", "without")
        ],
        first_requests_sent=sum(f.template in r["planned"] for r in runs for f in r["with"]),
        first_requests_sent_held=sum(
            bool(f.held) and f.template in r["planned"] for r in runs for f in r["with"]
        ),
        first_requests_held_per_run=[sum(bool(f.held) for f in r["with"]) for r in runs],
        template_tokens=[t for _, t in templates],
        prompt_tokens_held_with=[r["held_with"] for r in runs],
        prompt_tokens_held_without=[r["held_without"] for r in runs],
        watch_left_busy_replica=all(r["seen_busy"] for r in runs),
        detected=[r["found"][0][2] if r["found"] else None for r in runs],
        restart_s=[round(r["restart_s"], 1) for r in runs],
        detect_and_warm_s=[round(r["detect_warm_s"], 1) for r in runs],
        warmed=w.warmed, warm_failed=w.failed, warm_words=w.tokens,
        # per run: the coldest a warm skipped to end by its deadline
        warm_skipped=[r["warm"].skipped if r["warm"] else None for r in runs],
        warm_budget=f"{w.budget_tokens} ({w.budget_from})",
        load_avg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        seconds=round(time.monotonic() - t_start, 1),
        goal_ttft_p50_ratio_max=0.2,
        **study,
    )  # fmt: skip


def _held(url: str, before: EngineState | None = None) -> float | None:
    """The share of prompt tokens llama-server's prompt cache held since `before` (else since
    the process started), from its own counters."""
    now = read_engine(url)
    if now is None or now.prompt_tokens is None or now.held_tokens is None:
        return None
    asked, held = now.prompt_tokens, now.held_tokens
    if before is not None and before.prompt_tokens is not None:
        asked, held = asked - before.prompt_tokens, held - (before.held_tokens or 0.0)
    return round(held / asked, 3) if asked else None


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
    ap.add_argument("--no-sim", action="store_true", help="only the real prefix cache's row")
    ap.add_argument("--no-real", action="store_true", help="only the simulator's rows")
    ap.add_argument("--real-templates", type=int, default=20, help="500 to 2,000 tokens each")
    ap.add_argument("--real-requests", type=int, default=30,
                    help="live requests a run, drawn by popularity")  # fmt: skip
    ap.add_argument("--real-runs", type=int, default=3)
    ap.add_argument("--real-learn-requests", type=int, default=400)
    ap.add_argument("--real-cache-ram-mib", type=int, default=None,
                    help="a study: llama-server's --cache-ram, and the warm told of it "
                    "(default: the embedded server's)")  # fmt: skip
    ap.add_argument("--real-max-seconds", type=float, default=600.0,
                    help="per arm")  # fmt: skip
    args = ap.parse_args()
    if min(args.templates, args.quiet_requests, args.busy_requests, args.concurrency) < 1:
        ap.error("--templates, --*-requests and --concurrency must be >= 1")
    if min(args.real_templates, args.real_requests, args.real_learn_requests, args.real_runs) < 1:
        ap.error("--real-templates, --real-runs and --real-*-requests must be >= 1")
    if args.real_cache_ram_mib is not None and args.real_cache_ram_mib < 1:
        ap.error("--real-cache-ram-mib must be >= 1 (MiB)")
    with EmbeddedStack(kafka=False) as stack:
        assert stack.redis_url is not None
        r = connect(stack.redis_url)
        store = HotPrefixes(r)
        if not args.no_sim:
            tr = traffic(args.templates, args.seed)
            learn(store, tr, args.learn_requests)
            regime("prefix_warm", args.quiet_requests, store, tr, args)
            regime("prefix_warm_busy", args.busy_requests, store, tr, args)
        if not args.no_real:
            real_regime(store, args)
        r.close()


if __name__ == "__main__":
    main()
