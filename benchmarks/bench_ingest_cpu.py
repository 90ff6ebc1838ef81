"""CPU time per event of each process in bench_ingest's raw and stoker rounds, and of the worker's steps.

bench_ingest gives a ratio of wall-clock rates, which the other jobs on a shared box move by
more than most changes; CPU seconds per event move less, and say where the time goes: the
benchmark process (the consumer's Python and librdkafka's threads), redis-server and the broker
(Tansu), each read from the OS before and after a round. A stoker round also splits its worker
by thread: the batch tally (decode_batch, the loop's thread) and the apply (its own thread,
mostly waiting on Redis). On 2 cores, the sum over processes bounds the rate from below
whatever the overlap: 2 cores / (CPU seconds per event). Same events, topic and batch size as
bench_ingest; each round reads the topic from the start in a fresh group.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bench_ingest import produce, raw_rate, run_shapes, stoker_rate
from confluent_kafka import Message

from stoker.embedded import EmbeddedStack
from stoker.wiring import build_redis
from streams.base import Decoded
from streams.topics import ensure_topics
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process (this one when pid is None): every thread,
    the ended ones included (librdkafka's threads end with their consumer)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15)


class _TimedHandler(TrafficHandler):
    """The traffic handler, adding up the thread CPU seconds of its decode and its apply."""

    def __init__(self, profile: TrafficProfile) -> None:
        super().__init__(profile)
        self.cpu_s = {"tally": 0.0, "apply": 0.0}
        self.events = 0  # decoded: the worker reads a batch past the timed ones (bench_ingest)

    def decode_batch(self, messages: Sequence[Message]) -> Decoded:
        self.events += len(messages)
        return self._timed("tally", super().decode_batch, messages)

    def apply_decoded(self, decoded: Decoded) -> None:
        self._timed("apply", super().apply_decoded, decoded)

    def _timed(self, part: str, step: Callable[[Any], Any], arg: Any) -> Any:
        start = time.thread_time()
        try:
            return step(arg)
        finally:
            self.cpu_s[part] += time.thread_time() - start


def stoker_round(
    stack: EmbeddedStack, prefix: str, n: int, batch: int
) -> tuple[float, int, dict[str, float]]:
    """(events/s, events read, thread CPU seconds of the tally and the apply) of one stoker
    round."""
    made: list[_TimedHandler] = []

    def handler_of(profile: TrafficProfile) -> _TimedHandler:
        made.append(_TimedHandler(profile))
        return made[-1]

    rate = stoker_rate(stack, prefix, n, batch, handler_of)
    return rate, made[0].events, made[0].cpu_s


def measure(
    stack: EmbeddedStack, events: list[bytes], n: int, rounds: int, batch: int
) -> dict[str, Any]:
    prefix = f"benchcpu{uuid.uuid4().hex[:6]}."
    topic = f"{prefix}inference.requests"
    ensure_topics(stack.kafka_bootstrap, {topic: 6})
    produce(stack.kafka_bootstrap, topic, events)
    assert stack.kafka is not None and stack.redis is not None
    pids = {"bench": None, "redis": stack.redis.pid, "broker": stack.kafka.pid}
    r = build_redis(stack.settings())
    per: dict[str, list[dict[str, float]]] = {"raw": [], "stoker": []}
    for _ in range(rounds):
        r.flushdb()  # the profile's watermarks would refuse the re-read
        for side in ("raw", "stoker"):
            before = {name: process_cpu_s(pid) for name, pid in pids.items()}
            parts: dict[str, float] = {}
            read = n  # raw reads exactly n
            if side == "raw":
                rate = raw_rate(stack.kafka_bootstrap, topic, n, batch)
            else:
                rate, read, parts = stoker_round(stack, prefix, n, batch)
            us = {
                name: (process_cpu_s(pid) - before[name]) / read * 1e6 for name, pid in pids.items()
            }
            us |= {f"worker_{part}": s / read * 1e6 for part, s in parts.items()}
            us["total"] = sum(us[name] for name in pids)
            us["events_per_s"] = rate
            per[side].append(us)
    r.close()
    out: dict[str, Any] = {}
    for side, runs in per.items():
        for key in runs[0]:
            med = statistics.median(run[key] for run in runs)
            out[f"{side}_{key}" if key == "events_per_s" else f"{side}_{key}_us"] = (
                round(med) if key == "events_per_s" else round(med, 2)
            )
    return out


def main() -> None:
    run_shapes(measure, suffix="_cpu")


if __name__ == "__main__":
    main()
