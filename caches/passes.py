"""How the embedder's micro-batcher (embedders.BatchingEmbedder) shapes its passes: calls as
jobs split into slices, a pass sized to a time from what texts have cost, and the background
thread's priority."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]


@dataclass
class Job:
    texts: list[str]
    future: Future[Vectors]
    deadline: float | None  # time.monotonic(); None: background work, no deadline
    queued_at: float
    taken: int = 0  # texts handed to passes so far (a background job may span several)
    parts: list[Vectors] = field(default_factory=list)  # their vectors, in order

    @property
    def left(self) -> int:
        return len(self.texts) - self.taken


# A pass holds (job, first text, end) slices: a background job runs over as many passes as its
# size needs; a lookup's job always runs whole.
Slice = tuple[Job, int, int]

# How long a background pass may run while this process serves lookups. With a model that
# runs from two threads at once (ONNX Runtime), lookups have a thread of their own and never
# wait for it; with one that does not (torch), a lookup that comes during a background pass
# waits for it, so it is a fraction of the 50 ms lookup budget. all-MiniLM-L6-v2 on ONNX Runtime
# embeds an answer (~40 tokens) in ~15 ms of CPU here, so such a pass holds one answer, where
# 16 (what a warm run's call sent at once) held the model ~250 ms.
DEFAULT_BACKGROUND_PASS_S = 0.010
# A process that has served no lookup for this long (a worker) batches background work freely
# (up to max_texts a pass) at its normal priority: nobody waits behind it, and 4 prompts a pass
# cost half as much CPU each as one.
LOOKUPS_QUIET_S = 10.0
# The background thread's niceness once the process serves lookups (Linux: per thread): on a
# busy box the kernel then runs the lookup thread and the event loop first (CFS weight 110
# against 1024), so indexing takes the CPU they leave.
_BACKGROUND_NICE = 10


class PassCost:
    """What a pass of texts of one kind costs (moving average over passes), so a pass can be
    sized to a time: a pass of n texts costs `fixed + (1 - fixed) * n` times a pass of one
    (`fixed`: the share of a one-text pass that does not grow with its texts). `per_text`: the
    seconds of a one-text pass; None until a pass of that kind has run."""

    def __init__(self, fixed: float = 0.0) -> None:
        if not 0 <= fixed < 1:
            raise ValueError("fixed must be in [0, 1)")
        self.fixed = fixed
        self.per_text: float | None = None

    def add(self, texts: int, seconds: float) -> None:
        s = seconds / (self.fixed + (1 - self.fixed) * texts)
        self.per_text = s if self.per_text is None else 0.8 * self.per_text + 0.2 * s

    def texts_within(self, seconds: float, most: int, unknown: int) -> int:
        """How many texts fit in `seconds` (at least 1, at most `most`; `unknown` before a
        pass has shown the cost)."""
        if self.per_text is None:
            return unknown
        fit = (seconds / self.per_text - self.fixed) / (1 - self.fixed)
        if fit >= most:
            return most
        return max(1, int(fit))


# The fixed share of a lookup pass (short prompts, ~10 tokens, on ONNX Runtime): measured here
# (p10 of 30 passes, CLINC150 questions) 1 prompt 7.6 ms, 2 12.1 ms, 4 18.0 ms, 8 33 ms, about
# (1 + n) / 2 passes of one. Counted as n whole passes, a pass sized to the oldest deadline held
# half the prompts that fit, and the rest queued for the next pass: in a gateway_semantic_load
# run, 29 of 75 cut lookups had waited 15-43 ms in that queue.
LOOKUP_FIXED_SHARE = 0.5


def lower_priority() -> None:
    """Lower the calling thread's CPU priority (Linux only: elsewhere the call would reach the
    whole process)."""
    if sys.platform != "linux":
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _BACKGROUND_NICE)
    except OSError as e:
        log.debug("embedder: background thread priority unchanged: %s", e)


def take(q: deque[Job], most: int) -> list[Slice]:
    """Up to `most` texts from the head of `q`, splitting a job that does not fit; a job
    leaves the queue once its last text is taken."""
    out: list[Slice] = []
    size = 0
    while q and size < most:
        job = q[0]
        if job.future.done() or (job.taken == 0 and not job.future.set_running_or_notify_cancel()):
            q.popleft()  # cancelled, or failed in an earlier pass: the rest is not wanted
            continue
        n = min(job.left, most - size)
        out.append((job, job.taken, job.taken + n))
        job.taken += n
        size += n
        if not job.left:
            q.popleft()
    return out


def settle(
    fut: Future[Vectors], *, result: Vectors | None = None, exc: BaseException | None = None
) -> None:
    """Set a running future's outcome (a caller that stopped waiting never reads it)."""
    if exc is not None:
        fut.set_exception(exc)
    else:
        assert result is not None
        fut.set_result(result)
