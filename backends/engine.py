"""The model server's engine as it reports itself on /metrics: its load, its prefix cache, its
restarts. One reader, one fetch and one parse per read, vLLM's names and llama.cpp's.

What each engine exports (Prometheus text at the server's root, not under /v1):

    figure            vLLM (V1; V0 where named)                  llama.cpp (llama-server --metrics)
    queued for a slot vllm:num_requests_waiting                  llamacpp:requests_deferred
    in a slot         vllm:num_requests_running                  llamacpp:requests_processing
    slots             (not exported)                             total_slots of GET /props
    KV cache in use   vllm:kv_cache_usage_perc (gpu_cache_...)   (not exported)
    prefix cache size vllm:cache_config_info{num_gpu_blocks,     n_ctx of GET /props x slots (what
                      block_size, enable_prefix_caching}         the slots hold; --cache-ram is not said)
    prompt tokens     vllm:prefix_cache_queries_total            llamacpp:prompt_tokens_total (prefilled)
                                                                 + llamacpp:prompt_tokens_cached_total
    of them held      vllm:prefix_cache_hits_total               llamacpp:prompt_tokens_cached_total
    process start     process_start_time_seconds                 (not exported)
    busy seconds      vllm:request_inference_time_seconds_sum    llamacpp:prompt_seconds_total +
                      (prefill and decode of each request)       ..:tokens_predicted_seconds_total

- load, 0 idle .. 1 full: requests queued for a slot mean full (1.0); else vLLM's share of the KV
  cache in use, or llama.cpp's busy slots over its slots. None when the engine says neither.
- restarts (`restarted`): the process start time moved; or a work counter went back (prompt
  and generated tokens, decode calls: counters only reset with the process); or, first seen, it
  has prefilled nothing. The replica watch adds a third sign: a replica that stopped answering
  and answers again (warmers/prefix/after_restart.py).
The simulated backend exports vLLM's names (simulation/backend/http.py), so it is read alike.

`EngineReader` fetches through the one backend client (backends/client.py). `latest` reads at
most every `interval_s`, in the background after its first read, so a slow /metrics never
holds a caller back; its task ends with the reader (`aclose`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import orjson

from backends.client import OpenAIBackend, Timeouts
from schemas.errors import BackendUnavailable

Engine = Literal["vllm", "llama.cpp", "unknown"]

START = "process_start_time_seconds"
V_WAITING, V_RUNNING = "vllm:num_requests_waiting", "vllm:num_requests_running"
V_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
V_CACHE_INFO = "vllm:cache_config_info"
V_QUERIES, V_HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
L_DEFERRED, L_PROCESSING = "llamacpp:requests_deferred", "llamacpp:requests_processing"
L_PROMPT, L_CACHED = "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"
# The seconds the engine spent on requests (busy_s): each request's prefill and decode, summed.
V_BUSY = ("vllm:request_inference_time_seconds_sum",)
L_BUSY = ("llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total")
# Counters of work done that only a new process resets (summed over label sets).
WORK_COUNTERS = (
    V_QUERIES,
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    L_PROMPT,
    L_CACHED,
    "llamacpp:tokens_predicted_total",
    "llamacpp:n_decode_total",
)
_NAMES = frozenset(
    {START, V_WAITING, V_RUNNING, *V_KV_USAGE, V_CACHE_INFO, V_HITS, L_DEFERRED, L_PROCESSING}
    | set(WORK_COUNTERS)
    | {*V_BUSY, *L_BUSY}
)

# One regex over the whole text (C speed: a vLLM /metrics is hundreds of lines of histograms,
# read once a second on the warmer's event loop); the label set is kept unparsed, and parsed
# only for the one metric whose labels carry its figures (cache_config_info).
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?[ \t]+(\S+)", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def samples(text: str, names: Collection[str]) -> dict[str, list[tuple[str, float]]]:
    """name -> (its label set as written, value) per sample, for the names asked that occur.
    NaN and unparsable values say nothing and are left out."""
    out: dict[str, list[tuple[str, float]]] = {}
    for name, labels, raw in _SAMPLE.findall(text):
        if name not in names:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if value == value:  # NaN
            out.setdefault(name, []).append((labels, value))
    return out


@dataclass(frozen=True)
class Slots:
    """llama.cpp's slots as GET /props says: how many, and the context each holds."""

    total: int
    n_ctx: int | None


