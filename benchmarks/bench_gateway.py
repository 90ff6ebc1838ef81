"""stoker gateway on loopback: hit throughput against LiteLLM's proxy and the upstream itself, the
cost a miss pays, herd protection, and a bounded mixed load.

Every server is its own process (the load client must not share their GIL): `stoker sim-backend`
(the upstream), `stoker gateway` on the embedded Tansu + redis-server, and LiteLLM's proxy
(benchmarks/peers, its own venv) on the same redis-server with its Redis cache. One worker
process each, the same client (_load.py), the same request, in one run.

Lines (names are read by scripts):
- gateway_hit: rps, p50_ms, p99_ms at 32 concurrent clients on exact hits; litellm_rps,
  direct_rps (the upstream without a cache), ratio_vs_litellm; single_client_p50_ms
  (concurrency 1; goal <= 2 ms); goal ratio_vs_litellm >= 10.
- gateway_miss_overhead: p50 of a miss through the gateway minus the upstream's own p50, new
  prompts one at a time (goal <= 3 ms); with the semantic layer on, as shipped.
- gateway_herd: upstream calls for 100 concurrent identical misses (goal 1).
- gateway_load: 200 concurrent clients over 3 tenants, Zipf questions with a share of new ones
  (hits and misses), for --load-seconds: requests, errors, cross_tenant_hits (answers citing
  another tenant: the simulator cites the [tenant:..] marker of its prompt), p99_ms,
  dropped_log_events (the request log to Tansu).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _load
import httpx
import orjson
from _common import ROOT, emit, pct

from stoker.embedded import EmbeddedStack, free_port

STOKER = [sys.executable, "-m", "stoker.cli"]
CHAT = b"/v1/chat/completions"
TENANTS = ("acme", "globex", "initech")
_BANNER = re.compile(r"gateway on (http://127\.0\.0\.1:\d+)")


def _body(tenant: str, question: str) -> bytes:
    system = f"You answer for [tenant:{tenant}]."
    return orjson.dumps(
        {
            "model": "sim-model",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "temperature": 0,
            "max_tokens": 64,  # the simulated backend's longest answer: every answer completes
        }
    )


@contextlib.contextmanager
def _process(args: list[str], env: dict[str, str], ready: re.Pattern[str] | str) -> Iterator[str]:
    """A child process; yields the first match of `ready` in its output (bounded wait)."""
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, cwd=ROOT,
    )  # fmt: skip
    found: list[str] = []
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            m = re.search(ready, line)
            if m and not found:
                found.append(m.group(1) if m.groups() else line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 180
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{args[3:5]} did not start:\n{''.join(lines[-30:])}")
        time.sleep(0.05)
    try:
        yield found[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _env(**stoker: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STOKER_")}
    return base | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"} | stoker


def _sim(port: int) -> contextlib.AbstractContextManager[str]:
    # Fast decode: the upstream is never the bottleneck of a hit benchmark, and misses stay short.
    args = [*STOKER, "sim-backend", "--port", str(port), "--slots", "256", "--queue", "4096",
            "--prefill-ms-per-token", "0.01", "--decode-ms-per-token", "0.1", "--max-tokens", "32"]  # fmt: skip
    return _process(args, _env(), r"(simulated backend on)")


def _metric(url: str, series: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _sim_served(sim_url: str) -> int:
    return int(httpx.get(sim_url + "/health", timeout=10).json()["served"])


def bench_hit(gw: str, sim: str, litellm: Any, args: argparse.Namespace) -> None:
    body = _body("acme", "How do I reset my password?")
    hdr = {"x-stoker-tenant": "acme"}
    first = httpx.post(gw + "/v1/chat/completions", content=body, headers=hdr, timeout=30)
    assert first.status_code == 200, first.text
    deadline = time.monotonic() + 10
    while (
        httpx.post(gw + "/v1/chat/completions", content=body, headers=hdr).headers.get(
            "x-stoker-cache"
        )
        != "exact"
    ):
        assert time.monotonic() < deadline, "the entry never landed"
        time.sleep(0.02)
    ours = _load.run(gw, lambda n: (CHAT, body), concurrency=32, seconds=args.seconds, headers=hdr)
    single = _load.run(gw, lambda n: (CHAT, body), concurrency=1, seconds=min(args.seconds, 5),
                       headers=hdr)  # fmt: skip
    direct = _load.run(sim, lambda n: (CHAT, body), concurrency=32, seconds=args.seconds)
    peer = None
    if litellm is not None:
        auth = {"authorization": f"Bearer {litellm.key}"}
        httpx.post(litellm.url + "/v1/chat/completions", content=body, headers=auth, timeout=60)
        peer = _load.run(litellm.url, lambda n: (CHAT, body), concurrency=32,
                         seconds=args.seconds, headers=auth)  # fmt: skip
    emit(
        "gateway_hit",
        rps=round(ours.rps, 1),
        p50_ms=pct(ours.latencies_s, 50),
        p99_ms=pct(ours.latencies_s, 99),
        errors=ours.errors,
        single_client_p50_ms=pct(single.latencies_s, 50),
        litellm_rps=round(peer.rps, 1) if peer else None,
        litellm_p50_ms=pct(peer.latencies_s, 50) if peer else None,
        litellm_errors=peer.errors if peer else None,
        direct_rps=round(direct.rps, 1),
        ratio_vs_litellm=round(ours.rps / peer.rps, 2) if peer and peer.rps else None,
        concurrency=32,
        goal_ratio_vs_litellm_min=10,
        goal_single_client_p50_ms_max=2,
    )


def bench_miss_overhead(gw: str, exact_gw: str, sim: str, args: argparse.Namespace) -> None:
    """New prompts one at a time, interleaved in rounds: through the gateway as shipped
    (semantic layer on: each new prompt is embedded on this CPU before the upstream is asked),
    through one with STOKER_SEMANTIC_ENABLED=false, and straight to the upstream."""
    hdr = {"x-stoker-tenant": "globex"}
    tag = random.randrange(10**9)
    lat: dict[str, list[float]] = {"semantic": [], "exact": [], "direct": []}
    per_round = max(1, args.misses // 5)
    for rnd in range(5):
        for name, url in (("semantic", gw), ("exact", exact_gw), ("direct", sim)):
            prefix = f"{name} {tag} round {rnd}"
            res = _load.run(
                url, lambda i, p=prefix: (CHAT, _body("globex", f"{p} question {i} about things")),
                concurrency=1, seconds=120, max_requests=per_round, headers=hdr,
            )  # fmt: skip
            lat[name] += res.latencies_s
    direct = pct(lat["direct"], 50)
    emit(
        "gateway_miss_overhead",
        p50_ms=round(pct(lat["semantic"], 50) - direct, 3),
        p50_ms_exact_only=round(pct(lat["exact"], 50) - direct, 3),
        gateway_p50_ms=pct(lat["semantic"], 50),
        gateway_p99_ms=pct(lat["semantic"], 99),
        exact_only_p50_ms=pct(lat["exact"], 50),
        direct_p50_ms=direct,
        misses=len(lat["semantic"]),
        # the goal is the exact path's: the semantic layer adds a new prompt's embedding and the
        # wait for its entry to be searchable (STOKER_GATEWAY_INDEX_WAIT_MS)
        goal_p50_ms_exact_only_max=3,
    )


def bench_herd(gw: str, sim: str) -> None:
    body = _body("initech", f"the herd question {random.randrange(10**9)}")
    before = _sim_served(sim)
    res = _load.run(gw, lambda n: (CHAT, body), concurrency=100, seconds=60, max_requests=100,
                    headers={"x-stoker-tenant": "initech"})  # fmt: skip
    emit("gateway_herd", upstream_calls=_sim_served(sim) - before, requests=res.requests,
         errors=res.errors, goal_upstream_calls=1)  # fmt: skip


def bench_load(gw: str, args: argparse.Namespace) -> None:
    """Three tenants side by side (a third of the clients each, its header on every request),
    Zipf over a shared pool of questions plus 20% new ones: hits, misses and coalesced waits."""
    results: list[tuple[_load.LoadResult, int]] = []
    threads = [
        threading.Thread(target=lambda t=t: results.append(_load_tenant(gw, t, args)))
        for t in TENANTS
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    requests = sum(r.requests for r, _ in results)
    lat = [x for r, _ in results for x in r.latencies_s]
    failed_open = sum(
        _metric(gw, f'stoker_gateway_bypass_total{{reason="{r}"}}')
        for r in ("deadline", "cache_down")
    )
    emit(
        "gateway_load",
        requests=requests,
        errors=sum(r.errors for r, _ in results),
        cross_tenant_hits=sum(c for _, c in results),
        p50_ms=pct(lat, 50),
        p99_ms=pct(lat, 99),
        rps=round(requests / max(r.elapsed_s for r, _ in results), 1),
        dropped_log_events=_metric(gw, 'stoker_gateway_log_events_total{result="dropped"}'),
        published_log_events=_metric(gw, 'stoker_gateway_log_events_total{result="published"}'),
        bypassed_failing_open=failed_open,
        concurrency=args.load_concurrency,
        seconds=args.load_seconds,
        goal_errors=0,
        goal_cross_tenant_hits=0,
    )


POOL = [f"common question {q} about the product" for q in range(300)]
WEIGHTS = [1 / (i + 1) ** 1.1 for i in range(len(POOL))]


def _load_tenant(gw: str, tenant: str, args: argparse.Namespace) -> tuple[_load.LoadResult, int]:
    rng = random.Random(f"{tenant}-load")
    crossed = [0]

    def request(n: int) -> tuple[bytes, bytes]:
        new = rng.random() < 0.2
        q = f"new {tenant} question {n}" if new else rng.choices(POOL, WEIGHTS)[0]
        return CHAT, _body(tenant, q)

    def check(status: int, headers: dict[bytes, bytes], payload: bytes) -> None:
        if status == 200:
            text = orjson.loads(payload)["choices"][0]["message"]["content"] or ""
            cited = re.findall(r"\[tenant:([^\]]+)\]", text)
            crossed[0] += bool(cited) and cited[0] != tenant

    res = _load.run(
        gw, request, concurrency=max(1, args.load_concurrency // 3), seconds=args.load_seconds,
        max_requests=args.load_max_requests, headers={"x-stoker-tenant": tenant}, check=check,
    )  # fmt: skip
    return res, crossed[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0, help="each hit measurement")
    ap.add_argument("--misses", type=int, default=200)
    ap.add_argument("--load-seconds", type=float, default=60.0)
    ap.add_argument("--load-concurrency", type=int, default=200)
    ap.add_argument("--load-max-requests", type=int, default=2_000_000)
    ap.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM peer")
    args = ap.parse_args()
    with EmbeddedStack() as stack, _sim(sim_port := free_port()):
        sim = f"http://127.0.0.1:{sim_port}"
        env = _env(
            STOKER_REDIS_URL=stack.redis_url, STOKER_KAFKA_BOOTSTRAP=stack.kafka_bootstrap,
            STOKER_KAFKA_BROKER="tansu", STOKER_QDRANT_PATH=str(stack.qdrant_path),
            STOKER_LOG_LEVEL="WARNING",
        )  # fmt: skip
        gw_args = [*STOKER, "gateway", "--port", "0", "--upstream", sim]
        exact_env = env | {"STOKER_SEMANTIC_ENABLED": "false", "STOKER_KAFKA_BOOTSTRAP": ""}
        with (
            _process(gw_args, env, _BANNER) as gw,
            _process(gw_args, exact_env | {"STOKER_TOPIC_PREFIX": "exact."}, _BANNER) as exact_gw,
            _litellm(args, sim, stack) as peer,
        ):
            bench_hit(gw, sim, peer, args)
            bench_miss_overhead(gw, exact_gw, sim, args)
            bench_herd(gw, sim)
            bench_load(gw, args)


@contextlib.contextmanager
def _litellm(args: argparse.Namespace, sim: str, stack: EmbeddedStack) -> Iterator[Any]:
    if args.no_litellm:
        yield None
        return
    from peers.litellm import LiteLLMProxy

    assert stack.redis is not None
    with LiteLLMProxy(sim, "127.0.0.1", stack.redis.port) as proxy:
        yield proxy


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
