"""LiteLLM's proxy with its Redis response cache, as a side-by-side peer for benchmarks."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import ctypes
import hashlib
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

ROOT = Path(__file__).resolve().parents[2]
LOCK = Path(__file__).with_name("litellm.lock")
STAMP_NAME = ".litellm-installed"
LOOPBACK = "127.0.0.1"
# Measured here: the proxy serves 6-10 s after spawn (it imports a 750 MB venv); 120 s covers a
# loaded machine and still fails a hung start.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.25
_LOG_TAIL_BYTES = 4_000
CACHE_TTL_S = 3600
# A bound on the load loop besides its deadline: far above what one worker sends in a run.
MAX_REQUESTS_PER_WORKER = 100_000
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# This machine reaches package registries only: every remote fetch LiteLLM knows of is turned
# off, so a start neither hangs on a timeout nor phones home.
OFFLINE_ENV = {
    "LITELLM_TELEMETRY_DISABLED": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "true",
}


def _say(message: str) -> None:
    print(f"peers.litellm: {message}", file=sys.stderr, flush=True)


def _pip_install(python: Path) -> None:
    # Output captured: pip warns once per package about this machine's file:// index config.
    done = subprocess.run(
        [
            *(str(python), "-m", "pip", "install", "-q", "--require-hashes", "--no-deps"),
            *("--disable-pip-version-check", "-r", str(LOCK)),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise RuntimeError(f"pip install -r {LOCK} failed with code {done.returncode}")


def ensure_venv(path: Path = ROOT / ".venv-litellm") -> Path:
    """Create the venv and install litellm.lock into it unless its stamp matches; its python."""
    python = path / "bin" / "python"
    stamp = path / STAMP_NAME
    want = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    if python.exists() and stamp.is_file() and stamp.read_text().strip() == want:
        return python
    started = time.monotonic()
    if not python.exists():
        _say(f"creating {path}")
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    # --no-deps: the lock is complete, so nothing unhashed or unlisted can come in.
    _say(f"installing {LOCK.name} into {path} (about a minute the first time)")
    _pip_install(python)
    stamp.write_text(want + "\n")
    _say(f"installed in {time.monotonic() - started:.0f} s")
    return python


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that has Linux SIGTERM the child when we die, even by SIGKILL; else None."""
    # SIGTERM, not SIGKILL: with --num_workers > 1 the child is uvicorn's supervisor, and only
    # one that runs its shutdown takes its workers with it (measured: SIGKILL orphans them).
    # PDEATHSIG fires when the forking *thread* exits, so only the main thread arms it.
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os._exit(1)

    return arm


def proxy_config(upstream_url: str, redis_host: str, redis_port: int, model: str) -> dict[str, Any]:
    """One model routed to an OpenAI-compatible upstream, every response cached in Redis.

    LiteLLM reads a Redis cache through a DualCache: each worker's memory first (600 s), then
    Redis. A hit in a steady run is mostly a memory hit; a fresh worker's first is a Redis one.
    """
    return {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": upstream_url.rstrip("/") + "/v1",
                    "api_key": "sk-dummy",
                },
            }
        ],
        "litellm_settings": {
            "cache": True,
            # ttl: LiteLLM's Redis default is 60 s, which would expire the hit set mid-run.
            "cache_params": {
                "type": "redis",
                "host": redis_host,
                "port": redis_port,
                "ttl": CACHE_TTL_S,
            },
        },
    }


