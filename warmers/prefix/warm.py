"""KV prefix warming: send each hot prompt prefix once so the backend's prefix cache holds it.

After a deploy (new weights) or a replica restart, vLLM's (or SGLang's) automatic prefix cache
is empty, and the first request of every system prompt pays its whole prefill. One run:
1. plan: the model's most counted prefixes (warmers/prefix/hot.py) over its tenants, seen within
   max_age_s, the same messages of several tenants once, cut at top_n and at a token budget
   (summed prefix tokens: warming more than the backend's cache holds evicts the hottest):
   `kv_share` of the cache the backend's engine reports (backends/engine.py: vLLM's
   `vllm:cache_config_info`, num_gpu_blocks x block_size, nothing at all when it says prefix
   caching is off), else the fixed `token_budget`. Blocks a warm fills are free blocks vLLM
   evicts least recently used when a running request needs room, so they never stop a live
   request from being admitted; the share leaves room for the live traffic's own prefixes.
   llama.cpp is no pool of blocks (Room): each slot holds one prompt, whatever its context,
   and an idle slot's prompt is saved to its host-memory cache too (--cache-ram, which it does
   not report: `host_cache_tokens`). The hottest prompts, one a slot, go to the slots and the
   rest within `kv_share` of the host cache; without one, the slots' prompts alone;
2. send them coldest first, so that the hottest are the most recently used when the warm ends:
   vLLM evicts the least recently used free blocks, and llama.cpp's host cache drops the prompt
   saved longest ago, so the first live prompts of other templates push out the coldest;
   each as a generate of the one backend client (backends/client.py) with `max_tokens=1`,
   temperature 0, the prefix and a one-token user turn, straight to the backend at most `qps`
   a second (throttle.TokenBucket), `concurrency` at a time (on llama.cpp at most a send a
   slot: a request beyond its slots waits in its queue, where its timeout runs too), with
   `Cache-Control: no-cache, no-store` so that even a caching gateway named by mistake neither
   serves nor stores it: the answer cache is never read or written;
3. stop at the deadline (deadline_s) whatever is left, and report sent / warmed / failed.
   Since the hottest go last, a deadline would cut them first: once sends have come back, a
   send that the rest could not follow before the deadline (at the rate the warmed prefix
   tokens went, and at the QPS) is skipped, the coldest first (`skipped`). Stop at once when
   the backend refuses the connection (nothing listens at its URL: every other send would
   too), and report the URL (`unreachable`).
A warm costs one prefill of the prefix and one decoded token; a prefix already held costs a
token or two. Nothing is retried within a run: the next run (the next deploy, restart or
schedule) sends again, and a run is safe to repeat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backends.base import GenerationRequest
from backends.client import OpenAIBackend, RetryPolicy, Timeouts
from backends.engine import EngineReader
from backends.pacing import MonotonicClock, TokenBucket
from schemas.baseurl import BaseURL
from schemas.errors import (
    BackendRejected,
    BackendTimedOut,
    BackendUnavailable,
    BackendUnreachable,
    ConfigError,
    StokerError,
)
from schemas.prewarm import PrewarmRequest
from warmers.prefix.hot import HotPrefix, HotPrefixes

# The user turn a warm appends: a chat template needs one, and a single token adds ~nothing.
WARM_USER_TURN = "."
NO_CACHE_HEADERS = {"Cache-Control": "no-cache, no-store"}
PROBE_TIMEOUT_S = 5.0  # the /metrics read that sizes the budget
# Nothing is retried within a run, and the first refused connection ends it: every other send
# would be refused too.
_ONCE = RetryPolicy(attempts=1)


@dataclass(frozen=True)
class Room:
    """What a warm may fill: `tokens` of prefixes in a shared cache, and `slots` prefixes more
    of at most `slot_tokens` each (llama.cpp: a slot holds one prompt, so its context is no
    room for a second one; the hottest go there, being sent last)."""

    tokens: int
    slots: int = 0
    slot_tokens: int = 0


def warm_request(h: HotPrefix, model: str | None = None) -> GenerationRequest:
    """A prefix warm as a generation: the prefix, a one-token user turn, one token back."""
    body = {
        "model": model or h.prefix.model,
        "messages": [*h.prefix.as_messages(), {"role": "user", "content": WARM_USER_TURN}],
        "max_tokens": 1,
        "temperature": 0,
    }
    return GenerationRequest(
        h.tenant, h.model_id, "", "", WARM_USER_TURN, body=body, api="chat", route="prefix-warm"
    )


class PrefixWarmOptions(BaseModel):
    """The owner of the prefix_warm_* settings' defaults and bounds (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend_url: str | None  # None: plans only (a dry run), on the fixed token budget
    qps: float = Field(default=2.0, gt=0, le=1_000)
    top_n: int = Field(default=200, ge=1, le=10_000)
    # when the backend does not report its KV cache
    token_budget: int = Field(default=65_536, ge=1)
    # of the KV cache the backend reports; 0: always token_budget
    kv_share: float = Field(default=0.8, ge=0.0, le=1.0)
    # llama.cpp only: the tokens its host-memory prompt cache (--cache-ram) holds beside its
    # slots, which it does not report (the setting's default is the embedded server's)
    host_cache_tokens: int = Field(default=0, ge=0)
    max_age_s: float = Field(default=7 * 86_400.0, gt=0)
    concurrency: int = Field(default=4, ge=1, le=256)
    # A send's wait for its one token: its prompt's whole prefill. A GPU does a few thousand
    # tokens in well under a second; the embedded server on one CPU thread did ~150 a second
    # (13 s for 2,000 tokens), twice as long when two sends share its thread.
    timeout_s: float = Field(default=30.0, gt=0, le=3_600)
    # Two minutes: the deploy's pre-warm waits for the run.
    deadline_s: float = Field(default=120.0, gt=0, le=3_600)
    model: str | None = None  # the served model name to send; None: each prefix's own
    api_key: str | None = None


