"""The simulated GPU backend: latency per token, a fixed number of batch slots, a bounded queue.

Model of one generation (what `Simulator.generate` does, in order):
1. take a batch slot at once if one is free and nobody waits; else join the FIFO queue, or get
   a 429 (`QueueFull`) when `queue` requests already wait: overload is visible, as on vLLM;
2. hold the slot for prefill_ms_per_token * (tokens_in - cached) + decode_ms_per_token *
   tokens_out (tokens = whitespace-separated words); that time is also reported as `gpu_ms`.
   `cached` is the prompt's leading run of token blocks the KV prefix cache holds
   (prefixcache.py, vLLM's automatic prefix caching: on by default, SimConfig.prefix_cache_tokens
   of capacity), looked up when the slot is taken; the prompt's blocks are held once its
   prefill has run. A shorter prefill is all a caller sees of it, as of a real server: the
   time to first token and gpu_ms (plus the two counters vLLM exports, on /metrics);
3. answer as a model would (phrasing.py): the facts of the question's meaning, its specifics
   (amounts, dates, directions, names), in wording of its own. The meaning of a prompt comes
   from SimConfig.meanings (a test or demo hands over what a real model would understand:
   which questions are paraphrases), else the prompt is its own meaning. Paraphrases agree in
   meaning, never in text; the same prompt gets the same answer unless vary_wording, when every
   call words it anew, as sampling would. An explicit answer table (`answers`) overrides all.
   An answer cites the source markers its prompt holds ("[tenant:acme]", "[doc:kb/x@v3]"),
   first, as a RAG model cites what it read: the demo scores stale and cross-tenant hits by
   them, whatever the key scheme did (a scoring convenience of the simulator; say so).

Streamed (`Simulator.streaming`): the same slot and the same total time, but the answer comes
in chunks of a few tokens as a GPU decodes them: chunk k is ready at prefill time plus the decode
time of every token up to the end of chunk k, so the last one lands at `gpu_ms`.

Capacity (`set_slots`) can change at run time; requests already holding a slot finish.
`restart` empties the prefix cache, as a restarted server (or one with new weights) starts.
The HTTP face lives in simhttp.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import random
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field, replace

from backends.base import FinishReason
from caches.keys import normalise_prompt
from simulation.backend.phrasing import render
from simulation.backend.prefix_cache import DEFAULT_BLOCK_TOKENS, PrefixCache

# Source markers a prompt may carry, cited in the answer (see step 3 above).
CITATION = re.compile(r"\[(?:tenant|doc):[^\s\[\]]{1,300}\]")
# One token with the whitespace before it, as real tokenizers keep it (" cache"): the chunks of
# a streamed answer then join back to the exact text.
_TOKEN = re.compile(r"\s*\S+")
TOKENS_PER_CHUNK = 4


@dataclass(frozen=True)
class SimConfig:
    """Defaults resemble an 8B model on one GPU: ~0.2 ms/token prefill, ~10 ms/token decode
    per sequence, 8 concurrent sequences; answers of 8..64 tokens (0.1-0.6 s each); a KV prefix
    cache of 131,072 tokens (Llama-3-8B keeps 128 KiB of KV per token: ~16 GB of a 40 GB GPU
    beside the weights), in blocks of 16 tokens (0 tokens: no prefix caching)."""

    slots: int = 8
    queue: int = 64
    prefill_ms_per_token: float = 0.2
    decode_ms_per_token: float = 10.0
    min_answer_tokens: int = 8
    default_max_tokens: int = 64
    models: tuple[str, ...] = ("sim-model",)
    answers: Mapping[str, str] = field(default_factory=dict)
    # prompt -> meaning id: which prompts a model would answer alike (see step 3)
    meanings: Mapping[str, str] = field(default_factory=dict)
    vary_wording: bool = False
    prefix_cache_tokens: int = 131_072
    prefix_block_tokens: int = DEFAULT_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.slots < 0 or self.queue < 0:
            raise ValueError("slots and queue must be >= 0")
        if self.prefix_cache_tokens < 0 or self.prefix_block_tokens < 1:
            raise ValueError("need prefix_cache_tokens >= 0 and prefix_block_tokens >= 1")
        if not 1 <= self.min_answer_tokens <= self.default_max_tokens:
            raise ValueError("need 1 <= min_answer_tokens <= default_max_tokens")


@dataclass(frozen=True)
class SimAnswer:
    text: str
    tokens_in: int
    tokens_out: int
    gpu_ms: float
    finish_reason: FinishReason
    # the prompt's full token blocks (prefixcache.py) and, once a slot ran it, the prompt
    # tokens the prefix cache held: gpu_ms then counts prefill for the rest only
    blocks: tuple[bytes, ...] = ()
    cached_tokens: int = 0


@dataclass(frozen=True)
class SimRun:
    """A streamed generation holding its slot: the answer as run (cached_tokens and gpu_ms of
    this admission) and its chunks as they are decoded."""

    answer: SimAnswer
    chunks: AsyncIterator[str]


@dataclass
class SimStats:
    served: int = 0
    rejected: int = 0  # 429s
    busy: int = 0
    queued: int = 0
    slots: int = 0
    # streams the client dropped before [DONE] (counted by the HTTP face); one dropped after its
    # last token was generated is in served as well
    aborted: int = 0
    # the simulated GPU time of the answers served (each one's gpu_ms, in seconds): the busy
    # seconds an engine reports (vllm:request_inference_time_seconds_sum)
    busy_s: float = 0.0


class QueueFull(Exception):
    """Every slot is busy and the queue is full: the HTTP face answers 429."""


def count_tokens(text: str) -> int:
    return max(1, len(text.split()))


def split_chunks(text: str, tokens_per_chunk: int = TOKENS_PER_CHUNK) -> list[tuple[str, int]]:
    """text as (chunk, its token count) pairs of up to tokens_per_chunk tokens each, every token
    with its leading whitespace: "".join of the chunks is exactly text."""
    if tokens_per_chunk < 1:
        raise ValueError("tokens_per_chunk must be >= 1")
    toks = _TOKEN.findall(text)
    groups = [toks[i : i + tokens_per_chunk] for i in range(0, len(toks), tokens_per_chunk)]
    chunks = [("".join(g), len(g)) for g in groups]
    rest = text[sum(len(c) for c, _ in chunks) :]
    if rest:  # trailing whitespace belongs to no token but is part of the text
        chunks.append((rest, 0))
    return chunks


class Simulator:
    """Slots and queue of one simulated GPU. Call from one event loop (the server's)."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self._slots = self.config.slots
        self._busy = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []  # heap by arrival: FIFO
        self._seq = itertools.count()
        self._answers = {normalise_prompt(p): a for p, a in self.config.answers.items()}
        self._meanings = {normalise_prompt(p): m for p, m in self.config.meanings.items()}
        self._calls = itertools.count()
        self.stats = SimStats(slots=self._slots)
        self.prefix_cache = PrefixCache(
            self.config.prefix_cache_tokens, self.config.prefix_block_tokens
        )
        self.started_at = time.time()  # what a process exports as process_start_time_seconds

    # -- capacity --

    @property
    def slots(self) -> int:
        return self._slots

    def set_slots(self, n: int) -> None:
        """Change capacity now; busy slots above the new count drain as their requests end."""
        if n < 0:
            raise ValueError("slots must be >= 0")
        self._slots = self.stats.slots = n
        self._wake()

    def set_answer(self, prompt: str, answer: str) -> None:
        self._answers[normalise_prompt(prompt)] = answer

    def restart(self) -> None:
        """As a restarted server, or one that loaded new weights: the prefix cache is empty,
        and the process started now."""
        self.prefix_cache.clear()
        self.started_at = max(time.time(), self.started_at + 1e-6)

    # -- one generation --

    async def generate(self, model: str, prompt: str, max_tokens: int | None) -> SimAnswer:
        asked = self.answer_for(model, prompt, max_tokens)
        async with self._slot():
            answer = self._admit(asked)
            loop = asyncio.get_running_loop()
            start = loop.time()
            await asyncio.sleep(self._prefill_ms(answer) / 1000.0)
            self.prefix_cache.insert(answer.blocks)
            await asyncio.sleep(max(0.0, start + answer.gpu_ms / 1000.0 - loop.time()))
        self.stats.served += 1
        self.stats.busy_s += answer.gpu_ms / 1000.0
        return answer

    @asynccontextmanager
    async def streaming(
        self, answer: SimAnswer, tokens_per_chunk: int = TOKENS_PER_CHUNK
    ) -> AsyncIterator[SimRun]:
        """Hold a slot for the block and give the answer's chunks as they are decoded.

        Entering waits for a slot or raises QueueFull, before the caller has sent anything, so
        an overload is still a plain 429. Served counts only a block that ran to its end."""
        async with self._slot():
            ran = self._admit(answer)
            # aclosing: a stream cut short closes its pacer here, not whenever it is collected
            async with aclosing(self._paced(ran, tokens_per_chunk)) as chunks:
                yield SimRun(ran, chunks)
        self.stats.served += 1
        self.stats.busy_s += ran.gpu_ms / 1000.0

    def _admit(self, answer: SimAnswer) -> SimAnswer:
        """The answer as this slot runs it: the prefix cache's held tokens off its prefill. At
        least the last prompt token is computed (vLLM recomputes it for the first logits)."""
        if not answer.blocks:
            return answer
        held = self.prefix_cache.lookup(answer.blocks, answer.tokens_in)
        cached = min(held, answer.tokens_in - 1)
        gpu_ms = answer.gpu_ms - self.config.prefill_ms_per_token * cached
        return replace(answer, cached_tokens=cached, gpu_ms=gpu_ms)

    def _prefill_ms(self, answer: SimAnswer) -> float:
        return self.config.prefill_ms_per_token * (answer.tokens_in - answer.cached_tokens)

    async def _paced(self, answer: SimAnswer, tokens_per_chunk: int) -> AsyncGenerator[str, None]:
        # Deadlines from one start, not sleeps in a row: the loop's wake-up lag does not add up,
        # so the stream takes gpu_ms like the non-streamed answer.
        loop = asyncio.get_running_loop()
        start = loop.time()
        ready_ms = self._prefill_ms(answer)
        if answer.blocks:  # the prefill runs, then its blocks are held (module docstring)
            await asyncio.sleep(max(0.0, start + ready_ms / 1000.0 - loop.time()))
            self.prefix_cache.insert(answer.blocks)
        for chunk, tokens in split_chunks(answer.text, tokens_per_chunk):
            ready_ms += self.config.decode_ms_per_token * tokens
            await asyncio.sleep(max(0.0, start + ready_ms / 1000.0 - loop.time()))
            yield chunk
        await asyncio.sleep(max(0.0, start + answer.gpu_ms / 1000.0 - loop.time()))

    def answer_for(self, model: str, prompt: str, max_tokens: int | None) -> SimAnswer:
        cfg = self.config
        limit = max_tokens or cfg.default_max_tokens
        norm = normalise_prompt(prompt)
        table = self._answers.get(norm)
        words = table.split() if table is not None else self._phrase(model, prompt, norm)
        words[:0] = CITATION.findall(prompt)
        finish: FinishReason = "length" if len(words) > limit else "stop"
        words = words[:limit]
        tokens_in = count_tokens(prompt)
        gpu_ms = cfg.prefill_ms_per_token * tokens_in + cfg.decode_ms_per_token * len(words)
        blocks: tuple[bytes, ...] = ()
        if self.prefix_cache.enabled:
            blocks = tuple(self.prefix_cache.blocks(model, prompt.split()))
        return SimAnswer(" ".join(words), tokens_in, len(words), gpu_ms, finish, blocks)

    def _phrase(self, model: str, prompt: str, norm: str) -> list[str]:
        cfg = self.config
        meaning = f"{model}\x1f{self._meanings.get(norm, norm)}"
        digest = hashlib.sha256(meaning.encode()).digest()
        span = cfg.default_max_tokens - cfg.min_answer_tokens + 1
        length = cfg.min_answer_tokens + int.from_bytes(digest[:4], "big") % span
        seed = f"{model}\x1f{norm}" + (f"\x1f{next(self._calls)}" if cfg.vary_wording else "")
        # A model's own answers end within its default budget: only a smaller max_tokens cuts one.
        return render(meaning, prompt, random.Random(seed), length)[: cfg.default_max_tokens]

    # -- the slot gate --

    @asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self._busy < self._slots and not self._waiters:
            self._busy += 1
            self._sync_stats()
            return
        if len(self._waiters) >= self.config.queue:
            self.stats.rejected += 1
            raise QueueFull(
                f"{self._busy} of {self._slots} slots busy, {len(self._waiters)} queued"
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (next(self._seq), fut))
        self._sync_stats()
        try:
            await fut  # _wake hands the slot over (busy already counted) before resolving
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # the slot arrived with the cancellation: give it back
            else:
                self._waiters = [w for w in self._waiters if w[1] is not fut]
                heapq.heapify(self._waiters)
                self._sync_stats()
            raise

    def _release(self) -> None:
        self._busy -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._busy < self._slots:
            _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                self._busy += 1
                fut.set_result(None)
        self._sync_stats()

    def _sync_stats(self) -> None:
        self.stats.busy = self._busy
        self.stats.queued = len(self._waiters)