@dataclass(frozen=True)
class EngineState:
    """One read of an engine's /metrics (module docstring's table). None: not said."""

    engine: Engine
    waiting: float | None = None
    running: float | None = None
    slots: int | None = None
    kv_usage: float | None = None
    cache_tokens: int | None = None  # the prefix cache's size; 0: prefix caching is off
    prompt_tokens: float | None = None  # prompt tokens asked of the prefix cache
    held_tokens: float | None = None  # of them, found in it
    started: float | None = None  # process start, unix seconds
    # seconds spent on requests since the process started, as the engine accounts them (its
    # per-request prefill and decode times: concurrent requests each count their own)
    busy_s: float | None = None
    counters: tuple[tuple[str, float], ...] = ()  # WORK_COUNTERS present, in that order

    @property
    def load(self) -> float | None:
        """0 idle .. 1 full (module docstring); None when the engine says nothing of it."""
        return self.load_beside(0)

    def load_beside(self, own: int) -> float | None:
        """The load without `own` requests of the caller's in its slots, where the engine
        counts requests per slot (llama.cpp): what the other traffic holds. vLLM's KV share
        cannot tell one request from another, so it counts all."""
        if self.waiting is not None and self.waiting > 0:
            return 1.0
        if self.kv_usage is not None:
            return min(1.0, max(0.0, self.kv_usage))
        if self.running is not None and self.slots:
            return min(1.0, max(0.0, self.running - own) / self.slots)
        return None

    @property
    def held_share(self) -> float | None:
        """The share of prompt tokens the prefix cache held, since the process started."""
        if not self.prompt_tokens or self.held_tokens is None:
            return None
        return self.held_tokens / self.prompt_tokens


def parse(text: str, slots: Slots | None = None) -> EngineState:
    """An engine's state from its Prometheus text, and llama.cpp's slots when known."""
    got = samples(text, _NAMES)

    def total(name: str) -> float | None:
        vals = got.get(name)
        return sum(v for _, v in vals) if vals else None

    def top(*names: str) -> float | None:
        vals = [v for n in names for _, v in got.get(n, ())]
        return max(vals) if vals else None

    counters = tuple((n, v) for n in WORK_COUNTERS if (v := total(n)) is not None)
    if any(n.startswith("llamacpp:") for n in got):
        prompt, held = total(L_PROMPT), total(L_CACHED)
        n = slots.total if slots else None
        return EngineState(
            "llama.cpp", waiting=total(L_DEFERRED), running=total(L_PROCESSING), slots=n,
            cache_tokens=slots.n_ctx * slots.total if slots and slots.n_ctx else None,
            prompt_tokens=None if prompt is None else prompt + (held or 0.0),
            held_tokens=held, started=top(START), busy_s=_sum(got, L_BUSY), counters=counters,
        )  # fmt: skip
    engine: Engine = "vllm" if any(n.startswith("vllm:") for n in got) else "unknown"
    return EngineState(
        engine, waiting=top(V_WAITING), running=total(V_RUNNING), kv_usage=top(*V_KV_USAGE),
        cache_tokens=_vllm_cache_tokens(got.get(V_CACHE_INFO)), prompt_tokens=total(V_QUERIES),
        held_tokens=total(V_HITS), started=top(START), busy_s=_sum(got, V_BUSY), counters=counters,
    )  # fmt: skip


def _sum(got: dict[str, list[tuple[str, float]]], names: tuple[str, ...]) -> float | None:
    vals = [v for n in names for _, v in got.get(n, ())]
    return sum(vals) if vals else None


