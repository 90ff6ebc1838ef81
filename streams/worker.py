"""The worker loop every handler runs in: batch consume, decode, apply, dead-letter, commit.

One batch, in order (numbered as in the code):
1. consume up to batch_size messages (one confluent-kafka call);
2. decode: good events for the handler, poison for the dead-letter topic;
3. handler applies the good events (idempotent: a batch may come again);
4. poison goes to stoker.dlq (streams/deadletter.py: the original record with dlq.* headers,
   truncated when it is too big to copy whole) and the producer is flushed; done after apply
   so an outage's retries do not dead-letter the same record twice;
5. offsets (last + 1 per partition) are committed synchronously.
On the embedded broker, a worker whose topics have been quiet rests before step 1: it pauses
its partitions for up to half the quiet time (WorkerConfig.idle_fetch_max_s at most; see
streams/idle.py for why), then resumes them and consumes for one short probe. A record ends the
rest at once; the offsets read are those a fetch without the rest would have read.
A RetriableError in 3-5 commits nothing: the worker seeks every partition of the batch back to
the batch's first offset, backs off (doubling, bounded) and reads the same records again; it
never skips. stop() (SIGTERM) lets the current batch finish and commit, then leaves the group.

Pipelined handlers (`Handler.pipelined = True`, the traffic handler) overlap step 3 of batch N
with steps 1-2 of batch N+1: one apply runs in a background thread while the loop consumes and
decodes the next batch, then the loop waits for it and does 4-5 for batch N. The order of
effects and commits per batch is unchanged; a failed apply rewinds both batches.

Each step (one pass through 1-5) runs with the cyclic GC paused, and collects once after it. A
batch makes no reference cycles, so refcounting frees all of it; but its records (tracked
confluent-kafka Messages) live until the commit, and with collections on, every few hundred
allocations re-traversed the young generations that held them, a sixth of the traffic worker's
time (bench_ingest: ingest_traffic; the figures are in docs/benchmarks.md, "Ingest"). Cycles
that do arise (an exception's traceback, say) wait at most one batch.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import BrokerUnavailable, RetriableError
from streams.base import Decoded, Handler, Poison
from streams.deadletter import DEFAULT_MAX_RECORD_BYTES, DeadLetters, producer_limit
from streams.idle import IdleRest
from streams.metrics import WorkerMetrics
from streams.topics import TOPICS, consumer_config, ensure_topics, producer_config, topic_name

log = logging.getLogger(__name__)

DLQ_TOPIC = "stoker.dlq"
# A dead letter must reach the broker before the offsets move past it; 10 s is far above a
# healthy flush (~2 ms on the embedded broker) and bounds a stop during a broker outage.
_DLQ_FLUSH_S = 10.0
# How long close() may take to commit nothing further and leave the group.
_CLOSE_S = 10.0
# After a rest: long enough for one fetch of the resumed partitions to come back (measured on
# Tansu, resume to record: 6-16 ms on a loaded 2-core machine), short enough
# that a resting consumer fetches ~5% of the time.
_PROBE_S = 0.05
# resume() alone leaves librdkafka's fetcher asleep for up to 1 s: it waits on its connection
# and notices resumed partitions at its next wake-up (0.7 s measured), by when the next rest has
# paused them again (a record then waited 6 s). A request on that connection wakes it: the
# embedded broker is one broker, so a metadata request goes there (Tansu spends less on it than
# on ListOffsets: an idle stack's Tansu 1.8% against 3.0% of a core). Bounded, for a broker
# that has gone away.
_WAKE_TIMEOUT_S = 1.0


@dataclass
class WorkerStats:
    """Counters for metrics and tests; written by the worker thread only."""

    events: int = 0
    batches: int = 0
    dlq: int = 0
    dlq_reasons: dict[str, int] = field(default_factory=dict)  # records by EventDecodeError.reason
    last_dead_letter: str = ""  # where the last one was read, and why it was refused
    retries: int = 0
    commits: int = 0
    last_batch_at: float | None = None  # time.time() of the last committed batch
    rests: int = 0  # pauses of an idle consumer between fetches (the embedded broker only)
    last_rest_s: float = 0.0  # how long the last of them was
    last_error: str = ""
    # Partitions this member owns now, as "topic:partition" (rebalance callbacks keep it).
    assigned: frozenset[str] = frozenset()

    def dead_lettered(self) -> str:
        """How many records went to the dead-letter topic and, when any did, why: the count
        per reason, and the last one's place and detail (the shutdown report's words)."""
        if not self.dlq:
            return "0 dead-lettered"
        reasons = sorted(self.dlq_reasons.items(), key=lambda kv: -kv[1])
        said = ", ".join(f"{n} {reason}" for reason, n in reasons)
        return f"{self.dlq} dead-lettered ({said}; the last: {self.last_dead_letter})"


class WorkerConfig(BaseModel):
    """Everything the loop needs besides the handler (the shell builds it from settings), and
    the owner of the worker_* settings' defaults and bounds (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str
    group_id: str
    embedded: bool = False
    topic_prefix: str = ""
    batch_size: int = Field(default=20_000, ge=1, le=100_000)
    # how long consume() waits for a batch to fill; also how fast stop() is noticed
    poll_s: float = Field(default=0.25, gt=0, le=5)
    backoff_base_s: float = Field(default=0.1, gt=0)
    backoff_max_s: float = Field(default=10.0, gt=0)
    create_topics: bool = True
    # The embedded broker only: the longest an idle consumer rests between fetches (it rests
    # half the time its topics have been quiet, streams/idle.py); 0 fetches without rest. The
    # first record after a quiet spell waits up to this long; records that follow do not.
    idle_fetch_max_s: float = Field(default=1.0, ge=0, le=60)
    # The largest dead letter copied whole; a bigger one is truncated (streams/deadletter.py).
    # At least 128 KiB: a truncated copy keeps 64 KiB of the value and its headers.
    dlq_max_record_bytes: int = Field(default=DEFAULT_MAX_RECORD_BYTES, ge=131_072, le=100_000_000)