@dataclass
class PrefixWarmReport:
    model_id: str
    planned: int = 0
    sent: int = 0
    warmed: int = 0
    failed: int = 0
    left_by_deadline: int = 0
    skipped: int = 0  # the coldest, left so that the hottest were sent before the deadline
    tokens: int = 0  # prefix tokens of the warmed prefixes
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # the first few, for the report
    budget_tokens: int = 0  # the plan's token budget (beside any slots'), and where it came from
    budget_from: str = ""
    budget_slots: int = 0  # llama.cpp: the slots' prompts, beside budget_tokens
    unreachable: str = ""  # the backend refused the connection: the run stopped sending

    def __str__(self) -> str:
        late = f", {self.left_by_deadline} left at the deadline" if self.left_by_deadline else ""
        if self.skipped:
            late += f", the {self.skipped} coldest skipped to end by the deadline"
        why = f" ({self.unreachable or self.errors[0]})" if self.errors else ""
        room = f"{self.budget_tokens:,}" + (
            f" and {self.budget_slots} slots" if self.budget_slots else ""
        )
        return (
            f"prefix warm of {self.model_id}: planned {self.planned}, warmed {self.warmed} "
            f"({self.tokens:,} tokens of {room}: {self.budget_from}), "
            f"failed {self.failed}{why}{late} in {self.seconds:.1f} s"
        )