def _vllm_cache_tokens(info: list[tuple[str, float]] | None) -> int | None:
    """vLLM's KV cache in tokens, from the labels of its cache config: 0 when it says prefix
    caching is off (nothing a warm sends is kept), None when it does not say."""
    if not info:
        return None
    labels = dict(_LABEL.findall(info[0][0]))
    if labels.get("enable_prefix_caching", "").lower() == "false":
        return 0
    try:
        blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return blocks * size if blocks > 0 and size > 0 else None


def restarted(before: EngineState | None, now: EngineState) -> str | None:
    """Why the engine's caches must be empty now (module docstring), or None."""
    if before is None:
        if now.prompt_tokens is not None:
            fresh = now.prompt_tokens == 0
        else:
            fresh = bool(now.counters) and all(v == 0 for _, v in now.counters)
        return "a new replica: it has prefilled nothing yet" if fresh else None
    if now.started is not None and before.started is not None and now.started != before.started:
        return "restarted: its process start time moved"
    was = dict(before.counters)
    back = [name for name, v in now.counters if name in was and v < was[name]]
    if back:
        return f"restarted: its {back[0]} counter went back"
    return None


def slots_of(props: bytes) -> Slots | None:
    """llama.cpp's GET /props: total_slots, and the context of each
    (default_generation_settings.n_ctx)."""
    try:
        doc = orjson.loads(props)
        n = int(doc["total_slots"])
        ctx = (doc.get("default_generation_settings") or {}).get("n_ctx")
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
    return Slots(n, int(ctx) if isinstance(ctx, int) and ctx > 0 else None) if n > 0 else None


class EngineReader:
    """The engine of the server at `base_url` (any form schemas/baseurl.py takes), read from
    its /metrics, and once from /props when it is llama.cpp (its slots). ConfigError for a
    malformed URL."""

    def __init__(
        self,
        base_url: str,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.clock = clock
        t = Timeouts(connect_s=timeout_s, read_s=timeout_s, pool_s=timeout_s)
        self.client = OpenAIBackend(base_url, headers=headers, timeouts=t, connections=2)
        self.last: EngineState | None = None
        self.slots: Slots | None = None
        self._read_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def metrics_url(self) -> str:
        return str(self.client.server_url("metrics"))

    async def read(self) -> EngineState | None:
        """One read now: None when the server does not answer /metrics with 200 in time."""
        self._read_at = self.clock()
        try:
            reply = await self.client.get(self.client.server_url("metrics"),
                                          timeout_s=self.timeout_s)  # fmt: skip
            if reply.status != 200:
                self.last = None
                return None
            text = reply.content.decode(errors="replace")
            if self.slots is None and L_PROCESSING in text:  # llama.cpp: its slots, once
                props = await self.client.get(self.client.server_url("props"),
                                              timeout_s=self.timeout_s)  # fmt: skip
                self.slots = slots_of(props.content) if props.status == 200 else None
        except BackendUnavailable:
            self.last = None
            return None
        self.last = parse(text, self.slots)
        return self.last

    async def latest(self) -> EngineState | None:
        """The state as last read: the first call waits for one read (bounded by timeout_s);
        later calls start a refresh when the last read is older than interval_s, and return
        what is known without waiting for it."""
        if self._read_at is None:
            await self.read()
        elif self.clock() - self._read_at >= self.interval_s and self._task is None:
            self._task = asyncio.create_task(self._refresh())
            self._task.add_done_callback(self._forget)
        return self.last

    async def _refresh(self) -> None:
        await self.read()

    def _forget(self, _t: asyncio.Task[None]) -> None:
        self._task = None

    async def aclose(self) -> None:
        """Stop a refresh in flight and close the connection; the reader may read again."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.client.aclose()


def read_engine(base_url: str, timeout_s: float = 5.0) -> EngineState | None:
    """One read from code that runs no event loop (a command, the scheduler's thread)."""

    async def once() -> EngineState | None:
        reader = EngineReader(base_url, timeout_s=timeout_s)
        try:
            return await reader.read()
        finally:
            await reader.aclose()

    return asyncio.run(once())
