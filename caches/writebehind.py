"""Write-behind for the embedding cache: a lookup hands its fresh vectors to a thread that
writes them to Redis, instead of waiting for the write itself.

Why: in the gateway a lookup runs on a thread beside a busy event loop, and every blocking call
on it (a Redis round trip) gives the GIL away and waits to get it back, up to the switch
interval each time while the loop runs Python. The write-back of a prompt's vector was one such
call on every new prompt's lookup, after its embedding and before its vector search, for a write
nobody reads before the answer comes back from upstream (indexing the answer reads it, hundreds
of ms later) and that only saves an embedding if lost.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Final

import redis

from caches.boundary import redis_boundary
from schemas.errors import StokerError

log = logging.getLogger(__name__)

# Writes waiting at most; more are dropped (a lost write costs one embedding later). Each is a
# few vectors (1.5 kB each for 384 dimensions), so the queue holds ~1.5 MB at worst.
MAX_PENDING = 1024

Write = list[tuple[str, bytes]]  # (key, value) pairs, set together with the TTL
_STOP: Final = object()  # queued by close(): the writes before it land, then the thread ends


class WriteBehind:
    """SETs with a TTL, written on a daemon thread of its own in the order handed over."""

    def __init__(self, r: redis.Redis, ttl_s: int, max_pending: int = MAX_PENDING) -> None:
        self._r = r
        self._ttl_s = ttl_s
        self._q: queue.Queue[Write | threading.Event | object] = queue.Queue(max_pending)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.dropped = 0  # writes not queued (full), for tests and logs
        self.failed = 0  # writes Redis refused

    def put(self, write: Write) -> None:
        """Queue `write` (never blocks: when the queue is full it is dropped)."""
        self._start()
        try:
            self._q.put_nowait(write)
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until what was queued so far is written (tests, a clean stop); False if not in
        time."""
        done = threading.Event()  # a marker: the writes queued before it are written first
        self._start()
        try:
            self._q.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, then stop the thread (a cache client closing: each one
        started its own)."""
        with self._lock:
            thread, self._closed = self._thread, True
        if thread is None:
            return
        try:
            self._q.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return  # the writer is stuck on Redis; the daemon thread dies with the process
        thread.join(timeout_s)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="embedding-write-behind", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        stop = False
        while not stop:
            batch = [self._q.get()]
            while len(batch) < 64:  # what queued meanwhile goes in the same round trip
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in batch
            self._write([w for w in batch if isinstance(w, list)])
            for w in batch:
                if isinstance(w, threading.Event):
                    w.set()

    def _write(self, writes: list[Write]) -> None:
        if not writes:
            return
        pipe = self._r.pipeline(transaction=False)
        for w in writes:
            for key, value in w:
                pipe.set(key, value, ex=self._ttl_s)
        try:
            with redis_boundary("embedding set"):
                pipe.execute()
        except StokerError as e:
            self.failed += len(writes)
            log.debug("embedding cache write-behind failed (%d writes): %s", len(writes), e)