class PrefixWarmer:
    """Plans and sends prefix warms (module docstring). `warm` blocks; `warm_async` awaits."""

    def __init__(self, store: HotPrefixes, options: PrefixWarmOptions) -> None:
        """ConfigError for a malformed backend URL (any form schemas/baseurl.py takes)."""
        self.store = store
        self.options = options
        self.base = BaseURL.parse(options.backend_url) if options.backend_url else None

    def budget(self) -> tuple[Room, str]:
        """budget_async, from code that runs no event loop (the CLI's dry run)."""
        return asyncio.run(self.budget_async())

    async def budget_async(self) -> tuple[Room, str]:
        """Step 1's token budget, and where it came from: a share of the cache the backend's
        engine reports, else the fixed budget (one read of at most PROBE_TIMEOUT_S: a backend
        that does not answer it in time gets the fixed budget, not a stalled run)."""
        o = self.options
        fixed = (Room(o.token_budget), f"the fixed budget of {o.token_budget:,} tokens")
        if o.kv_share <= 0 or o.backend_url is None:
            return fixed
        reader = EngineReader(o.backend_url, timeout_s=min(o.timeout_s, PROBE_TIMEOUT_S))
        try:
            state = await reader.read()
        finally:
            await reader.aclose()
        kv = state.cache_tokens if state is not None else None
        if state is None or kv is None:
            return fixed
        if kv == 0:
            return Room(0), "the backend says its prefix caching is off"
        if state.engine != "llama.cpp" or not state.slots:
            share = int(o.kv_share * kv)
            return Room(share), f"{o.kv_share:g} of the backend's {kv:,}-token KV cache"
        n, each = state.slots, kv // state.slots
        slots = f"a prompt in each of its {n} slots (up to {each:,} tokens)"
        if not o.host_cache_tokens:
            return Room(0, n, each), slots
        # llama-server saves an idle slot's prompt to the host cache too, so the slots' prompts
        # are copies there. Sending them beside the host share costs the warm a prefill each and
        # pushes out only the coldest prompts sent (the host cache drops the one saved longest
        # ago); without them, prefix_warm_real held less in one of its 3 runs, and that run's
        # first requests waited 3x longer (the other two moved within the rows' own spread)
        host = int(o.kv_share * o.host_cache_tokens)
        return Room(host, n, each), (
            f"{slots}, and {o.kv_share:g} of the {o.host_cache_tokens:,} tokens of its "
            "host-memory cache (STOKER_PREFIX_WARM_HOST_CACHE_TOKENS)"
        )

    def plan(
        self,
        model_id: str,
        tenants: Sequence[str] | None = None,
        now: float | None = None,
        budget: Room | int | None = None,
    ) -> list[HotPrefix]:
        """Step 1: the prefixes to send, hottest first, within `budget` (tokens, or a Room:
        the first that fit a slot take the slots; default: the fixed token budget)."""
        o = self.options
        now = time.time() if now is None else now
        ranked = self.store.top(model_id, o.top_n, tenants, not_before=now - o.max_age_s)
        seen: set[tuple[Any, ...]] = set()
        out: list[HotPrefix] = []
        budget = o.token_budget if budget is None else budget
        room = budget if isinstance(budget, Room) else Room(budget)
        slots, left = room.slots, room.tokens
        for h in ranked:
            ident = (o.model or h.prefix.model, h.prefix.messages)
            if ident in seen:
                continue
            if slots and h.prefix.tokens <= room.slot_tokens:
                slots -= 1
            elif h.prefix.tokens <= left:
                left -= h.prefix.tokens
            else:
                continue
            seen.add(ident)
            out.append(h)
            if len(out) == o.top_n:
                break
        return out

    def warm(self, model_id: str, tenants: Sequence[str] | None = None) -> PrefixWarmReport:
        return asyncio.run(self.warm_async(model_id, tenants))

    async def warm_async(
        self, model_id: str, tenants: Sequence[str] | None = None
    ) -> PrefixWarmReport:
        o = self.options
        if o.backend_url is None:
            raise ConfigError("prefix warming needs the backend's URL; without one it only plans")
        t0 = time.monotonic()
        room, source = await self.budget_async()
        plan = self.plan(model_id, tenants, budget=room)
        report = PrefixWarmReport(
            model_id, planned=len(plan), budget_tokens=room.tokens, budget_from=source,
            budget_slots=room.slots,
        )  # fmt: skip
        bucket = TokenBucket(o.qps, MonotonicClock())
        at_once = min(o.concurrency, room.slots) if room.slots else o.concurrency
        gate = asyncio.Semaphore(at_once)
        backend = OpenAIBackend(
            o.backend_url, model=o.model, api_key=o.api_key, headers=NO_CACHE_HEADERS,
            timeouts=Timeouts(read_s=o.timeout_s), retry=_ONCE, circuit_refusals=1,
            connections=at_once,
        )  # fmt: skip
        sending = plan[::-1]  # step 2: the hottest last
        after = list(accumulate(h.prefix.tokens for h in plan))[::-1]  # of sending[i:]
        async with backend:
            tasks: list[asyncio.Task[None]] = []
            speeds: list[float] = []  # each warmed prefix's tokens a second of its own send
            for i, h in enumerate(sending):
                left = o.deadline_s - (time.monotonic() - t0)
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(gate.acquire(), left)
                except TimeoutError:
                    break
                if report.unreachable:  # an earlier send found nothing listening
                    gate.release()
                    break
                now = time.monotonic()
                count = len(sending) - i
                if self._past_deadline(after[i], count, after[-1], speeds, min(at_once, count),
                                       o.deadline_s - (now - t0)):  # fmt: skip
                    report.skipped += 1
                    gate.release()
                    continue
                try:
                    await asyncio.wait_for(bucket.acquire(), o.deadline_s - (now - t0))
                except TimeoutError:
                    gate.release()
                    break
                report.sent += 1
                tasks.append(asyncio.create_task(self._send(backend, h, gate, report, speeds)))
            if not report.unreachable:
                report.left_by_deadline = len(plan) - report.sent - report.skipped
            left = max(0.0, o.deadline_s - (time.monotonic() - t0))
            _, pending = await asyncio.wait(tasks, timeout=left) if tasks else (set(), set())
            for t in pending:  # step 3: the deadline holds for requests in flight too
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            report.failed += len(pending)
        report.seconds = time.monotonic() - t0
        return report

    def _past_deadline(
        self,
        tokens: int,
        count: int,
        last: int,
        speeds: list[float],
        parallel: int,
        left_s: float,
    ) -> bool:
        """Would the `count` sends still to go, of `tokens` in all, the last of `last` tokens,
        end past the deadline, at the QPS, or at the speed the warmed ones went (`speeds`,
        each its tokens over its own send's seconds, `parallel` at once; unknown before one
        has come back)? Then the coldest of them is skipped, so that the deadline never cuts
        the hottest, which are sent last. A send's own seconds, not the run's: sends that share
        the backend each go slower, `parallel` of them at once."""
        need = (count - 1) / self.options.qps
        if speeds:
            speed = sum(speeds) / len(speeds)
            need = max(need + last / speed, tokens / (speed * parallel))
        return need > left_s

    async def _send(
        self,
        backend: OpenAIBackend,
        h: HotPrefix,
        gate: asyncio.Semaphore,
        report: PrefixWarmReport,
        speeds: list[float],
    ) -> None:
        error = None
        t0 = time.monotonic()
        try:
            await backend.generate(warm_request(h, self.options.model))
        except BackendUnreachable as e:
            error = str(e)
            report.unreachable = report.unreachable or error
        except BackendTimedOut as e:  # a slow prefill: the one error a setting cures
            error = f"{e}; no answer within {self.options.timeout_s:g} s: a long prompt on a "
            error += "slow server needs more (STOKER_PREFIX_WARM_TIMEOUT_S)"
        except (BackendUnavailable, BackendRejected) as e:
            error = str(e)
        finally:
            gate.release()
        if error is None:
            report.warmed += 1
            report.tokens += h.prefix.tokens
            speeds.append(h.prefix.tokens / max(time.monotonic() - t0, 1e-6))
        else:
            report.failed += 1
            if len(report.errors) < 3:
                report.errors.append(error)


