"""Where eval-semantic's answers come from: the simulator, or a real OpenAI-compatible server
whose answers are kept on disk, so a rerun asks for nothing.

A real backend is asked each query once per sample through the one backend client
(backends/client.py), with a fixed system prompt and `max_tokens`, at `temperature`. What it
answered is kept in a SQLite file outside the checkout (<model cache>/answers/), keyed by
sha256 of (model, system prompt, prompt, parameters, sample), so every run of the same
protocol after the first reads it back. Two answers per query: the live answer a miss gets and
the monitor's re-ask of a hit. At temperature 0 both are one request (a greedy decode answers
it the same way each time), asked once; above 0 the re-ask is a second sample (sample 1).
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from backends.base import GenerationRequest
from backends.client import OpenAIBackend, Timeouts
from schemas.errors import BackendRejected, BackendUnavailable, UsageError

# A voice assistant's brief: CLINC150's queries are requests to one (banking, travel, kitchen,
# small talk, ...). Short answers keep the eval's run on one core in bounds (docs/benchmarks.md,
# "The `_real` rows").
SYSTEM_PROMPT = (
    "You are a helpful voice assistant. Answer the user's request in one or two short sentences."
)
MAX_TOKENS = 40
# Requests in flight: llama-server's slots (-np 2) decode them in one batch.
PARALLEL = 2
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class AskParams:
    """What shapes an answer besides the prompt: all of it keys the disk cache."""

    model: str
    system: str = SYSTEM_PROMPT
    max_tokens: int = MAX_TOKENS
    temperature: float = 0.0
    # Above temperature 0, the re-ask is a second sample; False: one answer per prompt (a
    # check's, not a query's two). Not part of the key: sample 0 is the same request either way.
    reask: bool = True

    def body(self, prompt: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": self.system},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }

    def key(self, prompt: str, sample: int) -> str:
        raw = orjson.dumps(
            [self.model, self.system, prompt, self.max_tokens, self.temperature, sample]
        )
        return hashlib.sha256(raw).hexdigest()

    def samples(self) -> tuple[int, int]:
        """The live answer's sample and the re-ask's: one request at temperature 0."""
        return (0, 1) if self.temperature > 0 and self.reask else (0, 0)


class AnswerCache:
    """Answers on disk, one SQLite file: key -> text, and what the server spent on it."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, timeout=30.0)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, text TEXT NOT NULL, "
            "server_ms REAL NOT NULL, finish TEXT NOT NULL, at REAL NOT NULL)"
        )
        self._db.commit()

    def get_many(self, keys: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        uniq = list(dict.fromkeys(keys))
        for i in range(0, len(uniq), 500):  # SQLite's bound on host parameters
            part = uniq[i : i + 500]
            marks = ",".join("?" * len(part))
            rows = self._db.execute(f"SELECT key, text FROM answers WHERE key IN ({marks})", part)
            out.update(dict(rows.fetchall()))
        return out

    def server_ms_many(self, keys: Sequence[str]) -> dict[str, float]:
        """What the server spent on each kept answer (llama.cpp's timings), whenever asked."""
        out: dict[str, float] = {}
        uniq = list(dict.fromkeys(keys))
        for i in range(0, len(uniq), 500):
            part = uniq[i : i + 500]
            marks = ",".join("?" * len(part))
            sql = f"SELECT key, server_ms FROM answers WHERE key IN ({marks})"
            out.update(dict(self._db.execute(sql, part).fetchall()))
        return out

    def put(self, key: str, text: str, server_ms: float, finish: str) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?)",
            (key, text, server_ms, finish, time.time()),
        )
        self._db.commit()

    def close(self) -> None:
        self._db.close()


def default_cache_path(root: Path) -> Path:
    return root / "answers" / "eval-semantic-v1.sqlite3"


@dataclass
class AskReport:
    """What one run cost the backend: answers asked for (not in the disk cache), their wall
    time, the server's own account of them (llama.cpp's timings) and answers read from disk."""

    asked: int = 0
    cached: int = 0
    seconds: float = 0.0
    server_s: float = 0.0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        failed = f", {self.failed} failed ({self.errors[0]})" if self.failed else ""
        return (
            f"asked the backend for {self.asked} answers in {self.seconds:.0f} s (the server "
            f"spent {self.server_s:.0f} s), {self.cached} read from the answer cache{failed}"
        )


class Endpoint:
    """Where answers are asked: a base URL, or a server `start`ed on the first answer the cache
    lacks (so a run whose answers are all kept starts none). Shared by every BackendAnswers of
    one run (`sibling`): one server, never two generating."""

    def __init__(self, base_url: str, start: Callable[[], str] | None = None) -> None:
        self.base_url = base_url
        self._start = start

    @property
    def started(self) -> bool:
        return self._start is None

    def url(self) -> str:
        if self._start is not None:
            self.base_url = self._start()
            self._start = None
        return self.base_url