class LiteLLMProxy:
    """`litellm --config` on a free loopback port for one `with` block; no process outlives it."""

    def __init__(
        self,
        upstream_url: str,
        redis_host: str,
        redis_port: int,
        model: str = "sim-model",
        workers: int = 1,
        port: int | None = None,
    ) -> None:
        self.config = proxy_config(upstream_url, redis_host, redis_port, model)
        self.model = model
        self.workers = workers
        self.port = port
        self.key = f"sk-bench-{secrets.token_hex(12)}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def __enter__(self) -> Self:
        try:
            self._launch(ensure_venv())
            self._wait_ready(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _launch(self, python: Path) -> None:
        self._workdir = Path(tempfile.mkdtemp(prefix="stoker-litellm-"))
        atexit.register(self.stop)
        # JSON is YAML: no YAML writer needed on the project's side.
        cfg = self._workdir / "config.yaml"
        cfg.write_text(json.dumps(self.config, indent=2))
        self.port = self.port or free_port()
        argv = [str(python.parent / "litellm"), "--config", str(cfg), "--host", LOOPBACK]
        argv += ["--port", str(self.port), "--num_workers", str(self.workers)]
        env = {**os.environ, **OFFLINE_ENV, "LITELLM_MASTER_KEY": self.key}
        env.pop("DATABASE_URL", None)  # a DB would bring prisma and migrations into the peer
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                cwd=self._workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() signals workers too
                preexec_fn=_die_with_parent(),
            )

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health/readiness", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            code = self._proc.poll() if self._proc is not None else -1
            if code is not None:
                raise RuntimeError(f"litellm exited with code {code}; log:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"litellm not ready in {timeout_s:g} s; log:\n{self.log_tail()}")
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after STOP_TIMEOUT_S; remove the temp dir."""
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate_group(proc)
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    @property
    def log_path(self) -> Path:
        if self._workdir is None:
            raise RuntimeError("litellm was not started")
        return self._workdir / "litellm.log"

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - max_bytes))
                return log.read().decode(errors="replace")
        except (OSError, RuntimeError):
            return ""


def _terminate_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_TIMEOUT_S)
    # Always, even after a clean exit: a worker the leader left behind keeps the group alive.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def is_cache_hit(response: httpx.Response) -> bool:
    """LiteLLM sends x-litellm-cache-key only when the answer came from its response cache."""
    return bool(response.headers.get("x-litellm-cache-key"))


def chat_body(model: str, prompt: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}


def _smoke(proxy: LiteLLMProxy, body: dict[str, Any], redis_host: str, redis_port: int) -> bool:
    """The same request twice; True when the second was a hit whose key is in Redis."""
    key = ""
    with httpx.Client(base_url=proxy.url, headers=proxy.headers, timeout=30) as client:
        for attempt in ("first", "second"):
            started = time.perf_counter()
            response = client.post("/v1/chat/completions", json=body)
            ms = (time.perf_counter() - started) * 1000
            response.raise_for_status()
            key = response.headers.get("x-litellm-cache-key", "")
            print(f"{attempt}: {ms:.1f} ms, cache hit: {is_cache_hit(response)}, key: {key or '-'}")
    in_redis = bool(key) and _redis_has(redis_host, redis_port, key)
    print(f"cache key in Redis: {in_redis}")
    return in_redis


def _redis_has(host: str, port: int, key: str) -> bool:
    import redis  # the project's venv has it; only the smoke needs it

    client = redis.Redis(host=host, port=port, socket_timeout=2)
    try:
        return bool(client.exists(key))
    finally:
        client.close()


async def _worker(
    client: httpx.AsyncClient, body: dict[str, Any], deadline: float, out: list[tuple[float, bool]]
) -> None:
    for _ in range(MAX_REQUESTS_PER_WORKER):
        if time.perf_counter() >= deadline:
            return
        started = time.perf_counter()
        try:
            response = await client.post("/v1/chat/completions", json=body)
            hit = response.status_code == 200 and is_cache_hit(response)
        except httpx.HTTPError:
            hit = False  # counted as a request, not a hit: a failing peer shows as low hits/s
        out.append((time.perf_counter() - started, hit))


async def load(
    proxy: LiteLLMProxy, body: dict[str, Any], concurrency: int, seconds: float
) -> dict[str, float]:
    """`concurrency` closed-loop clients sending `body` for `seconds`; hits/s and latency."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    samples: list[tuple[float, bool]] = []
    async with httpx.AsyncClient(
        base_url=proxy.url, headers=proxy.headers, timeout=30, limits=limits
    ) as client:
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(
            *(_worker(client, body, deadline, samples) for _ in range(concurrency))
        )
        elapsed = time.perf_counter() - started
    latencies = sorted(s for s, _ in samples)
    hits = sum(hit for _, hit in samples)
    return {
        "requests": len(samples),
        "hits": hits,
        "hits_per_s": hits / elapsed,
        "p50_ms": _quantile(latencies, 0.50) * 1000,
        "p99_ms": _quantile(latencies, 0.99) * 1000,
    }


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--upstream", required=True, help="OpenAI-compatible base URL, without /v1")
    ap.add_argument("--redis-host", default=LOOPBACK)
    ap.add_argument("--redis-port", type=int, required=True)
    ap.add_argument("--model", default="sim-model")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--load-seconds", type=float, default=0, help="then load it with cached hits")
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    body = chat_body(args.model, "Which cache keeps the hot set warm?")
    started = time.monotonic()
    with LiteLLMProxy(
        args.upstream, args.redis_host, args.redis_port, args.model, args.workers
    ) as proxy:
        print(f"litellm ready at {proxy.url} in {time.monotonic() - started:.1f} s")
        hit = _smoke(proxy, body, args.redis_host, args.redis_port)
        if args.load_seconds > 0:
            figures = asyncio.run(load(proxy, body, args.concurrency, args.load_seconds))
            print(json.dumps({"name": "litellm_cached_hits", "workers": args.workers, **figures}))
    sys.exit(0 if hit else 1)


if __name__ == "__main__":
    main()