@dataclass(frozen=True)
class WithPrefixWarm:
    """A deploy pre-warm's report (invalidators.deployjob.PrewarmReport) with the prefix warm
    that ran before it. READY's bar stays the hot set's: a prefix warm is best effort."""

    inner: Any
    prefixes: str

    @property
    def warmed(self) -> int:
        return int(self.inner.warmed)

    @property
    def failed(self) -> int:
        return int(self.inner.failed)

    @property
    def ok(self) -> bool:
        return bool(self.inner.ok)

    @property
    def detail(self) -> str:
        inner = str(self.inner.detail or f"warmed {self.warmed}, failed {self.failed}")
        return f"{inner}; {self.prefixes}"


class PrefixWarmingPrewarmer:
    """The deploy cutover's pre-warm with prefix warming first: the new replicas' prefix caches
    fill with the hot system prompts (one token each), then the hot-set pre-warm runs on them
    with those prefixes held, so its own prefills are shorter too."""

    def __init__(self, inner: Any, warmer: PrefixWarmer) -> None:
        self.inner = inner
        self.warmer = warmer

    def prewarm(self, req: PrewarmRequest) -> WithPrefixWarm:
        try:
            summary = str(self.warmer.warm(req.model_id, req.tenants or None))
        except StokerError as e:  # Redis down: the hot-set pre-warm decides the job's fate
            summary = f"prefix warm of {req.model_id} skipped: {e}"
        return WithPrefixWarm(self.inner.prewarm(req), summary)