class BackendAnswers:
    """Each query's live answer and re-ask from a real server, through the disk cache."""

    def __init__(
        self,
        base_url: str | Endpoint,
        params: AskParams,
        cache: AnswerCache,
        *,
        parallel: int = PARALLEL,
        read_s: float = 120.0,
    ) -> None:
        self.endpoint = base_url if isinstance(base_url, Endpoint) else Endpoint(base_url)
        self.params = params
        self.cache = cache
        self.parallel = parallel
        self.read_s = read_s
        self.report = AskReport()
        self._counted: set[str] = set()  # keys already counted in the report

    @property
    def base_url(self) -> str:
        return self.endpoint.base_url

    def sibling(self, params: AskParams) -> BackendAnswers:
        """Other answers (another system prompt, temperature, length) from the same server and
        answer cache, with a report of their own."""
        return BackendAnswers(
            self.endpoint, params, self.cache, parallel=self.parallel, read_s=self.read_s
        )

    def texts(self, prompts: Sequence[str]) -> dict[str, str]:
        """The kept first answer of each of `prompts` that has one (nothing is asked)."""
        keys = {p: self.params.key(p, 0) for p in prompts}
        have = self.cache.get_many(list(keys.values()))
        return {p: have[k] for p, k in keys.items() if k in have}

    def server_seconds(self, prompts: Sequence[str]) -> float:
        """What the server spent on the kept first answers of `prompts`, whenever asked."""
        ms = self.cache.server_ms_many([self.params.key(p, 0) for p in prompts])
        return sum(ms.values()) / 1000.0

    def keys(self, prompt: str) -> list[str]:
        return [self.params.key(prompt, s) for s in dict.fromkeys(self.params.samples())]

    def fetch(
        self, prompts: Sequence[str], deadline: float | None = None, progress: Progress = _quiet
    ) -> None:
        """Ask for what the cache lacks of `prompts`' answers, in their order, until
        `deadline` (time.monotonic()); what is not asked by then stays unasked."""
        wanted = [(p, s) for p in prompts for s in dict.fromkeys(self.params.samples())]
        have = self.cache.get_many([self.params.key(p, s) for p, s in wanted])
        todo = list(dict.fromkeys(w for w in wanted if self.params.key(*w) not in have))
        # each answer counts once per run, asked or read: pairs() fetches again what
        # answered_sample() fetched
        read = {self.params.key(*w) for w in wanted if self.params.key(*w) in have}
        self.report.cached += len(read - self._counted)
        self._counted |= read | {self.params.key(*w) for w in todo}
        if todo and (deadline is None or time.monotonic() < deadline):  # else start nothing
            t0 = time.perf_counter()
            asyncio.run(self._ask_all(todo, deadline, progress))
            self.report.seconds += time.perf_counter() - t0

    def answered(self, prompts: Sequence[str]) -> int:
        """How many of `prompts`, from the first, have all their answers cached."""
        have = self.cache.get_many([k for p in prompts for k in self.keys(p)])
        for i, p in enumerate(prompts):
            if any(k not in have for k in self.keys(p)):
                return i
        return len(prompts)

    def pairs(self, prompts: Sequence[str]) -> tuple[list[str], list[str]]:
        """(live, again) answers for `prompts`, asking only what the cache lacks."""
        self.fetch(prompts)
        s_live, s_again = self.params.samples()
        have = self.cache.get_many([k for p in prompts for k in self.keys(p)])
        try:
            live = [have[self.params.key(p, s_live)] for p in prompts]
            again = [have[self.params.key(p, s_again)] for p in prompts]
        except KeyError:
            why = self.report.errors[0] if self.report.errors else "no error said why"
            raise BackendUnavailable(
                f"some answers could not be had from {self.base_url}: {why}"
            ) from None
        return live, again

    async def _ask_all(
        self, todo: list[tuple[str, int]], deadline: float | None, progress: Progress
    ) -> None:
        gate = asyncio.Semaphore(self.parallel)
        done = 0
        t0 = time.perf_counter()
        timeouts = Timeouts(connect_s=5.0, read_s=self.read_s, pool_s=None)
        url = self.endpoint.url()
        async with OpenAIBackend(url, timeouts=timeouts, connections=self.parallel) as b:

            async def one(prompt: str, sample: int) -> None:
                nonlocal done
                async with gate:
                    if deadline is not None and time.monotonic() >= deadline:
                        return
                    await self._ask(b, prompt, sample)
                done += 1
                if done % 20 == 0 or done == len(todo):
                    rate = done / max(time.perf_counter() - t0, 1e-9)
                    progress(f"asked {done}/{len(todo)} answers ({rate:.2f}/s)")

            await asyncio.gather(*(one(p, s) for p, s in todo))

    async def _ask(self, b: OpenAIBackend, prompt: str, sample: int) -> None:
        req = GenerationRequest(
            "eval", self.params.model, "v1", "t1", prompt, body=self.params.body(prompt),
            api="chat",
        )  # fmt: skip
        try:
            g = await b.generate(req)
        except (BackendUnavailable, BackendRejected) as e:
            self.report.failed += 1
            if len(self.report.errors) < 3:
                self.report.errors.append(str(e)[:200])
            if isinstance(e, BackendRejected) or b.unreachable is not None:
                raise
            return
        self.report.asked += 1
        self.report.server_s += g.gpu_ms / 1000.0
        self.cache.put(self.params.key(prompt, sample), g.text, g.gpu_ms, g.finish_reason)


def served_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The one model a server lists at <base>/models (llama-server: its --alias); UsageError
    when it lists several or none, so the caller names one."""
    from backends.client import list_models

    try:
        ids = list_models(base_url, timeout_s)
    except (BackendUnavailable, BackendRejected) as e:
        raise UsageError(f"cannot list the models of {base_url}: {e}") from e
    if not ids or len(ids) > 1:
        raise UsageError(
            f"{base_url} lists {len(ids or [])} models ({', '.join(ids or [])}): name one "
            "with --model"
        )
    return ids[0]