def default_group_id(handler_name: str, topic_prefix: str = "") -> str:
    # The prefix isolates environments (and tests) that share a broker, as it does for topics.
    return f"{topic_prefix}stoker.{handler_name}"


class Worker:
    """Runs one handler in one consumer-group member. Not thread-safe except stop()."""

    def __init__(self, handler: Handler, config: WorkerConfig) -> None:
        self.config = config
        self.handler = handler
        self.stats = WorkerStats()
        self.metrics = WorkerMetrics(handler.name)
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self._dead_letters: DeadLetters | None = None
        self._backoff_s = 0.0
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: _InFlight | None = None
        self._idle = IdleRest(config.idle_fetch_max_s) if config.embedded else None
        self.topics = [topic_name(t, config.topic_prefix) for t in handler.topics]
        self.dlq_topic = topic_name(DLQ_TOPIC, config.topic_prefix)

    # -- lifecycle --
    def stop(self) -> None:
        """Ask the loop to finish its current batch, commit and return (safe from any thread)."""
        self._stop.set()

    def run(self) -> None:
        """Consume until stop(); then commit nothing half-done, leave the group, close the handler."""
        self.run_until(lambda _: False, timeout_s=None)

    def run_until(self, predicate: Callable[[WorkerStats], bool], timeout_s: float | None) -> bool:
        """Run until predicate(stats) holds (True), stop() or timeout_s passes (False); then close."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._open()
        try:
            while not self._stop.is_set():
                if predicate(self.stats):
                    return True
                if deadline is not None and time.monotonic() > deadline:
                    return False
                with _gc_paused():  # one collection per batch (see the module docstring)
                    self._step()
            return predicate(self.stats)
        finally:
            self._close()

    def _open(self) -> None:
        c = self.config
        if c.create_topics:
            wanted = {self.dlq_topic: TOPICS[DLQ_TOPIC]}
            wanted |= {topic_name(t, c.topic_prefix): TOPICS[t] for t in self.handler.topics}
            ensure_topics(c.bootstrap, wanted)
        if getattr(self.handler, "pipelined", False):
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"apply-{self.handler.name}")
        self._consumer = Consumer(consumer_config(c.bootstrap, c.group_id, embedded=c.embedded))
        self._consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
        log.info("worker %s joined group %s on %s", self.handler.name, c.group_id, self.topics)

    def _on_assign(self, _c: Consumer, partitions: list[TopicPartition]) -> None:
        if self._idle is not None:
            self._idle.reset()
        self.stats.assigned = self.stats.assigned | {f"{p.topic}:{p.partition}" for p in partitions}

    def _on_revoke(self, _c: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit the batch in flight (if any) while we still own its partitions; if its apply
        # failed, the next owner re-reads it from the last commit (applies are idempotent).
        if self._inflight is not None:
            try:
                self._finish_inflight()
            except RetriableError as exc:
                log.warning("batch in flight at revoke not committed: %s", exc)
                self._inflight = None
        self.stats.assigned = self.stats.assigned - {f"{p.topic}:{p.partition}" for p in partitions}
        self.metrics.revoked(partitions)

    def _close(self) -> None:
        if self._inflight is not None:
            try:
                self._finish_inflight()
            except RetriableError as exc:  # not committed: re-read after restart
                log.warning("batch in flight at stop not committed: %s", exc)
                self._inflight = None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()  # leaves the group now: partitions move without a session timeout
        letters, self._dead_letters = self._dead_letters, None
        if letters is not None:
            letters.producer.flush(_CLOSE_S)
        self.handler.close()

    # -- one batch --
    def _step(self) -> None:
        assert self._consumer is not None
        self.metrics.maybe_update_lag(self._consumer)
        batch = self._good_messages(self._consume(self._consumer))
        if self._pool is not None:
            self._step_pipelined(batch)
            return
        if not batch:
            return
        try:
            self._process(batch)
        except RetriableError as exc:
            self._retry(batch, exc)
        else:
            self._backoff_s = 0.0

    def _consume(self, consumer: Consumer) -> list[Message]:
        """Step 1, after a rest when the topics have been quiet (the embedded broker only)."""
        timeout = self.config.poll_s
        rest_s = self._idle.rest_s() if self._idle is not None and self._inflight is None else 0
        if rest_s and (partitions := consumer.assignment()):
            self._rest(consumer, partitions, rest_s)
            timeout = _PROBE_S
        messages = consumer.consume(num_messages=self.config.batch_size, timeout=timeout)
        if self._idle is not None:
            self._idle.saw(len(messages))
        return messages

    def _rest(self, consumer: Consumer, partitions: list[TopicPartition], rest_s: float) -> None:
        """Pause the partitions for rest_s (stop() cuts it short), resume them, wake the fetcher.

        The assignment cannot change meanwhile: rebalances are served inside consume() only.
        """
        consumer.pause(partitions)
        try:
            self._stop.wait(rest_s)
        finally:
            consumer.resume(partitions)
        self.stats.rests += 1
        self.stats.last_rest_s = rest_s
        try:
            consumer.list_topics(self.topics[0], timeout=_WAKE_TIMEOUT_S)
        except KafkaException as exc:  # the broker is down: the consume says so
            log.debug("worker %s: waking the fetcher failed: %s", self.handler.name, exc)

    def _process(self, batch: list[Message]) -> None:
        decoded = self.handler.decode_batch(batch)  # 2
        if decoded.good:
            self.handler.apply_decoded(decoded)  # 3
        self._settle(batch, decoded)  # 4, 5

    def _settle(self, batch: list[Message], decoded: Decoded) -> None:
        """Steps 4 and 5 of a batch whose effects are applied."""
        self._dead_letter(decoded.poison)  # 4
        self._commit(batch)  # 5
        self.stats.events += decoded.good
        self._count_poison(decoded.poison)
        self.stats.batches += 1
        self.stats.last_batch_at = time.time()
        self.metrics.settled(decoded.good, decoded.poison)
        self.handler.settled(decoded)

    def _count_poison(self, poison: Sequence[Poison]) -> None:
        """Count a batch's dead letters by reason, keep the last one's story, and say it once
        for the batch: a record refused is data someone sent wrong, so it is worth a line."""
        if not poison:
            return
        s = self.stats
        s.dlq += len(poison)
        for p in poison:
            s.dlq_reasons[p.error.reason] = s.dlq_reasons.get(p.error.reason, 0) + 1
        s.last_dead_letter = _story(poison[-1])
        log.warning(
            "worker %s: %d record(s) to %s; the last: %s",
            self.handler.name, len(poison), self.dlq_topic, s.last_dead_letter,
        )  # fmt: skip

    def _retry(self, batch: Sequence[Message], exc: RetriableError) -> None:
        self.stats.retries += 1
        self.metrics.retried()
        self.stats.last_error = str(exc)
        self._rewind(batch)
        self._back_off(exc)

    def _step_pipelined(self, batch: list[Message]) -> None:
        """Decode batch N+1 while batch N applies in the background; then settle N, submit N+1."""
        decoded = self.handler.decode_batch(batch) if batch else None  # 2 (N+1), overlapping 3 (N)
        prior = self._inflight
        if prior is not None:
            try:
                self._finish_inflight()
            except RetriableError as exc:
                self._retry([*prior.batch, *batch], exc)  # rewind to N's first offsets
                return
        if batch and decoded is not None:
            assert self._pool is not None
            done = self._pool.submit(self.handler.apply_decoded, decoded) if decoded.good else None
            self._inflight = _InFlight(batch, decoded, done)

    def _finish_inflight(self) -> None:
        """Wait for the apply in flight, then settle its batch (4, 5); raises what apply raised."""
        f = self._inflight
        assert f is not None
        try:
            if f.applied is not None:
                f.applied.result()  # 3 (N)
            self._settle(f.batch, f.decoded)
        finally:
            self._inflight = None
        self._backoff_s = 0.0

    def _good_messages(self, messages: list[Message]) -> list[Message]:
        if all(m.error() is None for m in messages):  # the common case: one pass, no copy
            return messages
        good = []
        for m in messages:
            err = m.error()
            if err is None:
                good.append(m)
            elif err.fatal():
                raise BrokerUnavailable(f"fatal consumer error: {err.str()}")
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error (librdkafka retries it): %s", err.str())
        return good

    def _dead_letter(self, poison: Sequence[Poison]) -> None:
        if not poison:
            return
        if self._dead_letters is None:
            c = self.config
            limit = producer_limit(c.dlq_max_record_bytes)
            conf = producer_config(c.bootstrap, embedded=c.embedded, **{"message.max.bytes": limit})
            self._dead_letters = DeadLetters(
                Producer(conf), self.dlq_topic, self.handler.name,
                max_record_bytes=c.dlq_max_record_bytes, flush_s=_DLQ_FLUSH_S,
            )  # fmt: skip
        self._dead_letters.write(poison)

    def _commit(self, batch: Sequence[Message]) -> None:
        assert self._consumer is not None
        offsets = next_offsets(batch)
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # The effects are applied and idempotent: re-reading the batch is safe, losing it not.
            raise BrokerUnavailable(f"offset commit failed: {exc.args[0]}") from exc
        self.stats.commits += 1
        self.metrics.committed(offsets)

    def _rewind(self, batch: Sequence[Message]) -> None:
        """Seek each partition of the batch back to its first offset in the batch."""
        assert self._consumer is not None
        firsts: dict[tuple[str, int], int] = {}
        for m in batch:
            firsts.setdefault((m.topic() or "", m.partition() or 0), m.offset() or 0)
        for (topic, partition), offset in firsts.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                # Revoked meanwhile: its new owner starts from the last commit, which is earlier.
                log.info("seek %s[%d] skipped: %s", topic, partition, exc.args[0])

    def _back_off(self, exc: RetriableError) -> None:
        c = self.config
        self._backoff_s = min(c.backoff_max_s, max(c.backoff_base_s, self._backoff_s * 2))
        log.warning(
            "worker %s: %s; retrying the same batch in %.2f s",
            self.handler.name,
            exc,
            self._backoff_s,
            extra={"worker": self.handler.name},
        )
        self._stop.wait(self._backoff_s)  # stop() cuts the wait short; nothing was committed


@dataclass(frozen=True)
class _InFlight:
    """A decoded batch whose apply runs in the background (pipelined handlers)."""

    batch: list[Message]
    decoded: Decoded
    applied: Future[None] | None


@contextmanager
def _gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def next_offsets(batch: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit: last offset + 1 of every partition in the batch."""
    last: dict[tuple[str, int], int] = {}
    for m in batch:
        last[(m.topic() or "", m.partition() or 0)] = m.offset() or 0
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]


# A dead letter's detail as a log line and the shutdown report quote it (the copy in the
# dead-letter topic keeps up to 4 KiB of it).
_STORY_CHARS = 300


def _story(p: Poison) -> str:
    """Where a refused record was read and why: `topic[partition]@offset: reason: detail`."""
    m, e = p.message, p.error
    detail = e.detail if len(e.detail) <= _STORY_CHARS else e.detail[:_STORY_CHARS] + "..."
    return f"{m.topic()}[{m.partition()}]@{m.offset()}: {e.reason}: {detail}"
